"""Composable basis functions with named, learnable hyperparameters (the revrand bases).

Random Fourier bases (RBF, Laplace, Cauchy, Matérn 3/2 and 5/2; i.i.d., orthogonal,
Fastfood or SORF frequencies), the à la carte spectral mixture, and linear, bias,
polynomial and radial bases. ``a + b`` concatenates; ``columns=`` applies a basis to
chosen input columns; hyperparameters are addressed as ``"<name>__<parameter>"``.
"""

from pmkjit.bases.base import Basis, BasisConcat, Hyperparameter
from pmkjit.bases.fourier import SAMPLERS, RandomFourierBasis, SpectralMixtureBasis
from pmkjit.bases.simple import BiasBasis, LinearBasis, PolynomialBasis, RadialBasis

__all__ = [
    "Basis",
    "BasisConcat",
    "Hyperparameter",
    "SAMPLERS",
    "RandomFourierBasis",
    "SpectralMixtureBasis",
    "LinearBasis",
    "BiasBasis",
    "PolynomialBasis",
    "RadialBasis",
]
