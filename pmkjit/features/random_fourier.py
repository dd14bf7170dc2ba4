"""Random Fourier features on vectors (scikit-learn style transformer).

``phi(x) = [cos(x/l @ W), sin(x/l @ W)] / sqrt(D/2)`` with ``W`` drawn from the kernel's
spectral density (:mod:`pmkjit.features.spectral`) gives ``phi(x) . phi(y)`` an unbiased
estimate of ``k(x, y)``: ``cos a cos b + sin a sin b = cos(a - b)`` and
``E[cos(w . (x - y) / l)] = k(x, y)`` by Bochner's theorem. Its error is ``O(1/sqrt(D))``.

scikit-learn is an optional dependency, so :class:`RandomFourierFeatures` does not
subclass its base classes; it follows their conventions instead (``__init__`` only
stores its arguments, ``get_params``/``set_params``, fitted attributes end in ``_``), so
``sklearn.base.clone`` and pipelines work with it.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike

from pmkjit._random import RandomState, as_generator
from pmkjit.features import _elementwise as _ew
from pmkjit.features.spectral import KERNELS, Lengthscale, _as_lengthscale, sample_frequencies

__all__ = ["RandomFourierFeatures", "cos_sin"]


def cos_sin(
    Z: np.ndarray,
    out: np.ndarray,
    scale: float = 1.0,
    amplitude: np.ndarray | None = None,
    threads: bool = True,
) -> None:
    """Write ``scale * amplitude * [cos(Z), sin(Z)]`` into ``out`` of shape ``(n, 2K)``.

    Parameters
    ----------
    Z : ndarray of shape (n, K)
    out : ndarray of shape (n, 2K)
        Receives ``cos`` in its first ``K`` columns and ``sin`` in the last ``K``; writing
        straight into it avoids building two temporaries and concatenating them.
    scale : float, default 1.0
    amplitude : ndarray broadcastable to (n, K), optional
    threads : bool, default True
        Split large inputs over two threads. ``False`` for callers already running on
        worker threads.

    Notes
    -----
    C-contiguous float64 ``Z`` and ``out`` go through a compiled kernel that computes
    cos and sin together with vectorised polynomials (:mod:`pmkjit.features._elementwise`,
    within 2.3e-16 of numpy, about 10 times faster than numpy's float64 cos and sin);
    rows with arguments beyond ``2**19`` are recomputed with numpy. Other inputs use numpy.
    """
    Z = np.asarray(Z)
    K = Z.shape[1]
    fast = (
        Z.dtype == np.float64 and out.dtype == np.float64 and Z.ndim == 2
        and Z.flags.c_contiguous and out.flags.c_contiguous and out.shape == (Z.shape[0], 2 * K)
    )
    if fast:
        n_big = _ew.run_rows(_ew.cos_sin_kernel, (Z, out), (float(scale),), Z.size, threads=threads)
        if n_big:
            rows = np.flatnonzero(np.any(np.abs(Z) > _ew.TRIG_LIMIT, axis=1))
            sub = np.empty((rows.size, 2 * K))
            _cos_sin_numpy(Z[rows], sub, scale, None)
            out[rows] = sub
        if amplitude is not None:
            amp = np.broadcast_to(amplitude, Z.shape)
            np.multiply(out[:, :K], amp, out=out[:, :K])
            np.multiply(out[:, K:], amp, out=out[:, K:])
        return
    _cos_sin_numpy(Z, out, scale, amplitude)


def _cos_sin_numpy(Z: np.ndarray, out: np.ndarray, scale: float, amplitude: np.ndarray | None) -> None:
    """:func:`cos_sin` with numpy's cos and sin (reference, and any dtype or layout)."""
    K = Z.shape[1]
    for fn, view in ((np.cos, out[:, :K]), (np.sin, out[:, K:])):
        fn(Z, out=view)
        if amplitude is not None:
            np.multiply(view, amplitude, out=view)
        if scale != 1.0:
            np.multiply(view, scale, out=view)


_PARAMS = ("kernel", "n_features", "lengthscale", "orthogonal", "random_state")


class RandomFourierFeatures:
    """Random Fourier features ``[cos(Z), sin(Z)] / sqrt(D/2)``, ``Z = (X / l) W``.

    ``phi(x) . phi(y)`` is an unbiased estimate of ``k(x, y)`` for the chosen kernel,
    with error shrinking like ``1 / sqrt(D)``.

    Parameters
    ----------
    kernel : {"rbf", "laplace", "cauchy", "matern32", "matern52"}, default "rbf"
        Shift-invariant kernel to approximate (formulas in :mod:`pmkjit.features.spectral`).
    n_features : int, default 500
        Output dimension ``D``; even, since ``D/2`` frequencies each give a cos and a sin.
    lengthscale : float or array_like of shape (n_dims,), default 1.0
        Applied at transform time, so it can change (``set_params``) without redrawing
        the frequencies, e.g. while searching length scales on fixed random bases.
    orthogonal : bool, default False
        Orthogonal random features (Yu et al., 2016), lower variance at equal ``D``;
        isotropic kernels only (not ``"laplace"``).
    random_state : None, int, SeedSequence or Generator, default None
        Seeds the frequencies, which are drawn in :meth:`fit` (never in ``__init__``).
        A ``Generator`` is advanced, so refitting with it draws new frequencies.

    Attributes
    ----------
    frequencies_ : ndarray of shape (n_dims, n_features // 2)
        Unit-length-scale frequencies.
    n_features_in_ : int
        Number of input columns seen in :meth:`fit`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(5, 2))
    >>> rff = RandomFourierFeatures("matern52", n_features=4000, random_state=0)
    >>> Phi = rff.fit_transform(X)
    >>> Phi.shape
    (5, 4000)
    """

    def __init__(
        self,
        kernel: str = "rbf",
        n_features: int = 500,
        lengthscale: Lengthscale = 1.0,
        orthogonal: bool = False,
        random_state: RandomState = None,
    ) -> None:
        # scikit-learn convention: store arguments untouched; validate and draw in fit
        self.kernel = kernel
        self.n_features = n_features
        self.lengthscale = lengthscale
        self.orthogonal = orthogonal
        self.random_state = random_state

    def get_params(self, deep: bool = True) -> dict:
        """Constructor arguments, as ``sklearn.base.BaseEstimator.get_params``.

        Parameters
        ----------
        deep : bool, default True
            Ignored (no parameter is itself an estimator); kept for scikit-learn.

        Returns
        -------
        dict
        """
        return {k: getattr(self, k) for k in _PARAMS}

    def set_params(self, **params) -> "RandomFourierFeatures":
        """Set constructor arguments; fitted frequencies are kept.

        Changing ``lengthscale`` takes effect at the next :meth:`transform`; changing
        anything else needs a new :meth:`fit`.

        Returns
        -------
        RandomFourierFeatures
            ``self``.

        Raises
        ------
        ValueError
            For a name that is not a constructor argument.
        """
        for key in params:
            if key not in _PARAMS:
                raise ValueError(f"RandomFourierFeatures has no parameter {key!r}; valid: {_PARAMS}")
        for key, value in params.items():
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in _PARAMS)
        return f"RandomFourierFeatures({args})"

    def fit(self, X: ArrayLike, y=None) -> "RandomFourierFeatures":
        """Draw ``n_features // 2`` unit-length-scale frequencies for ``X``'s columns.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_dims)
            Only its number of columns is used (and it must be finite).
        y : ignored

        Returns
        -------
        RandomFourierFeatures
            ``self``.

        Raises
        ------
        ValueError
            For an unknown kernel, an odd or too small ``n_features``, non-finite or
            non-2-D ``X``, or ``orthogonal=True`` with a non-isotropic kernel.
        """
        X = self._as_2d(X)
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {KERNELS}")
        n = self.n_features
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2 or n % 2:
            raise ValueError(f"n_features must be an even integer >= 2, got {n!r}")
        _as_lengthscale(self.lengthscale, X.shape[1])  # fail at fit, not at first transform
        rng = as_generator(self.random_state)
        self.frequencies_ = sample_frequencies(self.kernel, X.shape[1], int(n) // 2, rng, bool(self.orthogonal))
        self.n_features_in_ = X.shape[1]
        return self

    def transform(self, X: ArrayLike, out: np.ndarray | None = None, threads: bool = True) -> np.ndarray:
        """Features ``[cos(Z), sin(Z)] / sqrt(n_features / 2)``, ``Z = (X / lengthscale) @ frequencies_``.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features_in_)
        out : ndarray of shape (n_samples, n_features), optional
            A C-contiguous float64 array that receives the result (callers predicting
            in a loop reuse it instead of faulting in new pages).
        threads : bool, default True
            Let :func:`cos_sin` split large inputs over two threads; ``False`` when the
            caller is itself one of several worker threads.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
            float64; ``out`` when given.

        Raises
        ------
        RuntimeError
            If called before :meth:`fit`.
        ValueError
            For the wrong number of columns, non-finite input, a bad ``lengthscale``
            or a bad ``out``.
        """
        if not hasattr(self, "frequencies_"):
            raise RuntimeError("RandomFourierFeatures is not fitted yet; call fit first")
        X = self._as_2d(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"RandomFourierFeatures was fitted on {self.n_features_in_} columns, got {X.shape[1]}"
            )
        ell = _as_lengthscale(self.lengthscale, self.n_features_in_)
        # (X / l) @ W == X @ (W / l[:, None]): scaling the small (d, K) matrix is cheaper
        W = self.frequencies_ / (ell[:, None] if ell.ndim else ell)
        K = W.shape[1]
        if out is None:
            out = np.empty((X.shape[0], 2 * K))
        elif out.shape != (X.shape[0], 2 * K) or out.dtype != np.float64 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float64 array of shape {(X.shape[0], 2 * K)}")
        cos_sin(X @ W, out, scale=np.sqrt(1.0 / K), threads=threads)
        return out

    def fit_transform(self, X: ArrayLike, y=None) -> np.ndarray:
        """:meth:`fit` then :meth:`transform` on the same ``X``.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        return self.fit(X).transform(X)

    @staticmethod
    def _as_2d(X: ArrayLike) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        if X.ndim != 2:
            raise ValueError(f"expected a 2-D array (n_samples, n_dims), got shape {X.shape}")
        if not np.isfinite(X).all():
            raise ValueError("input contains NaN or infinity")
        return X
