"""Point masses: observed values seen by a KJIT operator as incoming messages.

An observed likelihood factor ``psi(y | x_1..x_c)`` whose outgoing messages a KJIT
operator learns depends on the datum ``y`` as much as on the incoming messages. Giving
``y`` to the operator as a Dirac message ``delta_y`` keeps one construction for both:
its characteristic function ``exp(i t y)`` enters the joint mean embedding exactly as a
message's would (the product kernel on messages and data), and the median heuristic
sees its mean ``y``. A point mass is never a regression target and is never projected.
"""

from __future__ import annotations

import numpy as np

from pmkjit.families.base import ExponentialFamily

__all__ = ["PointMass"]


class PointMass(ExponentialFamily):
    """A batch of Dirac measures ``delta_value`` (observed data as messages).

    Stored as natural parameters ``(value, 0)`` so that batching, indexing and
    concatenation behave as for the other families.

    Parameters
    ----------
    value : array_like
        Location of each point mass.
    """

    name = "PointMass"
    support = "real"
    __slots__ = ()

    def __init__(self, value):
        value = np.asarray(value, dtype=float)
        self._set_natural(np.stack([value, np.zeros_like(value)], axis=-1))

    @property
    def value(self) -> np.ndarray:
        """Location of each point mass, ``batch_shape``."""
        return self._natural[..., 0]

    def is_proper(self) -> np.ndarray:
        return np.isfinite(self.value)

    def parameters(self) -> dict[str, np.ndarray]:
        return {"value": self.value}

    @staticmethod
    def sufficient_statistics(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.stack([x, x * x], axis=-1)

    def log_partition(self) -> np.ndarray:
        return np.zeros(self.batch_shape)

    def expected_sufficient_statistics(self) -> np.ndarray:
        return self.sufficient_statistics(self.value)

    def mean(self) -> np.ndarray:
        return np.array(self.value)

    def var(self) -> np.ndarray:
        return np.zeros(self.batch_shape)

    @classmethod
    def project(cls, ess: np.ndarray, name: str = "message") -> "PointMass":
        """The point mass at ``E[x]``: a fixed datum's tilted marginal is the datum itself."""
        return cls(np.asarray(ess, dtype=float)[..., 0])

    def regression_targets(self) -> np.ndarray:
        raise TypeError("a point mass (observed value) is not a regression target")

    @classmethod
    def from_regression_targets(cls, y: np.ndarray) -> "PointMass":
        raise TypeError("a point mass (observed value) is not a regression target")

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] = ()) -> np.ndarray:
        size = (size,) if isinstance(size, int) else tuple(size)
        return np.broadcast_to(self.value, size + self.batch_shape).copy()

    def characteristic_function(self, t: np.ndarray) -> np.ndarray:
        """``exp(i t value)``; ``t`` has shape ``(*batch_shape, K)``."""
        return np.exp(1j * np.asarray(t, dtype=float) * self.value[..., None])

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        """Log-density with respect to counting measure: 0 at the value, ``-inf`` elsewhere."""
        return np.where(np.asarray(x) == self.value, 0.0, -np.inf)

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

    def entropy(self) -> np.ndarray:
        return np.zeros(self.batch_shape)

    def kl(self, other: "ExponentialFamily") -> np.ndarray:
        raise TypeError("KL divergences of point masses are not defined here")
