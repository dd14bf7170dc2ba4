"""Exponential-family messages against scipy, numerical integration and Monte Carlo."""

import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from pmkjit.errors import ImproperMessageError
from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian, MvGaussian, family_by_name

FAST = settings(max_examples=40, deadline=None)

# positive parameters (and Gaussian variances) drawn log-uniformly over the documented range
positive = st.floats(np.log(0.05), np.log(1000.0)).map(np.exp)
means = st.floats(-50.0, 50.0)


def build(family, p1, p2):
    """A message from its usual parameters."""
    return family(np.asarray(p1), np.asarray(p2))


def scipy_dist(m):
    """The frozen scipy distribution of a single message."""
    if isinstance(m, Gaussian):
        return stats.norm(m.mean(), np.sqrt(m.var()))
    if isinstance(m, Beta):
        return stats.beta(m.alpha, m.beta)
    return stats.gamma(m.shape, scale=1.0 / m.rate)


def expect_unconstrained(m, f, of_u=False):
    """``E[f(x)]`` (or ``E[f(u)]`` if ``of_u``) by adaptive quadrature in the unconstrained variable.

    Break points at the mode and at multiples of the exact sd of ``u`` keep ``quad``
    honest for skewed or concentrated messages.
    """
    c, v = m.unconstrained_moments()
    s = float(np.sqrt(v))
    c = float(c)

    def g(u):
        lp = m.logpdf_unconstrained(np.array([u]))[0]  # a single node
        arg = u if of_u else float(m.from_unconstrained(np.array(u)))
        return 0.0 if lp < -700 else f(arg) * np.exp(lp)

    pts = [-np.inf] + [c + k * s for k in (-60, -20, -5, -1, 0, 1, 5, 20, 60)] + [np.inf]
    with warnings.catch_warnings():
        # quad warns when a piece is ~0 to below its absolute tolerance (e.g. far tails,
        # or a characteristic function that has decayed): harmless at our tolerances
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        pieces = zip(pts[:-1], pts[1:])
        return sum(integrate.quad(g, lo, hi, epsabs=1e-14, epsrel=1e-13, limit=500)[0] for lo, hi in pieces)


# ------------------------------------------------------------------ algebra
@FAST
@given(
    fam=st.sampled_from([Gaussian, Beta, Gamma]),
    a=st.lists(positive, min_size=3, max_size=3),
    b=st.lists(positive, min_size=3, max_size=3),
    c=st.lists(positive, min_size=3, max_size=3),
    d=st.lists(positive, min_size=3, max_size=3),
)
def test_divide_undoes_multiply(fam, a, b, c, d):
    p, q = build(fam, a, b), build(fam, c, d)
    back = (p * q) / q
    np.testing.assert_allclose(back.natural, p.natural, rtol=1e-9, atol=1e-9 * np.abs(q.natural).max())
    # broadcasting: one message times a batch
    assert (p * q[0]).batch_shape == (3,)
    np.testing.assert_allclose((p * q[0]).natural, p.natural + q.natural[0])


@FAST
@given(
    fam=st.sampled_from([Gaussian, Beta, Gamma]),
    a=positive,
    b=positive,
    c=positive,
    d=positive,
    ma=means,
    mc=means,
)
def test_kl_nonnegative_and_zero_only_for_equal(fam, a, b, c, d, ma, mc):
    if fam is Gaussian:
        a, c = ma, mc  # any real mean
    p, q = build(fam, a, b), build(fam, c, d)
    kl = float(p.kl(q))
    # the generic formula subtracts log partitions: allow their rounding error
    slack = 1e-12 * (1.0 + abs(float(p.log_partition())) + abs(float(q.log_partition())))
    assert kl >= -slack
    assert abs(float(p.kl(p))) <= slack
    if not np.allclose([a, b], [c, d], rtol=1e-3, atol=1e-3):
        assert kl > slack


def test_kl_and_entropy_match_numerical_integration():
    pairs = [
        (Gaussian(1.5, 0.7), Gaussian(0.0, 2.0)),
        (Gaussian(-3.0, 20.0), Gaussian(1.0, 3.0)),
        (Beta(0.7, 2.5), Beta(2.0, 2.0)),
        (Beta(30.0, 8.0), Beta(20.0, 10.0)),
        (Gamma(0.8, 2.0), Gamma(2.0, 1.0)),
        (Gamma(12.0, 0.5), Gamma(10.0, 0.4)),
    ]
    for p, q in pairs:
        assert float(p.entropy()) == pytest.approx(float(scipy_dist(p).entropy()), rel=1e-9, abs=1e-10)

        def log_ratio(u, p=p, q=q):
            # log p(x)/q(x) in u (the Jacobians cancel): no rounding of x to the support's ends
            node = np.array([u])
            return (p.logpdf_unconstrained(node) - q.logpdf_unconstrained(node))[0]

        ref = expect_unconstrained(p, log_ratio, of_u=True)
        assert float(p.kl(q)) == pytest.approx(ref, rel=1e-8, abs=1e-11)


def test_gaussian_kl_and_logpdf_without_cancellation():
    p, q = Gaussian(1e6, 1.0), Gaussian(1e6 + 1e-3, 1.0)
    assert float(p.kl(q)) == pytest.approx(0.5e-6, rel=1e-9)
    assert float(p.logpdf(1e6 + 1.0)) == pytest.approx(stats.norm(1e6, 1.0).logpdf(1e6 + 1.0), rel=1e-13)


# -------------------------------------------------------------- projection
@FAST
@given(fam=st.sampled_from([Gaussian, Beta, Gamma]), a=positive, b=positive, ma=means)
def test_projection_returns_the_member(fam, a, b, ma):
    if fam is Gaussian:
        m = Gaussian([ma, -ma], [b, a])
    else:
        m = build(fam, [a, b], [b, a])
    back = fam.project(m.expected_sufficient_statistics())
    for key, value in m.parameters().items():
        np.testing.assert_allclose(back.parameters()[key], value, rtol=1e-8, atol=1e-12 if fam is Gaussian else 0)


def test_projection_of_non_members_matches_moment_equations():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.05, 0.9, size=(4, 500))  # a uniform sample is no Beta/Gamma
    for fam, T in ((Beta, Beta.sufficient_statistics), (Gamma, Gamma.sufficient_statistics)):
        ess = T(x).mean(axis=1)
        np.testing.assert_allclose(fam.project(ess).expected_sufficient_statistics(), ess, rtol=1e-11)


def test_projection_of_extreme_members():
    # Betas piled up against 0 or 1 (E log x ~ -3e-16 must be resolved), tiny and huge shapes
    beta = Beta(np.array([1e16, 3.0, 1e12, 1e-3, 7.0]), np.array([3.0, 1e16, 1e-2, 1e-3, 2e-4]))
    back = Beta.project(beta.expected_sufficient_statistics())
    np.testing.assert_allclose(back.natural + 1.0, beta.natural + 1.0, rtol=1e-10)
    gamma = Gamma(np.array([1e-5, 1e-2, 1e6]), np.array([1e3, 1.0, 1e-3]))
    # for shape 1e6, log E x - E log x ~ 5e-7 carries the rounding of E log x ~ 21: ~1e-9 relative
    np.testing.assert_allclose(Gamma.project(gamma.expected_sufficient_statistics()).shape, gamma.shape, rtol=1e-8)


def test_projection_rejects_impossible_statistics():
    with pytest.raises(ImproperMessageError, match=r"tilted z.*1 of 3.*index 1"):
        Gaussian.project(np.array([[0.0, 1.0], [1.0, 0.5], [2.0, 5.0]]), name="tilted z")
    bad_beta = np.log(np.array([[0.3, 0.3], [0.6, 0.6], [0.2, 0.7], [1.2, 0.1]]))
    with pytest.raises(ImproperMessageError, match=r"p .*2 of 4.*index 1"):
        Beta.project(bad_beta, name="p")
    with pytest.raises(ImproperMessageError, match=r"rate.*index 0"):
        Gamma.project(np.array([[np.log(2.0), 2.0], [0.0, 2.0]]), name="rate")  # E log x = log E x
    with pytest.raises(ImproperMessageError):
        Gamma.project(np.array([0.0, -1.0]))


def test_beta_projection_beyond_floating_point_is_refused_not_a_crash():
    # robustness round 19: quadrature's statistics of a logistic belief at eta ~ 420 (a logistic
    # regression with Cauchy priors, whose first cavities are very wide), E log x = -3.4e-183 and
    # E log(1-x) = -421.5, pass the existence check but need alpha ~ 1e183: the Newton step's
    # trigamma differences were inf / inf and fit crashed with "ValueError: cannot convert float
    # NaN to integer"; now the entry is improper, and the oracle leaves it unanswered
    from pmkjit.operators.oracle import _safe_project

    beyond = np.array([[-3.3544633061762198e-183, -4.2151628943243276e002]])
    with pytest.raises(ImproperMessageError, match="not converged"):
        Beta.project(beyond, name="p")
    members = Beta(np.array([2.0, 1e6]), np.array([3.0, 0.5]))
    natural, ok = _safe_project(Beta, np.concatenate([beyond, members.expected_sufficient_statistics()]), "p")
    assert ok.tolist() == [False, True, True]
    np.testing.assert_allclose(natural[1:] + 1.0, members.natural + 1.0, rtol=1e-9)


# ------------------------------------------------------------------ moments
@pytest.mark.parametrize(
    "m",
    [Gaussian([0.5, -20.0], [2.0, 0.01]), Beta([0.3, 5.0], [0.7, 200.0]), Gamma([0.4, 30.0], [3.0, 0.2])],
    ids=["Gaussian", "Beta", "Gamma"],
)
def test_moments_and_statistics_match_monte_carlo(m):
    n = 200_000
    x = m.sample(np.random.default_rng(42), n)
    assert x.shape == (n, 2)
    mean, var = x.mean(0), x.var(0)
    se_mean = np.sqrt(var / n)
    se_var = np.sqrt((np.mean((x - mean) ** 4, axis=0) - var**2) / n)
    assert np.all(np.abs(mean - m.mean()) < 5 * se_mean)
    assert np.all(np.abs(var - m.var()) < 5 * se_var)
    T = m.sufficient_statistics(x)
    se_T = T.std(0) / np.sqrt(n)
    assert np.all(np.abs(T.mean(0) - m.expected_sufficient_statistics()) < 5 * se_T)
    u = m.to_unconstrained(x)
    cu, vu = m.unconstrained_moments()
    assert np.all(np.abs(u.mean(0) - cu) < 5 * np.sqrt(vu / n))


def test_sample_shapes_and_reproducibility():
    m = Beta(np.ones((2, 3)), 2.0)
    assert m.sample(np.random.default_rng(0)).shape == (2, 3)
    assert m.sample(np.random.default_rng(0), (4, 5)).shape == (4, 5, 2, 3)
    np.testing.assert_array_equal(m.sample(np.random.default_rng(1), 7), m.sample(np.random.default_rng(1), 7))


# ------------------------------------------------------------------ densities
@pytest.mark.parametrize(
    "m",
    [Gaussian(0.3, 2.0), Gaussian(-40.0, 1e-3), Beta(0.6, 0.9), Beta(3.0, 400.0), Gamma(0.7, 3.0), Gamma(50.0, 2)],
)
def test_logpdf_integrates_to_one_and_matches_scipy(m):
    dist = scipy_dist(m)
    lo, hi = dist.ppf(1e-13), dist.isf(1e-13)
    mid = float(m.mean())
    total = sum(
        integrate.quad(lambda x: np.exp(float(m.logpdf(x))), a, b, epsabs=1e-14, epsrel=1e-12, limit=500)[0]
        for a, b in ((lo, mid), (mid, hi))
    )
    assert total == pytest.approx(1.0, abs=1e-9)
    x = dist.ppf(np.linspace(0.001, 0.999, 25))
    np.testing.assert_allclose(m.logpdf(x), dist.logpdf(x), rtol=1e-10, atol=1e-10)


def test_logpdf_broadcasts_and_handles_support():
    m = Beta([1.0, 2.0, 3.0], 2.0)
    x = np.full((5, 3), 0.4)
    assert m.logpdf(x).shape == (5, 3)
    assert np.all(m.logpdf(np.array([-0.1, 0.0, 1.5])) == -np.inf)
    assert np.all(Gamma(2.0, [1.0, 2.0]).logpdf(np.array([[-1.0], [0.0]])) == -np.inf)


# --------------------------------------------------------------- quadrature
QUAD_PARAMS = [0.1, 0.3, 1.0, 7.0, 100.0, 1000.0]


@pytest.mark.parametrize("a", QUAD_PARAMS)
def test_beta_quadrature_matches_adaptive_quadrature(a):
    fs = (np.sin, lambda x: 1.0 / (1.0 + x * x), lambda x: x, lambda x: special.expit(8 * (x - 0.4)))
    m = Beta(a, np.array(QUAD_PARAMS))
    x, w = m.quadrature()
    assert x.shape == w.shape == (len(QUAD_PARAMS), 256)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-14)
    for f in fs:
        ref = [expect_unconstrained(m[j], f) for j in range(len(QUAD_PARAMS))]
        np.testing.assert_allclose(np.sum(w * f(x), -1), ref, rtol=0, atol=1e-9)


def test_gamma_and_gaussian_quadrature_match_adaptive_quadrature():
    shapes = np.array(QUAD_PARAMS)
    rational = lambda x: 1.0 / (1.0 + x * x)  # noqa: E731
    # f must be smooth on the scale of the message: for the Gaussian the poles of
    # 1/(1+x^2) at +-i then lie at least one standard deviation from the real line.
    cases = [
        (Gamma(shapes, shapes), (rational, lambda x: special.expit(8 * (x - 0.4)), np.arctan)),
        (Gamma(shapes, 3.0), (rational, np.arctan, lambda x: np.exp(-x))),
        (Gaussian(np.linspace(-3, 3, 6), np.geomspace(1e-3, 1, 6)), (rational, special.expit, np.arctan, np.sin)),
    ]
    for m, fs in cases:
        x, w = m.quadrature()
        for f in fs:
            ref = [expect_unconstrained(m[j], f) for j in range(len(m))]
            np.testing.assert_allclose(np.sum(w * f(x), -1), ref, rtol=0, atol=1e-9)
    x, w = Gamma(shapes, 2.0).quadrature()
    np.testing.assert_allclose(np.sum(w * x, -1), shapes / 2.0, rtol=1e-10)  # unbounded, but integrable


def test_quadrature_is_exact_on_sufficient_statistics_and_unconstrained_nodes_are_finite():
    m = Beta(np.array([0.05, 0.5, 50.0]), np.array([3.0, 0.05, 80.0]))
    u, w = m.unconstrained_quadrature()
    assert np.all(np.isfinite(u))
    log_x = special.log_expit(u)  # exact where x itself underflows
    np.testing.assert_allclose(np.sum(w * log_x, -1), m.expected_sufficient_statistics()[:, 0], rtol=1e-9)
    x, w = Gamma(np.array([0.05, 1.0]), 1.0).quadrature()
    assert np.all(np.isfinite(x))


# ------------------------------------------------------- characteristic fns
def cf_reference(m, t):
    re = expect_unconstrained(m, lambda x: np.cos(t * x))
    im = expect_unconstrained(m, lambda x: np.sin(t * x))
    return re + 1j * im


@pytest.mark.parametrize(
    "m",
    [
        Beta(0.05, 0.05),
        Beta(0.05, 1000.0),
        Beta(1000.0, 1000.0),
        Beta(2.5, 0.4),
        Gaussian(1.3, 0.4),
        Gamma(0.3, 2.0),
        Gamma(40.0, 7.0),
    ],
)
def test_characteristic_function_matches_integration(m):
    t = np.array([0.5, -3.0, 17.0, 50.0])
    cf = m[None].characteristic_function(t[None])[0]
    ref = np.array([cf_reference(m, ti) for ti in t])
    np.testing.assert_allclose(cf, ref, rtol=0, atol=1e-8)


def test_beta_characteristic_function_batched_rows():
    m = Beta(np.array([[0.5, 3.0], [3.0, 200.0]]), np.array([[2.0, 3.0], [0.1, 200.0]]))
    t = np.random.default_rng(0).normal(scale=20.0, size=(2, 2, 5))
    cf = m.characteristic_function(t)
    assert cf.shape == (2, 2, 5) and cf.dtype == complex
    for idx in np.ndindex(2, 2):
        np.testing.assert_allclose(cf[idx], m[idx][None].characteristic_function(t[idx][None])[0], atol=1e-14)
    shared = np.broadcast_to(t[0, 0], (2, 2, 5))  # the shared-frequency fast path agrees
    expected = np.array([[m[i, j].characteristic_function(t[0, 0]) for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(m.characteristic_function(shared), expected, atol=1e-14)


# -------------------------------------------------------------- validity
def test_improper_detection_names_the_message():
    cavity = Gaussian(np.zeros(4), [1.0, 1.0, 1.0, 1.0]) / Gaussian(0.0, [2.0, 0.5, 4.0, 0.25])
    np.testing.assert_array_equal(cavity.is_proper(), [True, False, True, False])
    with pytest.raises(ImproperMessageError, match=r"cavity of x \(Gaussian\): 2 of 4 .*index 1"):
        cavity.check_proper("cavity of x")
    assert Gaussian(0.0, 1.0).check_proper("fine").var() == 1.0
    beta = Beta(1.0, [1.0, 3.0]) / Beta([2.0, 0.5], 1.0)
    np.testing.assert_array_equal(beta.is_proper(), [False, True])
    gamma = Gamma([2.0, 2.0], [1.0, np.nan])
    np.testing.assert_array_equal(gamma.is_proper(), [True, False])
    with pytest.raises(ImproperMessageError, match=r"q \(Gamma\): 1 of 2"):
        gamma.check_proper("q")
    assert not Gaussian(0.0, np.inf).is_proper()
    assert not Gaussian(np.nan, 1.0).is_proper()


def test_regression_targets_round_trip():
    for m in (Gaussian([0.0, -3.0], [0.5, 7.0]), Beta([0.2, 40.0], [3.0, 0.9]), Gamma([0.3, 8.0], [2.0, 0.1])):
        y = m.regression_targets()
        assert y.shape == (2, 2)
        np.testing.assert_allclose(type(m).from_regression_targets(y).natural, m.natural, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(Gaussian(2.0, np.e).regression_targets(), [2.0, 1.0])
    np.testing.assert_allclose(Beta(1.0, np.e).regression_targets(), [0.0, 1.0])
    np.testing.assert_allclose(Gamma(np.e, 1.0).regression_targets(), [1.0, 0.0])


@pytest.mark.parametrize("fam", [Gaussian, Beta, Gamma])
def test_unconstrained_maps(fam):
    u = np.linspace(-6, 6, 13)
    np.testing.assert_allclose(fam.to_unconstrained(fam.from_unconstrained(u)), u, atol=1e-12)
    h = 1e-6
    num = np.log(np.abs(fam.from_unconstrained(u + h) - fam.from_unconstrained(u - h)) / (2 * h))
    np.testing.assert_allclose(fam.log_abs_det_jacobian(u), num, atol=1e-7)
    m = fam(2.0, 3.0)
    c, v = m.unconstrained_moments()
    assert float(c) == pytest.approx(expect_unconstrained(m, lambda u: u, of_u=True), rel=1e-10)
    assert float(v) == pytest.approx(expect_unconstrained(m, lambda u: (u - c) ** 2, of_u=True), rel=1e-9)


# --------------------------------------------------------------- container
def test_container_behaviour_and_immutability():
    mean = np.array([0.0, 1.0, 2.0])
    m = Gaussian(mean, 1.0)
    mean[0] = 99.0  # the message holds its own copy
    assert m.mean()[0] == 0.0
    assert len(m) == 3 and m.batch_shape == (3,) and m[1:].batch_shape == (2,)
    assert m[0].batch_shape == () and float(m[-1].mean()) == 2.0
    assert m[np.array([True, False, True])].batch_shape == (2,)
    with pytest.raises(ValueError):
        m.natural[0, 0] = 1.0
    with pytest.raises(AttributeError):
        m._natural = np.zeros((3, 2))
    with pytest.raises(TypeError):
        len(m[0])
    with pytest.raises(TypeError):
        m * Beta(1.0, 1.0)
    grid = Beta(np.ones((2, 3)), 2.0)
    assert grid[..., 0].batch_shape == (2,) and grid[1, 2].batch_shape == ()
    both = Beta.concatenate([Beta([1.0, 2.0], 3.0), Beta(4.0, 5.0)])
    np.testing.assert_allclose(both.alpha, [1.0, 2.0, 4.0])
    assert Gaussian.from_natural(m.natural).batch_shape == (3,)
    assert repr(Beta(2.0, 3.0)) == "Beta(alpha=2., beta=3.)"
    assert "batch_shape=(100,)" in repr(Gamma(np.ones(100), 1.0))
    assert family_by_name("Gamma") is Gamma and issubclass(family_by_name("Beta"), ExponentialFamily)
    clone = pickle.loads(pickle.dumps(both))
    assert isinstance(clone, Beta) and not clone.natural.flags.writeable
    np.testing.assert_array_equal(clone.natural, both.natural)
    with pytest.raises(ValueError, match="unknown"):
        family_by_name("Poisson")


# --------------------------------------------------------------- MvGaussian
def _random_spd(rng, batch, d):
    A = rng.normal(size=batch + (d, d))
    return A @ np.swapaxes(A, -1, -2) + d * np.eye(d)


def test_mv_gaussian_moments_densities_and_algebra():
    rng = np.random.default_rng(0)
    mean, cov = rng.normal(size=(4, 3)), _random_spd(rng, (4,), 3)
    m = MvGaussian(mean, cov)
    assert m.batch_shape == (4,) and m.dim == 3 and len(m) == 4
    np.testing.assert_allclose(m.mean(), mean, atol=1e-12)
    np.testing.assert_allclose(m.cov(), cov, rtol=1e-12)
    x = rng.normal(size=(5, 4, 3))
    dists = [stats.multivariate_normal(mean[b], cov[b]) for b in range(4)]
    ref = np.array([[dists[b].logpdf(x[s, b]) for b in range(4)] for s in range(5)])
    np.testing.assert_allclose(m.logpdf(x), ref, rtol=1e-12)
    np.testing.assert_allclose(m.entropy(), [d.entropy() for d in dists], rtol=1e-12)
    other = MvGaussian(rng.normal(size=(4, 3)), _random_spd(rng, (4,), 3))
    back = (m * other) / other
    np.testing.assert_allclose(back.h, m.h, atol=1e-12)
    np.testing.assert_allclose(back.P, m.P, atol=1e-12)
    # KL in closed form with explicit inverses (fine in a test)
    S2inv = np.linalg.inv(other.cov())
    d = other.mean() - mean
    kl = 0.5 * (
        np.trace(S2inv @ cov, axis1=-2, axis2=-1)
        + np.einsum("bi,bij,bj->b", d, S2inv, d)
        - 3
        + np.linalg.slogdet(other.cov())[1]
        - np.linalg.slogdet(cov)[1]
    )
    np.testing.assert_allclose(m.kl(other), kl, rtol=1e-10)
    np.testing.assert_allclose(m.kl(m), 0.0, atol=1e-12)
    marg = m.marginals()
    assert isinstance(marg, Gaussian) and marg.batch_shape == (4, 3)
    np.testing.assert_allclose(marg.var(), np.diagonal(cov, axis1=-2, axis2=-1), rtol=1e-12)
    proj = MvGaussian.project(mean, cov + mean[:, :, None] * mean[:, None, :])
    np.testing.assert_allclose(proj.P, m.P, rtol=1e-10, atol=1e-12)
    assert m[1:3].batch_shape == (2,) and m[0].batch_shape == ()
    assert repr(m) == "MvGaussian(dim=3, batch_shape=(4,))"
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(m)).P, m.P)
    with pytest.raises(ValueError):
        m.h[0, 0] = 5.0
    with pytest.raises(AttributeError):
        m.P = None


def test_mv_gaussian_sampling():
    rng = np.random.default_rng(1)
    mean, cov = np.array([[1.0, -2.0], [0.0, 5.0]]), _random_spd(rng, (2,), 2)
    m = MvGaussian(mean, cov)
    n = 100_000
    x = m.sample(np.random.default_rng(3), n)
    assert x.shape == (n, 2, 2) and m.sample(rng, (3, 4)).shape == (3, 4, 2, 2)
    sd = np.sqrt(np.diagonal(cov, axis1=-2, axis2=-1))
    assert np.all(np.abs(x.mean(0) - mean) < 5 * sd / np.sqrt(n))
    emp = np.einsum("nbi,nbj->bij", x - x.mean(0), x - x.mean(0)) / n
    np.testing.assert_allclose(emp, cov, atol=5 * 2 * np.max(cov) / np.sqrt(n))


def test_mv_gaussian_improper_detection():
    rng = np.random.default_rng(2)
    m = MvGaussian(np.zeros((3, 2)), _random_spd(rng, (3,), 2))
    wide = MvGaussian(np.zeros(2), 100.0 * np.eye(2))
    narrow = MvGaussian(np.zeros(2), 0.01 * np.eye(2))
    assert np.all((m / wide).is_proper())
    bad = m / MvGaussian.from_natural(np.zeros((3, 2)), np.stack([np.zeros((2, 2)), narrow.P, np.zeros((2, 2))]))
    np.testing.assert_array_equal(bad.is_proper(), [True, False, True])
    with pytest.raises(ImproperMessageError, match=r"cavity w \(MvGaussian\): 1 of 3.*index 1"):
        bad.check_proper("cavity w")
    with pytest.raises(ImproperMessageError, match="index 1"):
        bad.mean()
    with pytest.raises(ImproperMessageError, match=r"moments of w.*index 0"):
        MvGaussian.project(np.zeros((2, 2)), np.stack([-np.eye(2), np.eye(2)]), name="moments of w")
    with pytest.raises(ImproperMessageError):
        MvGaussian(np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]]))
