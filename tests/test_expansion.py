"""Products written out column by column, and functions of scalar latents vectorised over
instances (pmkjit.graph.expansion): the factor the builder makes computes what PyMC's graph
computes, at random values of the latents."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pmkjit
from pmkjit.errors import UnsupportedModelError
from pmkjit.graph import build_factor_graph
from pmkjit.graph.expansion import MAX_EXPANDED_COLUMNS, MAX_REDUCED_ENTRIES, vectorised_scalar_function
from pmkjit.graph.factor_graph import DataSlot, ElementSlot, LinearSlot


def _factor_matches_pymc(model, name: str, seed: int = 0, trials: int = 3):
    """The factor ``name``'s parameters at random latent values equal PyMC's mean and sd."""
    graph = build_factor_graph(model)
    (factor,) = [f for f in graph.factors if f.name == name]
    assert factor.linear_normal is not None
    rv = model[name]
    mu_sigma = pytensor.function(model.free_RVs, list(rv.owner.op.dist_params(rv.owner)),
                                 on_unused_input="ignore")
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        values = {v.name: np.asarray(rng.uniform(0.5, 2.0, size=v.shape.eval()), dtype=float) for v in model.free_RVs}
        theta = np.zeros(graph.n_theta)
        for v in graph.gaussian_variables:
            theta[v.offset:v.offset + v.size] = values[v.name].ravel()
        ins = []
        for slot in factor.inputs:
            if isinstance(slot, DataSlot):
                ins.append(slot.values)
            elif isinstance(slot, LinearSlot):
                ins.append(slot.A @ theta + slot.c)
            else:
                assert isinstance(slot, ElementSlot)
                ins.append(values[slot.variable].ravel()[slot.index])
        got = [np.broadcast_to(a, (factor.size,)) for a in factor.linear_normal.params(*ins)]
        want = [np.broadcast_to(a, (factor.size,)) for a in mu_sigma(*[values[v.name] for v in model.free_RVs])]
        np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-10)
    return factor


def test_a_regression_with_latent_scales_per_coefficient_is_written_out_column_by_column():
    # X @ (z * scales): not affine in z as a whole (the scales are latent); per column it is
    rng = np.random.default_rng(1)
    X = rng.normal(size=(25, 3))
    with pm.Model() as model:
        z = pm.Normal("z", 0.0, 1.0, shape=3)
        s1, s2 = pm.HalfNormal("s1", 1.0), pm.HalfNormal("s2", 1.0)
        beta = pm.Deterministic("beta", z * pt.stack([s1, s2, s1 * s2]))  # (a pm.Deterministic of a stack)
        pm.Normal("y", X @ beta, pm.HalfNormal("sigma", 1.0), observed=rng.normal(size=25))
    factor = _factor_matches_pymc(model, "y")
    assert sum(isinstance(s, LinearSlot) for s in factor.inputs) == 3  # one Gaussian input per column


def test_an_hsgp_mean_indexed_by_group_is_the_pymc_one():
    # f = HSGP at 8 distinct inputs, read by 40 observations through an index (f[idx]); its
    # spectral density reads the length scale through prod and dot (vectorised over instances)
    rng = np.random.default_rng(2)
    Xu = np.linspace(0.0, 5.0, 8)[:, None]
    idx = rng.integers(0, 8, 40)
    with pm.Model() as model:
        ell = pm.Gamma("ell", 2.0, 2.0)
        eta = pm.Gamma("eta", 2.0, 2.0)
        f = pm.gp.HSGP(m=[9], c=1.5, cov_func=eta**2 * pm.gp.cov.Matern52(1, ls=ell)).prior("f", X=Xu)
        pm.Normal("y", 1.0 + f[idx], pm.HalfNormal("s", 1.0), observed=rng.normal(size=40))
    factor = _factor_matches_pymc(model, "y")
    assert sum(isinstance(s, LinearSlot) for s in factor.inputs) == 9


def test_a_function_of_scalars_is_vectorised_over_instances():
    # prod and dot over a length scale's vector copy, and an entry per instance (a prior's sd
    # of shape (4,)): each instance reads its own entry at its own values
    a, b = pt.dscalar("a"), pt.dscalar("b")
    w = np.array([0.5, 1.0, 1.5, 2.0])
    ls = pt.ones(2) * pt.stack([a, b])
    var = pt.prod(ls) * pt.exp(-pt.dot(pt.as_tensor(np.outer(w, [1.0, 0.5])), ls**2))
    va, vb, entry = pt.dvector("va"), pt.dvector("vb"), pt.dvector("entry")
    f = pytensor.function([va, vb, entry], vectorised_scalar_function(var, (a, b), (va, vb), entry))
    g = pytensor.function([a, b], var)
    xa, xb = np.array([0.3, 1.2, 2.0, 0.7, 1.1]), np.array([1.0, 0.4, 0.9, 2.2, 0.6])
    entries = np.array([3, 0, 2, 1, 3])
    want = [g(p, q)[e] for p, q, e in zip(xa, xb, entries)]
    np.testing.assert_allclose(f(xa, xb, entries.astype(float)), want, rtol=1e-12)


def test_products_beyond_a_normal_mean_or_too_many_columns_are_refused_by_name():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20, 3))
    with pm.Model() as bernoulli:
        z = pm.Normal("z", 0.0, 1.0, shape=3)
        s = pm.HalfNormal("s", 1.0, shape=3)
        pm.Bernoulli("y", logit_p=X @ (z * s), observed=rng.integers(0, 2, 20))
    with pytest.raises(UnsupportedModelError, match=r"^y: .*data matrix times a vector of latents \(z, s\).*"
                                                    r"only in the mean of a Normal likelihood"):
        build_factor_graph(bernoulli)
    wide = rng.normal(size=(20, MAX_EXPANDED_COLUMNS + 1))
    with pm.Model() as too_wide:
        z = pm.Normal("z", 0.0, 1.0, shape=wide.shape[1])
        tau = pm.HalfNormal("tau", 1.0, shape=wide.shape[1])
        pm.Normal("y", wide @ (z * tau), 1.0, observed=rng.normal(size=20))
    # (pmkjit.fit centres z * tau first, and then fits both models: the builder's rules are
    # for what centring leaves, as an HSGP's vector of scales)
    with pytest.raises(UnsupportedModelError, match=r"^y: its parameters depend on latent z, tau through"):
        build_factor_graph(too_wide)


def test_a_cumulative_sum_of_a_scalar_is_fitted_against_quadrature():
    # exp(cumsum(rho * ones(4))) = exp(k rho), k = 1..4: each entry reads its own entry of a
    # function of the one scalar rho (refused before robustness round 35). Against the
    # exact posterior of rho ~ Uniform(-1, 1) by quadrature
    from scipy import integrate, stats

    y = np.array([1, 0, 2, 1])
    k = np.arange(1, 5)
    with pm.Model() as model:
        rho = pm.Uniform("rho", -1.0, 1.0)
        pm.Poisson("y", pm.math.exp(pm.math.cumsum(rho * np.ones(4))), observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=2000, chains=2,
                       compute_log_likelihood=False)

    def density(r, power=0):
        return r**power * np.exp(stats.poisson.logpmf(y, np.exp(k * r)).sum())

    Z = integrate.quad(density, -1, 1)[0]
    mean = integrate.quad(density, -1, 1, args=(1,))[0] / Z
    sd = np.sqrt(integrate.quad(density, -1, 1, args=(2,))[0] / Z - mean**2)
    draws = idata.posterior["rho"].values.ravel()
    assert idata.ep.attrs["converged"]
    assert abs(draws.mean() - mean) < 0.06 * sd
    assert abs(draws.std() / sd - 1) < 0.06


@pytest.mark.parametrize("reduce", ["sum", "prod"])
def test_a_sum_or_product_of_a_short_positive_vector_is_read_entry_by_entry(reduce):
    # Gelman's rat tumours hyperprior, pm.Potential("p(a, b)", -2.5 * log(pm.math.sum(ab))), was
    # refused ("through Sum ... neither affine nor elementwise") though ab[0] + ab[1] was read:
    # now the reduction is written out, a function of two elements, and fitted as one site
    with pm.Model() as model:
        ab = pm.HalfNormal("ab", 10.0, shape=2)
        s = pm.math.sum(ab) if reduce == "sum" else pm.math.prod(ab)
        pm.Potential("p(a, b)", -2.5 * pm.math.log(s))
        pm.Poisson("y", ab[0], observed=[3, 5, 4])
        pm.Poisson("z", ab[1], observed=[10, 12])
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False, draws=10)
    a = np.linspace(1e-4, 15.0, 1500)[:, None]
    b = np.linspace(1e-4, 30.0, 1500)[None, :]
    log_p = (-(a**2 + b**2) / 200.0 - 2.5 * np.log(a + b if reduce == "sum" else a * b)
             + 12 * np.log(a) - 3 * a + 22 * np.log(b) - 2 * b)  # HalfNormal(10) priors, Poisson counts
    p = np.exp(log_p - log_p.max())
    p /= p.sum()
    post = pmkjit.ep_posterior(idata)["ab"]
    for k, v in enumerate((a, b)):
        m = np.sum(p * v)
        sd = np.sqrt(np.sum(p * (v - m) ** 2))
        assert abs(post.mean()[k] - m) / sd < 0.01
        assert abs(np.sqrt(post.var()[k]) / sd - 1) < 0.01

    # a longer vector stays refused, by name: written out it would be one factor of that many
    # elements, beyond what a one-site law integrates in reasonable time
    with pm.Model() as longer:
        w = pm.HalfNormal("w", 10.0, shape=MAX_REDUCED_ENTRIES + 1)
        pm.Potential("pen", -2.5 * pm.math.log(pm.math.sum(w) if reduce == "sum" else pm.math.prod(w)))
        pm.Poisson("y", w, observed=np.arange(MAX_REDUCED_ENTRIES + 1))
    with pytest.raises(UnsupportedModelError, match=r"^pen: .*latent w through"):
        pmkjit.fit(model=longer, random_seed=0, progressbar=False)
