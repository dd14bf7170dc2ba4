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

from collections.abc import Sequence

import numpy as np

from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian
from pmkjit.ep.methods import Answer

__all__ = ["NormalScaleMethod", "SEMI_ANALYTIC", "noise_power"]

_NOISE_POWER = {"scale": 2.0, "precision": -1.0, "variance": 1.0}  # sd^2 = s ** power
# the factors' ``analytic`` names (pmkjit.graph.factor_graph.BlackBoxFactor), one per link
SEMI_ANALYTIC = tuple(f"normal-{link}" for link in _NOISE_POWER)


def noise_power(analytic: str) -> float:
    """``p`` with the Normal's variance ``sd^2 = s ** p`` for a factor's ``analytic`` name
    (``"normal-scale"``: 2, ``"normal-precision"``: -1, ``"normal-variance"``: 1)."""
    return _NOISE_POWER[analytic.removeprefix("normal-")]
_NODES = 401
_HALF_WIDTH = 16.0  # cavity log-space standard deviations each side


def scale_nodes(q: ExponentialFamily) -> np.ndarray:
    """``(B, _NODES)`` trapezoid nodes for a scale message's unconstrained coordinate (``log s``
    of a Gamma, ``logit s`` of a Beta): ``_HALF_WIDTH`` of its exact sds each side of its mean."""
    mu_u, var_u = q.unconstrained_moments()
    return mu_u[:, None] + np.sqrt(var_u)[:, None] * np.linspace(-_HALF_WIDTH, _HALF_WIDTH, _NODES)


class NormalScaleMethod:
    """Tilted beliefs of ``(eta, s)`` for a Normal factor with a latent scale.

    Parameters
    ----------
    link : {"scale", "precision", "variance"}
        ``sd = s``, ``sd = s ** -0.5`` or ``sd = s ** 0.5``.
    """

    def __init__(self, link: str):
        if link not in _NOISE_POWER:
            raise ValueError(f"link must be one of {sorted(_NOISE_POWER)}, got {link!r}")
        self.link = link
        self.n_calls = 0

    def __call__(self, messages: Sequence[ExponentialFamily]) -> Answer:
        if isinstance(messages[1], Beta):
            return self._unit_scale(messages)
        s_msg = messages[1]
        m, v, y, u = self._nodes(messages)  # u: (B, K) nodes in log s
        w, e_eta, var_eta = self._eta_given_scale(s_msg.logpdf_unconstrained(u), u, m, v, y)
        e_log_s = np.sum(w * u, axis=1)
        e_s = np.sum(w * np.exp(u), axis=1)
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

    def _nodes(self, messages: Sequence[ExponentialFamily]) -> tuple[np.ndarray, ...]:
        """The cavity mean and variance of ``eta`` and the observation, as columns, and the scale's
        quadrature nodes (B, K) in its unconstrained coordinate; counts the call."""
        eta_msg, s_msg, y_msg = messages
        self.n_calls += len(eta_msg)
        m, v = eta_msg.mean()[:, None], eta_msg.var()[:, None]
        y = np.asarray(y_msg.value, dtype=float)[:, None]
        return m, v, y, scale_nodes(s_msg)

    def _eta_given_scale(self, log_prior: np.ndarray, log_s: np.ndarray, m: np.ndarray, v: np.ndarray,
                         y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Normalised quadrature weights over the scale's nodes, and the mean and variance of ``eta``.

        ``log_prior`` is the scale's cavity log-density at the nodes (B, K) in the integration
        coordinate and ``log_s`` the scale there; ``eta`` given each node is the Gaussian of
        the module's docstring, and its moments mix those over the weights.
        """
        noise = np.exp(_NOISE_POWER[self.link] * log_s)
        total = v + noise
        with np.errstate(over="ignore", invalid="ignore"):
            logw = log_prior - 0.5 * np.log(total) - 0.5 * (y - m) ** 2 / total
            logw -= logw.max(axis=1, keepdims=True)
        w = np.exp(logw)
        w /= w.sum(axis=1, keepdims=True)
        cond_mean = m + v / total * (y - m)
        cond_var = v * noise / total
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
        s_msg = messages[1]
        m, v, y, u = self._nodes(messages)  # u: (B, K) nodes in logit s
        stats_u = Beta.sufficient_statistics_unconstrained(u)  # log s, log(1 - s), exact in u
        w, e_eta, var_eta = self._eta_given_scale(s_msg.logpdf_unconstrained(u), stats_u[..., 0], m, v, y)
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
