"""Batched univariate Gaussian messages."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from pmkjit.families.base import ExponentialFamily, improper_error

__all__ = ["Gaussian"]

_LOG_2PI = np.log(2.0 * np.pi)


class Gaussian(ExponentialFamily):
    """Batch of univariate Gaussians ``N(mean, var)``.

    Natural parameters ``(mean / var, -1 / (2 var))``, sufficient statistics ``(x, x^2)``,
    regression targets ``(mean, log var)``.

    Parameters
    ----------
    mean, var : array_like
        Broadcastable arrays; ``var`` must be positive for a proper message.
    """

    name: ClassVar[str] = "Gaussian"
    support: ClassVar[str] = "real"
    __slots__ = ()

    def __init__(self, mean, var):
        mean, var = np.broadcast_arrays(np.asarray(mean, dtype=float), np.asarray(var, dtype=float))
        with np.errstate(divide="ignore", invalid="ignore"):
            natural = np.stack([mean / var, -0.5 / var], axis=-1)
        self._natural = natural
        self._natural.flags.writeable = False

    @property
    def precision(self) -> np.ndarray:
        return -2.0 * self._natural[..., 1]

    def var(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return 1.0 / self.precision

    def mean(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._natural[..., 0] / self.precision

    def parameters(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean(), "var": self.var()}

    def is_proper(self) -> np.ndarray:
        return np.all(np.isfinite(self._natural), axis=-1) & (self._natural[..., 1] < 0)

    @staticmethod
    def sufficient_statistics(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.stack([x, x * x], axis=-1)

    def log_partition(self) -> np.ndarray:
        h, l2 = self._natural[..., 0], self._natural[..., 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            return -(h * h) / (4.0 * l2) - 0.5 * np.log(-2.0 * l2) + 0.5 * _LOG_2PI

    def expected_sufficient_statistics(self) -> np.ndarray:
        m, v = self.mean(), self.var()
        return np.stack([m, v + m * m], axis=-1)

    @classmethod
    def project(cls, ess: np.ndarray, name: str = "message") -> "Gaussian":
        ess = np.asarray(ess, dtype=float)
        m = ess[..., 0]
        v = ess[..., 1] - m * m
        bad = ~(np.isfinite(v) & (v > 0) & np.isfinite(m))
        if bad.any():
            raise improper_error(f"{name}: Gaussian projection", bad, "not projectable (variance <= 0 or non-finite)")
        return cls(m, v)

    def regression_targets(self) -> np.ndarray:
        return np.stack([self.mean(), np.log(self.var())], axis=-1)

    @classmethod
    def from_regression_targets(cls, y: np.ndarray) -> "Gaussian":
        y = np.asarray(y, dtype=float)
        return cls(y[..., 0], np.exp(y[..., 1]))

    def sample(self, rng: np.random.Generator, size=()) -> np.ndarray:
        size = (size,) if np.isscalar(size) else tuple(size)
        return self.mean() + np.sqrt(self.var()) * rng.standard_normal(size + self.batch_shape)

    def characteristic_function(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        m, v = self.mean()[..., None], self.var()[..., None]
        return np.exp(-0.5 * v * t * t) * np.exp(1j * m * t)

    def unconstrained_moments(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mean(), self.var()

    @staticmethod
    def to_unconstrained(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=float)

    @staticmethod
    def from_unconstrained(u: np.ndarray) -> np.ndarray:
        return np.asarray(u, dtype=float)

    @staticmethod
    def log_abs_det_jacobian(u: np.ndarray) -> np.ndarray:
        return np.zeros_like(np.asarray(u, dtype=float))

    def logpdf_unconstrained(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        m, v = self.mean()[..., None], self.var()[..., None]
        return -0.5 * (u - m) ** 2 / v - 0.5 * np.log(2.0 * np.pi * v)
