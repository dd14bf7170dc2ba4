"""Exponential-family messages with batched natural parameters."""

from pmkjit.families.base import ExponentialFamily
from pmkjit.families.beta import Beta
from pmkjit.families.gamma import Gamma
from pmkjit.families.gaussian import Gaussian
from pmkjit.families.mv_gaussian import MvGaussian
from pmkjit.families.point_mass import PointMass

__all__ = ["ExponentialFamily", "Gaussian", "Beta", "Gamma", "MvGaussian", "PointMass", "family_by_name"]

_BY_NAME = {cls.name: cls for cls in (Gaussian, Beta, Gamma, PointMass)}


def family_by_name(name: str) -> type[ExponentialFamily]:
    """The univariate family class called ``name`` ("Gaussian", "Beta", "Gamma" or "PointMass")."""
    try:
        return _BY_NAME[str(name)]
    except KeyError:
        raise ValueError(f"unknown message family {name!r}; expected one of {sorted(_BY_NAME)}") from None
