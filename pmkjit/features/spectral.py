"""Spectral densities of shift-invariant kernels (revrand's Table 1) and exact kernels.

Every kernel here is ``k(x, y) = k((x - y) / lengthscale)`` with ``k(0) = 1``; by
Bochner's theorem ``k(delta) = E_w[cos(w . delta)]`` for frequencies ``w`` drawn from
its normalised spectral density, which is what :func:`sample_frequencies` draws
(at unit length scale).

=========  ====================================  =========================================
kernel     k(delta), r = ||delta||_2             frequencies w (unit length scale)
=========  ====================================  =========================================
rbf        exp(-r^2 / 2)                         w ~ N(0, I)
laplace    exp(-||delta||_1)                     independent standard Cauchy per axis
cauchy     1 / (1 + r^2)                         w = sqrt(2 s) z, s ~ Exp(1), z ~ N(0, I)
matern32   (1 + sqrt3 r) exp(-sqrt3 r)           w = z sqrt(3/2 / g), g ~ Gamma(3/2, 1)
matern52   (1 + sqrt5 r + 5r^2/3) exp(-sqrt5 r)  w = z sqrt(5/2 / g), g ~ Gamma(5/2, 1)
=========  ====================================  =========================================

Derivations (``z ~ N(0, I)`` throughout):

* rbf: the Fourier transform of a Gaussian of unit variance is a Gaussian of unit variance.
* laplace (product / L1 form, as revrand implements it): ``exp(-|t|)`` in one dimension is
  the characteristic function of the standard Cauchy law, and the kernel factorises over
  axes. (revrand's table writes the kernel with a plain norm; the Euclidean-norm kernel
  ``exp(-r)`` would instead need a multivariate Cauchy, i.e. Student-t with 1 dof.)
* cauchy: a scale mixture of Gaussians, ``1 / (1 + r^2) = int_0^inf e^-s e^(-s r^2) ds``,
  and ``e^(-s r^2) = E[cos(w . delta)]`` for ``w ~ N(0, 2 s I)``. (revrand's "GAL" is the
  same law: a Gaussian with exponentially distributed variance.)
* Matérn with smoothness ``nu`` and ``k(r) = (2^(1-nu)/Gamma(nu)) (sqrt(2 nu) r)^nu
  K_nu(sqrt(2 nu) r)`` has spectral density proportional to ``(2 nu + ||w||^2)^-(nu + d/2)``,
  which is the multivariate Student-t with ``2 nu`` degrees of freedom and scale matrix
  exactly ``I``: ``w = z sqrt(2 nu / chi2_{2 nu}) = z sqrt(nu / g)`` with
  ``g = chi2_{2 nu} / 2 ~ Gamma(nu, 1)``. For ``nu = 3/2, 5/2`` the Bessel form reduces to
  the polynomial-times-exponential formulas in the table (these are scikit-learn's
  ``Matern(nu=1.5)`` and ``Matern(nu=2.5)``).

References
----------
.. [1] A. Rahimi, B. Recht, "Random features for large-scale kernel machines", NIPS 2007.
.. [2] F. X. Yu et al., "Orthogonal random features", NIPS 2016.
.. [3] D. Steinberg et al., "revrand: technical report", Table 1.
"""

from __future__ import annotations

import numbers
from typing import Union

import numpy as np
from numpy.typing import ArrayLike
from scipy.spatial.distance import cdist

from pmkjit._random import RandomState, as_generator

__all__ = ["KERNELS", "ISOTROPIC", "sample_frequencies", "kernel_matrix"]

KERNELS = ("rbf", "laplace", "cauchy", "matern32", "matern52")
#: Kernels depending on ``||delta||_2`` only; their spectra are rotation invariant,
#: which orthogonal random features require.
ISOTROPIC = ("rbf", "cauchy", "matern32", "matern52")

Lengthscale = Union[float, ArrayLike]


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")


def _check_count(value, name: str) -> int:
    # bool is an Integral, but RandomFourierFeatures(n_features=True) is surely a mistake
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _as_lengthscale(lengthscale: Lengthscale, n_dims: int) -> np.ndarray:
    """Validated length scale: a 0-d array, or one of shape ``(n_dims,)``."""
    ell = np.asarray(lengthscale, dtype=float)
    if ell.ndim > 1 or (ell.ndim == 1 and ell.shape[0] != n_dims):
        raise ValueError(
            f"lengthscale must be a scalar or have shape ({n_dims},) to match the inputs, "
            f"got shape {ell.shape}"
        )
    if not (np.all(np.isfinite(ell)) and np.all(ell > 0)):
        raise ValueError(f"lengthscale must be positive and finite, got {lengthscale!r}")
    return ell


def _radial_scale(kernel: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-frequency factor multiplying a standard Gaussian vector (isotropic kernels).

    Each isotropic spectrum here is a Gaussian scale mixture ``w = c z``, so the norm of a
    frequency is ``c ||z||``; orthogonal features reuse this factor for their norms.
    """
    if kernel == "rbf":
        return np.ones(n)
    if kernel == "cauchy":
        return np.sqrt(2.0 * rng.exponential(1.0, n))
    nu = 1.5 if kernel == "matern32" else 2.5
    # multivariate t with 2 nu dof and unit scale: z sqrt(2 nu / chi2_{2 nu}), chi2 = 2 Gamma(nu, 1)
    return np.sqrt(nu / rng.gamma(nu, 1.0, n))


def sample_frequencies(
    kernel: str,
    n_dims: int,
    n_frequencies: int,
    rng: RandomState,
    orthogonal: bool = False,
) -> np.ndarray:
    """Draw unit-length-scale frequencies for ``kernel``, one per column.

    Parameters
    ----------
    kernel : {"rbf", "laplace", "cauchy", "matern32", "matern52"}
        The shift-invariant kernel whose normalised spectral density is sampled.
    n_dims : int
        Input dimension ``d``.
    n_frequencies : int
        Number of frequencies ``K`` (each later gives one cosine and one sine feature).
    rng : numpy.random.Generator
        Source of randomness (an int seed is also accepted); a generator is advanced.
    orthogonal : bool, default False
        Orthogonal random features (Yu et al., 2016): directions come in blocks of
        ``n_dims`` mutually orthogonal unit vectors (a Haar-random rotation per block),
        each scaled by an independent draw of the kernel's radial law (the norm of a
        sample from the spectral density). Blocks are stacked, and the last one
        truncated, when ``n_frequencies`` is not a multiple of ``n_dims``. Every column
        keeps the exact marginal spectral law, so the estimate stays unbiased while
        the orthogonality lowers its variance. Only for isotropic kernels.

    Returns
    -------
    ndarray of shape (n_dims, n_frequencies)
        Frequencies ``W`` with ``E[cos(delta @ W)] = k(delta)`` column by column.

    Raises
    ------
    ValueError
        For an unknown kernel, non-positive sizes, or ``orthogonal=True`` with the
        (non-isotropic) ``"laplace"`` kernel.
    """
    _check_kernel(kernel)
    n_dims = _check_count(n_dims, "n_dims")
    n_frequencies = _check_count(n_frequencies, "n_frequencies")
    rng = as_generator(rng)
    if kernel == "laplace":
        if orthogonal:
            raise ValueError(
                "orthogonal random features need an isotropic kernel (one of "
                f"{ISOTROPIC}); 'laplace' is the L1 (product) kernel, which is not"
            )
        return rng.standard_cauchy((n_dims, n_frequencies))
    if not orthogonal:
        return rng.standard_normal((n_dims, n_frequencies)) * _radial_scale(kernel, rng, n_frequencies)
    n_blocks = -(-n_frequencies // n_dims)  # ceil: one rotation per block of n_dims directions
    Q, R = np.linalg.qr(rng.standard_normal((n_blocks, n_dims, n_dims)))  # batched QR
    # numpy's QR is unique only up to column signs; making diag(R) > 0 makes each Q Haar
    Q *= np.where(np.diagonal(R, axis1=1, axis2=2) < 0, -1.0, 1.0)[:, None, :]
    # column norms ||z|| ~ chi_d, as for a Gaussian vector, so each column is marginally N(0, I)
    Q *= np.sqrt(rng.chisquare(n_dims, (n_blocks, 1, n_dims)))
    # block b's column j becomes frequency b * n_dims + j
    W = np.ascontiguousarray(Q.transpose(1, 0, 2).reshape(n_dims, n_blocks * n_dims)[:, :n_frequencies])
    # scale mixtures (cauchy, matern) multiply each Gaussian column by its own factor
    if kernel != "rbf":
        W *= _radial_scale(kernel, rng, n_frequencies)
    return W


def kernel_matrix(kernel: str, X: ArrayLike, Y: ArrayLike, lengthscale: Lengthscale = 1.0) -> np.ndarray:
    """The exact kernel matrix ``K[i, j] = k((X[i] - Y[j]) / lengthscale)``.

    Parameters
    ----------
    kernel : {"rbf", "laplace", "cauchy", "matern32", "matern52"}
        See the module docstring for the formulas.
    X : array_like of shape (n, d)
    Y : array_like of shape (m, d)
    lengthscale : float or array_like of shape (d,), default 1.0
        One positive length scale, or one per input dimension.

    Returns
    -------
    ndarray of shape (n, m)

    Raises
    ------
    ValueError
        For an unknown kernel, inputs that are not 2-D with the same number of
        columns, or a length scale of the wrong shape or not positive.
    """
    _check_kernel(kernel)
    X = np.asarray(X, dtype=float)
    Y = np.asarray(Y, dtype=float)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        raise ValueError(f"X and Y must be 2-D with the same number of columns, got {X.shape} and {Y.shape}")
    ell = _as_lengthscale(lengthscale, X.shape[1])
    Xs, Ys = X / ell, Y / ell
    if kernel == "laplace":
        return np.exp(-cdist(Xs, Ys, "cityblock"))
    if kernel in ("rbf", "cauchy"):
        r2 = cdist(Xs, Ys, "sqeuclidean")  # no sqrt then square
        return np.exp(-0.5 * r2) if kernel == "rbf" else 1.0 / (1.0 + r2)
    r = cdist(Xs, Ys)
    if kernel == "matern32":
        a = np.sqrt(3.0) * r
        return (1.0 + a) * np.exp(-a)
    a = np.sqrt(5.0) * r
    return (1.0 + a + a**2 / 3.0) * np.exp(-a)
