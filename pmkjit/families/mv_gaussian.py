"""Batched multivariate Gaussian messages in information form ``(h, P)``."""

from __future__ import annotations

import numpy as np

from pmkjit.errors import ImproperMessageError
from pmkjit.families.base import improper_error
from pmkjit.families.gaussian import Gaussian

__all__ = ["MvGaussian"]

_LOG_2PI = np.log(2.0 * np.pi)


class MvGaussian:
    """Batch of d-dimensional Gaussians held as precision-mean ``h`` and precision ``P``.

    Information form makes EP's multiply and divide exact additions; moments come from a
    Cholesky factor of ``P`` and triangular solves (no inverse is formed).

    Parameters
    ----------
    mean : array_like (*batch, d)
    cov : array_like (*batch, d, d)
    """

    name = "MvGaussian"
    support = "real"

    __slots__ = ("h", "P")

    def __init__(self, mean, cov):
        mean = np.asarray(mean, dtype=float)
        cov = np.asarray(cov, dtype=float)
        L = _cholesky(cov, "MvGaussian covariance")
        eye = np.broadcast_to(np.eye(cov.shape[-1]), cov.shape)
        P = _cho_solve(L, eye)
        self._set((P @ mean[..., None])[..., 0], 0.5 * (P + np.swapaxes(P, -1, -2)))

    def _set(self, h, P):
        h = np.array(h, dtype=float)
        P = np.array(P, dtype=float)
        h.flags.writeable = False
        P.flags.writeable = False
        object.__setattr__(self, "h", h)
        object.__setattr__(self, "P", P)

    @classmethod
    def from_natural(cls, h: np.ndarray, P: np.ndarray) -> "MvGaussian":
        obj = object.__new__(cls)
        obj._set(h, P)
        return obj

    @property
    def dim(self) -> int:
        return self.h.shape[-1]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.h.shape[:-1]

    def __mul__(self, other: "MvGaussian") -> "MvGaussian":
        return MvGaussian.from_natural(self.h + other.h, self.P + other.P)

    def __truediv__(self, other: "MvGaussian") -> "MvGaussian":
        return MvGaussian.from_natural(self.h - other.h, self.P - other.P)

    def __getitem__(self, index) -> "MvGaussian":
        if not isinstance(index, tuple):
            index = (index,)
        return MvGaussian.from_natural(self.h[index + (Ellipsis, slice(None))], self.P[index + (Ellipsis, slice(None), slice(None))])

    def is_proper(self) -> np.ndarray:
        finite = np.isfinite(self.h).all(-1) & np.isfinite(self.P).all((-1, -2))
        ok = np.zeros(self.batch_shape, dtype=bool)
        idx = np.flatnonzero(finite.ravel())
        if idx.size:
            Pf = self.P.reshape((-1,) + self.P.shape[-2:])[idx]
            # Eigenvalues of the symmetrised precision: Cholesky per entry would need a loop.
            ev = np.linalg.eigvalsh(0.5 * (Pf + np.swapaxes(Pf, -1, -2)))
            ok.ravel()[idx] = ev[:, 0] > 0
        return ok

    def check_proper(self, name: str = "message") -> "MvGaussian":
        ok = self.is_proper()
        if not np.all(ok):
            raise improper_error(f"{name} (MvGaussian)", ~ok)
        return self

    def _chol(self) -> np.ndarray:
        return _cholesky(self.P, "MvGaussian precision")

    def mean(self) -> np.ndarray:
        return _cho_solve(self._chol(), self.h[..., None])[..., 0]

    def cov(self) -> np.ndarray:
        L = self._chol()
        return _cho_solve(L, np.broadcast_to(np.eye(self.dim), self.P.shape))

    def marginals(self) -> Gaussian:
        """Univariate marginals, batch shape ``(*batch, d)``."""
        return Gaussian(self.mean(), np.diagonal(self.cov(), axis1=-2, axis2=-1))

    def _logdet_P(self, L=None) -> np.ndarray:
        L = self._chol() if L is None else L
        return 2.0 * np.sum(np.log(np.diagonal(L, axis1=-2, axis2=-1)), axis=-1)

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        L = self._chol()
        d = x - self.mean()
        z = np.einsum("...ji,...j->...i", L, d)  # L^T d, so z.z = d^T P d
        return -0.5 * np.sum(z * z, -1) + 0.5 * self._logdet_P(L) - 0.5 * self.dim * _LOG_2PI

    def sample(self, rng: np.random.Generator, size=()) -> np.ndarray:
        size = (size,) if np.isscalar(size) else tuple(size)
        L = self._chol()
        eps = rng.standard_normal(size + self.batch_shape + (self.dim,))
        # x = mean + L^-T eps has covariance (L L^T)^-1 = P^-1
        Lt = np.broadcast_to(np.swapaxes(L, -1, -2), eps.shape[:-1] + L.shape[-2:])
        return self.mean() + np.linalg.solve(Lt, eps[..., None])[..., 0]

    def entropy(self) -> np.ndarray:
        return 0.5 * self.dim * (1.0 + _LOG_2PI) - 0.5 * self._logdet_P()

    def kl(self, other: "MvGaussian") -> np.ndarray:
        """``KL[self || other]``."""
        S = self.cov()
        d = self.mean() - other.mean()
        tr = np.einsum("...ij,...ji->...", other.P, S)
        quad = np.einsum("...i,...ij,...j->...", d, other.P, d)
        return 0.5 * (tr + quad - self.dim - other._logdet_P() + self._logdet_P())

    @classmethod
    def project(cls, mean: np.ndarray, second_moment: np.ndarray, name: str = "message") -> "MvGaussian":
        """Moment matching from ``E[x]`` and ``E[x x^T]``."""
        mean = np.asarray(mean, dtype=float)
        cov = np.asarray(second_moment, dtype=float) - mean[..., :, None] * mean[..., None, :]
        try:
            return cls(mean, 0.5 * (cov + np.swapaxes(cov, -1, -2)))
        except ImproperMessageError as exc:
            raise ImproperMessageError(f"{name}: MvGaussian projection has a covariance that is not positive definite") from exc

    def __repr__(self) -> str:
        return f"MvGaussian(dim={self.dim}, batch_shape={self.batch_shape})"


def _cholesky(A: np.ndarray, what: str) -> np.ndarray:
    try:
        return np.linalg.cholesky(A)
    except np.linalg.LinAlgError as exc:
        raise ImproperMessageError(f"{what} is not positive definite") from exc


def _cho_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve ``(L L^T) X = B`` for batched lower-triangular ``L`` by two triangular solves."""
    from scipy.linalg import solve_triangular

    if L.ndim == 2:
        y = solve_triangular(L, B, lower=True)
        return solve_triangular(L, y, lower=True, trans="T")
    flatL = L.reshape((-1,) + L.shape[-2:])
    flatB = np.broadcast_to(B, L.shape[:-2] + B.shape[-2:]).reshape((-1,) + B.shape[-2:])
    out = np.empty(flatB.shape)
    for i in range(flatL.shape[0]):  # scipy's triangular solve is not batched; batches here are few
        y = solve_triangular(flatL[i], flatB[i], lower=True)
        out[i] = solve_triangular(flatL[i], y, lower=True, trans="T")
    return out.reshape(L.shape[:-2] + B.shape[-2:])
