"""Random features of tuples of incoming messages (kernels on distributions).

A KJIT operator regresses from the messages arriving at a factor, one batch per
neighbouring variable, to the projected belief of one variable. These classes turn
such a tuple of message batches into a feature matrix ``(B, D)`` whose inner products
approximate a kernel between message tuples:

``MeanVarianceFeatures``
    Gaussian kernel on the vector of message means and variances (the "MV kernel").
``ExpectedProductFeatures``
    Expected product kernels ``E_r E_s k(x, y)`` (inner product of mean embeddings)
    on the joint embedding, their sum over variables, or their product.
``GaussianJointEmbeddingFeatures``
    Gaussian kernel on joint mean embeddings, the two-stage random features of
    Algorithm 1 of the KJIT paper: the mean embedding of the product of all incoming
    messages under a Gaussian kernel, approximated with ``n_inner`` random features,
    then Gaussian random Fourier features of that vector.

Mean embeddings are exact: an inner feature ``(cos, sin)(w^T x)`` has expectation the
real and imaginary part of the message's characteristic function at ``w``; for a
product of independent messages the joint characteristic function is the product of
per-variable ones. Gaussians use ``exp(i w m - w^2 v / 2)``; Gamma its closed form;
Beta a Jacobi-Anger expansion ``exp(i a y) = sum_m eps_m i^m J_m(a) T_m(y)`` against
the exact Chebyshev moments of the Beta law, so the whole batch costs one matrix
product (scipy's complex ``hyp1f1`` is inaccurate for large Beta parameters, and
quadrature would be slower).

References
----------
.. [1] W. Jitkrittum et al., "Kernel-based just-in-time learning for passing
       expectation propagation messages", UAI 2015, Algorithm 1.
.. [2] R. Piessens, M. Branders, "The evaluation and application of some modified
       moments", BIT 13 (1973) 443-450 (Chebyshev moments of Jacobi weights).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import special

from pmkjit._random import as_generator
from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian, PointMass, family_by_name
from pmkjit.families.beta import beta_chebyshev_moments, chebyshev_order
from pmkjit.features import _elementwise as _ew
from pmkjit.features.random_fourier import RandomFourierFeatures, _cos_sin_numpy

__all__ = [
    "MeanVarianceFeatures",
    "ExpectedProductFeatures",
    "GaussianJointEmbeddingFeatures",
    "characteristic_function",
    "median_heuristic",
]

_MEDIAN_SUBSAMPLE = 1000


# ----------------------------------------------------------------- primitives
def _beta_cf_matrix(omega: np.ndarray) -> np.ndarray:
    """Real matrix ``(M, 2K)`` mapping Chebyshev moments to (Re, Im) of the Beta CF at ``omega``.

    With ``x = (y + 1) / 2``, ``exp(i w x) = exp(i w / 2) exp(i (w/2) y)`` and
    ``exp(i a y) = J_0(a) + 2 sum_{m>=1} i^m J_m(a) T_m(y)`` (Jacobi-Anger).
    """
    half = 0.5 * np.asarray(omega, dtype=float)
    M = chebyshev_order(np.max(np.abs(half), initial=0.0))
    m = np.arange(M)[:, None]
    coef = special.jv(m, half[None, :]) * np.where(m == 0, 1.0, 2.0) * (1j**m)
    coef = coef * np.exp(1j * half)[None, :]
    return np.concatenate([coef.real, coef.imag], axis=1)


def characteristic_function(
    message: ExponentialFamily, omega: np.ndarray, beta_matrix: np.ndarray | None = None
) -> np.ndarray:
    """``E[exp(i omega_k x)]`` for every message in a batch and every frequency.

    Parameters
    ----------
    message : Gaussian, Beta or Gamma batch of shape (B,)
    omega : ndarray of shape (K,)
        Frequencies shared by the batch.
    beta_matrix : ndarray, optional
        Precomputed :func:`_beta_cf_matrix` for ``omega`` (Beta only).

    Returns
    -------
    complex ndarray of shape (B, K)
    """
    omega = np.asarray(omega, dtype=float)
    if isinstance(message, Gaussian):
        m = message.mean()[:, None]
        v = message.var()[:, None]
        return np.exp(-0.5 * v * omega**2) * np.exp(1j * (m * omega))
    if isinstance(message, Beta):
        if beta_matrix is None:
            beta_matrix = _beta_cf_matrix(omega)
        mu = beta_chebyshev_moments(message.alpha, message.beta, beta_matrix.shape[0])
        reim = mu @ beta_matrix  # one GEMM for the whole batch
        K = omega.size
        return reim[:, :K] + 1j * reim[:, K:]
    if isinstance(message, Gamma):
        k = np.asarray(message.shape)[:, None]
        r = np.asarray(message.rate)[:, None]
        return np.exp(-k * np.log1p(-1j * omega / r))
    t = np.broadcast_to(omega, (len(message), omega.size))
    return message.characteristic_function(t)


_TINY = 1e-150


def _cf_parts(message: ExponentialFamily, omega: np.ndarray, beta_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Real and imaginary parts of the characteristic function, in real arithmetic."""
    if isinstance(message, Gaussian):
        m = message.mean()[:, None]
        v = message.var()[:, None]
        log_amp = -0.5 * v * omega**2
        amp = np.exp(np.maximum(log_amp, -700.0))
        amp[log_amp < -345.0] = 0.0  # below 1e-150: flush rather than go subnormal later
        parts = np.empty((m.shape[0], 2 * omega.size))
        _cos_sin_numpy(m * omega, parts, 1.0, amp)
        return parts[:, : omega.size], parts[:, omega.size :]
    if isinstance(message, Beta):
        mu = beta_chebyshev_moments(message.alpha, message.beta, beta_matrix.shape[0])
        reim = mu @ beta_matrix  # one GEMM for the whole batch
        K = omega.size
        return reim[:, :K], reim[:, K:]
    cf = characteristic_function(message, omega, beta_matrix)
    re, im = cf.real.copy(), cf.imag.copy()
    # Subnormal numbers make the next matrix product several times slower; flush them.
    re[np.abs(re) < _TINY] = 0.0
    im[np.abs(im) < _TINY] = 0.0
    return re, im


def log_gamma_characteristic_function(message: Gamma, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Real and imaginary parts of ``E[exp(i omega log x)]`` for ``x ~ Gamma(a, rate b)``.

    ``E[x^(i omega)] = Gamma(a + i omega) / Gamma(a) * b^(-i omega)``, exactly, with
    scipy's complex ``loggamma``: the mean embedding of the message as a law of ``log x``.

    Returns
    -------
    re, im : ndarray of shape (B, K)
    """
    a = np.asarray(message.shape, dtype=float)[:, None]
    log_b = np.log(np.asarray(message.rate, dtype=float))[:, None]
    omega = np.asarray(omega, dtype=float)[None, :]
    log_cf = special.loggamma(a + 1j * omega) - special.loggamma(a) - 1j * omega * log_b
    cf = np.exp(log_cf)
    re, im = cf.real.copy(), cf.imag.copy()
    re[np.abs(re) < _TINY] = 0.0
    im[np.abs(im) < _TINY] = 0.0
    return re, im


def median_heuristic(X: np.ndarray, rng: np.random.Generator | None = None) -> float:
    """Median pairwise Euclidean distance between rows of ``X`` (on a subsample)."""
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X[:, None]
    if X.shape[0] > _MEDIAN_SUBSAMPLE:
        rng = np.random.default_rng(0) if rng is None else rng
        X = X[rng.choice(X.shape[0], _MEDIAN_SUBSAMPLE, replace=False)]
    sq = np.sum(X**2, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * X @ X.T
    iu = np.triu_indices(X.shape[0], k=1)
    d = np.sqrt(np.maximum(d2[iu], 0.0))
    d = d[d > 0]
    return float(np.median(d)) if d.size else 1.0


# --------------------------------------------------------------- base class
class _MessageFeatures:
    """Shared validation, parameters and (de)serialisation of message feature maps."""

    _param_names: tuple[str, ...] = ()
    _state_names: tuple[str, ...] = ()

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in self._param_names}

    def set_params(self, **params) -> "_MessageFeatures":
        for key, value in params.items():
            if key not in self._param_names:
                raise ValueError(f"{type(self).__name__} has no parameter {key!r}")
            setattr(self, key, value)
        return self

    def fit_transform(self, messages: Sequence[ExponentialFamily]) -> np.ndarray:
        return self.fit(messages).transform(messages)

    def _validate(self, messages: Sequence[ExponentialFamily], *, fitting: bool) -> int:
        if isinstance(messages, ExponentialFamily):
            messages = (messages,)
        if len(messages) == 0:
            raise ValueError("need at least one incoming message batch")
        sizes = {len(m) for m in messages}
        if len(sizes) != 1:
            raise ValueError(f"incoming message batches differ in length: {[len(m) for m in messages]}")
        for i, m in enumerate(messages):
            if not isinstance(m, (Gaussian, Beta, Gamma, PointMass)):
                raise TypeError(
                    f"incoming message {i} is a {type(m).__name__}; expected Gaussian, Beta, Gamma or PointMass"
                )
            if np.ndim(m.natural) != 2:
                raise ValueError(f"incoming message {i} must be a 1-D batch, got batch shape {m.batch_shape}")
            m.check_proper(f"incoming message {i}")
        names = tuple(type(m).name for m in messages)
        if fitting:
            self.families_ = names
        elif not hasattr(self, "families_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet; call fit first")
        elif names != self.families_:
            raise ValueError(f"fitted on messages {self.families_}, got {names}")
        return sizes.pop()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Arrays and parameters that fully describe the fitted feature map."""
        # Only plain numbers and strings are stored: files must load without pickle.
        state = {
            f"param_{k}": np.asarray(v)
            for k, v in self.get_params().items()
            if k != "random_state" and isinstance(v, (int, float, str, np.number))
        }
        state["families"] = np.asarray(self.families_)
        for name in self._state_names:
            state[name] = np.asarray(getattr(self, name))
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray]) -> "_MessageFeatures":
        params = {}
        for name in cls._param_names:
            key = f"param_{name}"
            if key in state:
                value = state[key]
                params[name] = value.item() if value.ndim == 0 else value
        self = cls(**params)
        self.families_ = tuple(str(s) for s in state["families"])
        for name in self.families_:
            family_by_name(name)  # raises on an unknown family
        for name in cls._state_names:
            setattr(self, name, np.asarray(state[name]))
        self._restore()
        return self

    def _restore(self) -> None:
        """Rebuild derived attributes after loading."""


class _JointEmbedding:
    """Random-feature mean embedding of the product of incoming messages.

    Gaussian kernel on the joint variable with one length scale per variable;
    ``K`` joint frequencies give ``2K`` features ``[Re, Im] / sqrt(K)``.
    """

    def __init__(self, unit_frequencies: np.ndarray, lengthscales: np.ndarray, families: Sequence[str],
                 log_gamma: bool = False):
        self.log_gamma = bool(log_gamma)
        self.unit_frequencies = np.asarray(unit_frequencies, dtype=float)  # (c, K)
        self.lengthscales = np.asarray(lengthscales, dtype=float)  # (c,)
        self.omega = self.unit_frequencies / self.lengthscales[:, None]
        self._beta = [
            _beta_cf_matrix(self.omega[v]) if name == "Beta" else None for v, name in enumerate(families)
        ]

    @property
    def n_features(self) -> int:
        return 2 * self.omega.shape[1]

    def transform(
        self, messages: Sequence[ExponentialFamily], out: np.ndarray | None = None, threads: bool = True
    ) -> np.ndarray:
        """Features ``(B, 2K)``: ``[Re, Im]`` of the joint characteristic function over ``sqrt(K)``.

        Gaussian and point-mass messages are folded in by one compiled kernel (one exp
        and one sincos per entry for all of them together, phases and log amplitudes
        adding up); the others' characteristic functions are computed first (a Beta's
        by one matrix product written straight into ``out``) and multiplied in by the
        same pass. Rows whose phases are too large for the kernel's argument reduction
        are recomputed by :meth:`transform_reference`.
        """
        K = self.omega.shape[1]
        B = len(messages[0])
        if out is None:
            out = np.empty((B, 2 * K))
        scale = 1.0 / np.sqrt(K)
        phased = [v for v, m in enumerate(messages) if isinstance(m, (Gaussian, PointMass))]
        rest = [v for v in range(len(messages)) if v not in phased]
        for n, v in enumerate(rest):
            if isinstance(messages[v], Beta):
                mu = beta_chebyshev_moments(messages[v].alpha, messages[v].beta, self._beta[v].shape[0])
                parts = np.matmul(mu, self._beta[v], out=out if n == 0 else None)  # [Re, Im] layout
            else:
                re, im = self._parts(messages[v], v)
                parts = out if n == 0 else np.empty_like(out)
                parts[:, :K], parts[:, K:] = re, im
            if n > 0:
                _ew.run_rows(_ew.complex_multiply_kernel, (out, parts), (1.0,), out.size, threads=threads)
        if not phased:
            out *= scale
            return out
        M = np.stack([np.asarray(messages[v].mean(), dtype=float) for v in phased], axis=1)
        V = np.stack([np.asarray(messages[v].var(), dtype=float) for v in phased], axis=1)
        omega = np.ascontiguousarray(self.omega[phased])
        other = out if rest else np.empty((0, 0))
        n_big = _ew.run_rows(
            _ew.phase_cf_kernel, (M, V, other, out), (omega, 0.5 * omega**2, scale), out.size, threads=threads
        )
        if n_big:
            bound = np.abs(M) @ np.max(np.abs(omega), axis=1)  # >= every |phase| of the row
            rows = np.flatnonzero(bound > _ew.TRIG_LIMIT)
            out[rows] = self.transform_reference([m[rows] for m in messages])
        return out

    def transform_reference(self, messages: Sequence[ExponentialFamily]) -> np.ndarray:
        """:meth:`transform` with numpy's exp, cos and sin (reference and fallback)."""
        K = self.omega.shape[1]
        re, im = self._parts(messages[0], 0)
        out = np.empty((re.shape[0], 2 * K))
        o_re, o_im = out[:, :K], out[:, K:]
        np.copyto(o_re, re)
        np.copyto(o_im, im)
        tmp, tmp2 = np.empty_like(re), np.empty_like(re)
        for v in range(1, len(messages)):
            r2, i2 = self._parts(messages[v], v)
            # complex product (o_re + i o_im)(r2 + i i2), in place to avoid 20 MB temporaries
            np.multiply(o_im, i2, out=tmp)
            np.multiply(o_re, i2, out=tmp2)
            np.multiply(o_im, r2, out=o_im)
            o_im += tmp2
            np.multiply(o_re, r2, out=o_re)
            o_re -= tmp
        out *= 1.0 / np.sqrt(K)
        return out

    def _parts(self, message: ExponentialFamily, v: int) -> tuple[np.ndarray, np.ndarray]:
        if self.log_gamma and isinstance(message, Gamma):
            return log_gamma_characteristic_function(message, self.omega[v])
        return _cf_parts(message, self.omega[v], self._beta[v])


def _embedded_mean(message: ExponentialFamily, log_gamma: bool) -> np.ndarray:
    """Mean of the variable as the embedding sees it (``E[log x]`` for a log-space Gamma)."""
    if log_gamma and isinstance(message, Gamma):
        return np.asarray(message.unconstrained_moments()[0], dtype=float)
    return np.asarray(message.mean(), dtype=float)


def _mean_lengthscales(messages: Sequence[ExponentialFamily], rng: np.random.Generator,
                       log_gamma: bool = False) -> np.ndarray:
    """Median heuristic per variable on the message means (as embedded)."""
    return np.array([median_heuristic(_embedded_mean(m, log_gamma), rng) for m in messages])


def _check_even(n: int, name: str) -> int:
    n = int(n)
    if n < 2 or n % 2:
        raise ValueError(f"{name} must be an even integer >= 2, got {n}")
    return n


# ----------------------------------------------------------------- features
class MeanVarianceFeatures(_MessageFeatures):
    """Gaussian kernel on the means and variances of the incoming messages.

    Parameters
    ----------
    n_features : int, default 1000
        Random Fourier features of the Gaussian kernel.
    scale : float, default 1.0
        Multiplies the median-heuristic width on the standardised (mean, variance) vectors.
    random_state : int, Generator or None
    """

    _param_names = ("n_features", "scale", "random_state")
    _state_names = ("center_", "spread_", "frequencies_", "lengthscale_")

    def __init__(self, n_features: int = 1000, scale: float = 1.0, random_state=None):
        self.n_features = n_features
        self.scale = scale
        self.random_state = random_state

    @staticmethod
    def _raw(messages: Sequence[ExponentialFamily]) -> np.ndarray:
        cols = []
        for m in messages:
            cols += [np.asarray(m.mean()), np.asarray(m.var())]
        return np.stack(cols, axis=1)

    def fit(self, messages: Sequence[ExponentialFamily]) -> "MeanVarianceFeatures":
        self._validate(messages, fitting=True)
        rng = as_generator(self.random_state)
        raw = self._raw(messages)
        self.center_ = raw.mean(axis=0)
        self.spread_ = np.where(raw.std(axis=0) > 0, raw.std(axis=0), 1.0)
        z = (raw - self.center_) / self.spread_
        self.lengthscale_ = np.asarray(self.scale * median_heuristic(z, rng))
        rff = RandomFourierFeatures("rbf", _check_even(self.n_features, "n_features"), random_state=rng).fit(z)
        self.frequencies_ = rff.frequencies_
        self._restore()
        return self

    def _restore(self) -> None:
        self._rff = _rff_from(self.frequencies_, float(self.lengthscale_))

    def transform(self, messages: Sequence[ExponentialFamily]) -> np.ndarray:
        self._validate(messages, fitting=False)
        return self._rff.transform((self._raw(messages) - self.center_) / self.spread_)


class ExpectedProductFeatures(_MessageFeatures):
    """Expected product kernels ``<mu_r, mu_s>`` between mean embeddings.

    Parameters
    ----------
    mode : {"joint", "sum", "product"}
        ``"joint"``: embedding of the product of all incoming messages (one kernel on
        the joint variable). ``"sum"``: sum over variables of per-variable expected
        product kernels (features concatenated). ``"product"``: product of
        per-variable kernels (row-wise Kronecker product of their features).
    n_features : int, default 500
        Total number of features (for ``"product"``, per-variable sizes are chosen so
        that their product is close to this).
    scale : float, default 1.0
        Multiplies the per-variable median-heuristic kernel widths.
    random_state : int, Generator or None
    """

    _param_names = ("mode", "n_features", "scale", "random_state")
    _state_names = ("unit_frequencies_", "base_lengthscales_", "sizes_")

    def __init__(self, mode: str = "joint", n_features: int = 500, scale: float = 1.0, random_state=None):
        self.mode = mode
        self.n_features = n_features
        self.scale = scale
        self.random_state = random_state

    def fit(self, messages: Sequence[ExponentialFamily]) -> "ExpectedProductFeatures":
        if self.mode not in ("joint", "sum", "product"):
            raise ValueError(f"mode must be 'joint', 'sum' or 'product', got {self.mode!r}")
        self._validate(messages, fitting=True)
        rng = as_generator(self.random_state)
        c = len(messages)
        n = _check_even(self.n_features, "n_features")
        if self.mode == "joint":
            sizes = [n // 2]
        elif self.mode == "sum":
            sizes = [max(1, n // (2 * c))] * c
        else:
            per = max(2, int(round(n ** (1.0 / c))))
            sizes = [max(1, per // 2)] * c
        self.sizes_ = np.asarray(sizes)
        self.unit_frequencies_ = rng.standard_normal((c, int(np.sum(sizes))))
        self.base_lengthscales_ = _mean_lengthscales(messages, rng)
        self._restore()
        return self

    def _restore(self) -> None:
        ell = float(self.scale) * np.asarray(self.base_lengthscales_)
        names = self.families_
        if self.mode == "joint":
            self._maps = [(_JointEmbedding(self.unit_frequencies_, ell, names), None)]
            return
        self._maps = []
        start = 0
        for v, size in enumerate(np.asarray(self.sizes_).tolist()):
            block = self.unit_frequencies_[v : v + 1, start : start + size]
            self._maps.append((_JointEmbedding(block, ell[v : v + 1], names[v : v + 1]), v))
            start += size

    @property
    def n_features_out_(self) -> int:
        sizes = [m.n_features for m, _ in self._maps]
        return int(np.prod(sizes)) if self.mode == "product" else int(np.sum(sizes))

    def transform(self, messages: Sequence[ExponentialFamily]) -> np.ndarray:
        B = self._validate(messages, fitting=False)
        if self.mode == "joint":
            return self._maps[0][0].transform(messages)
        blocks = [emb.transform([messages[v]]) for emb, v in self._maps]
        if self.mode == "sum":
            return np.concatenate(blocks, axis=1)
        out = blocks[0]
        for blk in blocks[1:]:
            out = (out[:, :, None] * blk[:, None, :]).reshape(B, -1)
        return out


class GaussianJointEmbeddingFeatures(_MessageFeatures):
    """Gaussian kernel on joint mean embeddings, by two stages of random features.

    ``kappa(r, s) = exp(-||mu_r - mu_s||^2 / (2 gamma^2))`` where ``mu_r`` is the
    mean embedding of the product of the incoming messages ``r`` under a Gaussian
    kernel with per-variable widths. Stage one approximates ``mu_r`` with
    ``n_inner`` random features (exactly, given the frequencies); stage two
    approximates ``kappa`` with ``n_outer`` random Fourier features.

    Parameters
    ----------
    n_inner : int, default 500
        D_in, inner features (``n_inner / 2`` joint frequencies).
    n_outer : int, default 1000
        D_out, outer features.
    inner_scale, outer_scale : float, default 1.0
        Multipliers of the median-heuristic widths (per-variable widths on the
        message means; ``gamma`` on the inner embeddings). A KJIT operator chooses
        them by the regression's log evidence.
    orthogonal_outer : bool, default False
        Draw the outer frequencies as orthogonal random features (Yu et al., 2016),
        which lowers the variance of the outer kernel approximation.
    gamma_space : {"log", "linear"}, default "log"
        Embed a Gamma message as the law of ``log x`` (exact characteristic function
        ``E[x^(i w)]``) or of ``x``. Positive variables are scales, rates and
        precisions, compared by ratios: in ``log x`` a message's embedding depends on
        its scale only through a shift, so the kernel treats a doubling alike at every
        scale, and heavy upper tails (a precision under a compound-gamma prior has
        ``log tau`` logistic) stay within a few widths of the bulk. In ``x``, messages
        far in the tail all have nearly vanishing embeddings and look alike, so every
        new one is novel and none is predicted well (``docs/benchmarks.md``,
        experiment 2).
    random_state : int, Generator or None
    """

    _param_names = ("n_inner", "n_outer", "inner_scale", "outer_scale", "orthogonal_outer", "gamma_space",
                    "random_state")
    _state_names = ("unit_inner_", "base_lengthscales_", "unit_outer_", "outer_base_")

    def __init__(
        self,
        n_inner: int = 500,
        n_outer: int = 1000,
        inner_scale: float = 1.0,
        outer_scale: float = 1.0,
        orthogonal_outer: bool = False,
        gamma_space: str = "log",
        random_state=None,
    ):
        self.n_inner = n_inner
        self.n_outer = n_outer
        self.inner_scale = inner_scale
        self.outer_scale = outer_scale
        self.orthogonal_outer = orthogonal_outer
        self.gamma_space = gamma_space
        self.random_state = random_state

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray]) -> "GaussianJointEmbeddingFeatures":
        if "param_gamma_space" not in state:
            # maps saved before gamma_space existed embedded Gamma messages in x
            state = {**state, "param_gamma_space": np.asarray("linear")}
        return super().from_state_dict(state)

    @property
    def _log_gamma(self) -> bool:
        if self.gamma_space not in ("log", "linear"):
            raise ValueError(f"gamma_space must be 'log' or 'linear', got {self.gamma_space!r}")
        return self.gamma_space == "log"

    def fit(self, messages: Sequence[ExponentialFamily]) -> "GaussianJointEmbeddingFeatures":
        self._validate(messages, fitting=True)
        rng = as_generator(self.random_state)
        c = len(messages)
        K = _check_even(self.n_inner, "n_inner") // 2
        self.unit_inner_ = rng.standard_normal((c, K))
        self.base_lengthscales_ = _mean_lengthscales(messages, rng, self._log_gamma)
        D_out = _check_even(self.n_outer, "n_outer")
        self.unit_outer_ = RandomFourierFeatures(
            "rbf", D_out, orthogonal=bool(self.orthogonal_outer), random_state=rng
        ).fit(
            np.zeros((1, 2 * K))
        ).frequencies_
        self._median_rng = rng
        self.outer_base_ = np.asarray(np.nan)
        self._restore()
        self.refit_widths(messages)
        return self

    def refit_widths(self, messages: Sequence[ExponentialFamily]) -> "GaussianJointEmbeddingFeatures":
        """Recompute the outer median-heuristic width for the current ``inner_scale``.

        Frequencies are not redrawn, so scales can be searched on fixed random bases.
        """
        self._validate(messages, fitting=False)
        self._restore()
        inner = self._inner.transform(messages)
        self.outer_base_ = np.asarray(median_heuristic(inner, getattr(self, "_median_rng", None)))
        self._restore()
        return self

    def _restore(self) -> None:
        ell = float(self.inner_scale) * np.asarray(self.base_lengthscales_)
        self._inner = _JointEmbedding(self.unit_inner_, ell, self.families_, log_gamma=self._log_gamma)
        gamma = float(self.outer_scale) * float(self.outer_base_)
        self._outer = _rff_from(self.unit_outer_, gamma) if np.isfinite(gamma) else None

    @property
    def n_features_out_(self) -> int:
        return int(self.n_outer)

    def transform(
        self, messages: Sequence[ExponentialFamily], out: np.ndarray | None = None, threads: bool = True
    ) -> np.ndarray:
        """Features ``(B, n_outer)``; written into ``out`` when given (see RandomFourierFeatures).

        ``threads=False`` keeps the elementwise work on the calling thread (for callers
        that are themselves worker threads).
        """
        self._validate(messages, fitting=False)
        inner = self._inner.transform(messages, threads=threads)
        return self._outer.transform(inner, out=out, threads=threads)

    def embed(self, messages: Sequence[ExponentialFamily]) -> np.ndarray:
        """The first-stage features (approximate joint mean embeddings), ``(B, n_inner)``."""
        self._validate(messages, fitting=False)
        return self._inner.transform(messages)


def _rff_from(frequencies: np.ndarray, lengthscale: float) -> RandomFourierFeatures:
    """A fitted RBF random Fourier map with given unit frequencies (no new draws)."""
    rff = RandomFourierFeatures("rbf", 2 * frequencies.shape[1], lengthscale=lengthscale)
    rff.frequencies_ = np.asarray(frequencies, dtype=float)
    rff.n_features_in_ = frequencies.shape[0]
    return rff
