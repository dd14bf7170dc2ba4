"""The semi-analytic Normal factor with a latent scale, against a dense one-dimensional grid."""

from __future__ import annotations

import numpy as np
import pytest

from pmkjit.ep.normal_scale import NormalScaleMethod, noise_power
from pmkjit.families import Gamma, Gaussian, PointMass

from _dense import tilted_by_dense_grid


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
    e_eta, var, e_log_s, e_s, _ = tilted_by_dense_grid(0.0, v, y, shape, rate, noise_power(f"normal-{link}"))
    np.testing.assert_allclose(b_eta.mean(), e_eta, rtol=1e-5, atol=1e-6 * np.sqrt(var))
    np.testing.assert_allclose(b_eta.var(), var, rtol=1e-5)
    # the Gamma belief matches E[log s] and E[s] (its projection)
    np.testing.assert_allclose(b_s.expected_sufficient_statistics()[0], [e_log_s, e_s], rtol=1e-5, atol=1e-8)
