"""Spectral densities of shift-invariant kernels (revrand's Table 1) and exact kernels.

Every kernel here is ``k(x, y) = k((x - y) / lengthscale)`` with ``k(0) = 1``; by
Bochner's theorem ``k(delta) = E_w[cos(w . delta)]`` for frequencies ``w`` drawn from
its normalised spectral density, which is what :func:`sample_frequencies` draws
(at unit length scale).

=========  ==================================  =======================================
kernel     k(delta), r = ||delta||             frequencies
=========  ==================================  =======================================
rbf        exp(-r^2 / 2)                       w ~ N(0, I)
laplace    exp(-||delta||_1)                   independent standard Cauchy per axis
cauchy     1 / (1 + r^2)                       w = sqrt(2 s) z, s ~ Exp(1), z ~ N(0, I)
matern32   (1 + sqrt3 r) exp(-sqrt3 r)         w = z sqrt(3 / g), g ~ Gamma(3/2, 1)
matern52   (1 + sqrt5 r + 5r^2/3) exp(-sqrt5 r) w = z sqrt(5 / g), g ~ Gamma(5/2, 1)
=========  ==================================  =======================================

The Matérn spectra are multivariate Student-t with ``2 nu`` degrees of freedom and scale
``1``: ``w = z sqrt(2 nu / chi2_{2 nu}) = z sqrt(nu / Gamma(nu, 1))``. The Cauchy kernel
is a scale mixture of Gaussians, ``1/(1 + r^2) = E_s[exp(-s r^2)]`` with ``s ~ Exp(1)``.
Laplace in the product (L1) form factorises over axes, each with a Cauchy spectrum
(revrand's table lists it otherwise).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist

__all__ = ["KERNELS", "ISOTROPIC", "sample_frequencies", "kernel_matrix"]

KERNELS = ("rbf", "laplace", "cauchy", "matern32", "matern52")
ISOTROPIC = ("rbf", "cauchy", "matern32", "matern52")


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")


def _radial_scale(kernel: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-frequency factor multiplying a standard Gaussian vector (isotropic kernels)."""
    if kernel == "rbf":
        return np.ones(n)
    if kernel == "cauchy":
        return np.sqrt(2.0 * rng.exponential(1.0, n))
    nu = 1.5 if kernel == "matern32" else 2.5
    return np.sqrt(nu / rng.gamma(nu, 1.0, n))


def sample_frequencies(
    kernel: str, n_dims: int, n_frequencies: int, rng: np.random.Generator, orthogonal: bool = False
) -> np.ndarray:
    """Draw unit-length-scale frequencies ``(n_dims, n_frequencies)`` for ``kernel``.

    Parameters
    ----------
    kernel : {"rbf", "laplace", "cauchy", "matern32", "matern52"}
    n_dims, n_frequencies : int
    rng : numpy.random.Generator
    orthogonal : bool
        Orthogonal random features (Yu et al., 2016): directions come in blocks of
        ``n_dims`` mutually orthogonal vectors, norms from the kernel's radial law.
        Only for isotropic kernels.
    """
    _check_kernel(kernel)
    if kernel == "laplace":
        if orthogonal:
            raise ValueError("orthogonal random features need an isotropic kernel; 'laplace' (L1) is not")
        return rng.standard_cauchy((n_dims, n_frequencies))
    if not orthogonal:
        return rng.standard_normal((n_dims, n_frequencies)) * _radial_scale(kernel, rng, n_frequencies)
    blocks = []
    for _ in range(-(-n_frequencies // n_dims)):  # one QR per block of n_dims directions
        Q, R = np.linalg.qr(rng.standard_normal((n_dims, n_dims)))
        Q = Q * np.sign(np.diag(R))  # Haar-distributed orthogonal matrix
        norms = np.sqrt(rng.chisquare(n_dims, n_dims))  # norms of Gaussian vectors
        blocks.append(Q * norms)
    W = np.concatenate(blocks, axis=1)[:, :n_frequencies]
    return W * _radial_scale(kernel, rng, n_frequencies)


def kernel_matrix(kernel: str, X: np.ndarray, Y: np.ndarray, lengthscale=1.0) -> np.ndarray:
    """The exact kernel matrix ``k(X_i, Y_j)`` (length scale scalar or per dimension)."""
    _check_kernel(kernel)
    ell = np.asarray(lengthscale, dtype=float)
    Xs, Ys = np.atleast_2d(X) / ell, np.atleast_2d(Y) / ell
    if kernel == "laplace":
        return np.exp(-cdist(Xs, Ys, "cityblock"))
    r = cdist(Xs, Ys)
    if kernel == "rbf":
        return np.exp(-0.5 * r**2)
    if kernel == "cauchy":
        return 1.0 / (1.0 + r**2)
    if kernel == "matern32":
        a = np.sqrt(3.0) * r
        return (1.0 + a) * np.exp(-a)
    a = np.sqrt(5.0) * r
    return (1.0 + a + a**2 / 3.0) * np.exp(-a)
