"""Bayesian regression in the primal on random features."""

from pmkjit.regression.blr import BayesianLinearRegression, EvidenceCurve

__all__ = ["BayesianLinearRegression", "EvidenceCurve"]
