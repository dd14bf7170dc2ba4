"""Named hyperparameters <-> one flat, unconstrained-ish vector for the optimisers.

Optimisers see a flat vector (log values for positive scales); everything else sees a
dict keyed by name. The mapping is built from the names and specs, never from the
position of a basis in a concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pmkjit.bases.base import Hyperparameter

__all__ = ["ParamVector"]


@dataclass(frozen=True)
class ParamVector:
    """Layout of named array parameters inside a flat vector.

    Attributes
    ----------
    names : tuple of str
    shapes : tuple of tuple
    logs : tuple of bool
        Whether each parameter is stored as its logarithm.
    bounds : tuple of (float or None, float or None)
        Natural-unit bounds per parameter.
    """

    names: tuple
    shapes: tuple
    logs: tuple
    bounds: tuple

    @classmethod
    def from_specs(cls, specs: dict[str, Hyperparameter]) -> "ParamVector":
        """Layout for ``specs`` in their dict order."""
        return cls(
            tuple(specs),
            tuple(np.shape(h.value) for h in specs.values()),
            tuple(bool(h.log) for h in specs.values()),
            tuple(tuple(h.bounds) for h in specs.values()),
        )

    @property
    def size(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes))

    def _offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([int(np.prod(s)) for s in self.shapes])]).astype(int)

    def pack(self, values: dict[str, np.ndarray]) -> np.ndarray:
        """Flat vector (logs taken where declared) from named natural values."""
        parts = [
            (np.log(np.asarray(values[n], float)) if lg else np.asarray(values[n], float)).ravel()
            for n, lg in zip(self.names, self.logs)
        ]
        return np.concatenate(parts) if parts else np.zeros(0)

    def unpack(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Named natural values from a flat vector."""
        off = self._offsets()
        return {
            n: (np.exp(x[a:b]) if lg else x[a:b].copy()).reshape(s)
            for n, s, lg, a, b in zip(self.names, self.shapes, self.logs, off[:-1], off[1:])
        }

    def flat_gradient(self, grads: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> np.ndarray:
        """Gradient in the flat coordinates from natural-unit gradients (chain rule for logs)."""
        parts = [
            (np.asarray(grads[n], float) * (np.asarray(values[n], float) if lg else 1.0)).ravel()
            for n, lg in zip(self.names, self.logs)
        ]
        return np.concatenate(parts) if parts else np.zeros(0)

    def flat_bounds(self) -> list[tuple]:
        """Per-coordinate bounds in flat (log where declared) coordinates, for L-BFGS-B."""
        out = []
        for s, lg, (lo, hi) in zip(self.shapes, self.logs, self.bounds):
            if lg:
                lo = None if lo is None or lo <= 0 else float(np.log(lo))
                hi = None if hi is None else float(np.log(hi))
            out += [(lo, hi)] * int(np.prod(s))
        return out

    @cached_property
    def _box(self) -> tuple[np.ndarray, np.ndarray]:
        b = np.array([(-np.inf if lo is None else lo, np.inf if hi is None else hi) for lo, hi in self.flat_bounds()])
        return (b[:, 0], b[:, 1]) if b.size else (np.zeros(0), np.zeros(0))

    def clip(self, x: np.ndarray) -> np.ndarray:
        """Project a flat vector onto the bounds (built once: SVI clips after every step)."""
        lo, hi = self._box
        return np.clip(x, lo, hi)

    def random_start(self, x0: np.ndarray, rng: np.random.Generator, spread: float = 1.0) -> np.ndarray:
        """``x0`` perturbed by ``N(0, spread^2)`` per flat coordinate (a factor ``e^spread``
        for log-scale parameters), projected onto the bounds."""
        return self.clip(x0 + spread * rng.standard_normal(x0.shape))
