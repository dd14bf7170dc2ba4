"""The semi-analytic Normal factor with a latent scale, against a dense one-dimensional grid."""

from __future__ import annotations

import numpy as np
import pytest

from pmkjit.ep.normal_scale import NormalScaleMethod, noise_power
from pmkjit.families import Gamma, Gaussian, PointMass


def _tilted_by_dense_grid(m, v, y, shape, rate, power, n=4_000_001):
    """``E[eta]``, ``Var[eta]``, ``E[log s]``, ``E[s]`` of ``N(y; eta, s^power) N(eta; m, v)
    Gamma(s; shape, rate)``, by the trapezoid rule on millions of nodes in ``log s`` spanning
    the Gamma's whole support (``80 / shape`` units below 0: ``exp(shape u)`` is its lower tail),
    ``eta`` in closed form. (Adaptive quadrature, scipy's quad, lost the tail of a
    Gamma(0.001, 0.001) over its 80,000 units and missed by up to 8%.)"""
    u = np.linspace(-80.0 / min(shape, 1.0), np.log((shape + 80.0) / rate), n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # noise beyond float range
        noise = np.exp(power * u)
        total = v + noise
        log_w = shape * u - rate * np.exp(u) - 0.5 * np.log(total) - 0.5 * (y - m) ** 2 / total
        w = np.exp(log_w - np.max(log_w[np.isfinite(log_w)]))
        w = np.where(np.isfinite(w), w, 0.0)
        w /= w.sum()
        mean = m + v / total * (y - m)
        e_eta = w @ mean
        var = w @ (v / (1.0 + v / noise) + (mean - e_eta) ** 2)
        e_s = np.sum(np.where(w > 0, w * np.exp(u), 0.0))
    return e_eta, var, w @ u, e_s


@pytest.mark.parametrize("link", ["scale", "precision", "variance"])
@pytest.mark.parametrize("shape, rate, v, y", [
    (0.001, 0.001, 1e4, 0.8),    # BUGS's vague prior, first sweep: the likelihood reads a few units of log s
    (0.001, 0.44, 0.01, 0.3),    # the same a sweep later: the mean pinned down
    (0.01, 0.01, 1.0, 5.0),      # an outlier under a vague prior
    (2.0, 3.0, 0.5, 1.2),        # an informative cavity: the usual case
])
def test_tilted_moments_match_a_dense_grid(link, shape, rate, v, y):
    method = NormalScaleMethod(link)
    eta, s, obs = Gaussian(np.array([0.0]), np.array([v])), Gamma(np.array([shape]), np.array([rate])), \
        PointMass(np.array([y]))
    answer = method((eta, s, obs))
    assert answer.accepted.all()
    b_eta, b_s = answer.beliefs
    e_eta, var, e_log_s, e_s = _tilted_by_dense_grid(0.0, v, y, shape, rate, noise_power(f"normal-{link}"))
    np.testing.assert_allclose(b_eta.mean(), e_eta, rtol=1e-5, atol=1e-6 * np.sqrt(var))
    np.testing.assert_allclose(b_eta.var(), var, rtol=1e-5)
    # the Gamma belief matches E[log s] and E[s] (its projection)
    np.testing.assert_allclose(b_s.expected_sufficient_statistics()[0], [e_log_s, e_s], rtol=1e-5, atol=1e-8)
