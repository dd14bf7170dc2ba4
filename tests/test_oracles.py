"""Oracles against QUADPACK, brute force, closed forms and each other."""

import numpy as np
import pytest
from scipy import integrate, special, stats
from scipy.special import logsumexp

import pmkjit.operators.quadrature as quadrature_module
from pmkjit.errors import ImproperMessageError, OracleError
from pmkjit.families import Beta, Gamma, Gaussian
from pmkjit.operators import ImportanceSamplingOracle, OracleResult, QuadratureOracle

LOGISTIC = QuadratureOracle(special.expit, (Gaussian, Beta))


def sigmoid_sampler(inputs, rng):
    return special.expit(inputs[0])


def _logistic_log_tilted(z, mu, v, a, b):
    return -0.5 * (z - mu) ** 2 / v + (a - 1) * special.log_expit(z) + (b - 1) * special.log_expit(-z)


def _quad_tilted(mu, v, a, b):
    """Projected (mean, var) and (alpha, beta) of N(z; mu, v) Beta(sigmoid(z); a, b) by QUADPACK.

    A dense scan finds where the tilted density is above e^-80 of its peak (both modes,
    if there are two); QUADPACK then integrates that hull in 400 pieces, so that no
    piece hides a narrow peak from it.
    """
    sd = np.sqrt(v)
    zs = np.linspace(min(mu - 40 * sd, -60), max(mu + 40 * sd, 60), 2_000_001)
    lz = _logistic_log_tilted(zs, mu, v, a, b)
    top = lz.max()
    mass = zs[lz > top - 80.0]
    step = zs[1] - zs[0]
    edges = np.linspace(mass[0] - step, mass[-1] + step, 401)
    f = lambda z: np.exp(_logistic_log_tilted(z, mu, v, a, b) - top)  # noqa: E731

    def integral(g):
        return sum(integrate.quad(lambda z: g(z) * f(z), lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
                   for lo, hi in zip(edges[:-1], edges[1:]))

    Z = integral(lambda z: 1.0)
    m = integral(lambda z: z) / Z
    s2 = integral(lambda z: (z - m) ** 2) / Z
    e = np.array([[integral(special.log_expit) / Z, integral(lambda z: special.log_expit(-z)) / Z]])
    belief = Beta.project(e)
    return m, s2, belief.alpha[0], belief.beta[0]


# (mu, var, alpha, beta): ordinary, wide, narrow tilted, far-away tilted, two modes
REGIMES = [
    (0.0, 1.0, 2.0, 1.0),
    (5.0, 100.0, 1.0, 2.0),
    (-20.0, 1e3, 500.0, 500.0),  # tilted sd 0.06 inside an incoming sd of 32
    (3.0, 1e-3, 0.5, 3.0),
    (10.0, 0.5, 300.0, 1.0),
    (-15.0, 30.0, 2.0, 1.0),
    (-10.7, 0.09, 325.6, 8.3),  # tilted peak 37 incoming sds away from the incoming mean
    (5.0, 1e3, 0.5, 0.5),  # bimodal tilted law
    (20.0, 1e3, 0.5, 0.5),  # second mode of weight 2e-9 sets alpha
    (12.8, 0.07, 6.4, 224.8),
]


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # the reference's, near-zero integrands
@pytest.mark.parametrize("mu,v,a,b", REGIMES)
def test_quadrature_oracle_matches_quadpack(mu, v, a, b):
    res = LOGISTIC((Gaussian([mu], [v]), Beta([a], [b])))
    m, s2, alpha, beta = _quad_tilted(mu, v, a, b)
    assert res.accepted[0]
    g, p = res.beliefs
    assert g.mean()[0] == pytest.approx(m, abs=1e-9 * np.sqrt(s2))
    assert g.var()[0] == pytest.approx(s2, rel=1e-9)
    assert p.alpha[0] == pytest.approx(alpha, rel=1e-8)
    assert p.beta[0] == pytest.approx(beta, rel=1e-8)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_quadrature_oracle_random_messages_across_the_range():
    """mu in [-20, 20], var in [1e-3, 1e3], alpha, beta in [0.5, 500], log-uniform."""
    rng = np.random.default_rng(7)
    n = 12
    mu, v = rng.uniform(-20, 20, n), 10 ** rng.uniform(-3, 3, n)
    a, b = 10 ** rng.uniform(np.log10(0.5), np.log10(500), (2, n))
    res = LOGISTIC((Gaussian(mu, v), Beta(a, b)))
    assert res.accepted.all()
    for i in range(n):
        m, s2, alpha, beta = _quad_tilted(mu[i], v[i], a[i], b[i])
        assert res.beliefs[0].mean()[i] == pytest.approx(m, abs=1e-9 * np.sqrt(s2))
        assert res.beliefs[0].var()[i] == pytest.approx(s2, rel=1e-9)
        e = res.beliefs[1].expected_sufficient_statistics()[i]
        if np.min(np.abs(e)) > 1e-8:  # QUADPACK's absolute accuracy bounds the reference's
            assert res.beliefs[1].alpha[i] == pytest.approx(alpha, rel=1e-8)
            assert res.beliefs[1].beta[i] == pytest.approx(beta, rel=1e-8)


@pytest.mark.parametrize("mu,v,a,b", [(-20.0, 1e3, 0.5, 500.0), (20.0, 1e-3, 0.5, 500.0), (-0.6, 800.0, 0.51, 35.3)])
def test_quadrature_tiny_log_statistics_match_brute_force(mu, v, a, b):
    """E[log(1 - p)] of 1e-62 .. 1e-9 comes from thin regions far from the tilted peak."""
    res = LOGISTIC((Gaussian([mu], [v]), Beta([a], [b])))
    sd = np.sqrt(v)
    z = np.linspace(min(mu - 45 * sd, -80), max(mu + 45 * sd, 80), 4_000_001)
    lw = _logistic_log_tilted(z, mu, v, a, b)
    lz = logsumexp(lw)
    with np.errstate(divide="ignore"):
        e = [-np.exp(logsumexp(lw + np.log(-special.log_expit(s * z))) - lz) for s in (1, -1)]
    got = res.beliefs[1].expected_sufficient_statistics()[0]
    assert res.accepted[0]
    np.testing.assert_allclose(got, e, rtol=1e-9)


def test_quadrature_batch_equals_single_entries():
    rng = np.random.default_rng(0)
    n = 20
    msgs = (Gaussian(rng.normal(0, 5, n), np.exp(rng.uniform(-5, 6, n))),
            Beta(np.exp(rng.uniform(-0.7, 6, n)), np.exp(rng.uniform(-0.7, 6, n))))
    batch = LOGISTIC(msgs)
    for i in range(n):
        single = LOGISTIC((msgs[0][i : i + 1], msgs[1][i : i + 1]))
        assert single.accepted[0] == batch.accepted[i]
        for v in range(2):
            np.testing.assert_allclose(single.beliefs[v].natural[0], batch.beliefs[v].natural[i], rtol=1e-13)


def test_quadrature_chunks_do_not_change_the_answer(monkeypatch):
    rng = np.random.default_rng(1)
    msgs = (Gaussian(rng.normal(0, 5, 9), np.exp(rng.uniform(-3, 5, 9))), Beta(1 + rng.random(9) * 5, 1 + rng.random(9)))
    whole = LOGISTIC(msgs)
    monkeypatch.setattr(quadrature_module, "_MAX_POINTS", 5000)  # two entries per chunk
    chunked = QuadratureOracle(special.expit, (Gaussian, Beta))(msgs)
    for v in range(2):
        np.testing.assert_allclose(chunked.beliefs[v].natural, whole.beliefs[v].natural, rtol=1e-13)


def test_quadrature_refuses_where_the_function_saturates():
    """An unrecognised saturating link (expit wrapped in a lambda) cannot resolve p = 1 - 1e-20."""
    wrapped = QuadratureOracle(lambda z: special.expit(z), (Gaussian, Beta))
    msgs = (Gaussian([0.0, 45.0], [1.0, 1.0]), Beta([2.0, 2.0], [3.0, 3.0]))
    res = wrapped(msgs)
    assert res.accepted.tolist() == [True, False]
    assert np.isnan(res.beliefs[0].natural[1]).all() and np.isnan(res.beliefs[1].natural[1]).all()
    ref = LOGISTIC(msgs)  # the recognised expit works in logit space and answers both
    assert ref.accepted.all()
    np.testing.assert_allclose(res.beliefs[0].natural[0], ref.beliefs[0].natural[0], rtol=1e-9)


def test_probit_link_is_resolved_where_it_saturates():
    """0.5 erfc(u) (pm.math.invprobit) gets a stable logit: tilted laws in its flat tails
    are answered and agree with brute force on a dense grid in the latent's own scale."""
    from pmkjit.links import half_erfc

    probit = QuadratureOracle(half_erfc, (Gaussian, Beta))
    mu = np.array([0.0, -9.0, 9.0, -30.0, 2.0])
    v = np.array([1.0, 4.0, 0.5, 9.0, 25.0])
    a, b = np.array([2.0, 2.0, 1.0, 2.0, 1.0]), np.array([1.0, 1.0, 2.0, 1.0, 2.0])
    res = probit((Gaussian(mu, v), Beta(a, b)))
    assert res.accepted.all()
    wrapped = QuadratureOracle(lambda u: half_erfc(u), (Gaussian, Beta))  # the same link, unrecognised
    assert not wrapped((Gaussian(mu, v), Beta(a, b))).accepted.all()
    z = np.linspace(-80.0, 80.0, 800_001)
    for i in range(mu.size):
        log_p = special.log_ndtr(-np.sqrt(2.0) * z)  # log 0.5 erfc(z)
        log_q = special.log_ndtr(np.sqrt(2.0) * z)  # log (1 - 0.5 erfc(z))
        lw = stats.norm.logpdf(z, mu[i], np.sqrt(v[i])) + (a[i] - 1) * log_p + (b[i] - 1) * log_q
        w = np.exp(lw - lw.max())
        w /= w.sum()
        m = w @ z
        np.testing.assert_allclose(res.beliefs[0].mean()[i], m, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(res.beliefs[0].var()[i], w @ (z - m) ** 2, rtol=1e-8)


def test_quadrature_refuses_a_factor_that_cannot_be_evaluated():
    nan_density = QuadratureOracle(lambda x, ins: np.full_like(x, np.nan), (Gaussian,), kind="density", observed=[0.0])
    res = nan_density((Gaussian([0.0], [1.0]),))
    assert not res.accepted[0] and np.isnan(res.beliefs[0].natural).all()


def _gamma_rate_logp(tau, inputs):
    """Compound gamma: log Gamma(tau; shape 2, rate r)."""
    (r,) = inputs
    return 2.0 * np.log(r) - special.gammaln(2.0) + np.log(tau) - r * tau


def _brute_force_compound_gamma(kr, rr, kt, rt, n=2001):
    """E[(log r, r, log tau, tau)] under the 2-D tilted law, by a wide log-space grid."""
    m1, m2 = Gamma([kr], [rr]).unconstrained_moments(), Gamma([kt], [rt]).unconstrained_moments()
    axes = [np.linspace(m[0][0] - 25 * np.sqrt(m[1][0]) - 10, m[0][0] + 25 * np.sqrt(m[1][0]) + 10, n) for m in (m1, m2)]
    U1, U2 = np.meshgrid(*axes, indexing="ij")
    r, tau = np.exp(U1), np.exp(U2)
    lw = kr * U1 - rr * r + kt * U2 - rt * tau + _gamma_rate_logp(tau, (r,))
    w = np.exp(lw - logsumexp(lw))
    return np.array([np.sum(w * U1), np.sum(w * r), np.sum(w * U2), np.sum(w * tau)])


def test_two_latent_density_factor_quadrature_vs_brute_force():
    cases = [(3.0, 2.0, 2.0, 1.0), (0.5, 0.1, 0.5, 2.0), (50.0, 5.0, 1.0, 10.0)]
    kr, rr, kt, rt = (np.array(c) for c in zip(*cases))
    res = QuadratureOracle(_gamma_rate_logp, (Gamma, Gamma), kind="density")((Gamma(kr, rr), Gamma(kt, rt)))
    assert res.accepted.all()
    for i, c in enumerate(cases):
        got = np.concatenate([res.beliefs[0].expected_sufficient_statistics()[i],
                              res.beliefs[1].expected_sufficient_statistics()[i]])
        np.testing.assert_allclose(got, _brute_force_compound_gamma(*c), rtol=1e-10)


def _lognormal_in_first(x2, inputs):
    """A density of two positive latents: log-normal in the first (sd 8 in log x1), flat in the second."""
    (x1,) = inputs
    return -np.log(x1) ** 2 / 128.0 + 0.0 * x2


def test_quadrature_window_holds_the_statistics_mass_not_only_the_weight():
    # The tilted law in u = log x1 is exp(u - 1e-80 e^u - u^2 / 128), about N(64, 8^2). E[x1]'s
    # integrand, e^u times it, peaks 8 sds above the weight's peak, so a window of +-12 of the
    # weight's sds cuts it 4 of its sds from its peak (a 3e-5 share). In 2-D no scan looks beyond
    # the window: only the check of w |T| at its edges, not of w, widens it (without that check
    # E[x1] is 1.7e-6 low).
    msgs = (Gamma([1.0], [1e-80]), Gamma([2.0], [1.0]))
    res = QuadratureOracle(_lognormal_in_first, (Gamma, Gamma), kind="density")(msgs)
    assert res.accepted.all()
    u = np.linspace(-200.0, 400.0, 600_001)
    logw = u - 1e-80 * np.exp(u) - u**2 / 128.0
    exact = {"log x": np.exp(logsumexp(logw, b=u) - logsumexp(logw)), "x": np.exp(logsumexp(logw + u) - logsumexp(logw))}
    got = res.beliefs[0].expected_sufficient_statistics()[0]  # (E log x, E x)
    np.testing.assert_allclose(got, [exact["log x"], exact["x"]], rtol=1e-8)
    np.testing.assert_allclose(res.beliefs[1].expected_sufficient_statistics()[0], [special.digamma(2.0), 2.0],
                               rtol=1e-8)


def test_two_latent_density_factor_is_vs_quadrature():
    """Compound gamma: tau ~ Gamma(2, rate=r), r latent; both oracles on the 2-D tilted law."""
    msgs = (Gamma([3.0, 1.0], [2.0, 1.0]), Gamma([2.0, 5.0], [1.0, 3.0]))
    quad = QuadratureOracle(_gamma_rate_logp, (Gamma, Gamma), kind="density")(msgs)
    sampler = lambda ins, rng: rng.gamma(2.0, 1.0 / ins[0])  # noqa: E731
    ims = ImportanceSamplingOracle(sampler, (Gamma, Gamma), n_samples=200_000, random_state=1)(msgs)
    assert quad.accepted.all() and ims.accepted.all()
    for v in range(2):
        # Monte Carlo error of a weighted mean: sd / sqrt(ESS); allow 5 of them
        tol = 5 * np.sqrt(quad.beliefs[v].var() / ims.ess)
        assert np.all(np.abs(ims.beliefs[v].mean() - quad.beliefs[v].mean()) < tol)
        np.testing.assert_allclose(ims.beliefs[v].var(), quad.beliefs[v].var(), rtol=0.05)


def test_importance_sampling_agrees_with_quadrature_within_monte_carlo_error():
    msgs = (Gaussian([0.0, 3.0, -2.0, 8.0], [1.0, 10.0, 4.0, 30.0]), Beta([2.0, 1.0, 6.0, 0.7], [1.0, 2.0, 3.0, 4.0]))
    res = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=100_000, random_state=0)(msgs)
    ref = LOGISTIC(msgs)
    assert res.accepted.all() and np.all(res.ess > 1000)
    tol = 5 * np.sqrt(ref.beliefs[0].var() / res.ess)  # five Monte Carlo standard errors
    assert np.all(np.abs(res.beliefs[0].mean() - ref.beliefs[0].mean()) < tol)
    np.testing.assert_allclose(res.beliefs[0].var(), ref.beliefs[0].var(), rtol=0.05)
    # log sigmoid(+-z) are 1-Lipschitz in z, so their sds are about at most z's
    e_is = res.beliefs[1].expected_sufficient_statistics()
    e_ref = ref.beliefs[1].expected_sufficient_statistics()
    assert np.all(np.abs(e_is - e_ref) < tol[:, None])


def test_importance_sampling_batch_agrees_with_single_entries():
    msgs = (Gaussian([0.0, 3.0, -2.0], [1.0, 10.0, 4.0]), Beta([2.0, 1.0, 6.0], [1.0, 2.0, 3.0]))
    batch = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=50_000, random_state=3)(msgs)
    ref = LOGISTIC(msgs)
    for i in range(3):
        single = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=50_000, random_state=100 + i)(
            (msgs[0][i : i + 1], msgs[1][i : i + 1]))
        sd = np.sqrt(ref.beliefs[0].var()[i])
        se = sd * (1 / np.sqrt(single.ess[0]) + 1 / np.sqrt(batch.ess[i]))
        assert abs(single.beliefs[0].mean()[0] - batch.beliefs[0].mean()[i]) < 5 * se


def test_importance_sampling_is_reproducible_and_counts():
    msgs = (Gaussian([0.0, 1.0], [1.0, 2.0]), Beta([2.0, 3.0], [1.0, 3.0]))
    runs = [ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=5000, random_state=seed)
            for seed in (11, 11, 12)]
    a, b, c = (o(msgs) for o in runs)
    for v in range(2):
        np.testing.assert_array_equal(a.beliefs[v].natural, b.beliefs[v].natural)
        assert not np.array_equal(a.beliefs[v].natural, c.beliefs[v].natural)
    np.testing.assert_array_equal(a.ess, b.ess)
    assert runs[0].n_calls == 2 and runs[0].n_samples_drawn == 2 * 5000
    # a shared Generator advances: a second call gives a different answer
    again = runs[0](msgs)
    assert not np.array_equal(again.beliefs[0].natural, a.beliefs[0].natural)
    assert runs[0].n_calls == 4


def test_importance_sampling_chunks_are_valid():
    msgs = (Gaussian(np.linspace(-2, 2, 7), np.ones(7)), Beta(np.full(7, 2.0), np.full(7, 3.0)))
    ref = LOGISTIC(msgs)
    for chunk in (1, 3, 100):
        res = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=20_000, chunk_size=chunk,
                                       random_state=0)(msgs)
        assert res.accepted.all()
        tol = 5 * np.sqrt(ref.beliefs[0].var() / res.ess)
        assert np.all(np.abs(res.beliefs[0].mean() - ref.beliefs[0].mean()) < tol)


def test_small_ess_is_retried_then_masked_or_raised():
    msgs = (Gaussian([0.0, 0.0, 0.5], [1.0, 1.0, 1.0]), Beta([2.0, 5e4, 2.0], [1.0, 5.0, 2.0]))  # 1: far in the tail
    oracle = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=2000, min_ess=200, random_state=0)
    res = oracle(msgs)
    assert isinstance(res, OracleResult)
    assert res.accepted.tolist() == [True, False, True]
    assert res.ess[1] < 200 <= min(res.ess[0], res.ess[2])
    for belief in res.beliefs:  # refused: NaN in every belief, nothing silently wrong
        assert np.isnan(belief.natural[1]).all() and np.isfinite(belief.natural[[0, 2]]).all()
    # entry 1 was retried twice with 4000 and 8000 samples, the others drawn once
    assert oracle.n_samples_drawn == 3 * 2000 + 4000 + 8000
    strict = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=2000, min_ess=200,
                                      on_failure="raise", random_state=0)
    with pytest.raises(OracleError, match=r"batch indices \[1\]"):
        strict(msgs)


def test_failed_projection_is_masked_per_entry():
    """With min_ess=0 an entry whose weight sits on one sample has zero variance: refused, not raised."""
    msgs = (Gaussian([0.0, 0.0], [1.0, 1.0]), Beta([2.0, 1e7], [1.0, 5.0]))
    res = ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), n_samples=200, min_ess=0.0, random_state=0)(msgs)
    assert res.accepted.tolist() == [True, False]
    assert np.isnan(res.beliefs[0].natural[1]).all()


def test_observed_output_uses_the_likelihood():
    """A Normal observation of z has a closed-form Gaussian posterior."""
    prior = Gaussian([0.5, -1.0], [2.0, 0.3])
    y = np.array([1.5, 0.0])
    logp = lambda obs, ins: stats.norm.logpdf(obs, ins[0], 0.5)  # noqa: E731
    quad = QuadratureOracle(logp, (Gaussian,), kind="density", observed=y)((prior,))
    ims = ImportanceSamplingOracle(None, (Gaussian,), logp=logp, observed=y, random_state=0)((prior,))
    post_var = 1 / (1 / prior.var() + 1 / 0.25)
    post_mean = post_var * (prior.mean() / prior.var() + y / 0.25)
    np.testing.assert_allclose(quad.beliefs[0].mean(), post_mean, rtol=1e-12)
    np.testing.assert_allclose(quad.beliefs[0].var(), post_var, rtol=1e-12)
    assert len(quad.beliefs) == len(ims.beliefs) == 1
    assert np.all(np.abs(ims.beliefs[0].mean() - post_mean) < 5 * np.sqrt(post_var / ims.ess))
    # observed values per call override the constructor's
    other = ImportanceSamplingOracle(None, (Gaussian,), logp=logp, random_state=0)((prior,), observed=y)
    np.testing.assert_array_equal(other.beliefs[0].natural, ims.beliefs[0].natural)


def test_quadrature_counts_and_reports_nodes():
    oracle = QuadratureOracle(special.expit, (Gaussian, Beta))
    res = oracle((Gaussian([0.0, 1.0, 2.0], [1.0, 1.0, 1.0]), Beta([2.0, 2.0, 2.0], [2.0, 2.0, 2.0])))
    assert oracle.n_calls == 3
    assert np.all(res.ess >= oracle.n_nodes) and res.accepted.dtype == bool


def test_oracle_input_errors():
    with pytest.raises(TypeError, match="should be Beta"):
        LOGISTIC((Gaussian([0.0], [1.0]), Gaussian([0.0], [1.0])))
    with pytest.raises(ValueError, match="differ in length"):
        LOGISTIC((Gaussian([0.0], [1.0]), Beta([1.0, 2.0], [1.0, 1.0])))
    with pytest.raises(ValueError, match="expected 2 message batches"):
        LOGISTIC((Gaussian([0.0], [1.0]),))
    with pytest.raises(ImproperMessageError, match="incoming message 0"):
        LOGISTIC((Gaussian.from_natural([[0.0, 1.0]]), Beta([1.0], [1.0])))
    with pytest.raises(ValueError, match="logp"):
        ImportanceSamplingOracle(lambda i, r: i[0], (Gaussian,), observed=[1.0])
    with pytest.raises(ValueError, match="on_failure"):
        ImportanceSamplingOracle(sigmoid_sampler, (Gaussian, Beta), on_failure="ignore")
    with pytest.raises(ValueError, match="sampler returned shape"):
        ImportanceSamplingOracle(lambda i, r: i[0][:1], (Gaussian, Beta), n_samples=10)(
            (Gaussian([0.0], [1.0]), Beta([1.0], [1.0])))
    with pytest.raises(ValueError, match="1 or 2 latent"):
        QuadratureOracle(lambda x, ins: x, (Gaussian, Gaussian, Gaussian), kind="density")


def test_invprobit_in_a_model_is_recognised_as_the_probit_link():
    import pymc as pm

    from pmkjit.graph import build_factor_graph
    from pmkjit.links import half_erfc

    # (60 observations: fewer, and the likelihood would stay whole, to be one site)
    X = np.random.default_rng(0).standard_normal((60, 3))
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", p=pm.math.invprobit(pm.math.dot(X, w)), observed=(X[:, 0] > 0).astype(int))
    (factor,) = build_factor_graph(model, random_seed=0).factors
    assert factor.scipy_function is half_erfc
    u = np.linspace(-6.0, 6.0, 13)
    np.testing.assert_allclose(factor.function((u,), None), half_erfc(u), rtol=1e-12)
    # the linear slot carries the -1/sqrt(2) of invprobit: p = Phi(X w) (to float32 rounding:
    # PyMC's graph takes sqrt(2.0) of a float32 constant)
    w_val = np.array([0.3, -0.2, 0.5])
    z = factor.inputs[0].A @ w_val + factor.inputs[0].c
    np.testing.assert_allclose(half_erfc(z), stats.norm.cdf(X @ w_val), rtol=1e-7)


def test_quadrature_answers_a_kinked_integrand_to_the_coarse_tolerance():
    """A Laplace likelihood ``|y - mu| / s`` has a kink at ``mu = y``, where the trapezoid
    rule converges only as h^2: after its refinements it stops near 1e-5 of a statistic and
    was refused (importance sampling then answered half of a Laplace regression's entries,
    and EP did not converge). It is now accepted at 1e-4 and counted in ``n_coarse``;
    against a brute-force grid with the kink on a node (there the trapezoid rule converges
    geometrically on each side)."""
    y = np.array([1.02, 0.9])
    logp = lambda obs, ins: -np.log(2 * ins[1]) - np.abs(obs - ins[0]) / ins[1]  # noqa: E731
    msgs = (Gaussian([1.0, 1.0], [0.05**2, 0.3**2]), Gamma([40.0, 40.0], [60.0, 60.0]))
    oracle = QuadratureOracle(logp, (Gaussian, Gamma), kind="density", observed=y)
    res = oracle(msgs)
    assert res.accepted.all() and oracle.n_coarse >= 1
    for i in range(2):
        sd_mu = np.sqrt(msgs[0].var()[i])
        # mu: 20001 nodes over +-10 cavity sds with y on a node; log s: 801 nodes over +-10 sds
        mu = y[i] + sd_mu * np.arange(-10000, 10001) / 1000 + np.round((msgs[0].mean()[i] - y[i]) / sd_mu * 1000) / 1000 * sd_mu
        mu = mu[np.abs(mu - msgs[0].mean()[i]) <= 10 * sd_mu]
        m_log, v_log = msgs[1].unconstrained_moments()
        u = m_log[i] + np.sqrt(v_log[i]) * np.linspace(-10, 10, 801)
        s = np.exp(u)
        lw = (stats.norm.logpdf(mu, msgs[0].mean()[i], sd_mu)[:, None]
              + stats.gamma.logpdf(s, 40.0, scale=1 / 60.0)[None, :] + u[None, :]  # Jacobian of log s
              + logp(y[i], (mu[:, None], s[None, :])))
        w = np.exp(lw - lw.max())
        w /= w.sum()
        mean_mu = np.sum(w * mu[:, None])
        var_mu = np.sum(w * (mu[:, None] - mean_mu) ** 2)
        stats_s = (np.sum(w * u[None, :]), np.sum(w * s[None, :]))  # E[log s], E[s]
        assert abs(res.beliefs[0].mean()[i] - mean_mu) < 1e-4 * np.sqrt(var_mu)
        assert abs(res.beliefs[0].var()[i] / var_mu - 1) < 1e-3
        got = res.beliefs[1].expected_sufficient_statistics()[i]
        np.testing.assert_allclose(got, stats_s, rtol=1e-4)
