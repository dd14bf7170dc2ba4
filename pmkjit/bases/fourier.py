"""Random Fourier bases with learnable length scales, and the à la carte spectral mixture.

Both use the feature map of :class:`pmkjit.features.RandomFourierFeatures`,
``Phi = [cos(Z), sin(Z)] / sqrt(K)`` for ``K`` frequencies (``2K`` features), and draw
frequencies with :mod:`pmkjit.features.spectral` or :mod:`pmkjit.features.structured`.
What they add is the gradient with respect to their hyperparameters: with ``G = dL/dPhi``
split into cosine and sine halves ``G_c, G_s``,

    dL/dZ = G_s * Phi_c - G_c * Phi_s            (no trigonometry recomputed)

and ``Z = (X / l) W`` gives ``dL/dl_j = -(1 / l_j) sum_k [(X/l)^T dL/dZ]_jk W_jk`` (summed
over ``j`` for an isotropic length scale).
"""

from __future__ import annotations

import numpy as np

from pmkjit._random import RandomState
from pmkjit.bases.base import Basis, Hyperparameter, _parse_bounds
from pmkjit.features.random_fourier import cos_sin
from pmkjit.features.spectral import KERNELS, _as_lengthscale, _check_count, sample_frequencies
from pmkjit.features.structured import STRUCTURED, sample_structured_frequencies

__all__ = ["RandomFourierBasis", "SpectralMixtureBasis", "SAMPLERS"]

#: How frequencies are drawn: i.i.d. (Rahimi & Recht), orthogonal blocks (Yu et al.),
#: Fastfood (Le et al.) or structured orthogonal (SORF, Yu et al.).
SAMPLERS = ("iid", "orthogonal", *STRUCTURED)


def _dz(Phi: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``dL/dZ`` from the features and their gradient (cos half first, sin half second)."""
    K = Phi.shape[1] // 2
    return G[:, K:] * Phi[:, :K] - G[:, :K] * Phi[:, K:]


class RandomFourierBasis(Basis):
    """Random Fourier basis for a shift-invariant kernel, isotropic or ARD length scales.

    ``Phi @ Phi.T`` converges to the kernel matrix ``k((x - y) / lengthscale)`` as
    ``n_components`` grows (kernels and spectral laws: :mod:`pmkjit.features.spectral`).

    Parameters
    ----------
    kernel : {"rbf", "laplace", "cauchy", "matern32", "matern52"}, default "rbf"
    n_components : int, default 100
        Number of frequencies ``K``; the basis has ``2K`` features.
    lengthscale : float or array_like of shape (n_columns,), default 1.0
        A scalar is an isotropic length scale, an array one per input column (ARD).
        It is the starting point when a model learns it.
    lengthscale_bounds : (float, float) or "fixed", default (1e-3, 1e3)
        Box for learning; ``"fixed"`` keeps ``lengthscale`` as given.
    sampler : {"iid", "orthogonal", "sorf", "fastfood"}, default "iid"
        How frequencies are drawn. ``"orthogonal"`` and ``"sorf"`` lower the kernel
        approximation error at equal size; ``"fastfood"`` is Le et al.'s structured
        sampler (accuracy close to ``"iid"``). All but ``"iid"`` need an isotropic kernel.
    columns : array_like of int, slice or None, default None
        Input columns this basis reads.
    name : str or None, default None
        Component name in a concatenation; defaults to ``kernel``.
    random_state : None, int, SeedSequence or Generator, default None
        Seeds the frequencies, drawn in :meth:`fit`. Inside a model, ``None`` means the
        model's ``random_state`` decides.

    Attributes
    ----------
    frequencies_ : ndarray of shape (n_columns, n_components)
        Unit-length-scale frequencies.

    Examples
    --------
    >>> import numpy as np
    >>> from pmkjit.bases import RandomFourierBasis, LinearBasis
    >>> X = np.random.default_rng(0).normal(size=(4, 3))
    >>> basis = RandomFourierBasis("matern32", 50, lengthscale=[1.0, 2.0, 3.0], random_state=0) + LinearBasis()
    >>> basis.fit(X).transform(X).shape
    (4, 103)
    >>> basis.get_params()["matern32__lengthscale"]
    [1.0, 2.0, 3.0]
    """

    def __init__(
        self,
        kernel: str = "rbf",
        n_components: int = 100,
        lengthscale=1.0,
        lengthscale_bounds=(1e-3, 1e3),
        sampler: str = "iid",
        columns=None,
        name: str | None = None,
        random_state: RandomState = None,
    ) -> None:
        self.kernel = kernel
        self.n_components = n_components
        self.lengthscale = lengthscale
        self.lengthscale_bounds = lengthscale_bounds
        self.sampler = sampler
        self.columns = columns
        self.name = name
        self.random_state = random_state

    @property
    def default_name(self) -> str:  # type: ignore[override]
        return str(self.kernel)

    def _fit(self, X: np.ndarray, rng: np.random.Generator) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {KERNELS}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        K = _check_count(self.n_components, "n_components")
        _as_lengthscale(self.lengthscale, X.shape[1])
        _parse_bounds(self.lengthscale_bounds, "lengthscale_bounds")
        if self.sampler in STRUCTURED:
            self.frequencies_ = sample_structured_frequencies(self.kernel, X.shape[1], K, rng, self.sampler)
        else:
            self.frequencies_ = sample_frequencies(self.kernel, X.shape[1], K, rng, self.sampler == "orthogonal")

    def _n_outputs(self) -> int:
        return 2 * self.frequencies_.shape[1]

    def _hyperparameters(self) -> dict[str, Hyperparameter]:
        bounds = _parse_bounds(self.lengthscale_bounds, "lengthscale_bounds")
        if bounds is None:
            return {}
        return {"lengthscale": Hyperparameter(np.array(self.lengthscale, dtype=float), bounds)}

    def _lengthscale(self, hyper: dict) -> np.ndarray:
        return _as_lengthscale(hyper.get("lengthscale", self.lengthscale), self.frequencies_.shape[0])

    def _features(self, X: np.ndarray, hyper: dict) -> np.ndarray:
        Xs = X / self._lengthscale(hyper)
        K = self.frequencies_.shape[1]
        out = np.empty((X.shape[0], 2 * K))
        cos_sin(Xs @ self.frequencies_, out, scale=np.sqrt(1.0 / K))
        return out

    def _vjp(self, X, hyper, Phi, G) -> dict[str, np.ndarray]:
        ell = self._lengthscale(hyper)
        Xs = X / ell
        # dL/dl_j = -(1/l_j) sum_k [Xs^T dL/dZ]_jk W_jk: one (d, n) x (n, K) product
        per_dim = -np.einsum("jk,jk->j", Xs.T @ _dz(Phi, G), self.frequencies_) / ell
        return {"lengthscale": per_dim if ell.ndim else np.asarray(per_dim.sum())}


class SpectralMixtureBasis(Basis):
    """À la carte basis: random features of a learned Gaussian-mixture spectral density.

    The kernel is ``k(tau) = (1/Q) sum_q exp(-1/2 sum_j tau_j^2 / l_qj^2) cos(mu_q . tau)``
    (Wilson and Adams' spectral mixture with equal weights; the model's prior variance is
    the amplitude). Each of the ``Q`` mixture components owns ``K / Q`` frequencies
    ``omega = mu_q + eps / l_q`` with ``eps ~ N(0, I)`` drawn once in :meth:`fit`, so the
    features are differentiable in the means ``mu`` and length scales ``l``, which a model
    learns (Yang et al., 2015).

    Parameters
    ----------
    n_components : int, default 100
        Total frequencies ``K`` (a multiple of ``n_mixtures``); ``2K`` features.
    n_mixtures : int, default 4
        Mixture components ``Q``.
    lengthscale : float, default 1.0
        Initial length scale of every component and dimension.
    means : array_like of shape (Q, n_columns) or None, default None
        Initial spectral means; ``None`` draws them in :meth:`fit` from ``N(0, 1 / l^2)``.
    lengthscale_bounds : (float, float) or "fixed", default (1e-3, 1e3)
    means_bounds : (float or None, float or None) or "fixed", default (None, None)
    columns, name, random_state
        As for :class:`RandomFourierBasis`; the default name is ``"alacarte"``.

    References
    ----------
    .. [1] Z. Yang, A. J. Smola, L. Song, A. G. Wilson, "A la carte - learning fast
           kernels", AISTATS 2015.
    """

    default_name = "alacarte"

    def __init__(
        self,
        n_components: int = 100,
        n_mixtures: int = 4,
        lengthscale=1.0,
        means=None,
        lengthscale_bounds=(1e-3, 1e3),
        means_bounds=(None, None),
        columns=None,
        name: str | None = None,
        random_state: RandomState = None,
    ) -> None:
        self.n_components = n_components
        self.n_mixtures = n_mixtures
        self.lengthscale = lengthscale
        self.means = means
        self.lengthscale_bounds = lengthscale_bounds
        self.means_bounds = means_bounds
        self.columns = columns
        self.name = name
        self.random_state = random_state

    def _fit(self, X: np.ndarray, rng: np.random.Generator) -> None:
        K = _check_count(self.n_components, "n_components")
        Q = _check_count(self.n_mixtures, "n_mixtures")
        if K % Q:
            raise ValueError(f"n_components ({K}) must be a multiple of n_mixtures ({Q})")
        d = X.shape[1]
        ell = np.broadcast_to(np.asarray(self.lengthscale, dtype=float), (Q, d)).copy()
        if not (np.all(np.isfinite(ell)) and np.all(ell > 0)):
            raise ValueError(f"lengthscale must be positive and finite, got {self.lengthscale!r}")
        self.lengthscales_init_ = ell
        if self.means is None:
            self.means_init_ = rng.standard_normal((Q, d)) / ell
        else:
            self.means_init_ = np.broadcast_to(np.asarray(self.means, dtype=float), (Q, d)).copy()
        self.eps_ = rng.standard_normal((Q, d, K // Q))  # fixed draws: features are smooth in mu, l

    def _n_outputs(self) -> int:
        return 2 * self.n_components

    def _hyperparameters(self) -> dict[str, Hyperparameter]:
        out = {}
        lb = _parse_bounds(self.lengthscale_bounds, "lengthscale_bounds")
        mb = _parse_bounds(self.means_bounds, "means_bounds")
        if lb is not None:
            out["lengthscale"] = Hyperparameter(self._current("lengthscale"), lb)
        if mb is not None:
            out["means"] = Hyperparameter(self._current("means"), mb, log=False)
        return out

    def _current(self, key: str) -> np.ndarray:
        """Learned values once written back (arrays of shape (Q, d)), else the initial ones."""
        value = getattr(self, key)
        init = self.lengthscales_init_ if key == "lengthscale" else self.means_init_
        if value is None or np.ndim(value) < 2:
            return init.copy()
        return np.asarray(value, dtype=float)

    def frequencies(self, hyper: dict | None = None) -> np.ndarray:
        """Frequencies ``(n_columns, K)`` at the given (default: current) hyperparameters."""
        hyper = hyper or {}
        mu = np.asarray(hyper.get("means", self._current("means")))
        ell = np.asarray(hyper.get("lengthscale", self._current("lengthscale")))
        Q, d, m = self.eps_.shape
        return (mu[:, :, None] + self.eps_ / ell[:, :, None]).transpose(1, 0, 2).reshape(d, Q * m)

    def _features(self, X: np.ndarray, hyper: dict) -> np.ndarray:
        W = self.frequencies(hyper)
        K = W.shape[1]
        out = np.empty((X.shape[0], 2 * K))
        cos_sin(X @ W, out, scale=np.sqrt(1.0 / K))
        return out

    def _vjp(self, X, hyper, Phi, G) -> dict[str, np.ndarray]:
        Q, d, m = self.eps_.shape
        dW = (X.T @ _dz(Phi, G)).reshape(d, Q, m).transpose(1, 0, 2)  # (Q, d, m)
        out = {}
        if "means" in hyper:
            out["means"] = dW.sum(axis=2)
        if "lengthscale" in hyper:
            ell = np.asarray(hyper["lengthscale"])
            out["lengthscale"] = -np.einsum("qdm,qdm->qd", dW, self.eps_) / ell**2
        return out

    def kernel_matrix(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """The exact spectral-mixture kernel at the current hyperparameters (for checks)."""
        mu, ell = self._current("means"), self._current("lengthscale")
        tau = self._select(np.asarray(X, float))[:, None, :] - self._select(np.asarray(Y, float))[None, :, :]
        r2 = np.einsum("nmd,qd->qnm", tau**2, 1.0 / ell**2)
        return np.mean(np.exp(-0.5 * r2) * np.cos(np.einsum("nmd,qd->qnm", tau, mu)), axis=0)
