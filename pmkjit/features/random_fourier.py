"""Random Fourier features on vectors (scikit-learn style transformer)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pmkjit._random import as_generator
from pmkjit.features.spectral import KERNELS, sample_frequencies

__all__ = ["RandomFourierFeatures", "cos_sin"]

# Below this many entries one thread is faster than handing cos and sin to two.
_THREAD_MIN = 200_000
_POOL = ThreadPoolExecutor(max_workers=2)


def cos_sin(Z: np.ndarray, out: np.ndarray, scale: float = 1.0, amplitude: np.ndarray | None = None) -> None:
    """Write ``scale * amplitude * [cos(Z), sin(Z)]`` into ``out`` of shape ``(n, 2K)``.

    numpy's cos and sin run on one core and release the GIL, so large inputs get one
    thread each.
    """
    K = Z.shape[1]

    def part(fn, view):
        fn(Z, out=view)
        if amplitude is not None:
            np.multiply(view, amplitude, out=view)
        if scale != 1.0:
            np.multiply(view, scale, out=view)

    if Z.size >= _THREAD_MIN:
        futures = [_POOL.submit(part, np.cos, out[:, :K]), _POOL.submit(part, np.sin, out[:, K:])]
        for f in futures:
            f.result()
    else:
        part(np.cos, out[:, :K])
        part(np.sin, out[:, K:])


class RandomFourierFeatures:
    """Random Fourier features ``[cos(Z), sin(Z)] / sqrt(D/2)``, ``Z = (X / l) W``.

    ``phi(x) . phi(y)`` is an unbiased estimate of ``k(x, y)`` for the chosen kernel.

    Parameters
    ----------
    kernel : {"rbf", "laplace", "cauchy", "matern32", "matern52"}
    n_features : int, default 500
        Output dimension ``D`` (even: ``D/2`` frequencies, each giving a cos and a sin).
    lengthscale : float or array of shape (n_dims,), default 1.0
        Applied at transform time, so it can change without redrawing frequencies.
    orthogonal : bool, default False
        Orthogonal random features (isotropic kernels only).
    random_state : int, Generator or None
        Seeds the frequencies, which are drawn in :meth:`fit` (never in ``__init__``).

    Attributes
    ----------
    frequencies_ : ndarray (n_dims, n_features // 2)
        Unit-length-scale frequencies.
    n_features_in_ : int
    """

    def __init__(self, kernel: str = "rbf", n_features: int = 500, lengthscale=1.0, orthogonal: bool = False,
                 random_state=None):
        self.kernel = kernel
        self.n_features = n_features
        self.lengthscale = lengthscale
        self.orthogonal = orthogonal
        self.random_state = random_state

    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in ("kernel", "n_features", "lengthscale", "orthogonal", "random_state")}

    def set_params(self, **params) -> "RandomFourierFeatures":
        valid = self.get_params()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(f"RandomFourierFeatures has no parameter {key!r}")
            setattr(self, key, value)
        return self

    def fit(self, X: np.ndarray, y=None) -> "RandomFourierFeatures":
        """Draw the frequencies for inputs with ``X.shape[1]`` columns."""
        X = self._as_2d(X)
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {KERNELS}")
        n = int(self.n_features)
        if n < 2 or n % 2:
            raise ValueError(f"n_features must be an even integer >= 2, got {self.n_features}")
        rng = as_generator(self.random_state)
        self.frequencies_ = sample_frequencies(self.kernel, X.shape[1], n // 2, rng, self.orthogonal)
        self.n_features_in_ = X.shape[1]
        return self

    def transform(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Features of shape ``(n_samples, n_features)``.

        ``out``, a C-contiguous float64 array of that shape, receives the result when
        given (callers predicting in a loop reuse it instead of faulting in new pages).
        """
        if not hasattr(self, "frequencies_"):
            raise RuntimeError("RandomFourierFeatures is not fitted yet; call fit first")
        X = self._as_2d(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"fitted on {self.n_features_in_} columns, got {X.shape[1]}")
        ell = np.asarray(self.lengthscale, dtype=float)
        W = self.frequencies_ / ell[:, None] if ell.ndim else self.frequencies_ / float(ell)
        Z = X @ W
        K = W.shape[1]
        if out is None:
            out = np.empty((X.shape[0], 2 * K))
        elif out.shape != (X.shape[0], 2 * K) or out.dtype != np.float64 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float64 array of shape {(X.shape[0], 2 * K)}")
        cos_sin(Z, out, scale=np.sqrt(1.0 / K))
        return out

    def fit_transform(self, X: np.ndarray, y=None) -> np.ndarray:
        return self.fit(X).transform(X)

    @staticmethod
    def _as_2d(X) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        if X.ndim != 2:
            raise ValueError(f"expected a 2-D array (n_samples, n_dims), got shape {X.shape}")
        if not np.isfinite(X).all():
            raise ValueError("input contains NaN or infinity")
        return X
