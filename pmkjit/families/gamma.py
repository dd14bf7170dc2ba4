"""Batched Gamma messages (shape-rate), with the exact KL projection."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from scipy import special

from pmkjit.families.base import ExponentialFamily, improper_error

__all__ = ["Gamma"]

_NEWTON_ITERATIONS = 100
_TOL = 1e-13


class Gamma(ExponentialFamily):
    """Batch of Gamma messages ``Gamma(shape, rate)`` on (0, inf).

    Natural parameters ``(shape - 1, -rate)``, sufficient statistics ``(log x, x)``,
    regression targets ``(log shape, log rate)``.
    """

    name: ClassVar[str] = "Gamma"
    support: ClassVar[str] = "positive"
    __slots__ = ()

    def __init__(self, shape, rate):
        k, r = np.broadcast_arrays(np.asarray(shape, dtype=float), np.asarray(rate, dtype=float))
        self._natural = np.stack([k - 1.0, -r], axis=-1)
        self._natural.flags.writeable = False

    @property
    def shape(self) -> np.ndarray:
        return self._natural[..., 0] + 1.0

    @property
    def rate(self) -> np.ndarray:
        return -self._natural[..., 1]

    def parameters(self) -> dict[str, np.ndarray]:
        return {"shape": self.shape, "rate": self.rate}

    def is_proper(self) -> np.ndarray:
        return np.all(np.isfinite(self._natural), axis=-1) & (self.shape > 0) & (self.rate > 0)

    def _in_support(self, x):
        return x > 0

    @staticmethod
    def sufficient_statistics(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.stack([np.log(x), x], axis=-1)

    def log_partition(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return special.gammaln(self.shape) - self.shape * np.log(self.rate)

    def expected_sufficient_statistics(self) -> np.ndarray:
        k, r = self.shape, self.rate
        return np.stack([special.digamma(k) - np.log(r), k / r], axis=-1)

    def mean(self) -> np.ndarray:
        return self.shape / self.rate

    def var(self) -> np.ndarray:
        return self.shape / self.rate**2

    @classmethod
    def project(cls, ess: np.ndarray, name: str = "message") -> "Gamma":
        """Solve ``psi(k) - log k = E log x - log E x`` for the shape, then ``rate = k / E x``.

        Newton's method on ``log k`` (the left side is monotone in ``k``), started from
        Minka's closed-form approximation.
        """
        ess = np.asarray(ess, dtype=float)
        elog, ex = ess[..., 0], ess[..., 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.log(ex) - elog  # > 0 by Jensen for any non-degenerate law
        bad = ~(np.isfinite(s) & (s > 0) & (ex > 0))
        if bad.any():
            raise improper_error(f"{name}: Gamma projection", bad, "not projectable (need E log x < log E x)")
        k = (3.0 - s + np.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
        u = np.log(k)
        for _ in range(_NEWTON_ITERATIONS):
            k = np.exp(u)
            g = np.log(k) - special.digamma(k) - s
            dg = 1.0 - k * special.polygamma(1, k)  # d/du of log k - psi(k); negative
            step = -g / dg
            step = np.clip(step, -2.0, 2.0)
            u = u + step
            if np.all(np.abs(step) <= _TOL):
                break
        k = np.exp(u)
        out = cls(k, k / ex)
        if not np.all(out.is_proper()):
            raise improper_error(f"{name}: Gamma projection", ~out.is_proper(), "not converged")
        return out

    def regression_targets(self) -> np.ndarray:
        return np.stack([np.log(self.shape), np.log(self.rate)], axis=-1)

    @classmethod
    def from_regression_targets(cls, y: np.ndarray) -> "Gamma":
        y = np.asarray(y, dtype=float)
        return cls(np.exp(y[..., 0]), np.exp(y[..., 1]))

    def sample(self, rng: np.random.Generator, size=()) -> np.ndarray:
        size = (size,) if np.isscalar(size) else tuple(size)
        return rng.gamma(self.shape, 1.0 / self.rate, size=size + self.batch_shape)

    def characteristic_function(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        k, r = self.shape[..., None], self.rate[..., None]
        return np.exp(-k * np.log1p(-1j * t / r))

    def unconstrained_moments(self) -> tuple[np.ndarray, np.ndarray]:
        k = self.shape
        return special.digamma(k) - np.log(self.rate), special.polygamma(1, k)

    @staticmethod
    def to_unconstrained(x: np.ndarray) -> np.ndarray:
        return np.log(x)

    @staticmethod
    def from_unconstrained(u: np.ndarray) -> np.ndarray:
        return np.exp(u)

    @staticmethod
    def log_abs_det_jacobian(u: np.ndarray) -> np.ndarray:
        return np.asarray(u, dtype=float)

    def _quadrature_window(self):
        # log x has tail exp(k u) on the left and exp(-r e^u) on the right
        c, v = self.unconstrained_moments()
        s = 12.0 * np.sqrt(v)
        k, r = self.shape, self.rate
        return np.minimum(c - s, c - 38.0 / k), np.maximum(c + s, np.log((40.0 + 2.0 * k) / r))

    @classmethod
    def sufficient_statistics_unconstrained(cls, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        with np.errstate(over="ignore"):
            return np.stack([u, np.exp(u)], axis=-1)

    def logpdf_unconstrained(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        with np.errstate(over="ignore"):
            return self.shape[..., None] * u - self.rate[..., None] * np.exp(u) - self.log_partition()[..., None]
