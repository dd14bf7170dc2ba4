"""Mean-embedding features of messages against closed forms and quadrature."""

import numpy as np
import pytest
from scipy import integrate, special, stats

from pmkjit.errors import ImproperMessageError
from pmkjit.families import Beta, Gamma, Gaussian
from pmkjit.features import (
    ExpectedProductFeatures,
    GaussianJointEmbeddingFeatures,
    MeanVarianceFeatures,
)
from pmkjit.features.embeddings import characteristic_function
from pmkjit.families.beta import beta_chebyshev_moments


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 3.0), (5.0, 7.0), (300.0, 20.0), (2.0, 900.0)])
def test_beta_chebyshev_moments_match_quadrature(alpha, beta):
    mu = beta_chebyshev_moments(np.array([alpha]), np.array([beta]), 40)[0]
    c = special.digamma(alpha) - special.digamma(beta)
    sd = np.sqrt(special.polygamma(1, alpha) + special.polygamma(1, beta))

    def expect(f):
        # integrate in logit space, where the Beta density is smooth, bounded and unimodal
        dens = lambda u: np.exp(alpha * special.log_expit(u) + beta * special.log_expit(-u) - special.betaln(alpha, beta))
        return integrate.quad(lambda u: f(special.expit(u)) * dens(u), c - 40 * sd, c + 40 * sd,
                              points=[c], limit=500, epsabs=1e-13)[0]

    assert expect(lambda x: 1.0) == pytest.approx(1.0, abs=1e-9)
    for m in (1, 2, 7, 20, 39):
        ref = expect(lambda x: np.cos(m * np.arccos(2 * x - 1)))
        assert mu[m] == pytest.approx(ref, abs=1e-9)


@pytest.mark.parametrize(
    "message,scipy_dist",
    [
        (Beta(np.array([0.7, 40.0]), np.array([2.0, 15.0])), lambda i: stats.beta([0.7, 40.0][i], [2.0, 15.0][i])),
        (Gamma(np.array([0.8, 30.0]), np.array([2.0, 0.5])),
         lambda i: stats.gamma([0.8, 30.0][i], scale=1 / np.array([2.0, 0.5])[i])),
        (Gaussian(np.array([-1.0, 3.0]), np.array([0.5, 4.0])),
         lambda i: stats.norm([-1.0, 3.0][i], np.sqrt([0.5, 4.0][i]))),
    ],
)
def test_characteristic_functions_match_integration(message, scipy_dist):
    omega = np.array([-23.0, -3.1, 0.0, 0.4, 7.5, 31.0])
    cf = characteristic_function(message, omega)
    for i in range(2):
        dist = scipy_dist(i)
        lo, hi = dist.ppf(1e-14), dist.isf(1e-14)
        for k, w in enumerate(omega):
            re = integrate.quad(lambda x: np.cos(w * x) * dist.pdf(x), lo, hi, limit=800)[0]
            im = integrate.quad(lambda x: np.sin(w * x) * dist.pdf(x), lo, hi, limit=800)[0]
            assert cf[i, k].real == pytest.approx(re, abs=2e-8)
            assert cf[i, k].imag == pytest.approx(im, abs=2e-8)


def _expected_gauss_kernel(mp, Vp, mq, Vq, Sigma):
    """The slides' closed form of E_p E_q exp(-(x-y)^T Sigma^-1 (x-y) / 2) for Gaussians."""
    Dpq = np.linalg.inv(Vp + Vq + Sigma)
    d = mp - mq
    return np.sqrt(np.linalg.det(Dpq) / np.linalg.det(np.linalg.inv(Sigma))) * np.exp(-0.5 * d @ Dpq @ d)


def test_joint_expected_product_matches_closed_form_for_gaussians():
    rng = np.random.default_rng(0)
    B = 6
    m = rng.normal(0, 2, (B, 2))
    v = np.exp(rng.uniform(-1, 1, (B, 2)))
    msgs = (Gaussian(m[:, 0], v[:, 0]), Gaussian(m[:, 1], v[:, 1]))
    feats = ExpectedProductFeatures("joint", n_features=40_000, random_state=1).fit(msgs)
    Phi = feats.transform(msgs)
    ell = feats.base_lengthscales_ * feats.scale
    Sigma = np.diag(ell**2)
    exact = np.array([[_expected_gauss_kernel(m[i], np.diag(v[i]), m[j], np.diag(v[j]), Sigma)
                       for j in range(B)] for i in range(B)])
    approx = Phi @ Phi.T
    assert np.max(np.abs(approx - exact)) < 0.03
    # the product of per-variable kernels equals the joint kernel for independent messages
    prod = ExpectedProductFeatures("product", n_features=40_000, random_state=2).fit(msgs)
    Pp = prod.transform(msgs)
    assert np.max(np.abs(Pp @ Pp.T - exact)) < 0.05
    # the sum kernel is the sum of the per-variable closed forms
    summ = ExpectedProductFeatures("sum", n_features=40_000, random_state=3).fit(msgs)
    Ps = summ.transform(msgs)
    exact_sum = sum(
        np.array([[_expected_gauss_kernel(m[i, [c]], np.diag(v[i, [c]]), m[j, [c]], np.diag(v[j, [c]]),
                                          np.diag(ell[[c]] ** 2)) for j in range(B)] for i in range(B)])
        for c in range(2)
    )
    assert np.max(np.abs(Ps @ Ps.T - exact_sum)) < 0.06


def test_joint_embedding_error_shrinks_with_features():
    rng = np.random.default_rng(3)
    m, v = rng.normal(0, 1, 5), np.exp(rng.uniform(-1, 1, 5))
    msgs = (Gaussian(m, v),)
    errs = []
    for n in (200, 3200, 51200):
        e = []
        for seed in range(4):
            f = ExpectedProductFeatures("joint", n_features=n, random_state=seed).fit(msgs)
            ell = f.base_lengthscales_[0]
            P = f.transform(msgs)
            exact = np.array([[_expected_gauss_kernel(m[[i]], np.diag(v[[i]]), m[[j]], np.diag(v[[j]]),
                                                      np.diag([ell**2])) for j in range(5)] for i in range(5)])
            e.append(np.sqrt(np.mean((P @ P.T - exact) ** 2)))
        errs.append(np.mean(e))
    slope = np.polyfit(np.log([200, 3200, 51200]), np.log(errs), 1)[0]
    assert -0.75 < slope < -0.3


def test_beta_expected_product_matches_double_integral():
    msgs = (Beta(np.array([2.0, 5.0]), np.array([3.0, 1.5])),)
    f = ExpectedProductFeatures("joint", n_features=60_000, random_state=0).fit(msgs)
    ell = f.base_lengthscales_[0]
    P = f.transform(msgs)
    p, q = stats.beta(2.0, 3.0), stats.beta(5.0, 1.5)
    exact = integrate.dblquad(lambda y, x: np.exp(-0.5 * (x - y) ** 2 / ell**2) * p.pdf(x) * q.pdf(y), 0, 1, 0, 1)[0]
    assert P[0] @ P[1] == pytest.approx(exact, abs=0.01)


def test_two_stage_features_approximate_gaussian_kernel_on_embeddings():
    rng = np.random.default_rng(4)
    B = 30
    msgs = (Gaussian(rng.normal(0, 2, B), np.exp(rng.uniform(-2, 2, B))), Beta(1 + rng.integers(0, 2, B), 1.5 + rng.random(B)))
    f = GaussianJointEmbeddingFeatures(n_inner=200, n_outer=20_000, random_state=5).fit(msgs)
    E = f.embed(msgs)
    gamma = f.outer_scale * float(f.outer_base_)
    d2 = np.sum((E[:, None, :] - E[None, :, :]) ** 2, axis=-1)
    exact = np.exp(-0.5 * d2 / gamma**2)
    Phi = f.transform(msgs)
    assert np.max(np.abs(Phi @ Phi.T - exact)) < 0.05
    assert Phi.shape == (B, 20_000)


def test_state_roundtrip_and_scales_do_not_redraw():
    rng = np.random.default_rng(6)
    msgs = (Gaussian(rng.normal(size=50), np.exp(rng.normal(size=50))), Gamma(1 + rng.random(50), 1 + rng.random(50)))
    for feats in (
        GaussianJointEmbeddingFeatures(40, 60, random_state=0),
        ExpectedProductFeatures("product", 36, random_state=0),
        ExpectedProductFeatures("sum", 36, random_state=0),
        MeanVarianceFeatures(40, random_state=0),
    ):
        Phi = feats.fit_transform(msgs)
        clone = type(feats).from_state_dict(feats.state_dict())
        np.testing.assert_array_equal(clone.transform(msgs), Phi)
        assert np.isfinite(Phi).all()
    orth = GaussianJointEmbeddingFeatures(40, 40, orthogonal_outer=True, random_state=0).fit(msgs)
    W = orth.unit_outer_  # (n_inner, n_outer / 2) = (40, 20): one orthogonal block
    G = W.T @ W
    np.testing.assert_allclose(G - np.diag(np.diag(G)), 0.0, atol=1e-10)  # orthogonal directions
    clone = GaussianJointEmbeddingFeatures.from_state_dict(orth.state_dict())
    assert clone.orthogonal_outer is True
    np.testing.assert_array_equal(clone.transform(msgs), orth.transform(msgs))
    g = GaussianJointEmbeddingFeatures(40, 60, random_state=0).fit(msgs)
    G = g.unit_outer_.T @ g.unit_outer_
    assert np.abs(G - np.diag(np.diag(G))).max() > 1e-3  # plain random features are not orthogonal
    before = g.unit_inner_.copy()
    g.set_params(inner_scale=2.0).refit_widths(msgs)
    np.testing.assert_array_equal(g.unit_inner_, before)


def test_errors_name_the_message():
    msgs = (Gaussian(np.zeros(4), np.ones(4)), Beta(np.ones(4), np.ones(4)))
    f = GaussianJointEmbeddingFeatures(20, 20, random_state=0).fit(msgs)
    with pytest.raises(ValueError, match="fitted on messages"):
        f.transform((msgs[1], msgs[0]))
    bad = Gaussian(np.zeros(4), np.ones(4)) / Gaussian(np.zeros(4), np.full(4, 0.5))
    with pytest.raises(ImproperMessageError, match="incoming message 0"):
        f.transform((bad, msgs[1]))
    with pytest.raises(ValueError, match="differ in length"):
        f.transform((msgs[0], msgs[1][:2]))
    with pytest.raises(RuntimeError, match="not fitted"):
        MeanVarianceFeatures().transform(msgs)


def test_log_space_gamma_characteristic_function_matches_integration():
    from pmkjit.features.embeddings import log_gamma_characteristic_function

    shape, rate = np.array([0.6, 3.0, 45.0]), np.array([2.0, 0.01, 7.0])
    omega = np.array([-9.0, -0.7, 0.0, 1.3, 4.0, 20.0])
    re, im = log_gamma_characteristic_function(Gamma(shape, rate), omega)
    for i in range(3):
        # E[exp(i w log x)] as an integral over u = log x, where the density is smooth and unimodal
        dens = lambda u: np.exp(shape[i] * (u + np.log(rate[i])) - rate[i] * np.exp(u) - special.gammaln(shape[i]))
        c = special.digamma(shape[i]) - np.log(rate[i])
        sd = np.sqrt(special.polygamma(1, shape[i]))
        lo, hi = c - 40 * sd, c + 12 * sd
        for k, w in enumerate(omega):
            ref_re = integrate.quad(lambda u: np.cos(w * u) * dens(u), lo, hi, points=[c], limit=800)[0]
            ref_im = integrate.quad(lambda u: np.sin(w * u) * dens(u), lo, hi, points=[c], limit=800)[0]
            assert re[i, k] == pytest.approx(ref_re, abs=1e-8)
            assert im[i, k] == pytest.approx(ref_im, abs=1e-8)


def test_log_space_gamma_embedding_sees_scale_changes_as_shifts():
    # Rescaling x by c (a Gamma's rate by 1/c) only shifts log x: the embedding of two
    # messages rescaled together keeps their inner product, in the bulk and far in the tail,
    # whereas in x the tail messages' embeddings shrink towards zero and look alike.
    rng = np.random.default_rng(11)
    a = 1 + 50 * rng.random(60)
    b = np.exp(rng.normal(0, 1, 60))
    train = (Gamma(a, b),)
    pair = Gamma(np.array([20.0, 20.0]), np.array([1.0, 2.0]))  # scales one doubling apart
    for space, constant in (("log", True), ("linear", False)):
        f = GaussianJointEmbeddingFeatures(4000, 20, gamma_space=space, random_state=0).fit(train)
        dots = []
        for c in (1.0, 1e3, 1e6):
            E = f.embed((Gamma(pair.shape, pair.rate / c),))
            dots.append(E[0] @ E[1])
        if constant:
            np.testing.assert_allclose(dots, dots[0], rtol=1e-9)
            assert dots[0] > 0.1
        else:
            assert abs(dots[2]) < 1e-3 * abs(dots[0])


def test_gamma_space_is_saved_and_old_maps_load_as_linear():
    rng = np.random.default_rng(12)
    msgs = (Gaussian(rng.normal(size=30), np.ones(30)), Gamma(1 + rng.random(30), 1 + rng.random(30)))
    f = GaussianJointEmbeddingFeatures(40, 60, random_state=0).fit(msgs)
    assert f.gamma_space == "log"
    state = f.state_dict()
    np.testing.assert_array_equal(GaussianJointEmbeddingFeatures.from_state_dict(state).transform(msgs), f.transform(msgs))
    # a map saved before the option existed was fitted in x: it must load as such
    lin = GaussianJointEmbeddingFeatures(40, 60, gamma_space="linear", random_state=0).fit(msgs)
    old = {k: v for k, v in lin.state_dict().items() if k != "param_gamma_space"}
    loaded = GaussianJointEmbeddingFeatures.from_state_dict(old)
    assert loaded.gamma_space == "linear"
    np.testing.assert_array_equal(loaded.transform(msgs), lin.transform(msgs))
    with pytest.raises(ValueError, match="gamma_space"):
        GaussianJointEmbeddingFeatures(40, 60, gamma_space="sqrt").fit(msgs)
