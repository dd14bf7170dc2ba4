"""Structured random frequencies: Fastfood and structured orthogonal random features.

Both replace the dense Gaussian frequency matrix of random Fourier features by products
of Walsh-Hadamard matrices ``H`` and random diagonals, acting on inputs zero-padded to
``p = 2^ceil(log2 d)`` dimensions, one ``p x p`` block per ``p`` frequencies:

* ``"fastfood"`` (Le et al., 2013): ``V = S H G Pi H B / sqrt(p)`` with ``B`` random signs,
  ``Pi`` a permutation, ``G`` Gaussian and ``S`` rescaling each row to the norm of a
  Gaussian vector. Rows are only approximately orthogonal; at equal size its kernel
  approximation is close to, and measured slightly worse than, i.i.d. features: its
  point is the ``O(p log p)`` cost per block, not accuracy.
* ``"sorf"`` (structured orthogonal random features, Yu et al., 2016):
  ``V = H D1 H D2 H D3 / p^(3/2)`` with ``D_i`` random signs, an exactly orthogonal
  matrix, rows rescaled to chi-distributed norms. Like orthogonal random features it
  lowers the approximation error below i.i.d. features, at Fastfood's cost.

For non-Gaussian isotropic kernels each frequency is further multiplied by the kernel's
radial scale-mixture factor, as :func:`pmkjit.features.spectral.sample_frequencies` does.

The frequencies are returned as a dense ``(d, K)`` matrix: on this project's input sizes
(``d`` up to a few hundred) one BLAS matrix product ``X @ W`` is faster than a numpy
Walsh-Hadamard transform of every input row, and a dense matrix lets every random basis
share one feature map and one gradient. :func:`fwht` is used to build the blocks.

References
----------
.. [1] Q. Le, T. Sarlos, A. Smola, "Fastfood - approximating kernel expansions in
       loglinear time", ICML 2013.
.. [2] F. X. Yu, A. T. Suresh, K. Choromanski, D. Holtmann-Rice, S. Kumar, "Orthogonal
       random features", NIPS 2016.
"""

from __future__ import annotations

import numpy as np

from pmkjit._random import RandomState, as_generator
from pmkjit.features.spectral import ISOTROPIC, _check_count, _radial_scale

__all__ = ["STRUCTURED", "fwht", "sample_structured_frequencies"]

STRUCTURED = ("fastfood", "sorf")
_MIN_PAD = 64


def fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh-Hadamard transform along the last axis (length a power of 2).

    Parameters
    ----------
    x : ndarray of shape (..., p)

    Returns
    -------
    ndarray of shape (..., p)
        ``x @ H`` for the Sylvester-ordered Hadamard matrix ``H`` (symmetric, ``H H = p I``).
    """
    x = np.array(x, dtype=float)  # private copy: the butterflies work in place
    p = x.shape[-1]
    if p & (p - 1):
        raise ValueError(f"fwht needs a power-of-2 length, got {p}")
    h = 1
    # log2(p) butterfly levels, each vectorised over every row and pair
    while h < p:
        y = x.reshape(*x.shape[:-1], p // (2 * h), 2, h)
        a = y[..., 0, :].copy()
        y[..., 0, :] += y[..., 1, :]
        y[..., 1, :] *= -1.0
        y[..., 1, :] += a
        h *= 2
    return x


def sample_structured_frequencies(
    kernel: str, n_dims: int, n_frequencies: int, rng: RandomState, variant: str = "sorf"
) -> np.ndarray:
    """Draw Fastfood or SORF frequencies for an isotropic kernel at unit length scale.

    Parameters
    ----------
    kernel : {"rbf", "cauchy", "matern32", "matern52"}
    n_dims : int
        Input dimension ``d`` (padded internally to the next power of two ``p``).
    n_frequencies : int
        ``K``; ``ceil(K / p)`` independent blocks are stacked and the last truncated.
    rng : numpy.random.Generator or seed
    variant : {"sorf", "fastfood"}, default "sorf"

    Returns
    -------
    ndarray of shape (n_dims, n_frequencies)
        Frequencies ``W`` whose columns have (approximately, for ``"fastfood"``; in
        marginal norm exactly) the kernel's spectral law; ``E[cos(delta @ W)] ~ k(delta)``.

    Raises
    ------
    ValueError
        For a non-isotropic kernel or an unknown variant.
    """
    if kernel not in ISOTROPIC:
        raise ValueError(f"structured frequencies need an isotropic kernel, one of {ISOTROPIC}; got {kernel!r}")
    if variant not in STRUCTURED:
        raise ValueError(f"variant must be one of {STRUCTURED}, got {variant!r}")
    d = _check_count(n_dims, "n_dims")
    K = _check_count(n_frequencies, "n_frequencies")
    rng = as_generator(rng)
    # SORF's three sign diagonals hold only 3p random bits per block: with tiny p its
    # rows are far from uniformly oriented, so pad small inputs to at least _MIN_PAD
    # (the padded coordinates meet zeros, so only the quality of the directions changes).
    p = max(1 << (d - 1).bit_length(), _MIN_PAD if variant == "sorf" else 1)
    nb = -(-K // p)
    # Apply each block's linear map to the identity: rows of M are V e_j, so M[b] = V_b^T.
    M = np.broadcast_to(np.eye(p), (nb, p, p))
    if variant == "fastfood":
        signs = rng.choice([-1.0, 1.0], (nb, 1, p))
        perm = np.argsort(rng.random((nb, 1, p)), axis=-1)
        g = rng.standard_normal((nb, 1, p))
        M = fwht(M * signs)
        M = np.take_along_axis(M, np.broadcast_to(perm, M.shape), axis=-1)
        M = fwht(M * g)
        # S: row norms of H G Pi H B are sqrt(p) ||g||; rescale them to chi_p / sqrt(p)
        norms = np.sqrt(rng.chisquare(p, (nb, 1, p)))
        M *= norms / (np.sqrt(p) * np.linalg.norm(g, axis=-1, keepdims=True))
    else:
        for _ in range(3):
            M = fwht(M * rng.choice([-1.0, 1.0], (nb, 1, p))) / np.sqrt(p)
        M = M * np.sqrt(rng.chisquare(p, (nb, 1, p)))  # orthonormal rows -> Gaussian-like norms
    # M[b, j, i] = V_b[i, j]; keep the first d input coordinates (the rest meet zero padding)
    W = np.ascontiguousarray(M[:, :d, :].transpose(1, 0, 2).reshape(d, nb * p)[:, :K])
    # The first d coordinates of a p-dimensional N(0, I) vector are N(0, I_d): dropping the
    # padded coordinates needs no rescaling.
    if kernel != "rbf":
        W *= _radial_scale(kernel, rng, K)
    return W
