"""Posterior draws of the real latents given the scales they are Normal under (pmkjit.ep.conditional)."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import integrate, stats

import pmkjit
from pmkjit.ep import conditional


def _hierarchy(non_centred: bool, form: str = "standard"):
    """Groups' means a_k ~ N(0, tau), y_ik ~ N(a_k, 1), tau ~ HalfNormal(1): exact by 1-D quadrature.

    ``form``: ``"prior sd"`` writes ``a = tau * z`` with ``z ~ N(0, 2)`` and ``"scale factor"``
    ``a = 2 * tau * z`` (both a_k ~ N(0, 2 tau)).
    """
    rng = np.random.default_rng(4)
    K, per = 5, 8
    group = np.repeat(np.arange(K), per)
    y = rng.normal(rng.normal(0.0, 0.6, K)[group], 1.0)
    with pm.Model() as model:
        tau = pm.HalfNormal("tau", 1.0)
        if non_centred:
            z = pm.Normal("z", 0.0, 2.0 if form == "prior sd" else 1.0, shape=K)
            a = pm.Deterministic("a", (2.0 * tau if form == "scale factor" else tau) * z)
        else:
            a = pm.Normal("a", 0.0, tau, shape=K)
        pm.Normal("y", a[group], 1.0, observed=y)
    return model, y, group, K, per


def _exact(y, group, K, per, c=1.0, z_per_a=None):
    """Posterior moments of tau, a_k and z_k = a_k / tau by quadrature over tau.

    ``a_k ~ N(0, c tau)``; ``z_k = z_per_a(tau) * a_k`` (``1 / tau`` by default).
    """
    ybar = np.array([y[group == k].mean() for k in range(K)])
    z_per_a = z_per_a or (lambda t: 1.0 / t)

    def density(t):
        return stats.halfnorm.pdf(t) * np.prod(stats.norm.pdf(ybar, 0.0, np.sqrt((c * t) ** 2 + 1.0 / per)))

    def conditional(t):  # a_k | tau, y ~ N(m, v)
        v = 1.0 / (per + 1.0 / (c * t) ** 2)
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
    e1 = moment(lambda t: conditional(t)[0] * z_per_a(t))
    e2 = moment(lambda t: (conditional(t)[1] + conditional(t)[0] ** 2) * z_per_a(t) ** 2)
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
    assert idata.ep.attrs["draws_given_scales"] == "reweighted" and idata.ep.attrs["scale_pareto_k"] <= 0.7
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


@pytest.mark.parametrize("written", ["sqrt", "power"])
def test_a_hierarchical_variance_is_semi_analytic_and_its_draws_match_the_exact_posterior(written):
    # a_k ~ N(0, sqrt(v)) with v ~ InverseGamma (the BUGS habit) was a black-box prior of a
    # and v: v's posterior sd came out 0.79 of NUTS's on 8 groups, 0.70 on the eight schools
    # (robustness round 31), unwarned. With sd = v ** 0.5 it is the semi-analytic Normal
    # factor, and the draws are made given v, v reweighted to its marginal.
    rng = np.random.default_rng(4)
    K, per = 5, 8
    group = np.repeat(np.arange(K), per)
    y = rng.normal(rng.normal(0.0, 0.6, K)[group], 1.0)
    with pm.Model() as model:
        v = pm.InverseGamma("v", 2.0, 1.0)
        a = pm.Normal("a", 0.0, pm.math.sqrt(v) if written == "sqrt" else v**0.5, shape=K)
        pm.Normal("y", a[group], 1.0, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, draws=2000, chains=2, progressbar=False)
    assert "a: semi-analytic" in idata.ep.attrs["factor_methods"]
    assert idata.ep.attrs["draws_given_scales"] == "reweighted"
    # the exact posterior by quadrature over v: tau = sqrt(v), c = 1 in _exact, with v's
    # prior in place of the HalfNormal
    ybar = np.array([y[group == k].mean() for k in range(K)])

    def density(t):
        return stats.invgamma.pdf(t, 2.0, scale=1.0) * np.prod(stats.norm.pdf(ybar, 0.0, np.sqrt(t + 1.0 / per)))

    norm = integrate.quad(density, 0, 30, limit=200)[0]
    e1, e2 = (integrate.quad(lambda t: density(t) * t**k, 0, 30, limit=200)[0] / norm for k in (1, 2))
    post_a = [integrate.quad(lambda t: density(t) * (per * ybar[0] / (per + 1 / t)) ** k, 1e-9, 30, limit=200)[0] / norm
              for k in (1, 2)]
    mean, sd = _moments(idata, "v")
    v_sd = np.sqrt(e2 - e1**2)
    assert abs(mean - e1) < 0.08 * v_sd and abs(sd / v_sd - 1) < 0.1
    a_mean, a_sd = _moments(idata, "a")
    cond_var = integrate.quad(lambda t: density(t) / (per + 1 / t), 1e-9, 30, limit=200)[0] / norm
    a0_sd = np.sqrt(cond_var + post_a[1] - post_a[0] ** 2)
    assert abs(a_mean[0] - post_a[0]) < 0.08 * a0_sd and abs(a_sd[0] / a0_sd - 1) < 0.1


def test_the_defensive_proposal_is_a_normalised_density_that_covers_a_polynomial_tail(monkeypatch):
    # The proposal's log densities weigh the scales' draws: importance weights of an
    # InverseGamma(3, 2) target (mean 1, a polynomial tail) against the proposal built on a
    # Gamma(3, 3) marginal (mean 1, an exponential tail) have mean 1 (the proposal is
    # normalised, Jacobian and truncation included) and a Pareto k below 0.7. Without the
    # defensive component the weights have no bound.
    import arviz as az
    from scipy import stats as st

    from pmkjit.families import Gamma

    q = Gamma(np.array([3.0]), np.array([3.0])).natural
    body, near_zero = conditional._proposal(q, np.zeros_like(q), np.zeros((1, 2), bool))
    target = st.invgamma(3.0, scale=2.0)
    for heavy, bounded in ((conditional._HEAVY, True), (1e-12, False)):
        monkeypatch.setattr(conditional, "_HEAVY", heavy)
        x, log_q = conditional._draw_proposal(Gamma, body, near_zero, 200_000, np.random.default_rng(0))
        log_w = target.logpdf(x[:, 0]) - log_q[:, 0]
        with np.errstate(over="ignore"):  # (arviz's Pareto fit, as in conditional_draws)
            _, k = az.psislw(log_w)
        assert (float(k) < 0.7) == bounded
        if bounded:
            w = np.exp(log_w)
            assert abs(w.mean() - 1.0) < 0.02 and abs(np.sum(w * x[:, 0]) / w.sum() - 1.0) < 0.03
    # and on the gallery's named non-centred model (an untruncated component once drew a scale
    # e^-37 times the body's, a conditional precision was singular and the reweighting lost)
    rng = np.random.default_rng(5)
    x = rng.normal(size=60)
    rng.choice(60, 8, replace=False)  # (the gallery's draw of its missing entries: the same data)
    g = rng.integers(0, 5, 60)
    y = rng.normal(size=5)[g] + 0.5 * x + 0.6 * rng.normal(size=60)
    with pm.Model(coords={"group": range(5)}) as model:
        mu, tau, s = pm.Normal("mu", 0, 3), pm.HalfNormal("tau", 2), pm.HalfNormal("s", 2)
        b = pm.Normal("b", 0, 2)
        z = pm.Normal("z", 0, 1, dims="group")
        a = pm.Deterministic("a", mu + tau * z, dims="group")
        pm.Normal("y", a[g] + b * x, s, observed=y)
    monkeypatch.setattr(conditional, "_HEAVY", 0.1)
    idata = pmkjit.fit(model=model, random_seed=5, progressbar=False, compute_log_likelihood=False)
    assert idata.ep.attrs["draws_given_scales"] == "reweighted"
    assert np.all(idata.posterior["z"].values.reshape(-1, 5).std(axis=0) < 0.9)  # 1.6-2.2 when lost


@pytest.mark.parametrize("form", ["prior sd", "scale factor"])
def test_a_constant_factor_in_the_non_centred_scale_keeps_the_prior_semi_analytic(form):
    # a = tau * z with z ~ N(0, 2), or a = 2 * tau * z: centred as Normal(0, 2 * tau), a
    # black box (importance sampling, not converged in 50 sweeps) whose z was drawn from EP's
    # factorised q, sds 1.5-2 times NUTS's. The centred latent is now a / 2 ~ Normal(0, tau).
    model, y, group, K, per = _hierarchy(non_centred=True, form=form)
    idata = pmkjit.fit(model=model, random_seed=1, draws=2000, chains=2, progressbar=False)
    attrs = idata.ep.attrs
    assert attrs["centred"] == "z" and attrs["converged"] and attrs["scale_pareto_k"] <= 0.7
    assert "__pmkjit_centred_z: semi-analytic" in attrs["factor_methods"]
    assert list(idata.posterior.data_vars) == ["z", "tau", "a"]
    exact = _exact(y, group, K, per, c=2.0, z_per_a=(lambda t: 1.0 / t) if form == "prior sd" else
                   (lambda t: 0.5 / t))
    for name in ("z", "a", "tau"):
        mean, sd = _moments(idata, name)
        m0, s0 = exact[name]
        np.testing.assert_array_less(np.abs(mean - m0) / s0, 0.1, err_msg=name)
        np.testing.assert_allclose(sd / s0, 1.0, atol=0.12, err_msg=name)
    factor = 2.0 if form == "scale factor" else 1.0
    np.testing.assert_allclose(idata.posterior["a"], factor * idata.posterior["tau"] * idata.posterior["z"],
                               atol=1e-9)


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
    assert "scale_pareto_k" not in idata.ep.attrs and idata.ep.attrs["draws_given_scales"] == "no"
    tau = idata.posterior["tau"].values.ravel()
    spread = np.abs(idata.posterior["a"].values).mean(-1).ravel()
    assert abs(stats.spearmanr(tau, spread)[0]) < 0.15  # independent, as EP's q has them


def test_a_centred_z_drawn_beyond_the_work_budget_is_warned_about(monkeypatch):
    # radon with varying intercepts and slopes written non-centred (85 counties, D = 172) is
    # beyond the budget: the slopes' z = (b - mu_b) / sigma_b came out of independent draws
    # of b and sigma_b with sds 4-10 times NUTS's, silently (robustness round 12)
    model, *_ = _hierarchy(non_centred=True)
    monkeypatch.setattr(conditional, "_MAX_WORK", 1.0)
    with pytest.warns(UserWarning, match=r"^z: the non-centred effect was fitted centred, but the draws given "
                                         r"the scales were not made .*5 real latents"):
        idata = pmkjit.fit(model=model, random_seed=2, draws=200, chains=2, progressbar=False)
    assert idata.ep.attrs["draws_given_scales"] == "no"


def test_model_without_latent_scales_draws_from_eps_joint_gaussian():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 1.0, shape=2)
        pm.Normal("y", w[0] + w[1] * x, 0.5, observed=1.0 + 2.0 * x + rng.normal(0, 0.5, 30))
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False)
    assert "scale_pareto_k" not in idata.ep.attrs


def _fitted_graph_and_state(model):
    """The factor graph and EP state pmkjit.fit ends with (captured at the draws)."""
    import importlib

    fit_module = importlib.import_module("pmkjit.inference_data")  # where fit's draws are made
    seen = {}
    original = fit_module.conditional_draws

    def spy(graph, state, scales, n, rng):
        seen.update(graph=graph, state=state)
        return original(graph, state, scales, n, rng)

    fit_module.conditional_draws = spy
    try:
        pmkjit.fit(model=model, random_seed=1, draws=20, progressbar=False)
    finally:
        fit_module.conditional_draws = original
    return seen["graph"], seen["state"]


def test_one_scale_eigendecomposition_equals_a_cholesky_per_draw():
    # one scale element: P_j = P_ref + (w_j - w_ref) G in one eigenbasis, O(D^2) per draw;
    # the general path (a Cholesky per draw) must give the same log Z and the same law
    graph, state = _fitted_graph_and_state(_hierarchy(non_centred=False)[0])
    factors = [(fi, f) for fi, f in enumerate(graph.factors) if f.analytic in conditional.SEMI_ANALYTIC]
    columns = conditional._columns(factors)
    assert len(columns) == 1
    one = conditional._Conditional(graph, state, factors, columns)
    two = conditional._Conditional(graph, state, factors, columns)
    # the same blocks plus a column with nothing in it: the Cholesky path
    two.G, two.g = np.concatenate([two.G, 0 * two.G]), np.concatenate([two.g, 0 * two.g])
    two.counts, two.squares = np.r_[two.counts, 0.0], np.r_[two.squares, 0.0]
    rng = np.random.default_rng(0)
    W = rng.gamma(3.0, 1.0, (6, 1))
    log_z1, _ = one.evidence(W)
    log_z2, v = two.evidence(np.c_[W, np.ones(6)])
    np.testing.assert_allclose(log_z1, log_z2, rtol=0, atol=1e-10)
    # both draw theta = m + B z, each with its own square root B of the same covariance
    # (an eigenbasis against a Cholesky factor), so compare the laws, not the draws: the
    # mean at z = 0 and the covariance B B^T from the unit vectors
    D = graph.n_theta
    z = np.vstack([np.zeros(D), np.eye(D)])
    Wb = np.repeat(W[:1], D + 1, axis=0)
    a = one.sample(Wb, None, z)
    b = two.sample(np.c_[Wb, np.ones(D + 1)], np.repeat(v[:1], D + 1, axis=0), z)
    np.testing.assert_allclose(a[0], b[0], atol=1e-10)
    Ba, Bb = (a[1:] - a[0]).T, (b[1:] - b[0]).T
    np.testing.assert_allclose(Ba @ Ba.T, Bb @ Bb.T, atol=1e-10)


def test_many_groups_with_one_scale_are_drawn_given_the_scale():
    # D = 151 real latents: beyond a Cholesky per draw (4 n D^3 > 1e10), within the
    # one-scale eigendecomposition; the funnel is kept
    rng = np.random.default_rng(3)
    G, N = 150, 600
    g = rng.integers(0, G, N)
    y = rng.normal(rng.normal(0.0, 0.3, G)[g], 1.0)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=G)
        pm.Normal("y", a[g], 1.0, observed=y)
    idata = pmkjit.fit(model=model, random_seed=0, draws=1000, chains=2, progressbar=False)
    assert idata.ep.attrs["scale_pareto_k"] <= 0.7
    tau = idata.posterior["tau"].values.ravel()
    spread = np.abs(idata.posterior["a"] - idata.posterior["mu"]).values.mean(-1).ravel()
    assert stats.spearmanr(tau, spread)[0] > 0.5


def test_many_scale_elements_fall_back_to_eps_joint_gaussian_quickly():
    # a scale per observation (a Student-t as a Normal scale mixture): importance weights
    # over 300 dimensions degenerate (Pareto k 27 at N = 2,000), and building them cost
    # 7.7 s and 1 GB before they were thrown away
    rng = np.random.default_rng(1)
    N = 300
    X = rng.normal(size=(N, 3))
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 2.0, shape=3)
        lam = pm.HalfNormal("lam", 1.0, shape=N)
        pm.Normal("y", X @ w, lam, observed=X @ np.array([1.0, -1.0, 0.5]) + rng.standard_t(3, N))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 sweeps: only the draws are under test
        idata = pmkjit.fit(model=model, random_seed=0, draws=200, progressbar=False, max_sweeps=3)
    assert idata.ep.attrs["draws_given_scales"] == "no"
    assert idata.ep.attrs["seconds_draws"] < 2.0


def test_beyond_the_reweighting_budget_draws_are_still_made_given_the_scales(monkeypatch):
    # two scales (tau and the noise sd) beyond the budget of a Cholesky per proposal: one
    # per draw, given EP's scale marginals (radon with non-centred varying intercepts and
    # slopes, D = 172: z within 0.08 NUTS sd, sd ratios 0.95-1.05, where EP's joint draws
    # gave the slopes' z 4-10 times NUTS's sd)
    rng = np.random.default_rng(5)
    g = rng.integers(0, 6, 90)
    with pm.Model() as model:
        mu, tau, s = pm.Normal("mu", 0.0, 2.0), pm.HalfNormal("tau", 1.0), pm.HalfNormal("s", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=6)
        pm.Normal("y", mu + tau * z[g], s, observed=rng.normal(rng.normal(0.0, 0.5, 6)[g], 1.0))
    monkeypatch.setattr(conditional, "_MAX_WORK", 1.0)
    idata = pmkjit.fit(model=model, random_seed=0, draws=1000, progressbar=False)
    assert idata.ep.attrs["draws_given_scales"] == "given EP's scale marginals"
    tau = idata.posterior["tau"].values.ravel()
    spread = np.abs(idata.posterior["z"].values * idata.posterior["tau"].values[..., None]).mean(-1).ravel()
    assert stats.spearmanr(tau, spread)[0] > 0.3
