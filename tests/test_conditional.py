"""Posterior draws of the real latents given the scales they are Normal under (pmkjit.ep.conditional)."""

from __future__ import annotations

import numpy as np
import pymc as pm
from scipy import integrate, stats

import pmkjit
from pmkjit.ep import conditional


def _hierarchy(non_centred: bool):
    """Groups' means a_k ~ N(0, tau), y_ik ~ N(a_k, 1), tau ~ HalfNormal(1): exact by 1-D quadrature."""
    rng = np.random.default_rng(4)
    K, per = 5, 8
    group = np.repeat(np.arange(K), per)
    y = rng.normal(rng.normal(0.0, 0.6, K)[group], 1.0)
    with pm.Model() as model:
        tau = pm.HalfNormal("tau", 1.0)
        if non_centred:
            z = pm.Normal("z", 0.0, 1.0, shape=K)
            a = pm.Deterministic("a", tau * z)
        else:
            a = pm.Normal("a", 0.0, tau, shape=K)
        pm.Normal("y", a[group], 1.0, observed=y)
    return model, y, group, K, per


def _exact(y, group, K, per):
    """Posterior moments of tau, a_k and z_k = a_k / tau by quadrature over tau."""
    ybar = np.array([y[group == k].mean() for k in range(K)])

    def density(t):
        return stats.halfnorm.pdf(t) * np.prod(stats.norm.pdf(ybar, 0.0, np.sqrt(t**2 + 1.0 / per)))

    def conditional(t):  # a_k | tau, y ~ N(m, v)
        v = 1.0 / (per + 1.0 / t**2)
        return v * per * ybar, v

    norm = integrate.quad(density, 0, 20, limit=200)[0]

    def moment(f):
        return np.array([integrate.quad(lambda t: density(t) * np.atleast_1d(f(t))[i], 1e-9, 20, limit=200)[0]
                         for i in range(np.atleast_1d(f(1.0)).size)]) / norm

    out = {}
    e1, e2 = moment(lambda t: t), moment(lambda t: t**2)
    out["tau"] = (e1, np.sqrt(e2 - e1**2))
    e1 = moment(lambda t: conditional(t)[0])
    e2 = moment(lambda t: conditional(t)[1] + conditional(t)[0] ** 2)
    out["a"] = (e1, np.sqrt(e2 - e1**2))
    e1 = moment(lambda t: conditional(t)[0] / t)
    e2 = moment(lambda t: (conditional(t)[1] + conditional(t)[0] ** 2) / t**2)
    out["z"] = (e1, np.sqrt(e2 - e1**2))
    return out


def _moments(idata, name):
    x = idata.posterior[name].values.reshape(-1, *idata.posterior[name].shape[2:])
    return x.mean(0), x.std(0)


def test_non_centred_effect_draws_match_the_exact_posterior():
    # EP's factorised q left z = a / tau a ratio of independent draws: sd 1.5-3 times the
    # posterior's. Drawn given tau (tau reweighted to its marginal), z is right.
    model, y, group, K, per = _hierarchy(non_centred=True)
    idata = pmkjit.fit(model=model, random_seed=1, draws=2000, chains=2, progressbar=False)
    assert idata.ep.attrs["centred"] == "z"
    assert idata.ep.attrs["scale_pareto_k"] <= 0.7
    exact = _exact(y, group, K, per)
    # (tau's marginal reaches the exact one up to the Gamma site standing in for its
    # HalfNormal prior: sd ratios 1.00-1.07 over 11 seeds, mean 1.03)
    for name in ("z", "a", "tau"):
        mean, sd = _moments(idata, name)
        m0, s0 = exact[name]
        np.testing.assert_array_less(np.abs(mean - m0) / s0, 0.08, err_msg=name)
        np.testing.assert_allclose(sd / s0, 1.0, atol=0.1, err_msg=name)
    # each draw is one draw of the model: a = tau * z holds draw by draw
    np.testing.assert_allclose(idata.posterior["a"], idata.posterior["tau"] * idata.posterior["z"], atol=1e-9)


def test_group_effects_shrink_with_the_scale_in_each_draw():
    # the funnel: |a_k| is small where tau is; EP's joint draws had them independent
    model, *_ = _hierarchy(non_centred=False)
    idata = pmkjit.fit(model=model, random_seed=2, draws=1000, chains=2, progressbar=False)
    tau = idata.posterior["tau"].values.ravel()
    spread = np.abs(idata.posterior["a"].values).mean(-1).ravel()
    assert stats.spearmanr(tau, spread)[0] > 0.3


def test_draws_fall_back_to_eps_joint_gaussian_beyond_the_work_budget(monkeypatch):
    model, *_ = _hierarchy(non_centred=False)
    monkeypatch.setattr(conditional, "_MAX_WORK", 1.0)
    idata = pmkjit.fit(model=model, random_seed=2, draws=500, chains=2, progressbar=False)
    assert "scale_pareto_k" not in idata.ep.attrs
    tau = idata.posterior["tau"].values.ravel()
    spread = np.abs(idata.posterior["a"].values).mean(-1).ravel()
    assert abs(stats.spearmanr(tau, spread)[0]) < 0.15  # independent, as EP's q has them


def test_model_without_latent_scales_draws_from_eps_joint_gaussian():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 1.0, shape=2)
        pm.Normal("y", w[0] + w[1] * x, 0.5, observed=1.0 + 2.0 * x + rng.normal(0, 0.5, 30))
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False)
    assert "scale_pareto_k" not in idata.ep.attrs
