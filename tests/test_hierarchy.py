"""One site for a hierarchical prior whose instances share their hyperparameters.

References are exact posteriors: the hyperparameters' marginal on a dense grid, each
instance's output integrated out in closed form or by 1-D quadrature given them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import special, stats

import pmkjit
from pmkjit.ep.hierarchy import collapsible_prior
from _dense import assert_draws_match_grid
from _graphs import factor as _factor


def _grid_moments(logp: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    w = np.exp(logp - logp.max())
    w /= w.sum()
    mean = float(w @ x)
    return mean, float(np.sqrt(w @ (x - mean) ** 2))


def test_which_priors_are_collapsed():
    obs = np.ones(5)  # the outputs are observed (a latent nothing reads is drawn from its prior)
    with pm.Model() as scales:  # one hyper-scale read by every group's scale
        pm.Normal("y", 0.0, pm.HalfNormal("sigma", pm.HalfNormal("s", 1.0), shape=5), observed=obs)
    with pm.Model() as rates:  # two hyperparameters
        pm.Poisson("y", pm.Gamma("theta", pm.Exponential("a", 1.0), pm.Gamma("b", 0.1, 1.0), shape=5), observed=obs)
    with pm.Model() as laplace:  # a Gaussian output (the coefficients), a latent scale
        pm.Normal("y", pm.Laplace("w", 0.0, pm.HalfCauchy("lam", 1.0), shape=5), 1.0, observed=obs)
    with pm.Model() as own:  # each instance its own hyperparameter: nothing shared
        pm.Normal("y", 0.0, pm.HalfNormal("sigma", pm.HalfNormal("s", 1.0, shape=5), shape=5), observed=obs)
    with pm.Model() as normal:  # a Normal's latent scale keeps its semi-analytic method
        pm.Normal("y", pm.Normal("u", pm.Normal("mu", 0.0, 1.0), pm.HalfNormal("tau", 1.0), shape=5), 1.0,
                  observed=obs)
    with pm.Model() as constant:  # no latent parameter
        pm.Normal("y", 0.0, pm.HalfNormal("sigma", 1.0, shape=5), observed=obs)
    assert collapsible_prior(_factor(scales, "sigma"))
    assert collapsible_prior(_factor(rates, "theta"))
    assert collapsible_prior(_factor(laplace, "w"))
    assert not collapsible_prior(_factor(own, "sigma"))
    assert not collapsible_prior(_factor(normal, "u"))
    assert not collapsible_prior(_factor(constant, "sigma"))


def test_a_hyper_scale_over_few_groups_matches_the_exact_posterior():
    # Instance-by-instance sites left s at 0.75 of NUTS's sd on a LogNormal model like this
    # one, converged and unwarned. With the observations' mean known, each group's likelihood
    # of its scale is sigma**-n exp(-SS / (2 sigma**2)); the seventh group has no data, so its
    # scale's posterior is the prior predictive E_s[HalfNormal(s)] (mean sqrt(2 / pi) E[s]).
    rng = np.random.default_rng(29)
    G, n = 6, 25
    g = np.repeat(np.arange(G), n)
    y = rng.normal(0.0, rng.gamma(4.0, 0.1, G)[g])
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        sigma = pm.HalfNormal("sigma", s, shape=G + 1)
        pm.Normal("y", 0.0, sigma[g], observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False)
    assert "sigma: collapsed prior" in idata.ep.attrs["factor_methods"]

    SS = np.bincount(g, y**2)
    s_grid = np.linspace(1e-3, 3.0, 1500)
    v = np.linspace(1e-3, 4.0, 8000)  # each group's scale, integrated out given s
    log_lik = -n * np.log(v)[None, :] - SS[:, None] / (2 * v[None, :] ** 2)  # (G, V)
    log_prior = stats.halfnorm.logpdf(v[None, :], scale=s_grid[:, None])  # (S, V)
    log_z = special.logsumexp(log_prior[:, None, :] + log_lik[None, :, :], axis=2)  # (S, G)
    logp = stats.halfnorm.logpdf(s_grid) + log_z.sum(axis=1)
    mean, sd = _grid_moments(logp, s_grid)
    draws = idata.posterior["s"].values.ravel()
    assert abs(draws.mean() - mean) < 0.05 * sd
    assert draws.std() == pytest.approx(sd, rel=0.07)
    # the draws keep the hyper-scale's correlation with the group scales, which EP's
    # independent marginals would leave at 0: the empty group's scale is s |Z|, whose
    # correlation with s is E|Z| sd(s) / sd(s |Z|)
    sig = idata.posterior["sigma"].values.reshape(-1, G + 1)
    e_abs = np.sqrt(2 / np.pi)
    rho = e_abs * sd / np.sqrt(mean**2 + sd**2 - (e_abs * mean) ** 2)
    assert np.corrcoef(draws, sig[:, G])[0, 1] == pytest.approx(rho, abs=0.08)
    assert sig[:, G].mean() == pytest.approx(e_abs * mean, rel=0.05)


def test_two_hyperparameters_of_poisson_rates_match_the_exact_posterior():
    # The BUGS pumps: theta_i ~ Gamma(alpha, beta), y_i ~ Poisson(theta_i t_i). Given (alpha,
    # beta) each y_i is negative binomial, so their exact law is a 2-D grid away; each theta_i
    # given them is Gamma(alpha + y_i, beta + t_i). Instance by instance, EP's sds of alpha and
    # beta were 0.71 and 0.72 of NUTS's.
    t = np.array([94.3, 15.7, 62.9, 126, 5.24, 31.4, 1.05, 1.05, 2.1, 10.5])
    y = np.array([5, 1, 5, 14, 3, 19, 1, 1, 4, 22])
    with pm.Model() as model:
        alpha = pm.Exponential("alpha", 1.0)
        beta = pm.Gamma("beta", 0.1, 1.0)
        theta = pm.Gamma("theta", alpha, beta, shape=10)
        pm.Poisson("y", theta * t, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False)
    assert "theta: collapsed prior" in idata.ep.attrs["factor_methods"]

    a, b = np.meshgrid(np.linspace(0.05, 4.0, 400), np.linspace(0.02, 6.0, 400), indexing="ij")
    a, b = a[..., None], b[..., None]
    log_nb = (special.gammaln(a + y) - special.gammaln(a) + a * np.log(b / (b + t)) + y * np.log(t / (b + t)))
    logp = stats.expon.logpdf(a[..., 0]) + stats.gamma.logpdf(b[..., 0], 0.1) + log_nb.sum(axis=-1)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    for name, x in (("alpha", a[..., 0]), ("beta", b[..., 0])):
        mean = float(np.sum(w * x))
        sd = float(np.sqrt(np.sum(w * (x - mean) ** 2)))
        draws = idata.posterior[name].values.ravel()
        assert abs(draws.mean() - mean) < 0.07 * sd, name
        assert draws.std() == pytest.approx(sd, rel=0.06), name
    # theta_i: the mixture over the grid of Gamma(alpha + y_i, beta + t_i)
    shape, rate = a + y, b + t
    mean = np.sum(w[..., None] * shape / rate, axis=(0, 1))
    var = np.sum(w[..., None] * (shape / rate**2 + (shape / rate) ** 2), axis=(0, 1)) - mean**2
    theta = idata.posterior["theta"].values.reshape(-1, 10)
    np.testing.assert_array_less(np.abs(theta.mean(0) - mean), 0.07 * np.sqrt(var))
    np.testing.assert_allclose(theta.std(0), np.sqrt(var), rtol=0.07)


@pytest.mark.parametrize("form", ["vector", "scalars"])
def test_a_potential_hyperprior_is_drawn_with_the_prior_it_shapes(form):
    # Gelman's rat tumours as PyMC's example writes it: the hyperprior a pm.Potential of (a, b),
    # theta_j ~ Beta(a, b), y_j ~ Binomial(n_j, theta_j). The potential was drawn first, from its
    # own law with separate Gamma cavities: the draws of a and b were uncorrelated (0.05 where
    # the exact law has 0.86) with sds 0.93-0.95 of it, and theta's prior warned. Given (a, b)
    # each y_j is beta-binomial, so the exact law of (a, b) is a 2-D grid away.
    rng = np.random.default_rng(0)
    n = rng.integers(15, 30, 20)
    y = rng.binomial(n, rng.beta(2.0, 12.0, 20))
    with pm.Model() as model:
        if form == "vector":
            ab = pm.HalfNormal("ab", 10.0, shape=2)
            a, b = ab[0], ab[1]
            pm.Potential("p(a, b)", -2.5 * pm.math.log(pm.math.sum(ab)))
        else:
            a, b = pm.HalfNormal("a", 10.0), pm.HalfNormal("b", 10.0)
            pm.Potential("p(a, b)", -2.5 * pm.math.log(a + b))
        theta = pm.Beta("theta", alpha=a, beta=b, shape=20)
        pm.Binomial("y", p=theta, observed=y, n=n)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=2000)
    # the draws are the law's, so the correlated-hyperparameters warning no longer applies
    assert not [w for w in caught if "correlated at about" in str(w.message)]
    assert "theta: collapsed prior" in idata.ep.attrs["factor_methods"]

    A, B = np.meshgrid(np.linspace(0.01, 8.0, 500), np.linspace(0.05, 45.0, 600), indexing="ij")
    log_bb = stats.betabinom.logpmf(y, n, A[..., None], B[..., None]).sum(axis=-1)
    logp = -(A**2 + B**2) / 200.0 - 2.5 * np.log(A + B) + log_bb
    if form == "vector":
        draws = idata.posterior["ab"].values.reshape(-1, 2)
    else:
        draws = np.stack([idata.posterior[v].values.ravel() for v in "ab"], axis=1)
    assert_draws_match_grid(draws, logp, A, B, sd_rel=0.06, min_corr=0.8)


def test_a_potential_of_one_hyperparameter_is_drawn_within_the_priors_law():
    # One pm.Potential per hyperparameter (-log a, -0.5 log b) of Gamma rates: each potential
    # drew its scalar from its own law, and the draws of a and b had 0.89 of the exact sds.
    # Given (a, b) each count is negative binomial, so their exact law is a 2-D grid away.
    rng = np.random.default_rng(463)
    y = rng.poisson(rng.gamma(3.0, 1 / 0.5, 12))
    with pm.Model() as model:
        a, b = pm.HalfNormal("a", 10.0), pm.HalfNormal("b", 10.0)
        pm.Potential("pa", -pm.math.log(a))
        pm.Potential("pb", -0.5 * pm.math.log(b))
        lam = pm.Gamma("lam", a, b, shape=12)
        pm.Poisson("y", lam, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=2000, compute_log_likelihood=False)
    assert "lam: collapsed prior" in idata.ep.attrs["factor_methods"]
    A, B = np.meshgrid(np.linspace(0.05, 40.0, 800), np.linspace(0.005, 8.0, 800), indexing="ij")
    a_, b_ = A[..., None], B[..., None]
    log_nb = special.gammaln(a_ + y) - special.gammaln(a_) + a_ * np.log(b_ / (b_ + 1)) - y * np.log(b_ + 1)
    logp = -(A**2 + B**2) / 200.0 - np.log(A) - 0.5 * np.log(B) + log_nb.sum(axis=-1)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    for name, x in (("a", A), ("b", B)):
        mean = float(np.sum(w * x))
        sd = float(np.sqrt(np.sum(w * (x - mean) ** 2)))
        draws = idata.posterior[name].values.ravel()
        assert abs(draws.mean() - mean) < 0.07 * sd, name
        assert draws.std() == pytest.approx(sd, rel=0.06), name


def test_a_laplace_prior_scale_with_gaussian_coefficients_matches_the_exact_posterior():
    # w_k ~ Laplace(0, lam) with each w_k observed once in unit noise: given lam the w_k are
    # independent, so lam's exact law is a 1-D grid of products of 1-D integrals. Instance by
    # instance, a Bayesian-lasso logistic regression left lam at 0.80 of NUTS's sd and EP did
    # not converge in 50 sweeps.
    rng = np.random.default_rng(26)
    K = 8
    z = rng.laplace(0.0, 0.7, K) + rng.normal(size=K)
    with pm.Model() as model:
        lam = pm.HalfNormal("lam", 2.0)
        w = pm.Laplace("w", 0.0, lam, shape=K)
        pm.Normal("z", w, 1.0, observed=z)
    # more draws: lam's long right tail makes the sd of 2,000 draws uncertain by 3-4%
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=5000)
    assert "w: collapsed prior" in idata.ep.attrs["factor_methods"]

    # int Laplace(w | 0, b) N(z | w, 1) dw in closed form (a grid would step over the spike
    # the Laplace density makes as b -> 0)
    b = np.linspace(1e-3, 8.0, 4000)[:, None]
    log_z = -np.log(2 * b) + 0.5 / b**2 + np.logaddexp(-z / b + special.log_ndtr(z - 1 / b),
                                                        z / b + special.log_ndtr(-z - 1 / b))
    lam_grid = b[:, 0]
    logp = stats.halfnorm.logpdf(lam_grid, scale=2.0) + log_z.sum(axis=1)
    mean, sd = _grid_moments(logp, lam_grid)
    # drawn from the collapsed law's marginal (EP's Gamma marginal has 1.07 of the exact sd;
    # drawn given EP's Gaussian draws of w, which lack the prior's spike at 0, lam came out
    # 0.26 sd high and 0.74 as wide)
    draws = idata.posterior["lam"].values.ravel()
    assert abs(draws.mean() - mean) < 0.05 * sd
    assert draws.std() == pytest.approx(sd, rel=0.07)


def test_a_laplace_prior_on_many_coefficients_is_integrated_to_its_closed_form():
    # The output integrals against int Laplace(w | 0, b) N(z | w, 1) dw in closed form, for 300
    # coefficients (290 of them 0) over the scale's posterior range: on the grid alone, a kink
    # at 0 within a few spacings of a conditional law erred by up to 16% per coefficient, -7.6
    # nats in all at b = 0.064, where the exact posterior's mean is 0.058 (review of stop 28).
    from pmkjit.ep.hierarchy import _INNER_HALF, _INNER_NODES, CollapsedPrior, _OutputGrids
    from pmkjit.families import Gaussian

    rng = np.random.default_rng(7)
    K = 300
    w_true = np.zeros(K)
    w_true[:10] = rng.normal(0, 3, 10)
    z = w_true + rng.normal(size=K)
    with pm.Model() as model:
        lam = pm.HalfNormal("lam", 1.0)
        pm.Normal("z", pm.Laplace("w", 0.0, lam, shape=K), 1.0, observed=z)
    method = CollapsedPrior(_factor(model, "w"), None, rng=np.random.default_rng(1))
    cavity = Gaussian(z, np.ones(K))
    centre, sd = 0.3 * z, np.full(K, 0.7)  # the outputs' EP marginals set each grid
    u = centre[:, None] + (_INNER_HALF * sd)[:, None] * np.linspace(-1, 1, _INNER_NODES)[None, :]
    grids = _OutputGrids(u, 2 * _INNER_HALF * sd / (_INNER_NODES - 1), cavity.logpdf_unconstrained(u), u,
                         Gaussian.sufficient_statistics_unconstrained(u), cavity, np.zeros(K, bool))
    b = np.exp(np.linspace(np.log(0.02), np.log(0.6), 41))[:, None]
    log_z = method._inner([b[:, 0]], grids)[0]
    exact = -np.log(2 * b) + 0.5 / b**2 + np.logaddexp(-z / b + special.log_ndtr(z - 1 / b),
                                                        z / b + special.log_ndtr(-z - 1 / b))
    assert np.abs(log_z - exact).max() < 0.01
    # in all, within 0.1 nats (the prior's draws on the narrowest laws: 0.06 at b = 0.02)
    assert np.abs((log_z - exact).sum(axis=1)).max() < 0.1


def test_a_hyper_scale_is_drawn_given_the_group_scales_it_shares_out():
    # A funnel: b[g, j] ~ Normal(0, sigma[g]), sigma[g] ~ HalfNormal(s), s ~ HalfCauchy(1),
    # and a seventh group with no data. The group scales are drawn given the group effects'
    # law (pmkjit.ep.conditional), the hyper-scale given them; one draw in 2,000 whose law the
    # grid could not hold (the empty group's scale drawn far into the HalfCauchy's tail) made
    # every draw of s fall back to EP's Gamma marginal, sd 0.85 of the exact one (review of
    # stop 28). Exact: b integrated out (y_gj ~ Normal(0, sqrt(sigma_g^2 + 1))), then each
    # sigma_g on a grid given s.
    rng = np.random.default_rng(3)
    G, J = 6, 4
    sig_true = np.abs(rng.normal(0, 1.5, G))
    y = rng.normal(0, sig_true[:, None], (G, J)) + rng.normal(0, 1, (G, J))
    with pm.Model() as model:
        s = pm.HalfCauchy("s", 1.0)
        sigma = pm.HalfNormal("sigma", s, shape=G + 1)
        b = pm.Normal("b", 0, sigma[:G, None], shape=(G, J))
        pm.Normal("y", b, 1.0, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=2000)
    assert "sigma: collapsed prior" in idata.ep.attrs["factor_methods"]
    s_grid = np.exp(np.linspace(np.log(1e-3), np.log(300), 2500))
    v = np.exp(np.linspace(np.log(1e-4), np.log(1e3), 6000))
    log_lik = np.stack([stats.norm.logpdf(y[g][:, None], 0, np.sqrt(v**2 + 1)[None, :]).sum(0) for g in range(G)])
    log_prior = stats.halfnorm.logpdf(v[None, :], scale=s_grid[:, None]) + np.log(v)[None, :]  # per log v
    log_z = special.logsumexp(log_prior[:, None, :] + log_lik[None], axis=2)
    logp = stats.halfcauchy.logpdf(s_grid) + np.log(s_grid) + log_z.sum(axis=1)  # per log s
    # the group scales' draws are independent given the data (EP's marginals, reweighted), not
    # correlated through s as they are a posteriori, so s given them is a little narrow: sds of
    # s and log s 0.97 and 0.95 of the exact ones
    draws = idata.posterior["s"].values.ravel()
    for x, d in ((s_grid, draws), (np.log(s_grid), np.log(draws))):
        mean, sd = _grid_moments(logp, x)
        assert abs(d.mean() - mean) < 0.08 * sd
        assert d.std() == pytest.approx(sd, rel=0.08)


@pytest.mark.slow  # 16 s: NUTS as its reference
def test_a_bayesian_lasso_with_a_latent_noise_keeps_its_one_site():
    # The diabetes lasso (HalfCauchy lam, Laplace coefficients, HalfNormal sigma): lam's cavity
    # is its prior's Gamma site (shape 0.31), whose left tail in log lam, e^(0.31 u), is far
    # heavier than the HalfCauchy's own; beside coefficients whose cavities hold 0 the law was
    # a narrow peak on a long tail that no uniform grid resolved, and the prior ran instance
    # by instance in every sweep (robustness round 30). The prior's exact density now stands
    # in for its site where the law is otherwise refused. Against NUTS.
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    X, y = X[:150], y[:150]
    with pm.Model() as model:
        lam = pm.HalfCauchy("lam", 1)
        beta = pm.Laplace("beta", 0, lam, shape=10)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", pm.math.dot(X, beta), sigma, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=1000)
    methods = idata.ep.attrs["factor_methods"]
    # the first sweep, before the likelihood has sites, is instance by instance by design
    assert "beta: collapsed prior;" in methods or "beta: collapsed prior (1 sweep " in methods, methods
    with model:
        ref = pm.sample(1000, tune=1000, chains=2, cores=1, random_seed=1, progressbar=False,
                        compute_convergence_checks=False)
    for name in ("lam", "beta", "sigma"):
        e = idata.posterior[name].values.reshape(2000, -1)
        n = ref.posterior[name].values.reshape(2000, -1)
        assert np.all(np.abs(e.mean(0) - n.mean(0)) < 0.15 * n.std(0)), name
        ratio = e.std(0) / n.std(0)
        assert np.all((ratio > 0.92) & (ratio < 1.12)), (name, ratio)
