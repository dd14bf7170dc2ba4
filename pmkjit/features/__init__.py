"""Random features on vectors and on probability distributions (messages)."""

from pmkjit.features.embeddings import (
    ExpectedProductFeatures,
    GaussianJointEmbeddingFeatures,
    MeanVarianceFeatures,
)
from pmkjit.features.random_fourier import RandomFourierFeatures
from pmkjit.features.spectral import KERNELS, kernel_matrix, sample_frequencies

__all__ = [
    "KERNELS",
    "RandomFourierFeatures",
    "sample_frequencies",
    "kernel_matrix",
    "MeanVarianceFeatures",
    "ExpectedProductFeatures",
    "GaussianJointEmbeddingFeatures",
]
