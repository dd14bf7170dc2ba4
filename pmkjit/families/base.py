"""Batched univariate exponential-family messages: the shared machinery.

A batch of messages holds natural parameters ``eta`` of shape ``(*batch_shape, 2)``.
Every density is ``p(x) = exp(eta . T(x) - A(eta))`` with respect to Lebesgue measure on
the family's support (the base measure is folded into ``A``), so KL divergences and
entropies follow from ``A`` and the expected sufficient statistics alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from pmkjit.errors import ImproperMessageError

__all__ = ["ExponentialFamily", "improper_error"]

DEFAULT_QUADRATURE_NODES = 64


def improper_error(name: str, bad: np.ndarray, what: str = "improper") -> ImproperMessageError:
    """An error naming ``name``, the number of bad entries and the first bad batch index."""
    bad = np.asarray(bad, dtype=bool)
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else ()
    where = first[0] if len(first) == 1 else first
    return ImproperMessageError(f"{name}: {int(bad.sum())} of {bad.size} entries are {what} (first at index {where})")


class ExponentialFamily(ABC):
    """A batch of univariate exponential-family messages (immutable).

    Subclasses define the sufficient statistics, log partition, moments, projection
    and the unconstrained parameterisation of the support.
    """

    name: ClassVar[str]
    support: ClassVar[str]
    n_params: ClassVar[int] = 2

    __slots__ = ("_natural",)

    def __init__(self, *args, **kwargs):  # pragma: no cover - subclasses define constructors
        raise NotImplementedError

    # ------------------------------------------------------------ construction
    @classmethod
    def from_natural(cls, natural: np.ndarray) -> "ExponentialFamily":
        """Wrap natural parameters ``(*batch, 2)`` without validation (see :meth:`is_proper`)."""
        natural = np.array(natural, dtype=float)  # private copy: messages are immutable
        if natural.ndim < 1 or natural.shape[-1] != 2:
            raise ValueError(f"{cls.__name__} natural parameters need a trailing axis of 2, got {natural.shape}")
        natural.flags.writeable = False
        obj = object.__new__(cls)
        obj._natural = natural
        return obj

    @classmethod
    def concatenate(cls, items: Sequence["ExponentialFamily"]) -> "ExponentialFamily":
        """Join 1-D batches end to end."""
        return cls.from_natural(np.concatenate([np.atleast_2d(i.natural) for i in items], axis=0))

    # ------------------------------------------------------------- container
    @property
    def natural(self) -> np.ndarray:
        return self._natural

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._natural.shape[:-1]

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError(f"a single {self.name} message has no length")
        return self.batch_shape[0]

    def __getitem__(self, index) -> "ExponentialFamily":
        if not isinstance(index, tuple):
            index = (index,)
        return type(self).from_natural(self._natural[index + (Ellipsis, slice(None))])

    def __mul__(self, other: "ExponentialFamily") -> "ExponentialFamily":
        self._same_family(other)
        return type(self).from_natural(self._natural + other._natural)

    def __truediv__(self, other: "ExponentialFamily") -> "ExponentialFamily":
        self._same_family(other)
        return type(self).from_natural(self._natural - other._natural)

    def _same_family(self, other) -> None:
        if type(other) is not type(self):
            raise TypeError(f"cannot combine a {self.name} message with {type(other).__name__}")

    def __repr__(self) -> str:
        p = self.parameters()
        if self._natural.size <= 6:
            body = ", ".join(f"{k}={np.array2string(np.asarray(v), precision=4)}" for k, v in p.items())
        else:
            body = f"batch_shape={self.batch_shape}"
        return f"{self.name}({body})"

    # --------------------------------------------------------------- validity
    @abstractmethod
    def is_proper(self) -> np.ndarray:
        """Boolean array ``batch_shape``: finite parameters of a normalisable density."""

    def check_proper(self, name: str = "message") -> "ExponentialFamily":
        """Return ``self`` if every entry is proper, else raise naming ``name``."""
        ok = self.is_proper()
        if not np.all(ok):
            raise improper_error(f"{name} ({self.name})", ~np.asarray(ok))
        return self

    # ------------------------------------------------------------ the family
    @abstractmethod
    def parameters(self) -> dict[str, np.ndarray]:
        """The usual parameters, by name."""

    @staticmethod
    @abstractmethod
    def sufficient_statistics(x: np.ndarray) -> np.ndarray:
        """``T(x)`` of shape ``(*x.shape, 2)``."""

    @abstractmethod
    def log_partition(self) -> np.ndarray:
        """``A(eta)`` (including the base measure), shape ``batch_shape``."""

    @abstractmethod
    def expected_sufficient_statistics(self) -> np.ndarray:
        """``E[T(x)]`` of shape ``(*batch_shape, 2)``."""

    @abstractmethod
    def mean(self) -> np.ndarray:
        """Mean of ``x``."""

    @abstractmethod
    def var(self) -> np.ndarray:
        """Variance of ``x``."""

    @classmethod
    @abstractmethod
    def project(cls, ess: np.ndarray, name: str = "message") -> "ExponentialFamily":
        """The member whose expected sufficient statistics are ``ess`` (KL projection)."""

    @abstractmethod
    def regression_targets(self) -> np.ndarray:
        """Smooth unconstrained coordinates used as regression outputs, ``(*batch, 2)``."""

    @classmethod
    @abstractmethod
    def from_regression_targets(cls, y: np.ndarray) -> "ExponentialFamily":
        """Inverse of :meth:`regression_targets`."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] = ()) -> np.ndarray:
        """Draws of shape ``(*size, *batch_shape)`` from ``rng``."""

    @abstractmethod
    def characteristic_function(self, t: np.ndarray) -> np.ndarray:
        """Complex ``E[exp(i t x)]``; ``t`` of shape ``(*batch_shape, K)``."""

    @abstractmethod
    def unconstrained_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Exact mean and variance of ``to_unconstrained(x)``."""

    @staticmethod
    @abstractmethod
    def to_unconstrained(x: np.ndarray) -> np.ndarray:
        """Map the support to the real line."""

    @staticmethod
    @abstractmethod
    def from_unconstrained(u: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_unconstrained`."""

    @staticmethod
    @abstractmethod
    def log_abs_det_jacobian(u: np.ndarray) -> np.ndarray:
        """``log |d from_unconstrained(u) / du|``."""

    # ------------------------------------------------------ derived quantities
    def logpdf(self, x: np.ndarray) -> np.ndarray:
        """Log density at ``x`` (broadcast against the batch; leading sample axes allowed)."""
        x = np.asarray(x, dtype=float)
        T = self.sufficient_statistics(x)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.sum(self._natural * T, axis=-1) - self.log_partition()
        return np.where(self._in_support(x), out, -np.inf)

    def _in_support(self, x: np.ndarray) -> np.ndarray:
        return np.isfinite(x)

    def entropy(self) -> np.ndarray:
        return self.log_partition() - np.sum(self._natural * self.expected_sufficient_statistics(), axis=-1)

    def kl(self, other: "ExponentialFamily") -> np.ndarray:
        """``KL[self || other]``, elementwise over broadcast batches."""
        self._same_family(other)
        d = self._natural - other._natural
        return np.sum(d * self.expected_sufficient_statistics(), axis=-1) - self.log_partition() + other.log_partition()

    def quadrature(self, n: int = DEFAULT_QUADRATURE_NODES) -> tuple[np.ndarray, np.ndarray]:
        """Nodes and weights ``(*batch, n)`` with ``sum(w * f(x), -1) ~ E[f(x)]``.

        Gauss-Hermite in the unconstrained space, centred on the exact unconstrained
        mean with the exact unconstrained standard deviation, reweighted by the ratio of
        the true density of ``u`` to that Gaussian (so the rule is exact for the family
        itself and accurate for smooth ``f``).
        """
        z, w = hermegauss(n)
        c, v = self.unconstrained_moments()
        s = np.sqrt(v)[..., None]
        u = c[..., None] + s * z
        x = self.from_unconstrained(u)
        with np.errstate(under="ignore", over="ignore", invalid="ignore"):
            log_ratio = self.logpdf_unconstrained(u) + 0.5 * z**2 + np.log(s)
            log_ratio -= np.max(log_ratio, axis=-1, keepdims=True)
            weights = w * np.exp(log_ratio)
        weights /= np.sum(weights, axis=-1, keepdims=True)
        return x, weights

    @classmethod
    def sufficient_statistics_unconstrained(cls, u: np.ndarray) -> np.ndarray:
        """``T(from_unconstrained(u))``, computed stably where the family allows."""
        return cls.sufficient_statistics(cls.from_unconstrained(u))

    def logpdf_at_unconstrained(self, u: np.ndarray) -> np.ndarray:
        """``log p(x)`` at ``x = from_unconstrained(u)``; ``u`` broadcasts against the batch."""
        T = self.sufficient_statistics_unconstrained(u)
        return np.sum(self._natural * T, axis=-1) - self.log_partition()

    def logpdf_unconstrained(self, u: np.ndarray) -> np.ndarray:
        """Log density of ``u = to_unconstrained(x)``; ``u`` of shape ``(*batch, n)``."""
        x = self.from_unconstrained(u)
        T = self.sufficient_statistics(x)
        return np.sum(self._natural[..., None, :] * T, axis=-1) - self.log_partition()[..., None] + self.log_abs_det_jacobian(u)
