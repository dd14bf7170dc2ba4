"""Dense references: a Normal factor with a latent Gamma scale; draws of two scalars against a grid."""

from __future__ import annotations

import numpy as np
from scipy import special


def tilted_by_dense_grid(m, v, y, shape, rate, power, n=4_000_001):
    """``E[eta]``, ``Var[eta]``, ``E[log s]``, ``E[s]`` and ``log Z`` of ``N(y; eta, s^power)
    N(eta; m, v) Gamma(s; shape, rate)``, by the trapezoid rule on millions of nodes in ``log s`` spanning
    the Gamma's whole support (``80 / shape`` units below 0: ``exp(shape u)`` is its lower tail),
    ``eta`` in closed form. (Adaptive quadrature, scipy's quad, lost the tail of a
    Gamma(0.001, 0.001) over its 80,000 units and missed by up to 8%.)"""
    u = np.linspace(-80.0 / min(shape, 1.0), np.log((shape + 80.0) / rate), n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # noise beyond float range
        noise = np.exp(power * u)
        total = v + noise
        log_w = shape * u - rate * np.exp(u) - 0.5 * np.log(total) - 0.5 * (y - m) ** 2 / total
        top = np.max(log_w[np.isfinite(log_w)])
        w = np.exp(log_w - top)
        w = np.where(np.isfinite(w), w, 0.0)
        # log Z: the Gamma's and the Normal's constants, the trapezoid's spacing
        log_z = (top + np.log(w.sum() * (u[1] - u[0])) + shape * np.log(rate) - special.gammaln(shape)
                 - 0.5 * np.log(2 * np.pi))
        w /= w.sum()
        mean = m + v / total * (y - m)
        e_eta = w @ mean
        var = w @ (v / (1.0 + v / noise) + (mean - e_eta) ** 2)
        e_s = np.sum(np.where(w > 0, w * np.exp(u), 0.0))
    return e_eta, var, w @ u, e_s, log_z


def assert_draws_match_grid(draws, logp, A, B, sd_rel, min_corr):
    """Check draws ``(n, 2)`` of two scalars against their exact law ``logp`` on the grid ``A``,
    ``B`` (``np.meshgrid(..., indexing="ij")``): means within 0.07 sds, sds within ``sd_rel``,
    and the correlation (at least ``min_corr`` in the law) within 0.04."""
    w = np.exp(logp - logp.max())
    w /= w.sum()
    moments = []
    for k, x in enumerate((A, B)):
        mean = float(np.sum(w * x))
        sd = float(np.sqrt(np.sum(w * (x - mean) ** 2)))
        moments.append((mean, sd))
        assert abs(draws[:, k].mean() - mean) < 0.07 * sd, k
        assert abs(draws[:, k].std() / sd - 1) < sd_rel, k
    (ma, sa), (mb, sb) = moments
    rho = float(np.sum(w * (A - ma) * (B - mb))) / (sa * sb)
    assert rho > min_corr
    assert abs(np.corrcoef(draws.T)[0, 1] - rho) < 0.04
