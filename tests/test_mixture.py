"""Mixtures of Normals: recognition and semi-analytic tilted moments (pmkjit.ep.mixture)."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats
from _dense import tilted_by_dense_grid
from test_grid import _answer_statistics, _dense_moments

import pmkjit
from pmkjit.ep.mixture import NormalMixtureMethod
from pmkjit.families import Beta, Gamma, Gaussian, PointMass
from pmkjit.graph import build_factor_graph
from pmkjit.graph.factor_graph import DataSlot, LinearSlot
from pmkjit.graph.simplex import stick_break_dirichlet


def _likelihood(model):
    model, _ = stick_break_dirichlet(model)  # as pmkjit.fit does
    (f,) = [f for f in build_factor_graph(model).factors if f.name == "y"]
    return f


def _cavities(f, rng, B):
    """Random proper messages for the factor's inputs (operator convention, observed last)."""
    msgs = []
    for s in f.inputs:
        if isinstance(s, DataSlot):
            msgs.append(PointMass(s.values[:B]))
        elif isinstance(s, LinearSlot):
            msgs.append(Gaussian(rng.normal(0.0, 1.5, B), rng.uniform(0.3, 3.0, B)))
        elif s.family is Gamma:
            shape = rng.uniform(3.0, 15.0, B)
            msgs.append(Gamma(shape, shape / rng.uniform(0.6, 1.6, B)))
        else:
            msgs.append(Beta(rng.uniform(1.5, 8.0, B), rng.uniform(1.5, 8.0, B)))
    msgs.append(PointMass(f.observed[:B]))
    return msgs


def _beta_weight():
    with pm.Model() as m:
        p = pm.Beta("p", 2.0, 2.0)
        mu = pm.Normal("mu", 0.0, 3.0, shape=2)
        s = pm.HalfNormal("s", 1.0)
        pm.Mixture("y", w=pt.stack([p, 1.0 - p]), comp_dists=pm.Normal.dist(mu, s), observed=[-2.0, 0.3, 1.5, 3.0])
    return m


def _precision_components():
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 3.0, shape=2)
        tau = pm.Gamma("tau", 2.0, 2.0)
        pm.Mixture("y", w=[0.3, 0.7], comp_dists=[pm.Normal.dist(mu[0], tau=tau), pm.Normal.dist(mu[1], tau=tau)],
                   observed=[-1.0, 0.2, 2.5])
    return m


def _clutter():
    # Minka's clutter problem: a signal around theta among background points around 0
    with pm.Model() as m:
        theta = pm.Normal("theta", 0.0, 3.0)
        pm.NormalMixture("y", w=[0.6, 0.4], mu=pt.stack([theta, 0.0]), sigma=[1.0, 4.0],
                         observed=[-3.0, 0.5, 2.0, 6.0])
    return m


def _regression_with_weighted_scale():
    # component means a regression, the sd a latent scale times per-observation data
    x = np.array([-1.0, 0.0, 0.5, 2.0])
    with pm.Model() as m:
        a = pm.Normal("a", 0.0, 2.0, shape=2)
        b = pm.Normal("b", 0.0, 1.0)
        s = pm.HalfNormal("s", 1.0)
        w = pm.Beta("w", 3.0, 2.0)
        pm.NormalMixture("y", w=pt.stack([w, 1 - w]), mu=pt.stack([a[0] + b * x, a[1] + b * x], axis=-1),
                         sigma=s * (1.0 + x**2)[:, None], observed=[-2.0, 0.1, 1.0, 4.0])
    return m


@pytest.mark.parametrize("make", [_beta_weight, _precision_components, _clutter, _regression_with_weighted_scale])
def test_semi_analytic_moments_match_a_dense_grid(make):
    f = _likelihood(make())
    assert f.mixture is not None and "semi-analytic mixture of Normals" in f.description
    B = f.size
    msgs = _cavities(f, np.random.default_rng(3), B)
    answer = NormalMixtureMethod(f)(msgs)
    assert answer.accepted.all()
    latent = f.latent_inputs
    fams = [f.inputs[i].family for i in latent]
    data = {i: s.values for i, s in enumerate(f.inputs) if isinstance(s, DataSlot)}
    n = {1: 4001, 2: 301, 3: 80, 4: 40}[len(latent)]
    for b in range(B):
        def logp(y, xs, b=b):
            it = iter(xs)
            ins = [np.full(xs[0].shape, data[i][b]) if i in data else next(it) for i in range(len(f.inputs))]
            return f.logp(np.full(xs[0].shape, y), ins)

        first, second = _dense_moments(logp, f.observed[b], [msgs[i][[b]] for i in latent], fams, n=n, width=6.0)
        got_first, got_second = _answer_statistics(answer.beliefs, b)
        np.testing.assert_allclose(got_first, first, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(got_second, second, rtol=5e-3, atol=2e-3)


def _scale_components():
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 3.0, shape=2)
        s = pm.Gamma("s", 2.0, 2.0)
        pm.Mixture("y", w=[0.3, 0.7], comp_dists=[pm.Normal.dist(mu[0], s), pm.Normal.dist(mu[1], 2.0 * s)],
                   observed=[-1.0, 0.2, 2.5])
    return m


@pytest.mark.parametrize("link", ["precision", "scale"])
def test_a_vague_scale_cavity_is_integrated_where_the_terms_are(link):
    # A Normal mixture with BUGS's tau ~ dgamma(0.001, 0.001) (its Eyes example's prior): the
    # shared precision's cavity is a thousand units wide in log tau, and nodes over all of it
    # left every instance unanswered (a two-component probe: not converged, 54 NUTS sds off);
    # with sigma ~ Gamma(0.001, 0.001), 15 sds off and the scale collapsed. Against a dense
    # grid per term: the tilted law is sum_k w_k N(y; m_k, v_k + noise_k(s)) Gamma(s; 0.001, 0.001).
    f = _likelihood(_precision_components() if link == "precision" else _scale_components())
    spec = f.mixture
    msgs = []
    for s in f.inputs:
        msgs.append(Gaussian(np.array([-1.0, 0.5, 0.0]), np.array([9.0, 4.0, 100.0])) if isinstance(s, LinearSlot)
                    else Gamma(np.full(3, 0.001), np.full(3, 0.001)))
    msgs.append(PointMass(f.observed))
    answer = NormalMixtureMethod(f)(msgs)
    assert answer.accepted.all()
    weights = [0.3, 0.7]
    i_tau = spec.scale_input[0]
    for b in range(3):
        terms = []
        for k in range(2):
            q = msgs[spec.mean_input[k]]
            if link == "precision":
                terms.append(tilted_by_dense_grid(q.mean()[b], q.var()[b], f.observed[b], 0.001, 0.001, -1.0))
                continue
            c = 1.0 + k  # the second component's sd is 2 s: N(y; eta, 4 s^2) = N(y / 2; eta / 2, s^2) / 2
            e, var, e_log, e_s, log_z = tilted_by_dense_grid(q.mean()[b] / c, q.var()[b] / c**2, f.observed[b] / c,
                                                             0.001, 0.001, 2.0)
            terms.append((c * e, c**2 * var, e_log, e_s, log_z - np.log(c)))
        log_r = np.log(weights) + np.array([t[4] for t in terms])
        r = np.exp(log_r - log_r.max())
        r /= r.sum()
        for v_out, i in enumerate(f.latent_inputs):
            got = answer.beliefs[v_out]
            if i == i_tau:
                want = r @ np.array([[t[2], t[3]] for t in terms])
                np.testing.assert_allclose(got.expected_sufficient_statistics()[b], want, rtol=1e-4)
                continue
            q = msgs[i]
            moments = [(t[0], t[1]) if spec.mean_input[k] == i else (q.mean()[b], q.var()[b])
                       for k, t in enumerate(terms)]
            mean = r @ np.array([mo[0] for mo in moments])
            var = r @ np.array([mo[1] + (mo[0] - mean) ** 2 for mo in moments])
            np.testing.assert_allclose([got.mean()[b], got.var()[b]], [mean, var], rtol=1e-4)


def test_dirichlet_weights_of_three_components_are_products_of_sticks():
    with pm.Model() as m:
        w = pm.Dirichlet("w", np.ones(3))
        mu = pm.Normal("mu", [-2.0, 0.0, 2.0], 1.0, shape=3)
        pm.NormalMixture("y", w=w, mu=mu, sigma=0.5, observed=[-2.0, 0.1, 2.2])
    f = _likelihood(m)
    spec = f.mixture
    assert spec is not None and len(spec.stick_inputs) == 2
    # w_1 = v_1, w_2 = (1 - v_1) v_2, w_3 = (1 - v_1)(1 - v_2), in some order of the sticks
    e = spec.exponents
    assert set(np.unique(e)) <= {0.0, 1.0}
    assert sorted(tuple(row) for row in e.sum(axis=1)) == [(0.0, 2.0), (1.0, 0.0), (1.0, 1.0)]
    # and the moments of all five latents agree with self-normalised importance sampling
    # from the cavities (2e6 draws per entry; a 5-D dense grid would be too costly)
    msgs = _cavities(f, np.random.default_rng(1), f.size)
    ours = NormalMixtureMethod(f)(msgs)
    assert ours.accepted.all()
    rng = np.random.default_rng(2)
    for b in range(f.size):
        xs = [msgs[i][[b]].sample(rng, 2_000_000).ravel() for i in f.latent_inputs]
        w = np.exp(f.logp(np.full(xs[0].shape, f.observed[b]), xs))
        w /= w.sum()
        for k, (x, bel) in enumerate(zip(xs, ours.beliefs)):
            if isinstance(bel, Gaussian):
                mean = np.sum(w * x)
                expected = [mean, np.sum(w * (x - mean) ** 2)]
                got = [bel.mean()[b], bel.var()[b]]
            else:
                expected = np.sum(w[:, None] * Beta.sufficient_statistics(x), axis=0)
                got = bel[[b]].expected_sufficient_statistics()[0]
            np.testing.assert_allclose(got, expected, rtol=0.01, atol=0.005)


@pytest.mark.parametrize("kind", ["link weight", "exp mean", "student components"])
def test_other_mixtures_keep_the_grid(kind):
    y = [-1.0, 0.5, 2.0]
    with pm.Model() as m:
        a = pm.Normal("a", 0.0, 1.0)
        mu = pm.Normal("mu", 0.0, 2.0, shape=2)
        s = pm.HalfNormal("s", 1.0)
        if kind == "link weight":
            p = pm.math.invlogit(a)
            pm.Mixture("y", w=pt.stack([p, 1 - p]), comp_dists=pm.Normal.dist(mu, s), observed=y)
        elif kind == "exp mean":
            pm.NormalMixture("y", w=[0.5, 0.5], mu=pt.stack([mu[0], pt.exp(a)]), sigma=s, observed=y)
        else:
            pm.Mixture("y", w=[0.5, 0.5], comp_dists=pm.StudentT.dist(nu=4.0, mu=mu, sigma=s), observed=y)
    assert _likelihood(m).mixture is None


def test_the_clutter_problem_matches_its_exact_posterior():
    r = np.random.default_rng(7)
    n = 60
    signal = r.random(n) < 0.5
    y = np.where(signal, r.normal(2.0, 1.0, n), r.normal(0.0, 10.0, n))
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 10.0)
        pm.NormalMixture("y", w=[0.5, 0.5], mu=pt.stack([theta, 0.0]), sigma=[1.0, 10.0], observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=4000, compute_log_likelihood=False)
    assert idata.ep.attrs["converged"] and "y: semi-analytic" in idata.ep.attrs["factor_methods"]
    t = np.linspace(-5.0, 8.0, 20001)
    log_post = stats.norm.logpdf(t, 0, 10) + sum(
        np.logaddexp(np.log(0.5) + stats.norm.logpdf(yi, t, 1.0), np.log(0.5) + stats.norm.logpdf(yi, 0.0, 10.0))
        for yi in y)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    mean = np.sum(w * t)
    sd = np.sqrt(np.sum(w * (t - mean) ** 2))
    draws = idata.posterior["theta"].values.ravel()
    assert abs(draws.mean() - mean) < 0.05 * sd
    assert 0.9 < draws.std() / sd < 1.1


def _three_clusters(seed):
    """The gallery's three-component mixture (benchmarks/gallery_vs_nuts.py): clusters at
    -4, 0 and 5 with sds 0.7, 1 and 1.5, Dirichlet weights, ordered means, a latent sd each."""
    rng = np.random.default_rng(seed)
    z = rng.choice(3, 200, p=[0.3, 0.5, 0.2])
    y = np.array([-4.0, 0.0, 5.0])[z] + np.array([0.7, 1.0, 1.5])[z] * rng.normal(size=200)
    with pm.Model() as m:
        w = pm.Dirichlet("w", np.ones(3))
        mu = pm.Normal("mu", [-3.0, 0.0, 3.0], 5.0, shape=3, transform=pm.distributions.transforms.ordered,
                       initval=[-3.0, 0.0, 3.0])
        s = pm.HalfNormal("s", 2.0, shape=3)
        pm.NormalMixture("y", w=w, mu=mu, sigma=s, observed=y)
    return m


def _map_from_the_clusters(model):
    """The posterior mode nearest the generating values (scipy's optimiser on PyMC's logp)."""
    start = {"w": np.array([0.3, 0.5, 0.2]), "mu": np.array([-4.0, 0.0, 5.0]), "s": np.array([0.7, 1.0, 1.5])}
    with model:
        return pm.find_MAP(start=start, progressbar=False)


def test_a_three_component_mixture_drifting_out_of_its_first_sweeps_reaches_the_mode():
    # its sweeps 23-28 moved the posterior further each time, all in one direction (a slow
    # escape from where the first sweeps put it): halving the step on each left EP at the
    # smallest step, creeping for 80 sweeps, not converged at 50 with mu[2] 3.6 sds off
    model = _three_clusters(0)
    idata = pmkjit.fit(model=model, random_seed=0, progressbar=False, draws=2000, compute_log_likelihood=False)
    assert idata.ep.attrs["converged"]
    mode = _map_from_the_clusters(model)
    # find_MAP's mode is that of the unconstrained coordinates: compare there (mu, log s);
    # log s is still skewed (NUTS's mean of s[2] is 1.82, the mode 1.62), hence its wider
    # margin. Before, mu[2] was 3.6 sds and log s[1] 7 sds from the mode.
    for name, f, margin in (("mu", lambda x: x, 0.35), ("s", np.log, 0.7)):
        draws = f(idata.posterior[name].values.reshape(-1, 3))
        assert np.all(np.abs(draws.mean(0) - f(mode[name])) < margin * draws.std(0)), name


def test_a_mixture_settled_in_a_poor_mode_is_warned_about():
    # on the seed-5 data the first sweeps put two components on the cluster at 0 and a broad
    # one over the cluster at 5: EP converges there, 22 NUTS sds off, its own output silent
    model = _three_clusters(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pmkjit.fit(model=model, random_seed=5, progressbar=False, draws=200, compute_log_likelihood=False)
    assert any("mixture components 1 and 2 overlap after EP" in str(w.message) for w in caught)
    # it is a poor mode indeed: the posterior density at EP's means is far below the mode's
    logp = model.compile_logp()
    point = model.initial_point()
    ep = {name: idata.posterior[name].mean(("chain", "draw")).values for name in ("w", "mu", "s")}
    mode = _map_from_the_clusters(model)

    def at(values):
        q = dict(point)
        for name, value in values.items():
            rv = model[name]
            q[model.rvs_to_values[rv].name] = model.rvs_to_transforms[rv].forward(value).eval()
        return float(logp(q))

    assert at({k: mode[k] for k in ep}) - at(ep) > 5.0
