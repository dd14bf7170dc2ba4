"""Exponential-family messages: algebra, projections and moments against references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from pmkjit.errors import ImproperMessageError
from pmkjit.families import Beta, Gamma, Gaussian, MvGaussian, family_by_name

pos = st.floats(0.05, 200.0)
real = st.floats(-50.0, 50.0)
var = st.floats(1e-3, 1e3)
FAST = settings(max_examples=60, deadline=None)


def make(family, a, b):
    return {"Gaussian": lambda: Gaussian(a, b), "Beta": lambda: Beta(a, b), "Gamma": lambda: Gamma(a, b)}[family]()


members = st.one_of(
    st.tuples(st.just("Gaussian"), real, var),
    st.tuples(st.just("Beta"), pos, pos),
    st.tuples(st.just("Gamma"), pos, pos),
)


def scipy_dist(msg):
    if isinstance(msg, Gaussian):
        return stats.norm(msg.mean(), np.sqrt(msg.var()))
    if isinstance(msg, Beta):
        return stats.beta(msg.alpha, msg.beta)
    return stats.gamma(msg.shape, scale=1.0 / msg.rate)


@FAST
@given(members, members)
def test_divide_undoes_multiply(p, q):
    a = make(*p)
    if p[0] != q[0]:
        return
    b = make(*q)
    np.testing.assert_allclose(((a * b) / b).natural, a.natural, rtol=1e-9, atol=1e-9)


@FAST
@given(members, members)
def test_kl_nonnegative_and_zero_only_for_equal(p, q):
    a = make(*p)
    assert a.kl(a) == pytest.approx(0.0, abs=1e-9)
    if p[0] == q[0]:
        b = make(*q)
        kl = a.kl(b)
        assert kl >= -1e-9
        if not np.allclose(a.natural, b.natural, rtol=1e-3, atol=1e-3):
            assert kl > 0


@FAST
@given(members)
def test_projecting_a_member_returns_it(p):
    a = make(*p)
    back = type(a).project(a.expected_sufficient_statistics())
    np.testing.assert_allclose(back.regression_targets(), a.regression_targets(), rtol=1e-8, atol=1e-8)


@FAST
@given(members)
def test_regression_targets_roundtrip(p):
    a = make(*p)
    np.testing.assert_allclose(type(a).from_regression_targets(a.regression_targets()).natural, a.natural, rtol=1e-12)


@pytest.mark.parametrize("msg", [Gaussian([-3.0, 2.0], [0.5, 9.0]), Beta([0.7, 20.0], [3.0, 5.0]), Gamma([0.6, 15.0], [2.0, 0.3])])
def test_moments_agree_with_monte_carlo(msg):
    x = msg.sample(np.random.default_rng(0), 200_000)
    assert x.shape == (200_000, 2)
    se_mean = np.sqrt(msg.var() / x.shape[0])
    assert np.all(np.abs(x.mean(0) - msg.mean()) < 5 * se_mean)
    np.testing.assert_allclose(x.var(0), msg.var(), rtol=0.03)
    ess = msg.expected_sufficient_statistics()
    np.testing.assert_allclose(msg.sufficient_statistics(x).mean(0), ess, rtol=0.02, atol=0.01)


@pytest.mark.parametrize("msg", [Gaussian(1.5, 2.0), Beta(2.5, 0.8), Gamma(3.0, 1.5), Beta(40.0, 60.0)])
def test_density_entropy_against_scipy(msg):
    ref = scipy_dist(msg)
    xs = ref.ppf(np.linspace(0.01, 0.99, 7))
    np.testing.assert_allclose(msg.logpdf(xs), ref.logpdf(xs), rtol=1e-10)
    assert msg.entropy() == pytest.approx(ref.entropy(), rel=1e-9)
    assert msg.mean() == pytest.approx(ref.mean(), rel=1e-12)
    assert msg.var() == pytest.approx(ref.var(), rel=1e-10)


@pytest.mark.parametrize("p,q", [(Gaussian(0.3, 2.0), Gaussian(-1.0, 0.5)), (Beta(2.0, 3.0), Beta(0.9, 1.4)), (Gamma(2.0, 1.0), Gamma(4.0, 3.0))])
def test_kl_against_numerical_integration(p, q):
    a, b = scipy_dist(p), scipy_dist(q)
    lo, hi = a.ppf(1e-12), a.isf(1e-12)
    ref = integrate.quad(lambda x: a.pdf(x) * (a.logpdf(x) - b.logpdf(x)), lo, hi, limit=200)[0]
    assert p.kl(q) == pytest.approx(ref, rel=1e-7)


@pytest.mark.parametrize("msg", [Gaussian(1.0, 3.0), Beta(3.0, 4.0), Beta(0.8, 2.0), Beta(0.2, 0.3), Beta(200.0, 30.0), Gamma(0.7, 2.0), Gamma(0.1, 1.0), Gamma(50.0, 3.0)])
def test_quadrature_matches_quad(msg):
    x, w = msg.quadrature()
    ref = scipy_dist(msg)
    # reference: QUADPACK in the unconstrained space, with scipy's density and the Jacobian
    c, v = msg.unconstrained_moments()
    x_of = type(msg).from_unconstrained
    if isinstance(msg, Beta):  # textbook densities of logit(x) and log(x)
        dens = lambda u: np.exp(msg.alpha * special.log_expit(u) + msg.beta * special.log_expit(-u) - special.betaln(msg.alpha, msg.beta))
    elif isinstance(msg, Gamma):
        dens = lambda u: np.exp(msg.shape * u - msg.rate * np.exp(u) - special.gammaln(msg.shape) + msg.shape * np.log(msg.rate))
    else:
        dens = ref.pdf
    lo, hi = c - 40 * np.sqrt(v), c + 40 * np.sqrt(v)
    if isinstance(msg, Gamma):
        hi = min(hi, np.log(300.0 / msg.rate))  # exp(-rate x) has long vanished at x = 300 / rate
    for f in (np.sin, lambda t: 1.0 / (1.0 + t * t), np.tanh):
        exact = integrate.quad(lambda u: f(x_of(u)) * dens(u), lo, hi,
                               limit=800, points=[c], epsabs=1e-14, epsrel=1e-13)[0]
        assert np.sum(w * f(x)) == pytest.approx(exact, abs=1e-10)


def test_characteristic_function_gaussian_and_gamma_closed_forms():
    t = np.array([[-4.0, 0.0, 1.3, 9.0]])
    g = Gaussian([0.7], [0.2])
    np.testing.assert_allclose(g.characteristic_function(t), np.exp(1j * 0.7 * t - 0.1 * t**2))
    k = Gamma([2.5], [1.5])
    pdf = lambda x: stats.gamma.pdf(x, 2.5, scale=1 / 1.5)
    # QUADPACK's Fourier-integral rule (QAWF) for the oscillatory integrands
    ref = np.array([[(integrate.quad(pdf, 0, np.inf, weight="cos", wvar=s)[0]
                      + 1j * integrate.quad(pdf, 0, np.inf, weight="sin", wvar=s)[0]) if s != 0 else 1.0
                     for s in t[0]]])
    np.testing.assert_allclose(k.characteristic_function(t), ref, atol=1e-9)


def test_improper_results_are_detected_and_named():
    wide, narrow = Gaussian(0.0, 1.0), Gaussian(0.0, 0.5)
    cavity = wide / narrow  # precision 1 - 2 < 0
    assert not cavity.is_proper()
    with pytest.raises(ImproperMessageError, match=r"cavity of w \(Gaussian\): 1 of 1"):
        cavity.check_proper("cavity of w")
    batch = Beta([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) / Beta([0.5, 3.5, 0.5], [0.5, 0.5, 0.5])  # alpha[1] = 2 - 3.5 + 1 < 0
    with pytest.raises(ImproperMessageError, match="first at index 1"):
        batch.check_proper("site")
    with pytest.raises(ImproperMessageError, match="variance <= 0"):
        Gaussian.project(np.array([[1.0, 0.5]]))
    with pytest.raises(ImproperMessageError, match="Beta projection"):
        Beta.project(np.array([[-0.1, -0.1]]))  # exp(-0.1) * 2 > 1: no Beta has these
    with pytest.raises(ImproperMessageError, match="Gamma projection"):
        Gamma.project(np.array([[1.0, 2.0]]))  # E log x > log E x violates Jensen


def test_batches_index_and_broadcast():
    g = Gaussian(np.arange(6.0).reshape(2, 3), 1.0)
    assert g.batch_shape == (2, 3) and len(g) == 2
    assert g[1, 2].mean() == 5.0
    assert g.logpdf(np.zeros((4, 2, 3))).shape == (4, 2, 3)
    assert g.sample(np.random.default_rng(0), (5,)).shape == (5, 2, 3)
    with pytest.raises(ValueError):
        g.natural[0, 0, 0] = 1.0  # read-only: messages are immutable
    assert family_by_name("Beta") is Beta
    with pytest.raises(ValueError, match="unknown message family"):
        family_by_name("Dirichlet")
    with pytest.raises(TypeError, match="cannot combine"):
        g * Beta(1.0, 1.0)


def test_mv_gaussian_against_scipy():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(3, 3))
    cov = A @ A.T + np.eye(3)
    mean = rng.normal(size=3)
    m = MvGaussian(mean, cov)
    np.testing.assert_allclose(m.mean(), mean, atol=1e-12)
    np.testing.assert_allclose(m.cov(), cov, atol=1e-10)
    ref = stats.multivariate_normal(mean, cov)
    x = rng.normal(size=(5, 3))
    np.testing.assert_allclose(m.logpdf(x), ref.logpdf(x), rtol=1e-10)
    assert m.entropy() == pytest.approx(ref.entropy(), rel=1e-10)
    other = MvGaussian(np.zeros(3), np.eye(3) * 2.0)
    # KL between Gaussians in closed form
    S1, S2 = cov, np.eye(3) * 2.0
    kl = 0.5 * (np.trace(np.linalg.solve(S2, S1)) + mean @ np.linalg.solve(S2, mean) - 3 + np.log(np.linalg.det(S2) / np.linalg.det(S1)))
    assert m.kl(other) == pytest.approx(kl, rel=1e-10)
    np.testing.assert_allclose(((m * other) / other).P, m.P, atol=1e-10)
    proj = MvGaussian.project(mean, cov + np.outer(mean, mean))
    np.testing.assert_allclose(proj.cov(), cov, atol=1e-9)
    s = m.sample(np.random.default_rng(2), 100_000)
    np.testing.assert_allclose(np.cov(s.T), cov, rtol=0.05, atol=0.05)
    marg = m.marginals()
    np.testing.assert_allclose(marg.var(), np.diag(cov), rtol=1e-10)
    bad = MvGaussian.from_natural(np.zeros(2), np.array([[1.0, 0.0], [0.0, -1.0]]))
    assert not bad.is_proper()
    with pytest.raises(ImproperMessageError, match="site"):
        bad.check_proper("site")
