"""Missing observations (PyMC's imputation), latents nothing reads, and entries split by what they read."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pmkjit
from pmkjit.errors import UnsupportedModelError
from pmkjit.graph import build_factor_graph


def _with_nan(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.asarray(values, dtype=float).copy()
    out[rows] = np.nan
    return out


def _model(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyMC's ImputationWarning
        with pm.Model() as model:
            build()
    return model


def _draws(idata, name):
    x = idata.posterior[name].values
    return x.reshape((-1,) + x.shape[2:])


def test_missing_normal_observations_are_imputed_as_the_exact_predictive():
    # sigma known: the posterior of (a, b) is Gaussian in closed form and the missing
    # y_i | data ~ N(a + b x_i, sigma^2) averaged over it
    rng = np.random.default_rng(2)
    n, sigma = 40, 0.5
    x = rng.normal(size=n)
    y = 1.0 + 2.0 * x + sigma * rng.normal(size=n)
    miss = np.array([3, 11, 17, 30])
    keep = np.setdiff1d(np.arange(n), miss)

    def build():
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0)
        pm.Normal("y", a + b * x, sigma, observed=_with_nan(y, miss))

    model = _model(build)
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False, draws=2000)
    X = np.column_stack([np.ones(keep.size), x[keep]])
    prec = np.eye(2) / 25.0 + X.T @ X / sigma**2
    cov = np.linalg.inv(prec)
    mean = cov @ X.T @ y[keep] / sigma**2
    Xm = np.column_stack([np.ones(miss.size), x[miss]])
    exact_mean = Xm @ mean
    exact_sd = np.sqrt(sigma**2 + np.einsum("ij,jk,ik->i", Xm, cov, Xm))
    draws = _draws(idata, "y_unobserved")
    se = exact_sd / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - exact_mean) < 4 * se)
    np.testing.assert_allclose(draws.std(0), exact_sd, rtol=0.05)
    # the joined deterministic keeps the data where they were observed
    joined = _draws(idata, "y")
    np.testing.assert_array_equal(joined[:, keep], np.broadcast_to(y[keep], (joined.shape[0], keep.size)))
    np.testing.assert_array_equal(joined[:, miss], draws)
    assert "y_unobserved" in idata.ep.attrs["factor_graph"]  # reported as drawn from its predictive


def test_imputed_entries_do_not_change_the_posterior_of_the_other_latents():
    # y_unobserved carries no information: EP on the model with NaN is EP on the complete cases
    rng = np.random.default_rng(4)
    n = 50
    x = rng.normal(size=n)
    y = 0.5 - 1.0 * x + 0.7 * rng.normal(size=n)
    miss = rng.choice(n, 7, replace=False)
    keep = np.setdiff1d(np.arange(n), miss)

    def with_missing():
        a, b, s = pm.Normal("a", 0, 3), pm.Normal("b", 0, 3), pm.HalfNormal("s", 2)
        pm.Normal("y", a + b * x, s, observed=_with_nan(y, miss))

    def complete_cases():
        a, b, s = pm.Normal("a", 0, 3), pm.Normal("b", 0, 3), pm.HalfNormal("s", 2)
        pm.Normal("y", a + b * x[keep], s, observed=y[keep])

    full = pmkjit.ep_posterior(pmkjit.fit(model=_model(with_missing), random_seed=1, progressbar=False))
    ref = pmkjit.ep_posterior(pmkjit.fit(model=_model(complete_cases), random_seed=1, progressbar=False))
    assert "y_unobserved" not in full
    for name in ("a", "b", "s"):
        np.testing.assert_allclose(full[name].mean(), ref[name].mean(), rtol=1e-6)
        np.testing.assert_allclose(full[name].var(), ref[name].var(), rtol=1e-6)


def test_missing_counts_are_drawn_from_their_predictive():
    rng = np.random.default_rng(5)
    n = 60
    x = rng.normal(size=n)
    k = rng.poisson(np.exp(0.5 + 0.4 * x))
    miss = np.array([2, 9, 40])

    def build():
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        pm.Poisson("k", pm.math.exp(a + b * x), observed=_with_nan(k, miss))

    idata = pmkjit.fit(model=_model(build), random_seed=3, progressbar=False, draws=2000)
    counts = _draws(idata, "k_unobserved")
    assert np.issubdtype(counts.dtype, np.integer) and counts.min() >= 0
    # each draw is a Poisson draw at that draw's rate: the mean matches E[exp(a + b x)]
    rate = np.exp(_draws(idata, "a")[:, None] + _draws(idata, "b")[:, None] * x[miss])
    se = np.sqrt(rate.mean(0) + rate.var(0)) / np.sqrt(counts.shape[0])
    assert np.all(np.abs(counts.mean(0) - rate.mean(0)) < 4 * se)


def test_a_missing_count_that_another_variable_reads_is_refused_by_name():
    rng = np.random.default_rng(6)
    k = rng.poisson(3.0, size=20).astype(float)
    k[4] = np.nan

    def build():
        lam = pm.Gamma("lam", 2.0, 1.0)
        counts = pm.Poisson("k", lam, observed=k)
        pm.Normal("z", counts, 1.0, observed=np.zeros(20))

    with pytest.raises(UnsupportedModelError, match="k_unobserved"):
        pmkjit.fit(model=_model(build), progressbar=False)


def test_latents_nothing_reads_are_drawn_from_their_prior():
    def build():
        pm.Poisson("k", 3.0)
        pm.Uniform("u", -1.0, 3.0, shape=2)
        z = pm.Normal("z", 0.0, 1.0)
        pm.Normal("w", z, 1.0)  # read by nothing; z is read by w only, so it goes too
        pm.Normal("obs", 0.0, 1.0, observed=np.zeros(3))

    model = _model(build)
    graph = build_factor_graph(model)
    assert graph.predictive == ["k", "u", "z", "w"] and not graph.variables
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False, draws=2000)
    assert abs(_draws(idata, "k").mean() - 3.0) < 4 * np.sqrt(3.0 / 4000)
    u = _draws(idata, "u")
    assert u.shape == (4000, 2) and u.min() > -1.0 and u.max() < 3.0
    np.testing.assert_allclose(_draws(idata, "w").std(), np.sqrt(2.0), rtol=0.05)


def test_a_group_without_data_gets_the_predictive_of_its_hyperparameters():
    # u[4] has no observation: its only factor is its prior, whose cavity is flat up to
    # round-off; EP must give it mean E[mu] and variance var(mu) + E[tau^2] under EP's own
    # marginals (it used to skip the entry whenever the round-off came out negative)
    rng = np.random.default_rng(3)
    g = rng.integers(0, 4, size=80)
    y = rng.normal(size=4)[g] + 0.7 * rng.normal(size=80)

    def build():
        mu = pm.Normal("mu", 0.0, 3.0)
        tau = pm.HalfNormal("tau", 2.0)
        u = pm.Normal("u", mu, tau, shape=5)
        pm.Normal("y", u[g], pm.HalfNormal("s", 2.0), observed=y)

    idata = pmkjit.fit(model=_model(build), random_seed=1, progressbar=False)
    q = pmkjit.ep_posterior(idata)
    mu, tau, u = q["mu"], q["tau"], q["u"]
    np.testing.assert_allclose(u.mean()[4], mu.mean()[0], rtol=1e-4)
    np.testing.assert_allclose(u.var()[4], mu.var()[0] + tau.var()[0] + tau.mean()[0] ** 2, rtol=1e-3)


def test_entries_that_read_an_imputed_covariate_get_a_factor_of_their_own():
    # y reads x, whose missing entries PyMC imputes as latents: the other entries read
    # data only. As one factor, those entries had a covariate slot of zero variance, EP
    # skipped them as improper, and b came out with 8 times NUTS's sd.
    rng = np.random.default_rng(5)
    n = 60
    x = rng.normal(size=n)
    y = 1.0 + 2.0 * x + 0.5 * rng.normal(size=n)
    miss = rng.choice(n, 8, replace=False)
    keep = np.setdiff1d(np.arange(n), miss)

    def with_missing_x():
        mx, sx = pm.Normal("mx", 0, 2), pm.HalfNormal("sx", 2)
        xo = pm.Normal("x", mx, sx, observed=_with_nan(x, miss))
        a, b, s = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5), pm.HalfNormal("s", 2)
        pm.Normal("y", a + b * xo, s, observed=y)

    def complete_cases():
        a, b, s = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5), pm.HalfNormal("s", 2)
        pm.Normal("y", a + b * x[keep], s, observed=y[keep])

    model = _model(with_missing_x)
    graph = build_factor_graph(model)
    names = sorted(f.name for f in graph.factors if f.name.startswith("y"))
    assert names == ["y (52 of 60 entries)", "y (8 of 60 entries)"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # importance sampling on the 8 entries may not meet tol
        idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, max_sweeps=12)
    ref = pmkjit.fit(model=_model(complete_cases), random_seed=1, progressbar=False)
    # the 8 entries with a latent covariate add little: the complete cases are close
    for name in ("a", "b", "s"):
        m, r = _draws(idata, name), _draws(ref, name)
        assert abs(m.mean() - r.mean()) < 0.3 * r.std(), name
        assert 0.8 < m.std() / r.std() < 1.25, name


def _grid_moments_2d(grids, logp):
    w = np.exp(logp - logp.max())
    w /= w.sum()
    out = []
    for g in grids:
        m = float((w * g).sum())
        out.append((m, float(np.sqrt((w * (g - m) ** 2).sum()))))
    return out


def test_missing_values_of_a_symbolic_distribution_are_imputed_and_the_rest_fitted():
    # PyMC imputes NaN of a symbolic distribution (Weibull, pm.Truncated, a CustomDist with
    # dist=) with one PartialObservedRV node over the whole variable, not two random
    # variables: fit crashed with PyMC's "extended_signature must be provided"
    from scipy import stats
    from scipy.special import gamma as gamma_fn

    rng = np.random.default_rng(11)
    n = 30
    t = 2.0 * rng.weibull(1.5, n)
    miss = np.array([3, 17])
    keep = np.setdiff1d(np.arange(n), miss)

    def build():
        k = pm.Gamma("k", 2.0, 1.0)
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Weibull("t", alpha=k, beta=lam, observed=_with_nan(t, miss))

    model = _model(build)
    assert type(model["t_observed"].owner.op).__name__ == "PartialObservedRV"
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False, compute_log_likelihood=False)
    assert "t_observed: likelihood WeibullBeta (28 instances" in idata.ep.attrs["factor_graph"]
    K, L = np.meshgrid(np.linspace(0.5, 3.5, 300), np.linspace(0.8, 4.0, 300), indexing="ij")
    logp = stats.gamma(2).logpdf(K) + stats.gamma(2).logpdf(L)
    logp = logp + stats.weibull_min.logpdf(t[keep][:, None, None], K, scale=L).sum(0)
    q = pmkjit.ep_posterior(idata)
    for name, (mean, sd) in zip(("k", "lam"), _grid_moments_2d((K, L), logp)):
        assert abs(q[name].mean()[0] - mean) < 0.1 * sd, name
        assert 0.9 < np.sqrt(q[name].var()[0]) / sd < 1.1, name
    # the missing times are Weibull draws given each posterior draw of (k, lam)
    draws = _draws(idata, "t_unobserved")
    k, lam = _draws(idata, "k"), _draws(idata, "lam")
    expected = lam * gamma_fn(1.0 + 1.0 / k)
    assert draws.shape == (2000, 2) and draws.min() > 0
    se = np.sqrt(draws.var(0) / draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - expected.mean()) < 4 * se)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # PyMC's truncated Poisson sampler calls pytensor's scan
def test_a_truncated_likelihood_with_missing_values_keeps_its_absent_bound():
    # its observed entries were the whole variable's parameters broadcast and indexed: the
    # absent upper bound became a data array of inf, and EP failed mid-fit on an
    # "improper point mass"
    rng = np.random.default_rng(33)
    x = rng.normal(size=70)
    k = rng.poisson(np.exp(0.7 + 0.4 * x))
    x, k = x[k > 0], k[k > 0]
    miss = np.array([0, 9])
    keep = np.setdiff1d(np.arange(x.size), miss)

    def build():
        a, b = pm.Normal("a", 0.0, 2.0), pm.Normal("b", 0.0, 2.0)
        pm.Truncated("k", pm.Poisson.dist(pm.math.exp(a + b * x)), lower=1, observed=_with_nan(k, miss))

    idata = pmkjit.fit(model=_model(build), random_seed=0, progressbar=False, compute_log_likelihood=False)
    A, B = np.meshgrid(np.linspace(-0.5, 1.8, 250), np.linspace(-0.6, 1.2, 250), indexing="ij")
    mu = np.exp(A[None] + B[None] * x[keep][:, None, None])
    kk = k[keep][:, None, None]
    logp = -(A**2 + B**2) / 8.0 + (kk * np.log(mu) - mu - np.log1p(-np.exp(-mu))).sum(0)
    q = pmkjit.ep_posterior(idata)
    for name, (mean, sd) in zip(("a", "b"), _grid_moments_2d((A, B), logp)):
        assert abs(q[name].mean()[0] - mean) < 0.1 * sd, name
        assert 0.85 < np.sqrt(q[name].var()[0]) / sd < 1.15, name
    counts = _draws(idata, "k_unobserved")
    assert counts.min() >= 1  # drawn from the truncated predictive


def test_missing_values_of_a_symbolic_distribution_read_by_another_variable_are_refused_by_name():
    rng = np.random.default_rng(35)
    t = 2.0 * rng.weibull(1.5, 20)

    def build():
        k, lam = pm.Gamma("k", 2.0, 1.0), pm.Gamma("lam", 2.0, 1.0)
        tt = pm.Weibull("t", alpha=k, beta=lam, observed=_with_nan(t, [1, 2]))
        pm.Normal("y", pm.Normal("b", 0.0, 1.0) * tt, 0.3, observed=np.zeros(20))

    with pytest.raises(UnsupportedModelError, match=r"^t: .*t_unobserved.*drop or fill"):
        pmkjit.fit(model=_model(build), progressbar=False)


def test_the_posterior_has_pm_samples_variables_dims_and_coords():
    # pm.sample orders its posterior as model.unobserved_value_vars (untransformed free
    # variables, then transformed ones, then deterministics) and gives a dimension without
    # coords (y_unobserved_dim_0) the coordinates 0, 1, ...; EP's imputed draws had none,
    # and its variables came in declaration order (s first)
    rng = np.random.default_rng(8)
    g = rng.integers(0, 3, 30)
    y = _with_nan(rng.normal(size=30), [4, 9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pm.Model(coords={"group": ["a", "b", "c"]}) as model:
            s = pm.HalfNormal("s", 1.0)
            mu = pm.Normal("mu", 0.0, 1.0, dims="group")
            pm.Deterministic("spread", mu * s, dims="group")
            pm.Normal("y", mu[g], s, observed=y)
    post = pmkjit.fit(model=model, random_seed=0, progressbar=False, draws=5, chains=1,
                      compute_log_likelihood=False).posterior
    # pm.sample(draws=5, chains=1) on this model gives exactly these (PyMC 5.28)
    assert list(post.data_vars) == ["mu", "y_unobserved", "s", "spread", "y"]
    dims = {"mu": ("group",), "y_unobserved": ("y_unobserved_dim_0",), "s": (), "spread": ("group",),
            "y": ("y_dim_0",)}
    for name, d in dims.items():
        assert post[name].dims == ("chain", "draw") + d, name
    coords = {"chain": [0], "draw": np.arange(5), "group": ["a", "b", "c"], "y_unobserved_dim_0": [0, 1],
              "y_dim_0": np.arange(30)}
    assert set(post.coords) == set(coords)
    for dim, values in coords.items():
        np.testing.assert_array_equal(post[dim].values, values)
    draws = post["y_unobserved"]
    assert float(draws.sel(y_unobserved_dim_0=1).mean()) == float(draws[..., 1].mean())


def test_a_multivariate_likelihood_with_missing_entries_is_refused_naming_its_distribution():
    # a NaN in some entries of an MvNormal row makes PyMC wrap the whole variable in a
    # PartialObservedRV: the refusal named that ("multivariate likelihood PartialObservedRV");
    # an observed MvNormal is now supported, rows missing whole too, but not partly missing rows
    Y = np.random.default_rng(0).normal(size=(20, 2))
    Y[3, 1] = np.nan

    def build():
        pm.MvNormal("Y", pm.Normal("mu", 0.0, 1.0, shape=2), np.eye(2), observed=Y)

    with pytest.raises(UnsupportedModelError, match=r"^Y: 1 rows of this observed MvNormal have some entries missing"):
        build_factor_graph(_model(build))


def test_a_predictive_latent_downstream_of_pm_data_keeps_its_parents_posterior():
    # given a bare posterior, PyMC took every pm.Data as changed and redrew mu from its
    # prior for the predictive draws of `new` (mean -0.35, sd 9.9 instead of 3.08, 0.14)
    rng = np.random.default_rng(0)
    y = 3.0 + rng.normal(size=100)

    def build():
        s0 = pm.Data("s0", 10.0)
        mu = pm.Normal("mu", 0.0, s0)
        pm.Normal("y", mu, 1.0, observed=y)
        pm.Normal("new", mu, 0.1)

    idata = pmkjit.fit(model=_model(build), random_seed=0, progressbar=False, draws=2000)
    prec = 1 / 100 + 100
    new = _draws(idata, "new")
    exact_sd = np.sqrt(1 / prec + 0.01)
    assert abs(new.mean() - y.sum() / prec) < 4 * exact_sd / np.sqrt(new.size)
    assert abs(new.std() / exact_sd - 1) < 0.05
    assert np.corrcoef(_draws(idata, "mu"), new)[0, 1] > 0.6  # drawn given mu's draws (exact 0.71)


def test_an_unread_improper_latent_is_refused_before_ep():
    def build():
        pm.Flat("f")
        pm.Normal("y", pm.Normal("m", 0.0, 1.0), 1.0, observed=np.zeros(3))

    with pytest.raises(UnsupportedModelError, match="f: its prior is improper"):
        build_factor_graph(_model(build))


def test_two_dimensional_observations_split_like_flat_ones():
    # a 2-D likelihood whose covariate has missing entries, and one whose linear slot is 0 in
    # some entries (an indicator without intercept): the split crashed in 2-D with PyTensor's
    # "Runtime broadcasting not allowed" or was refused, where the flat model worked
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 2))
    y = 1 + 2 * x + 0.3 * rng.normal(size=(30, 2))
    x[[3, 7], [0, 1]] = np.nan
    X = rng.integers(0, 2, size=(30, 2)).astype(float)
    Y = 0.7 * X + 0.5 * rng.standard_t(3, size=(30, 2))
    moments = []
    for shape in [(30, 2), (60,)]:
        def imputed_covariate():
            xo = pm.Normal("x", 0, 1, observed=x.reshape(shape))
            a, b = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5)
            pm.Normal("y", a + b * xo, 0.3, observed=y.reshape(shape))

        names = sorted(f.name for f in build_factor_graph(_model(imputed_covariate)).factors)
        assert names == ["y (2 of 60 entries)"]  # the 58 data entries are an exact Gaussian term

        def indicator():
            b, s = pm.Normal("b", 0, 2), pm.HalfNormal("s", 1)
            pm.StudentT("y", nu=3, mu=b * X.reshape(shape), sigma=s, observed=Y.reshape(shape))

        q = pmkjit.ep_posterior(pmkjit.fit(model=_model(indicator), random_seed=0, progressbar=False, draws=10))
        moments.append([q["b"].mean()[0], q["b"].var()[0], q["s"].mean()[0]])
    # the entries with X = 0 read only s; the model gives the same posterior in either shape
    np.testing.assert_allclose(moments[0], moments[1], rtol=1e-6)


def test_an_improper_latent_read_by_a_prior_is_refused_naming_it():
    # theta ~ Beta(ab[0], ab[1]) with ab = pm.HalfFlat: EP draws theta's prior from ab's
    # (improper) start, and failed inside numpy's Gamma sampler with "scale < 0"
    def build():
        ab = pm.HalfFlat("ab", shape=2)
        pm.Potential("p(a, b)", -2.5 * pm.math.log(ab[0] + ab[1]))
        theta = pm.Beta("theta", ab[0], ab[1], shape=4)
        pm.Binomial("y", n=20, p=theta, observed=[3, 5, 2, 4])

    with pytest.raises(UnsupportedModelError, match=r"^ab: its prior is improper \(e.g. pm.HalfFlat"):
        pmkjit.fit(model=_model(build), random_seed=0, progressbar=False)
