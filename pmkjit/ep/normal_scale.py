"""Semi-analytic tilted moments of a Normal factor with a latent scale or precision.

For ``y ~ Normal(eta, sd(s))`` with a Gaussian cavity ``N(eta; m, v)`` on the mean and a
Gamma cavity on ``s`` (the scale, ``sd = s``; the precision, ``sd = s^-1/2``; or the
variance, ``sd = s^1/2``), the mean integrates out in closed form:

    integral N(y; eta, sd^2) N(eta; m, v) d eta = N(y; m, v + sd^2),
    eta | s  ~  N(m + v (y - m) / (v + sd^2),  v sd^2 / (v + sd^2)),

so the two-dimensional tilted law needs only a one-dimensional integral over ``s``,
done by the trapezoid rule in ``log s`` on a window of the cavity's log-space moments
(the integrand is the Gamma cavity times a bounded smooth function of ``s``, so the rule
converges geometrically). This covers Normal likelihoods with a latent ``sigma``, ``tau``
or variance (``sigma=pm.math.sqrt(s2)``, ``s2 ~ pm.InverseGamma``) and Normal priors with a latent scale (``w ~ Normal(mu, s)``, the hierarchical
scale), whose residual ``x - mu`` is the linear slot and whose "observation" is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.special import digamma

from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian
from pmkjit.ep.methods import Answer

__all__ = ["MAX_LOG_NOISE_STEP", "NormalScaleMethod", "SEMI_ANALYTIC", "flat_tail", "noise_power", "scale_nodes",
           "tilted_nodes", "unresolved_rows", "zoom_nodes"]

_NOISE_POWER = {"scale": 2.0, "precision": -1.0, "variance": 1.0}  # sd^2 = s ** power
# the factors' ``analytic`` names (pmkjit.graph.factor_graph.BlackBoxFactor), one per link
SEMI_ANALYTIC = tuple(f"normal-{link}" for link in _NOISE_POWER)


def noise_power(analytic: str) -> float:
    """``p`` with the Normal's variance ``sd^2 = s ** p`` for a factor's ``analytic`` name
    (``"normal-scale"``: 2, ``"normal-precision"``: -1, ``"normal-variance"``: 1)."""
    return _NOISE_POWER[analytic.removeprefix("normal-")]
_NODES = 401
_HALF_WIDTH = 16.0  # cavity log-space standard deviations each side
# A vague scale cavity (Gamma(0.001, 0.001), BUGS's habit: log-space sd 1000) spreads the nodes
# a thousand times wider than the one observation's tilted law, which then fell between two
# nodes and every instance went unanswered. The window is narrowed onto the nodes within
# _DROP nats of the largest weight (one node more each side) while that more than halves it.
_DROP = 46.0  # exp(-46) ~ 1e-20: weight beyond it is below round-off
_MAX_ZOOMS = 8
# nodes further apart than this in log(noise) do not resolve a likelihood that varies over a
# few units of it: a scale's flat tail is then integrated in closed form (flat_tail)
MAX_LOG_NOISE_STEP = 0.25


def scale_nodes(q: ExponentialFamily) -> np.ndarray:
    """``(B, _NODES)`` trapezoid nodes for a scale message's unconstrained coordinate (``log s``
    of a Gamma, ``logit s`` of a Beta): ``_HALF_WIDTH`` of its exact sds each side of its mean."""
    mu_u, var_u = q.unconstrained_moments()
    return mu_u[:, None] + np.sqrt(var_u)[:, None] * np.linspace(-_HALF_WIDTH, _HALF_WIDTH, _NODES)


def tilted_nodes(q: ExponentialFamily, log_weight: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 max_zooms: int = _MAX_ZOOMS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B, _NODES)`` nodes in a scale message's unconstrained coordinate, from its cavity's
    window (:func:`scale_nodes`) zoomed onto the tilted law at most ``max_zooms`` times; which
    rows were zoomed; and the law's unnormalised log-density at the nodes returned.

    ``log_weight(u, rows)`` is that log-density at nodes ``u`` of the batch rows ``rows`` (an
    index array). A row the zoom leaves in place keeps its nodes and weights for good, so each
    pass evaluates only the rows the last one narrowed (every row, every pass, doubled the
    time of a semi-analytic Normal factor, most of whose rows never zoom)."""
    u = scale_nodes(q)
    rows = np.arange(u.shape[0])
    logw = log_weight(u, rows)
    zoomed = np.zeros(u.shape[0], dtype=bool)
    for _ in range(max_zooms):
        narrowed_u, narrowed = zoom_nodes(u[rows], logw[rows])
        if not narrowed.any():
            break
        rows = rows[narrowed]
        u[rows] = narrowed_u[narrowed]
        logw[rows] = log_weight(u[rows], rows)
        zoomed[rows] = True
    return u, zoomed, logw


def zoom_nodes(u: np.ndarray, log_weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``u`` (B, K) narrowed, row by row, onto the span of ``log_weight`` within ``_DROP``
    nats of its largest value, one node wider each side; and which rows were narrowed.

    A row is narrowed only where the span is at most half its window (so an informative
    cavity keeps its nodes) and has a finite weight at all (else nothing says where to go).
    """
    K = u.shape[1]
    with np.errstate(invalid="ignore"):
        keep = log_weight >= np.max(log_weight, axis=1, keepdims=True) - _DROP
    keep &= np.isfinite(log_weight)
    rows = np.arange(u.shape[0])
    lo = np.clip(np.argmax(keep, axis=1) - 1, 0, K - 1)
    hi = np.clip(K - np.argmax(keep[:, ::-1], axis=1), 0, K - 1)
    narrow = keep.any(axis=1) & (u[rows, hi] - u[rows, lo] <= 0.5 * (u[:, -1] - u[:, 0]))
    out = u.copy()
    t = np.linspace(0.0, 1.0, K)
    r = np.flatnonzero(narrow)
    out[r] = u[r, lo[r], None] + (u[r, hi[r]] - u[r, lo[r]])[:, None] * t
    return out, narrow


def unresolved_rows(u: np.ndarray, power: float, step: float = MAX_LOG_NOISE_STEP) -> np.ndarray:
    """Rows of nodes ``u`` (B, K) in ``log s`` spaced more than ``step`` apart in log noise
    (``power`` times ``log s``): for a scale or a variance (``power > 0``), rows whose flat tail
    :func:`flat_tail` integrates; none for a precision, whose tail the zoom resolves."""
    if power <= 0:
        return np.zeros(0, dtype=int)
    return np.flatnonzero((u[:, 1] - u[:, 0]) * power > step)


def flat_tail(s_msg: Gamma, m: np.ndarray, v: np.ndarray, y: np.ndarray,
              power: float) -> tuple[np.ndarray, ...]:
    """Tilted moments of ``N(y; eta, s^power) N(eta; m, v) Gamma(s)`` (``power > 0``: a scale or a
    variance) where nodes over the cavity cannot resolve the likelihood: a Gamma cavity of tiny
    shape, ``sigma ~ pm.Gamma(0.001, 0.001)``.

    Its cavity in ``log s`` falls as ``exp(alpha log s)`` towards 0: a thousand units wide
    for ``alpha = 0.001``, where the likelihood, ``N(y; m, v + s^2)``, is flat below ``s^2 ~
    v`` and varies over a few units above. 401 nodes over the cavity put one node in that
    region, and the first sweep's sites collapsed the scale to 0 (rate 1e14). The
    likelihood's limit ``L0`` at ``s -> 0`` is subtracted instead:
    ``E[T L] = L0 E[T] + integral q(u) (L - L0) T du``, with the cavity's ``E[T]`` in
    closed form and the rest on a fine grid between where ``L - L0`` is below 1e-14 of
    ``L0`` and the cavity's upper tail (light for a Gamma). ``eta``'s moments are taken
    about ``y``, its limit at ``s -> 0`` (where ``eta | s`` is ``N(y, 0)``).

    ``m``, ``v`` and ``y`` are columns ``(b, 1)``. Returns ``E[eta]``, ``Var[eta]``,
    ``E[log s]``, ``E[s]`` and ``log Z``, the log of ``integral N(y; m, v + s^power) Gamma(s) ds``.
    """
    alpha, beta = s_msg.shape, s_msg.rate
    r2 = (y - m) ** 2
    log_v = np.log(v)
    # relative change of L from L0 is about noise * max(1, r2 / v) / v at small noise
    lo = (log_v - 32.0 - np.log(np.maximum(1.0, r2 / v))) / power
    top = np.log((alpha + 50.0) / beta)[:, None] + 1.0  # the cavity below e^-130 of its peak
    lo = np.minimum(lo, top - 1.0)
    t = np.linspace(0.0, 1.0, _NODES)
    u = lo + (top - lo) * t  # (b, K)
    h = (top - lo) * (t[1] - t[0]) * np.where((t == 0) | (t == 1), 0.5, 1.0)  # trapezoid weights
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        noise = np.exp(power * u)
        total = v + noise
        log_l = -0.5 * np.log(total / v) - 0.5 * r2 / total + 0.5 * r2 / v  # log(L / L0)
        log_c = s_msg.logpdf_unconstrained(u) + np.log(h)
        shift = np.maximum(0.0, np.max(log_c + log_l, axis=1, keepdims=True))  # all terms times e^-shift
        cl, c = np.exp(log_c + log_l - shift), np.exp(log_c - shift)
        d = (m - y) * noise / total  # E[eta | s] - y
        cond_var = np.where(np.isfinite(noise), v * noise / total, v)
        z = np.exp(-shift[:, 0]) + np.sum(cl - c, axis=1)
        e_d = np.sum(cl * d, axis=1) / z
        var_eta = np.sum(cl * (cond_var + d**2), axis=1) / z - e_d**2
        e_log_s = (np.exp(-shift[:, 0]) * (digamma(alpha) - np.log(beta)) + np.sum((cl - c) * u, axis=1)) / z
        e_s = (np.exp(-shift[:, 0]) * alpha / beta + np.sum((cl - c) * np.exp(u), axis=1)) / z
        log_z = -0.5 * np.log(2 * np.pi * v[:, 0]) - 0.5 * r2[:, 0] / v[:, 0] + np.log(z) + shift[:, 0]
    return y[:, 0] + e_d, var_eta, e_log_s, e_s, log_z


class NormalScaleMethod:
    """Tilted beliefs of ``(eta, s)`` for a Normal factor with a latent scale.

    Parameters
    ----------
    link : {"scale", "precision", "variance"}
        ``sd = s``, ``sd = s ** -0.5`` or ``sd = s ** 0.5``.
    """

    # the zoom and the closed-form flat tail for vague cavities (class attributes, so that a
    # benchmark's ablation can turn them off: benchmarks/vague_priors_vs_nuts.py)
    max_zooms = _MAX_ZOOMS
    max_log_noise_step = MAX_LOG_NOISE_STEP

    def __init__(self, link: str):
        if link not in _NOISE_POWER:
            raise ValueError(f"link must be one of {sorted(_NOISE_POWER)}, got {link!r}")
        self.link = link
        self.n_calls = 0

    def __call__(self, messages: Sequence[ExponentialFamily]) -> Answer:
        if isinstance(messages[1], Beta):
            return self._unit_scale(messages)
        s_msg = messages[1]
        m, v, y, u, logw = self._nodes(messages, lambda u: u)  # u: (B, K) nodes in log s
        w, e_eta, var_eta = self._eta_given_scale(logw, u, m, v, y)
        e_log_s = np.sum(w * u, axis=1)
        with np.errstate(over="ignore", invalid="ignore"):  # nodes of no weight beyond exp's range
            e_s = np.sum(np.where(w > 0, w * np.exp(u), 0.0), axis=1)
        power = _NOISE_POWER[self.link]
        coarse = unresolved_rows(u, power, self.max_log_noise_step)
        if coarse.size:
            e_eta[coarse], var_eta[coarse], e_log_s[coarse], e_s[coarse], _ = flat_tail(
                s_msg[coarse], m[coarse], v[coarse], y[coarse], power)
        ok = np.isfinite(e_eta) & np.isfinite(var_eta) & (var_eta > 0) & np.isfinite(e_s)
        eta_belief = Gaussian(np.where(ok, e_eta, 0.0), np.where(ok, var_eta, 1.0))
        stats = np.stack([np.where(ok, e_log_s, 0.0), np.where(ok, e_s, 1.0)], axis=1)
        # Jensen's gap must be positive for a proper Gamma; anything else is round-off
        ok &= np.log(stats[:, 1]) - stats[:, 0] > 1e-12
        safe = np.where(ok[:, None], stats, np.array([0.0, 1.5]))
        s_belief = Gamma.project(safe, "tilted scale")
        nat_eta = np.where(ok[:, None], eta_belief.natural, np.nan)
        nat_s = np.where(ok[:, None], s_belief.natural, np.nan)
        return Answer((Gaussian.from_natural(nat_eta), Gamma.from_natural(nat_s)), ok)

    def _nodes(self, messages: Sequence[ExponentialFamily],
               log_scale: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, ...]:
        """The cavity mean and variance of ``eta`` and the observation, as columns, the scale's
        quadrature nodes (B, K) in its unconstrained coordinate ``u``, zoomed onto the tilted
        law (``log_scale(u)`` is ``log s`` there), and the law's unnormalised log quadrature
        weights at them; counts the call."""
        eta_msg, s_msg, y_msg = messages
        self.n_calls += len(eta_msg)
        m, v = eta_msg.mean()[:, None], eta_msg.var()[:, None]
        y = np.asarray(y_msg.value, dtype=float)[:, None]

        def log_weight(u, rows):
            with np.errstate(over="ignore", invalid="ignore"):
                total = v[rows] + self._noise(log_scale(u))
                return s_msg[rows].logpdf_unconstrained(u) - 0.5 * np.log(total) - 0.5 * (y[rows] - m[rows]) ** 2 / total

        u, _, logw = tilted_nodes(s_msg, log_weight, self.max_zooms)
        return m, v, y, u, logw

    def _noise(self, log_s: np.ndarray) -> np.ndarray:
        """The noise variance at ``log s`` (``inf`` beyond float range)."""
        with np.errstate(over="ignore"):
            return np.exp(_NOISE_POWER[self.link] * log_s)

    def _eta_given_scale(self, logw: np.ndarray, log_s: np.ndarray, m: np.ndarray, v: np.ndarray,
                         y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Normalised quadrature weights over the scale's nodes, and the mean and variance of ``eta``.

        ``logw`` are the unnormalised log weights at the nodes (B, K) in the integration
        coordinate (:meth:`_nodes`) and ``log_s`` the scale there; ``eta`` given each node is
        the Gaussian of the module's docstring, and its moments mix those over the weights.
        """
        noise = self._noise(log_s)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            total = v + noise
            logw = logw - logw.max(axis=1, keepdims=True)
            w = np.exp(logw)
            w /= w.sum(axis=1, keepdims=True)
            cond_mean = m + v / total * (y - m)
            cond_var = np.where(np.isfinite(noise), v * noise / total, v)  # v at noise beyond float range
        e_eta = np.sum(w * cond_mean, axis=1)
        var_eta = np.sum(w * (cond_var + (cond_mean - e_eta[:, None]) ** 2), axis=1)
        return w, e_eta, var_eta

    def _unit_scale(self, messages: Sequence[ExponentialFamily]) -> Answer:
        """The same for a scale on (0, 1) with a Beta message: the integral in ``logit s``.

        A scale ``sigma ~ pm.Uniform(0, 50)`` (Statistical Rethinking's habit) is fitted as
        ``50 * u`` with ``u ~ Uniform(0, 1)``, a Beta latent, and the Normal factor, divided
        by 50, has the scale ``u`` (see ``_try_normal_scale``). Without a Beta version it was a
        2-D quadrature factor (43 s for a cubic regression, N = 60, where NUTS took 6-19 s).
        """
        m, v, y, u, logw = self._nodes(messages, lambda u: Beta.sufficient_statistics_unconstrained(u)[..., 0])
        stats_u = Beta.sufficient_statistics_unconstrained(u)  # log s, log(1 - s), exact in u
        w, e_eta, var_eta = self._eta_given_scale(logw, stats_u[..., 0], m, v, y)
        stats = np.einsum("bk,bkj->bj", w, stats_u)
        ok = np.isfinite(e_eta) & np.isfinite(var_eta) & (var_eta > 0) & np.all(np.isfinite(stats), axis=1)
        # a proper Beta needs E[s] + E[1 - s] beyond exp(E log s) + exp(E log(1 - s)): Jensen's
        # gap, round-off where it is not
        with np.errstate(invalid="ignore"):
            ok &= np.exp(stats[:, 0]) + np.exp(stats[:, 1]) < 1.0 - 1e-12
        eta_belief = Gaussian(np.where(ok, e_eta, 0.0), np.where(ok, var_eta, 1.0))
        safe = np.where(ok[:, None], stats, np.log([0.5, 0.4]))
        s_belief = Beta.project(safe, "tilted scale")
        nat_eta = np.where(ok[:, None], eta_belief.natural, np.nan)
        nat_s = np.where(ok[:, None], s_belief.natural, np.nan)
        return Answer((Gaussian.from_natural(nat_eta), Beta.from_natural(nat_s)), ok)
