"""Bayesian linear and generalised linear models on composable bases (the revrand models)."""

from pmkjit.models.glm import GeneralizedLinearModel
from pmkjit.models.likelihoods import Bernoulli, Binomial, Gaussian, Likelihood, Poisson
from pmkjit.models.slm import StandardLinearModel

__all__ = [
    "StandardLinearModel",
    "GeneralizedLinearModel",
    "Likelihood",
    "Gaussian",
    "Bernoulli",
    "Binomial",
    "Poisson",
]
