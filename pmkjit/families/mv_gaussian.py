"""Batched multivariate Gaussian messages in information form ``(h, P)``."""

from __future__ import annotations

from typing import Any

import numpy as np

from pmkjit.families.base import _as_size, improper_error
from pmkjit.families.gaussian import Gaussian

__all__ = ["MvGaussian"]

_LOG_2PI = np.log(2.0 * np.pi)


def _swap(A: np.ndarray) -> np.ndarray:
    return np.swapaxes(A, -1, -2)


def _cholesky_ok(A: np.ndarray) -> np.ndarray:
    """Which matrices of a batch ``(..., d, d)`` have a Cholesky factor (are positive definite).

    A column-by-column Cholesky vectorised over the batch (a loop over ``d`` only), used
    to *locate* failures: LAPACK's batched factorisation fails for the whole batch at once.
    """
    A = np.asarray(A, dtype=float)
    d = A.shape[-1]
    ok = np.all(np.isfinite(A), axis=(-1, -2))
    L = np.zeros(A.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(d):
            s = A[..., j, j] - np.sum(L[..., j, :j] ** 2, axis=-1)
            ok &= s > 0
            ljj = np.sqrt(np.where(ok, s, 1.0))
            L[..., j, j] = ljj
            below = A[..., j + 1 :, j] - np.einsum("...ik,...k->...i", L[..., j + 1 :, :j], L[..., j, :j])
            L[..., j + 1 :, j] = below / ljj[..., None]
    return ok


def _cholesky(A: np.ndarray, what: str) -> np.ndarray:
    """Lower Cholesky factors of a batch, or an error naming ``what`` and the first bad entry."""
    try:
        L = np.linalg.cholesky(A)
    except np.linalg.LinAlgError:
        L = None
    if L is None or not np.all(np.isfinite(L)):
        raise improper_error(what, ~_cholesky_ok(A), "not positive definite")
    return L


def _cho_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve ``(L L^T) X = B`` for batched lower-triangular ``L`` and ``B`` of shape ``(..., d, m)``.

    Two batched solves with the triangular factors (numpy's ``solve`` broadcasts over the
    batch; scipy's triangular solvers do not in the scipy versions we support).
    """
    return np.linalg.solve(_swap(L), np.linalg.solve(L, B))


class MvGaussian:
    """Batch of d-dimensional Gaussians held as precision-mean ``h`` and precision ``P``.

    Information form makes EP's multiply and divide exact additions; moments come from a
    Cholesky factor of ``P`` and triangular solves (no inverse is formed).

    Parameters
    ----------
    mean : array_like, shape (*batch_shape, d)
    cov : array_like, shape (*batch_shape, d, d)
        Must be symmetric positive definite.

    Raises
    ------
    ImproperMessageError
        If some covariance is not positive definite (naming the first bad index).
    """

    name = "MvGaussian"
    support = "real"

    __slots__ = ("_h", "_P")

    def __init__(self, mean, cov):
        mean = np.asarray(mean, dtype=float)
        cov = np.asarray(cov, dtype=float)
        if mean.ndim < 1 or cov.shape[-2:] != (mean.shape[-1],) * 2:
            raise ValueError(
                f"MvGaussian needs mean (..., d) and cov (..., d, d), got {mean.shape} and {cov.shape}"
            )
        batch = np.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        d = mean.shape[-1]
        mean = np.broadcast_to(mean, batch + (d,))
        cov = np.broadcast_to(cov, batch + (d, d))
        L = _cholesky(0.5 * (cov + _swap(cov)), "MvGaussian covariance")
        P = _cho_solve(L, np.broadcast_to(np.eye(d), cov.shape))
        P = 0.5 * (P + _swap(P))  # exactly symmetric, so that sums stay symmetric
        self._set(np.einsum("...ij,...j->...i", P, mean), P)

    def _set(self, h: np.ndarray, P: np.ndarray) -> None:
        h = np.array(h, dtype=float)  # private copies, read-only: messages are immutable
        P = np.array(P, dtype=float)
        h.flags.writeable = False
        P.flags.writeable = False
        object.__setattr__(self, "_h", h)
        object.__setattr__(self, "_P", P)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("MvGaussian messages are immutable")

    def __reduce__(self):
        return (MvGaussian.from_natural, (np.array(self._h), np.array(self._P)))

    @classmethod
    def from_natural(cls, h: np.ndarray, P: np.ndarray) -> "MvGaussian":
        """Wrap precision-mean ``h`` ``(*batch, d)`` and precision ``P`` ``(*batch, d, d)``, unvalidated."""
        h = np.asarray(h, dtype=float)
        P = np.asarray(P, dtype=float)
        if h.ndim < 1 or P.shape[-2:] != (h.shape[-1],) * 2:
            raise ValueError(f"MvGaussian needs h (..., d) and P (..., d, d), got {h.shape} and {P.shape}")
        batch = np.broadcast_shapes(h.shape[:-1], P.shape[:-2])
        d = h.shape[-1]
        obj = object.__new__(cls)
        obj._set(np.broadcast_to(h, batch + (d,)), np.broadcast_to(P, batch + (d, d)))
        return obj

    # ------------------------------------------------------------- container
    @property
    def h(self) -> np.ndarray:
        """Precision-mean ``P @ mean``, read-only ``(*batch_shape, d)``."""
        return self._h

    @property
    def P(self) -> np.ndarray:
        """Precision matrix, read-only ``(*batch_shape, d, d)``."""
        return self._P

    @property
    def natural(self) -> tuple[np.ndarray, np.ndarray]:
        """``(h, P)``."""
        return self._h, self._P

    @property
    def dim(self) -> int:
        """Dimension ``d`` of each Gaussian."""
        return self._h.shape[-1]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._h.shape[:-1]

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError("a single MvGaussian message has no length")
        return self.batch_shape[0]

    def __getitem__(self, index) -> "MvGaussian":
        """Index the batch like a numpy array."""
        if not isinstance(index, tuple):
            index = (index,)
        if any(i is Ellipsis for i in index):
            ih, iP = index + (slice(None),), index + (slice(None), slice(None))
        else:
            ih, iP = index + (Ellipsis, slice(None)), index + (Ellipsis, slice(None), slice(None))
        return MvGaussian.from_natural(self._h[ih], self._P[iP])

    def _check_other(self, other: "MvGaussian") -> None:
        if not isinstance(other, MvGaussian):
            raise TypeError(f"cannot combine an MvGaussian message with {type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"cannot combine MvGaussians of dimensions {self.dim} and {other.dim}")

    def __mul__(self, other: "MvGaussian") -> "MvGaussian":
        """Product of densities: ``h`` and ``P`` add (batches broadcast)."""
        self._check_other(other)
        return MvGaussian.from_natural(self._h + other._h, self._P + other._P)

    def __truediv__(self, other: "MvGaussian") -> "MvGaussian":
        """Quotient of densities: ``h`` and ``P`` subtract."""
        self._check_other(other)
        return MvGaussian.from_natural(self._h - other._h, self._P - other._P)

    def __repr__(self) -> str:
        return f"MvGaussian(dim={self.dim}, batch_shape={self.batch_shape})"

    # --------------------------------------------------------------- validity
    def is_proper(self) -> np.ndarray:
        """Boolean ``batch_shape``: finite ``h`` and a precision with a Cholesky factor."""
        return np.all(np.isfinite(self._h), axis=-1) & _cholesky_ok(self._P)

    def check_proper(self, name: str = "message") -> "MvGaussian":
        """Return ``self`` if every entry is proper, else raise naming ``name``, the count and first index."""
        ok = self.is_proper()
        if not np.all(ok):
            raise improper_error(f"{name} (MvGaussian)", ~ok)
        return self

    # --------------------------------------------------------------- moments
    def _chol(self) -> np.ndarray:
        return _cholesky(self._P, "MvGaussian precision")

    def mean(self) -> np.ndarray:
        """Mean ``P^-1 h``, ``(*batch_shape, d)``."""
        return _cho_solve(self._chol(), self._h[..., None])[..., 0]

    def cov(self) -> np.ndarray:
        """Covariance ``P^-1``, ``(*batch_shape, d, d)``, by Cholesky solves."""
        C = _cho_solve(self._chol(), np.broadcast_to(np.eye(self.dim), self._P.shape))
        return 0.5 * (C + _swap(C))

    def marginals(self) -> Gaussian:
        """Univariate marginals as a :class:`Gaussian` batch of shape ``(*batch_shape, d)``."""
        return Gaussian(self.mean(), np.diagonal(self.cov(), axis1=-2, axis2=-1))

    @staticmethod
    def _logdet(L: np.ndarray) -> np.ndarray:
        return 2.0 * np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)), axis=-1)

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        """Log density at ``x`` of shape ``(..., *batch_shape, d)`` (leading sample axes allowed)."""
        x = np.asarray(x, dtype=float)
        L = self._chol()
        diff = x - self.mean()
        z = np.einsum("...ji,...j->...i", L, diff)  # L^T (x - m), so z.z = (x - m)^T P (x - m)
        return -0.5 * np.sum(z * z, axis=-1) + 0.5 * self._logdet(L) - 0.5 * self.dim * _LOG_2PI

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] = ()) -> np.ndarray:
        """Draws of shape ``(*size, *batch_shape, d)``: ``mean + L^-T eps`` with ``P = L L^T``."""
        size = _as_size(size)
        S = int(np.prod(size))
        L = self._chol()
        eps = rng.standard_normal(self.batch_shape + (self.dim, S))
        draws = np.linalg.solve(_swap(L), eps)  # one batched triangular solve, S right-hand sides
        draws = np.moveaxis(draws, -1, 0).reshape(size + self.batch_shape + (self.dim,))
        return self.mean() + draws

    def entropy(self) -> np.ndarray:
        """Differential entropy ``d/2 (1 + log 2 pi) - log det P / 2``."""
        return 0.5 * self.dim * (1.0 + _LOG_2PI) - 0.5 * self._logdet(self._chol())

    def kl(self, other: "MvGaussian") -> np.ndarray:
        """``KL[self || other]``, batches broadcast."""
        self._check_other(other)
        L1, L2 = self._chol(), other._chol()
        S1 = _cho_solve(L1, np.broadcast_to(np.eye(self.dim), L1.shape))
        diff = self.mean() - other.mean()
        tr = np.einsum("...ij,...ji->...", other._P, S1)
        quad = np.einsum("...i,...ij,...j->...", diff, other._P, diff)
        return 0.5 * (tr + quad - self.dim + self._logdet(L1) - self._logdet(L2))

    @classmethod
    def project(cls, mean: np.ndarray, second_moment: np.ndarray, name: str = "message") -> "MvGaussian":
        """Moment matching from ``E[x]`` ``(*batch, d)`` and ``E[x x^T]`` ``(*batch, d, d)``.

        Raises
        ------
        ImproperMessageError
            If some implied covariance is not positive definite (naming ``name`` and the index).
        """
        mean = np.asarray(mean, dtype=float)
        cov = np.asarray(second_moment, dtype=float) - mean[..., :, None] * mean[..., None, :]
        cov = 0.5 * (cov + _swap(cov))
        ok = _cholesky_ok(cov) & np.all(np.isfinite(mean), axis=-1)
        if not np.all(ok):
            what = "not projectable (covariance not positive definite)"
            raise improper_error(f"{name} (MvGaussian projection)", ~ok, what)
        return cls(mean, cov)
