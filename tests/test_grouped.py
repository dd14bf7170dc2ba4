"""One site per group for a likelihood whose groups each read their own scalars.

References are exact posteriors on dense grids, group by group (the model is the
likelihood and independent priors, so each group's posterior is its own 2-D law).
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
from scipy import special, stats

import pmkjit
from pmkjit.ep.grouped import groupable
from _graphs import factor as _factor


def _exact(logp, a, b):
    """Means, sds and correlation of a law on a product grid (``a`` down, ``b`` across)."""
    w = np.exp(logp - logp.max())
    w /= w.sum()
    ma, mb = np.sum(w * a), np.sum(w * b)
    sa, sb = np.sqrt(np.sum(w * (a - ma) ** 2)), np.sqrt(np.sum(w * (b - mb) ** 2))
    return (ma, mb), (sa, sb), np.sum(w * (a - ma) * (b - mb)) / (sa * sb)


def test_which_likelihoods_are_grouped():
    g = np.repeat(np.arange(3), 4)
    h = np.tile(np.arange(4), 3)
    y = np.linspace(0.5, 3.0, 12)
    with pm.Model() as model:
        a = pm.Gamma("a", 2, 1, shape=4)
        b = pm.Gamma("b", 2, 1, shape=4)
        ab = pm.Gamma("ab", 2, 1, shape=(3, 2))
        mu = pm.Normal("mu", 0, 1, shape=3)
        pm.Gamma("per_group", alpha=a[g], beta=b[g], observed=y)
        pm.Gamma("one_element_pair", alpha=ab[g, 0], beta=ab[g, 1], observed=y)
        pm.Gamma("crossed", alpha=a[g], beta=b[h], observed=y)  # b[h] is read by three groups
        pm.Gamma("shared", alpha=a[0], beta=b[1], observed=y)  # one group: pmkjit.ep.collapsed's
        pm.Gamma("by_another_index", alpha=a[h], beta=b[h], observed=y)
        pm.Gamma("on_the_block", alpha=a[g], beta=pm.math.exp(mu[g]), observed=y)  # a group's Gaussian coordinate
        pm.Gamma("across_groups", alpha=a[g], beta=pm.math.exp(mu[g] + h), observed=y)  # + data: a row per instance
    assert groupable(_factor(model, "per_group"))
    assert groupable(_factor(model, "one_element_pair"))
    assert groupable(_factor(model, "by_another_index"))
    assert not groupable(_factor(model, "crossed"))
    assert not groupable(_factor(model, "shared"))
    assert groupable(_factor(model, "on_the_block"))
    assert not groupable(_factor(model, "across_groups"))


def test_per_group_gamma_parameters_match_the_exact_posteriors():
    # Instance by instance: sds 0.30-0.53 of NUTS's (robustness round 29), converged.
    rng = np.random.default_rng(4)
    shapes, rates = np.array([2.0, 5.0, 1.2]), np.array([1.0, 2.5, 0.4])
    g = np.repeat(np.arange(3), [25, 15, 40])
    rng.shuffle(g)
    y = rng.gamma(shapes[g], 1 / rates[g])
    with pm.Model(coords={"g": ["a", "b", "c"]}) as model:
        shape = pm.Gamma("shape", 2, 0.5, dims="g")
        rate = pm.Gamma("rate", 2, 1, dims="g")
        pm.Gamma("y", alpha=shape[g], beta=rate[g], observed=y)
    idata = pmkjit.fit(model=model, random_seed=2, progressbar=False, draws=1000, compute_log_likelihood=False)
    assert idata.ep.attrs["converged"] and "y: one site per group" in idata.ep.attrs["factor_methods"]
    q = pmkjit.ep_posterior(idata)
    a = np.linspace(0.02, 25.0, 900)[:, None]
    b = np.linspace(0.005, 10.0, 900)[None, :]
    for j in range(3):
        yj = y[g == j]
        logp = stats.gamma.logpdf(a, 2, scale=2) + stats.gamma.logpdf(b, 2, scale=1) + (
            yj.size * (a * np.log(b) - special.gammaln(a)) + (a - 1) * np.log(yj).sum() - b * yj.sum())
        mean, sd, rho = _exact(logp, a, b)
        assert rho > 0.8
        draws = [idata.posterior[name].values[..., j].ravel() for name in ("shape", "rate")]
        for k, name in enumerate(("shape", "rate")):
            # EP's marginal: the Gamma matching the exact law's E[x] and E[log x]
            assert abs(q[name].mean()[j] - mean[k]) < 0.02 * sd[k], (name, j)
            assert abs(np.sqrt(q[name].var()[j]) / sd[k] - 1) < 0.06, (name, j)
            # the draws: the group's law itself, 2,000 of them
            assert abs(draws[k].mean() - mean[k]) < 0.08 * sd[k] and abs(draws[k].std() / sd[k] - 1) < 0.08, (name, j)
        assert abs(np.corrcoef(*draws)[0, 1] - rho) < 0.04, j


def test_per_group_beta_binomial_with_trial_counts_matches_the_exact_posteriors():
    # Instance by instance: sds 0.33-0.61 of NUTS's. The trial counts differ by instance.
    rng = np.random.default_rng(8)
    g = np.repeat(np.arange(4), 12)
    n = rng.integers(5, 30, g.size)
    y = rng.binomial(n, rng.beta(np.array([2.0, 6.0, 1.0, 4.0])[g], np.array([5.0, 3.0, 2.0, 4.0])[g]))
    with pm.Model() as model:
        mu = pm.Beta("mu", 1, 1, shape=4)
        kappa = pm.Gamma("kappa", 2, 0.1, shape=4)
        pm.BetaBinomial("y", alpha=mu[g] * kappa[g], beta=(1 - mu[g]) * kappa[g], n=n, observed=y)
    idata = pmkjit.fit(model=model, random_seed=3, progressbar=False, draws=500, compute_log_likelihood=False)
    assert "y: one site per group" in idata.ep.attrs["factor_methods"]
    q = pmkjit.ep_posterior(idata)
    m = np.linspace(0.0005, 0.9995, 700)[:, None]
    k = np.exp(np.linspace(np.log(0.05), np.log(2000.0), 700))[None, :]
    for j in range(4):
        s = g == j
        al, be = m * k, (1 - m) * k
        ll = sum(special.betaln(yi + al, ni - yi + be) - special.betaln(al, be) for yi, ni in zip(y[s], n[s]))
        # the prior in (mu, log kappa): kappa's density times kappa
        logp = ll + stats.gamma.logpdf(k, 2, scale=10) + np.log(k)
        mean, sd, _ = _exact(logp, m + 0 * k, np.log(k) + 0 * m)
        assert abs(q["mu"].mean()[j] - mean[0]) < 0.03 * sd[0], j
        assert abs(np.sqrt(q["mu"].var()[j]) / sd[0] - 1) < 0.06, j
        log_kappa = np.log(idata.posterior["kappa"].values[..., j].ravel())
        assert abs(log_kappa.mean() - mean[1]) < 0.1 * sd[1] and abs(log_kappa.std() / sd[1] - 1) < 0.1, j


def test_per_group_pairs_under_a_hierarchical_prior_are_drawn_jointly():
    # review of round 29: the prior's one site drew the shapes first (with its hyper-rate),
    # and the likelihood, finding them taken, left each group's shape and rate independent in
    # the draws: correlations -0.11 to 0.05 where NUTS has 0.89-0.95, the sd of each group's
    # mean shape / rate 3.5-5.3 times NUTS's. Likelihoods are drawn first now, and the prior's
    # hyperparameter given their draws.
    rng = np.random.default_rng(11)
    g = np.repeat(np.arange(4), [4, 8, 15, 30])
    y = rng.gamma(rng.gamma(4, 1.0, 4)[g], 1 / np.array([1.0, 2.5, 0.4, 1.5])[g])
    with pm.Model() as model:
        bh = pm.Gamma("bh", 2, 2)
        shape = pm.Gamma("shape", 3, bh, shape=4)
        rate = pm.Gamma("rate", 2, 1, shape=4)
        pm.Gamma("y", alpha=shape[g], beta=rate[g], observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=500, compute_log_likelihood=False)
    methods = idata.ep.attrs["factor_methods"]
    assert "shape: collapsed prior" in methods and "y: one site per group" in methods
    shape, rate = (idata.posterior[v].values.reshape(-1, 4) for v in ("shape", "rate"))
    # NUTS (2 x 1,000 draws): 0.91, 0.91, 0.91 and 0.95; the hyper-rate, drawn given the
    # shapes, against their mean: -0.53
    nuts = [0.91, 0.91, 0.91, 0.95]
    assert all(abs(np.corrcoef(shape[:, j], rate[:, j])[0, 1] - nuts[j]) < 0.04 for j in range(4))
    assert np.corrcoef(idata.posterior["bh"].values.ravel(), shape.mean(axis=1))[0, 1] < -0.4


def test_a_groups_gaussian_location_matches_the_exact_posteriors_and_is_drawn_with_its_scale():
    # A Normal-prior location mu[g] is a coordinate of the Gaussian block, not an element: its
    # group's law is integrated the same way, and its draws replace the block's coordinate
    # (EP's posterior leaves it uncorrelated with every other one).
    rng = np.random.default_rng(12)
    g = np.repeat(np.arange(3), [10, 25, 40])
    mu_true, sd_true = np.exp(np.array([0.5, 1.0, 0.2])), np.array([0.8, 1.5, 0.3])
    y = rng.gamma(((mu_true / sd_true) ** 2)[g], (sd_true**2 / mu_true)[g])
    with pm.Model() as model:
        a = pm.Normal("a", 0, 2, shape=3)
        s = pm.HalfNormal("s", 2, shape=3)
        pm.Gamma("y", mu=pm.math.exp(a[g]), sigma=s[g], observed=y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pmkjit.fit(model=model, random_seed=4, progressbar=False, draws=2000, compute_log_likelihood=False)
    assert "y: one site per group" in idata.ep.attrs["factor_methods"]
    assert not [w for w in caught if "EP's marginals of" in str(w.message)]
    q = pmkjit.ep_posterior(idata)
    a_grid = np.linspace(-3.0, 4.0, 700)[:, None]
    s_grid = np.linspace(0.005, 6.0, 700)[None, :]
    for j in range(3):
        yj = y[g == j]
        mu = np.exp(a_grid)
        shape, rate = (mu / s_grid) ** 2, mu / s_grid**2
        logp = stats.norm.logpdf(a_grid, 0, 2) + stats.halfnorm.logpdf(s_grid, scale=2) + (
            yj.size * (shape * np.log(rate) - special.gammaln(shape)) + (shape - 1) * np.log(yj).sum() - rate * yj.sum())
        mean, sd, rho = _exact(logp, a_grid + 0 * s_grid, s_grid + 0 * a_grid)
        # a's Gaussian marginal is the law's mean and variance exactly; s's Gamma has its E[s]
        assert abs(q["a"].mean()[j] - mean[0]) < 0.02 * sd[0], j
        assert abs(np.sqrt(q["a"].var()[j]) / sd[0] - 1) < 0.02, j
        assert abs(q["s"].mean()[j] - mean[1]) < 0.02 * sd[1], j
        # the draws (4,000): the group's law, its correlation too
        draws = [idata.posterior[v].values[..., j].ravel() for v in ("a", "s")]
        for k in range(2):
            assert abs(draws[k].mean() - mean[k]) < 0.08 * sd[k] and abs(draws[k].std() / sd[k] - 1) < 0.08, (j, k)
        assert abs(np.corrcoef(*draws)[0, 1] - rho) < 0.05, j
