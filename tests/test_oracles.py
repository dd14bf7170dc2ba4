"""Oracles against QUADPACK and against each other."""

import numpy as np
import pytest
from scipy import integrate, special, stats

from pmkjit.errors import OracleError
from pmkjit.families import Beta, Gamma, Gaussian
from pmkjit.operators import ImportanceSamplingOracle, QuadratureOracle

LOGISTIC = QuadratureOracle(special.expit, (Gaussian, Beta), unconstrained_function=lambda z: z)


def _quad_tilted(mu, v, a, b):
    """Mean and variance of N(z; mu, v) Beta(sigmoid(z); a, b) by adaptive QUADPACK."""
    logf = lambda z: stats.norm.logpdf(z, mu, np.sqrt(v)) + (a - 1) * special.log_expit(z) + (b - 1) * special.log_expit(-z)
    # locate the mode first so that QUADPACK sees the mass
    zs = np.linspace(mu - 30 * np.sqrt(v), mu + 30 * np.sqrt(v), 200001)
    lz = logf(zs)
    mode = zs[np.argmax(lz)]
    f = lambda z: np.exp(logf(z) - lz.max())
    kw = dict(points=[mode], limit=2000, epsabs=0, epsrel=1e-11)
    mass = zs[lz > lz.max() - 80.0]  # where the tilted density is above e^-80 of its peak
    step = zs[1] - zs[0]
    lo, hi = mass[0] - step, mass[-1] + step
    Z = integrate.quad(f, lo, hi, **kw)[0]
    m = integrate.quad(lambda z: z * f(z), lo, hi, **kw)[0] / Z
    return m, integrate.quad(lambda z: (z - m) ** 2 * f(z), lo, hi, **kw)[0] / Z


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # the reference's, near-zero means
@pytest.mark.parametrize(
    "mu,v,a,b",
    [(0.0, 1.0, 2.0, 1.0), (5.0, 100.0, 1.0, 2.0), (-20.0, 1e3, 500.0, 500.0), (3.0, 1e-3, 0.5, 3.0),
     (10.0, 0.5, 300.0, 1.0), (-15.0, 30.0, 2.0, 1.0), (40.0, 1.0, 2.0, 1.0)],
)
def test_quadrature_oracle_matches_quadpack(mu, v, a, b):
    res = LOGISTIC((Gaussian([mu], [v]), Beta([a], [b])))
    m, s2 = _quad_tilted(mu, v, a, b)
    q = res.beliefs[0]
    assert res.accepted[0]
    assert q.mean()[0] == pytest.approx(m, abs=1e-7 * np.sqrt(s2))
    assert q.var()[0] == pytest.approx(s2, rel=1e-7)


def test_quadrature_batch_equals_single_entries():
    rng = np.random.default_rng(0)
    msgs = (Gaussian(rng.normal(0, 5, 20), np.exp(rng.uniform(-3, 5, 20))), Beta(1 + rng.random(20) * 5, 1 + rng.random(20)))
    batch = LOGISTIC(msgs)
    for i in (0, 7, 19):
        single = LOGISTIC((msgs[0][i : i + 1], msgs[1][i : i + 1]))
        np.testing.assert_allclose(single.beliefs[0].natural[0], batch.beliefs[0].natural[i], rtol=1e-9)
        np.testing.assert_allclose(single.beliefs[1].natural[0], batch.beliefs[1].natural[i], rtol=1e-9)


def test_importance_sampling_agrees_with_quadrature_within_monte_carlo_error():
    msgs = (Gaussian([0.0, 3.0, -2.0], [1.0, 10.0, 4.0]), Beta([2.0, 1.0, 6.0], [1.0, 2.0, 3.0]))
    oracle = ImportanceSamplingOracle(lambda ins, rng: special.expit(ins[0]), (Gaussian, Beta), n_samples=100_000, random_state=0)
    res = oracle(msgs)
    ref = LOGISTIC(msgs)
    assert res.accepted.all() and np.all(res.ess > 1000)
    sd = np.sqrt(ref.beliefs[0].var())
    tol = 6 * sd / np.sqrt(res.ess)  # several Monte Carlo standard errors
    assert np.all(np.abs(res.beliefs[0].mean() - ref.beliefs[0].mean()) < tol)
    np.testing.assert_allclose(res.beliefs[0].var(), ref.beliefs[0].var(), rtol=0.05)
    np.testing.assert_allclose(res.beliefs[1].mean(), ref.beliefs[1].mean(), rtol=0.02)
    # same seed, same answer
    again = ImportanceSamplingOracle(lambda ins, rng: special.expit(ins[0]), (Gaussian, Beta), n_samples=100_000, random_state=0)
    np.testing.assert_array_equal(again(msgs).beliefs[0].natural, res.beliefs[0].natural)


def _gamma_rate_logp(tau, inputs):
    (r,) = inputs
    return stats.gamma.logpdf(tau, 2.0, scale=1.0 / r)


def test_two_latent_density_factor_is_vs_quadrature():
    """Compound gamma: tau ~ Gamma(2, rate=r) with r latent; both oracles on the 2-D tilted law."""
    msgs = (Gamma([3.0, 1.0], [2.0, 1.0]), Gamma([2.0, 5.0], [1.0, 3.0]))
    quad = QuadratureOracle(_gamma_rate_logp, (Gamma, Gamma), kind="density")(msgs)
    sampler = lambda ins, rng: rng.gamma(2.0, 1.0 / ins[0])
    ims = ImportanceSamplingOracle(sampler, (Gamma, Gamma), n_samples=200_000, random_state=1)(msgs)
    assert quad.accepted.all() and ims.accepted.all()
    for v in range(2):
        np.testing.assert_allclose(ims.beliefs[v].mean(), quad.beliefs[v].mean(), rtol=0.02)
    # brute-force 2-D grid in log space as an independent reference for the first entry
    u = np.linspace(-8, 5, 1500)
    U1, U2 = np.meshgrid(u, u, indexing="ij")
    r, tau = np.exp(U1), np.exp(U2)
    lw = (stats.gamma.logpdf(r, 3.0, scale=0.5) + U1 + stats.gamma.logpdf(tau, 2.0, scale=1.0) + U2
          + stats.gamma.logpdf(tau, 2.0, scale=1.0 / r))
    w = np.exp(lw - lw.max())
    w /= w.sum()
    assert quad.beliefs[0].mean()[0] == pytest.approx(np.sum(w * r), rel=1e-6)
    assert quad.beliefs[1].mean()[0] == pytest.approx(np.sum(w * tau), rel=1e-6)


def test_observed_output_uses_the_likelihood():
    """Probit-free check: a Normal observation of z has a closed-form Gaussian posterior."""
    prior = Gaussian([0.5, -1.0], [2.0, 0.3])
    y = np.array([1.5, 0.0])
    logp = lambda obs, ins: stats.norm.logpdf(obs, ins[0], 0.5)
    quad = QuadratureOracle(logp, (Gaussian,), kind="density", observed=y)((prior,))
    ims = ImportanceSamplingOracle(lambda ins, rng: ins[0], (Gaussian,), logp=logp, observed=y, random_state=0)((prior,))
    post_var = 1 / (1 / prior.var() + 1 / 0.25)
    post_mean = post_var * (prior.mean() / prior.var() + y / 0.25)
    np.testing.assert_allclose(quad.beliefs[0].mean(), post_mean, rtol=1e-9)
    np.testing.assert_allclose(quad.beliefs[0].var(), post_var, rtol=1e-9)
    np.testing.assert_allclose(ims.beliefs[0].mean(), post_mean, atol=0.02)


def test_small_ess_is_masked_or_raised():
    msgs = (Gaussian([0.0, 0.0], [1.0, 1.0]), Beta([2.0, 5e4], [1.0, 5.0]))  # second: tilted far in the tail
    oracle = ImportanceSamplingOracle(lambda ins, rng: special.expit(ins[0]), (Gaussian, Beta),
                                      n_samples=2000, min_ess=200, random_state=0)
    res = oracle(msgs)
    assert res.accepted.tolist() == [True, False]
    assert np.isnan(res.beliefs[0].natural[1]).all() and np.isfinite(res.beliefs[0].natural[0]).all()
    strict = ImportanceSamplingOracle(lambda ins, rng: special.expit(ins[0]), (Gaussian, Beta),
                                      n_samples=2000, min_ess=200, on_failure="raise", random_state=0)
    with pytest.raises(OracleError, match=r"batch indices \[1\]"):
        strict(msgs)


def test_oracle_input_errors():
    with pytest.raises(TypeError, match="should be Beta"):
        LOGISTIC((Gaussian([0.0], [1.0]), Gaussian([0.0], [1.0])))
    with pytest.raises(ValueError, match="logp"):
        ImportanceSamplingOracle(lambda i, r: i[0], (Gaussian,), observed=[1.0])
