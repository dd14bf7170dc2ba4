"""Categorical likelihoods with a softmax (multinomial logistic regression): joint sites."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy import special

import pmkjit
from pmkjit.ep.joint import JointQuadrature, joint_site, slot_sites
from pmkjit.errors import UnsupportedModelError
from pmkjit.graph import build_factor_graph


def test_slot_sites_and_joint_site_are_inverse():
    rng = np.random.default_rng(0)
    B, m = 5, 3
    M = rng.normal(size=(B, m, m))
    Lam = M + np.swapaxes(M, 1, 2)  # symmetric, of either sign, as a site may be
    h = rng.normal(size=(B, m))
    sites = slot_sites(Lam, h)
    assert len(sites) == m + m * (m - 1) // 2
    Lam2, h2 = joint_site(sites, m)
    np.testing.assert_allclose(Lam2, Lam, atol=1e-12)
    np.testing.assert_allclose(h2, h, atol=1e-12)


def _three_class_model(y, x):
    with pm.Model() as model:
        a = pm.Normal("a", 0, 2, shape=2)
        b = pm.Normal("b", 0, 2, shape=2)
        eta = pm.math.concatenate([pm.math.zeros((len(y), 1)), a + x[:, None] * b], axis=1)
        pm.Categorical("y", logit_p=eta, observed=y)
    return model


def test_joint_quadrature_matches_a_brute_force_grid():
    """Tilted moments of log softmax(0, e1, e2)[y] under a correlated Gaussian cavity."""
    y = np.array([0, 1, 2, 2])
    graph = build_factor_graph(_three_class_model(y, np.linspace(-1, 1, 4)))
    (f,) = graph.factors
    assert f.joint and len(f.pair_slots) == 1
    mean = np.array([[0.3, -0.5], [1.0, 2.0], [-1.0, 0.5], [4.0, -3.0]])
    cov = np.array([[[1.0, 0.4], [0.4, 2.0]], [[0.5, -0.2], [-0.2, 0.3]],
                    [[3.0, 1.5], [1.5, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    t_mean, t_cov, ok = JointQuadrature(f, np.random.default_rng(0))(mean, cov, np.arange(4))
    assert ok.all()
    for b in range(4):
        sd = np.sqrt(np.diag(cov[b]))
        g1 = np.linspace(mean[b, 0] - 10 * sd[0], mean[b, 0] + 10 * sd[0], 801)
        g2 = np.linspace(mean[b, 1] - 10 * sd[1], mean[b, 1] + 10 * sd[1], 801)
        E1, E2 = np.meshgrid(g1, g2, indexing="ij")
        E = np.stack([E1, E2], -1)
        d = E - mean[b]
        log_q = -0.5 * np.einsum("...i,ij,...j->...", d, np.linalg.inv(cov[b]), d)
        log_lik = special.log_softmax(np.stack([np.zeros_like(E1), E1, E2], -1), axis=-1)[..., y[b]]
        w = np.exp(log_q + log_lik - (log_q + log_lik).max())
        w /= w.sum()
        mu = np.einsum("ij,ijk->k", w, E)
        c = np.einsum("ij,ijk,ijl->kl", w, E - mu, E - mu)
        np.testing.assert_allclose(t_mean[b], mu, atol=1e-5 * sd.max())
        np.testing.assert_allclose(t_cov[b], c, atol=1e-4 * cov[b].max())


def _grid_posterior(log_post, axes):
    """Means and sds of every axis of a posterior tabulated on a product grid."""
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    grids = np.meshgrid(*axes, indexing="ij")
    mean = np.array([np.sum(w * g) for g in grids])
    sd = np.array([np.sqrt(np.sum(w * (g - m) ** 2)) for g, m in zip(grids, mean)])
    return mean, sd


def test_intercepts_with_a_reference_class_match_the_exact_posterior():
    """Factorised sites gave sds of 0.76 of the exact ones here: the classes' intercepts
    are correlated a posteriori (both are measured against the reference class)."""
    counts = np.array([14, 5, 9])
    y = np.repeat(np.arange(3), counts)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1.5, shape=2)
        pm.Categorical("y", p=pm.math.softmax(pm.math.concatenate([[0.0], a])), observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False)
    q = pmkjit.ep_posterior(idata)["a"]
    g = np.linspace(-5, 4, 451)
    A1, A2 = np.meshgrid(g, g, indexing="ij")
    logits = np.stack([np.zeros_like(A1), A1, A2], -1)
    log_post = special.log_softmax(logits, axis=-1) @ counts - (A1**2 + A2**2) / (2 * 1.5**2)
    mean, sd = _grid_posterior(log_post, [g, g])
    np.testing.assert_array_less(np.abs(q.mean() - mean) / sd, 0.05)
    np.testing.assert_allclose(np.sqrt(q.var()) / sd, 1.0, atol=0.05)
    assert idata.ep.attrs["converged"]


def test_a_latent_predictor_for_every_class_is_fitted_through_its_priors():
    """softmax is unchanged by a shift shared by all classes: that direction of the
    posterior is the prior's, which per-class sites lost (not converged, sds 0.3-0.5 of
    NUTS's on a regression with K = 3)."""
    counts = np.array([6, 11, 3])
    y = np.repeat(np.arange(3), counts)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1, shape=3)
        pm.Categorical("y", logit_p=a, observed=y)
    idata = pmkjit.fit(model=model, random_seed=2, progressbar=False)
    q = pmkjit.ep_posterior(idata)["a"]
    g = np.linspace(-4.5, 4.5, 91)
    A = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1)
    log_post = special.log_softmax(A, axis=-1) @ counts - 0.5 * np.sum(A**2, axis=-1)
    mean, sd = _grid_posterior(log_post, [g, g, g])
    np.testing.assert_array_less(np.abs(q.mean() - mean) / sd, 0.05)
    np.testing.assert_allclose(np.sqrt(q.var()) / sd, 1.0, atol=0.05)


def test_regression_result_has_predictive_and_log_likelihood():
    rng = np.random.default_rng(3)
    x = rng.normal(size=60)
    eta = np.column_stack([np.zeros(60), 0.5 + 1.5 * x, -0.5 - x])
    p = special.softmax(eta, axis=1)
    y = (rng.random(60)[:, None] > np.cumsum(p, axis=1)).sum(1)
    model = _three_class_model(y, x)
    idata = pmkjit.fit(model=model, random_seed=4, progressbar=False)
    assert idata.ep.attrs["factor_methods"] == "y: joint quadrature"
    assert idata.log_likelihood["y"].shape[-1] == 60
    b = idata.posterior["b"].mean(("chain", "draw")).values
    assert b[0] > 0.5 and b[1] < -0.3  # the signs of the true slopes 1.5 and -1
    with model:
        pp = pm.sample_posterior_predictive(idata, random_seed=5, progressbar=False)
    assert set(np.unique(pp.posterior_predictive["y"].values)) <= {0, 1, 2}
    again = pmkjit.fit(model=model, random_seed=4, progressbar=False)
    np.testing.assert_array_equal(again.posterior["a"].values, idata.posterior["a"].values)


def test_class_probabilities_that_are_no_softmax_are_refused_naming_the_variable():
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1, shape=3)
        e = pm.math.exp(a)
        pm.Categorical("y", p=e / e.sum(), observed=np.array([0, 1, 2, 1]))
    with pytest.raises(UnsupportedModelError, match=r"^y: CategoricalRV .*p=pm.math.softmax"):
        pmkjit.fit(model=model, random_seed=1, progressbar=False)
