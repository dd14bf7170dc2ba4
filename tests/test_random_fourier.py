"""Random Fourier bases: exact kernels, spectral laws, convergence, estimator conventions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import gamma as gamma_fn
from scipy.special import kv

from pmkjit.features import KERNELS, RandomFourierFeatures, kernel_matrix, sample_frequencies
from pmkjit.features.spectral import ISOTROPIC

SIZES = [64, 256, 1024, 4096]


def _gram_rms_error(kernel, D, seed, X, lengthscale, orthogonal=False):
    rff = RandomFourierFeatures(kernel, D, lengthscale=lengthscale, orthogonal=orthogonal, random_state=seed)
    Phi = rff.fit_transform(X)
    return np.sqrt(np.mean((Phi @ Phi.T - kernel_matrix(kernel, X, X, lengthscale)) ** 2))


def _loglog_slope(kernel, X, lengthscale, orthogonal=False, n_seeds=6):
    errs = [np.mean([_gram_rms_error(kernel, D, s, X, lengthscale, orthogonal) for s in range(n_seeds)]) for D in SIZES]
    return np.polyfit(np.log(SIZES), np.log(errs), 1)[0], errs


# ---------------------------------------------------------------------------------------
# Exact kernels against closed forms and independent implementations


def _matern_bessel(r, nu):
    """The general Matérn form 2^(1-nu)/Gamma(nu) (sqrt(2 nu) r)^nu K_nu(sqrt(2 nu) r)."""
    a = np.sqrt(2 * nu) * np.asarray(r, dtype=float)
    with np.errstate(invalid="ignore"):
        out = 2 ** (1 - nu) / gamma_fn(nu) * a**nu * kv(nu, a)
    return np.where(a == 0, 1.0, out)


def test_exact_kernels_closed_forms():
    X = np.array([[0.0, 0.0]])
    Y = np.array([[1.0, -2.0]])
    r = np.sqrt(5.0)
    assert kernel_matrix("rbf", X, Y)[0, 0] == pytest.approx(np.exp(-2.5))
    assert kernel_matrix("laplace", X, Y)[0, 0] == pytest.approx(np.exp(-3.0))  # L1 distance
    assert kernel_matrix("cauchy", X, Y)[0, 0] == pytest.approx(1 / 6.0)
    assert kernel_matrix("matern32", X, Y)[0, 0] == pytest.approx((1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r))
    a = np.sqrt(5) * r
    assert kernel_matrix("matern52", X, Y)[0, 0] == pytest.approx((1 + a + a * a / 3) * np.exp(-a))
    # per-dimension length scales divide each coordinate
    ell = np.array([0.5, 4.0])
    assert kernel_matrix("laplace", X, Y, ell)[0, 0] == pytest.approx(np.exp(-(2.0 + 0.5)))
    assert kernel_matrix("rbf", X, Y, ell)[0, 0] == pytest.approx(np.exp(-0.5 * (4.0 + 0.25)))
    for kernel in KERNELS:
        K = kernel_matrix(kernel, X, X)
        assert K.shape == (1, 1) and K[0, 0] == 1.0


@pytest.mark.parametrize(("kernel", "nu"), [("matern32", 1.5), ("matern52", 2.5)])
def test_matern_equals_general_bessel_form(kernel, nu):
    Z = np.random.default_rng(2).normal(size=(7, 3))
    r = np.sqrt(((Z[:, None] - Z[None]) ** 2).sum(-1)) / 0.7
    np.testing.assert_allclose(kernel_matrix(kernel, Z, Z, 0.7), _matern_bessel(r, nu), rtol=1e-10, atol=1e-14)


def test_exact_kernels_match_scikit_learn():
    kernels = pytest.importorskip("sklearn.gaussian_process.kernels")
    pairwise = pytest.importorskip("sklearn.metrics.pairwise")
    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(6, 3)), rng.normal(size=(4, 3))
    for ell in (0.7, np.array([0.5, 1.0, 2.0])):
        for kernel, ref in [
            ("rbf", kernels.RBF(ell)),
            ("matern32", kernels.Matern(ell, nu=1.5)),
            ("matern52", kernels.Matern(ell, nu=2.5)),
            # (1 + r^2 / (2 alpha l'^2))^-alpha with alpha = 1, l' = l / sqrt 2
            ("cauchy", kernels.RationalQuadratic(ell / np.sqrt(2), alpha=1.0) if np.ndim(ell) == 0 else None),
        ]:
            if ref is not None:
                np.testing.assert_allclose(kernel_matrix(kernel, X, Y, ell), ref(X, Y), rtol=1e-10)
        # exp(-gamma ||x - y||_1)
        np.testing.assert_allclose(
            kernel_matrix("laplace", X / ell, Y / ell), pairwise.laplacian_kernel(X / ell, Y / ell, gamma=1.0), rtol=1e-12
        )
        np.testing.assert_allclose(kernel_matrix("laplace", X, Y, ell), kernel_matrix("laplace", X / ell, Y / ell))


# ---------------------------------------------------------------------------------------
# Spectral laws: Bochner's k(delta) = E[cos(w . delta)], checked by Monte Carlo


@pytest.mark.parametrize(
    ("kernel", "orthogonal"), [(k, False) for k in KERNELS] + [(k, True) for k in ISOTROPIC]
)
def test_frequencies_reproduce_kernel_by_bochner(kernel, orthogonal):
    rng = np.random.default_rng(10)
    d, n = 3, 400_000
    deltas = np.vstack([np.zeros(d), rng.normal(size=(6, d)) * 0.8, [[2.0, 0.0, 0.0]]])
    W = sample_frequencies(kernel, d, n, rng, orthogonal=orthogonal)
    assert W.shape == (d, n) and W.dtype == np.float64
    mc = np.cos(deltas @ W).mean(axis=1)
    exact = kernel_matrix(kernel, deltas, np.zeros((1, d)))[:, 0]
    # standard error <= 1/sqrt(2n) ~ 1.1e-3; a wrong scale (e.g. sqrt(2 nu / g) for the
    # Matérn t law) would be off by ~0.1-0.2 at these distances
    np.testing.assert_allclose(mc, exact, atol=6e-3)


def test_orthogonal_blocks_are_orthogonal():
    d = 5
    W = sample_frequencies("matern32", d, 12, np.random.default_rng(0), orthogonal=True)
    assert W.shape == (d, 12)
    for block in (W[:, :5], W[:, 5:10], W[:, 10:]):  # the last block is truncated
        G = block.T @ block
        np.testing.assert_allclose(G - np.diag(np.diag(G)), 0.0, atol=1e-10)
    # different blocks use independent rotations
    assert np.abs(W[:, :5].T @ W[:, 5:10]).max() > 1e-3


def test_orthogonal_rbf_norms_follow_chi_law():
    d = 4
    W = sample_frequencies("rbf", d, 40_000, np.random.default_rng(1), orthogonal=True)
    sq = (W**2).sum(axis=0)  # chi-squared with d dof: mean d, variance 2 d
    assert sq.mean() == pytest.approx(d, rel=0.03)
    assert sq.var() == pytest.approx(2 * d, rel=0.08)


def test_laplace_orthogonal_is_refused():
    with pytest.raises(ValueError, match="isotropic"):
        sample_frequencies("laplace", 2, 4, np.random.default_rng(0), orthogonal=True)
    with pytest.raises(ValueError, match="isotropic"):
        RandomFourierFeatures("laplace", 8, orthogonal=True, random_state=0).fit(np.zeros((2, 2)))


# ---------------------------------------------------------------------------------------
# Convergence of the Gram matrix


@pytest.mark.parametrize("kernel", KERNELS)
def test_gram_converges_like_one_over_sqrt_d(kernel):
    X = np.random.default_rng(0).normal(size=(40, 3))
    slope, errs = _loglog_slope(kernel, X, 1.3)
    assert -0.7 < slope < -0.3, (kernel, errs, slope)
    assert errs[-1] < 0.05, errs
    assert all(a > b for a, b in zip(errs, errs[1:])), errs


@pytest.mark.parametrize("kernel", ISOTROPIC)
def test_orthogonal_gram_converges(kernel):
    X = np.random.default_rng(0).normal(size=(40, 3))
    slope, errs = _loglog_slope(kernel, X, 1.3, orthogonal=True)
    assert -0.7 < slope < -0.3, (kernel, errs, slope)
    assert errs[-1] < 0.05, errs


@pytest.mark.parametrize("kernel", KERNELS)
def test_gram_converges_with_per_dimension_lengthscale(kernel):
    X = np.random.default_rng(4).normal(size=(30, 3))
    ell = np.array([0.6, 1.5, 3.0])
    errs = [_gram_rms_error(kernel, 4096, s, X, ell) for s in range(3)]
    assert np.mean(errs) < 0.05, errs


def test_orthogonal_features_beat_plain_features():
    # the reason orthogonal features exist: lower Gram error at equal D (Yu et al. 2016);
    # the gain is largest when D / 2 is about n_dims (here 16 frequencies in 16 dimensions),
    # where the ratio is ~0.65-0.72 across seed sets
    X = np.random.default_rng(1).normal(size=(60, 16)) * 0.3
    plain = np.mean([_gram_rms_error("rbf", 32, s, X, 1.0) for s in range(30)])
    ortho = np.mean([_gram_rms_error("rbf", 32, s, X, 1.0, orthogonal=True) for s in range(30)])
    assert ortho < 0.85 * plain, (ortho, plain)


# ---------------------------------------------------------------------------------------
# Transformer behaviour


@settings(max_examples=30, deadline=None)
@given(
    X=arrays(np.float64, (4, 2), elements=st.floats(-1e3, 1e3)),
    kernel=st.sampled_from(KERNELS),
    ell=st.floats(0.01, 100.0),
)
def test_feature_vectors_have_unit_norm(X, kernel, ell):
    # cos^2 + sin^2 = 1 on each of the D/2 frequencies, so ||phi(x)||^2 = k(x, x) = 1 exactly
    Phi = RandomFourierFeatures(kernel, 16, lengthscale=ell, random_state=0).fit_transform(X)
    assert Phi.shape == (4, 16) and Phi.dtype == np.float64
    np.testing.assert_allclose((Phi**2).sum(axis=1), 1.0, rtol=1e-12)


def test_layout_is_cos_then_sin():
    X = np.random.default_rng(0).normal(size=(5, 3))
    rff = RandomFourierFeatures("cauchy", 10, lengthscale=[1.0, 2.0, 0.5], random_state=1).fit(X)
    Z = (X / [1.0, 2.0, 0.5]) @ rff.frequencies_
    expected = np.hstack([np.cos(Z), np.sin(Z)]) / np.sqrt(5)
    np.testing.assert_allclose(rff.transform(X), expected, rtol=1e-12, atol=1e-15)
    assert rff.frequencies_.shape == (3, 5) and rff.n_features_in_ == 3


def test_transform_into_out_and_threaded_path():
    X = np.random.default_rng(0).normal(size=(300, 4))
    rff = RandomFourierFeatures("rbf", 2048, random_state=0).fit(X)  # 300 x 1024 runs cos/sin on threads
    out = np.empty((300, 2048))
    assert rff.transform(X, out=out) is out
    rowwise = np.vstack([rff.transform(X[i : i + 10]) for i in range(0, 300, 10)])  # single-thread path
    np.testing.assert_array_equal(out, rowwise)
    with pytest.raises(ValueError, match="out must be"):
        rff.transform(X, out=np.empty((300, 2048), dtype=np.float32))
    with pytest.raises(ValueError, match="out must be"):
        rff.transform(X, out=np.empty((300, 2046)))


def test_init_draws_nothing_and_seeding_is_reproducible():
    X = np.random.default_rng(3).normal(size=(10, 2))
    gen = np.random.default_rng(7)
    state = gen.bit_generator.state
    a = RandomFourierFeatures(n_features=20, random_state=gen)
    assert gen.bit_generator.state == state  # __init__ consumed no randomness
    assert not hasattr(a, "frequencies_") and not hasattr(a, "n_features_in_")
    assert a.get_params() == dict(kernel="rbf", n_features=20, lengthscale=1.0, orthogonal=False, random_state=gen)

    for orthogonal in (False, True):
        F1 = RandomFourierFeatures("matern32", 20, orthogonal=orthogonal, random_state=5).fit_transform(X)
        F2 = RandomFourierFeatures("matern32", 20, orthogonal=orthogonal, random_state=5).fit_transform(X)
        np.testing.assert_array_equal(F1, F2)
        F3 = RandomFourierFeatures("matern32", 20, orthogonal=orthogonal, random_state=6).fit_transform(X)
        assert not np.allclose(F1, F3)
    # an int seed refits to the same frequencies; a shared Generator moves on
    b = RandomFourierFeatures(n_features=20, random_state=5).fit(X)
    W = b.frequencies_.copy()
    np.testing.assert_array_equal(b.fit(X).frequencies_, W)
    a.fit(X)
    W_gen = a.frequencies_.copy()
    assert not np.array_equal(a.fit(X).frequencies_, W_gen)


def test_lengthscale_acts_at_transform_time():
    X = np.random.default_rng(3).normal(size=(10, 2))
    a = RandomFourierFeatures("laplace", 20, random_state=5).fit(X)
    W = a.frequencies_.copy()
    base = a.transform(X)
    ell = np.array([2.0, 0.5])
    a.set_params(lengthscale=ell)
    np.testing.assert_array_equal(a.frequencies_, W)  # no redraw
    # scaling inputs and length scale together is a no-op
    np.testing.assert_allclose(a.transform(X * ell), base, rtol=1e-12, atol=1e-15)
    a.set_params(lengthscale=3.0)
    np.testing.assert_allclose(a.transform(3.0 * X), base, rtol=1e-12, atol=1e-15)


def test_sklearn_clone():
    base = pytest.importorskip("sklearn.base")
    a = RandomFourierFeatures("cauchy", 30, lengthscale=2.0, orthogonal=True, random_state=4)
    b = base.clone(a)
    assert b is not a and b.get_params() == a.get_params()
    X = np.random.default_rng(0).normal(size=(5, 3))
    np.testing.assert_array_equal(a.fit_transform(X), b.fit_transform(X))
    assert "kernel='cauchy'" in repr(a)


def test_error_messages():
    X = np.random.default_rng(3).normal(size=(10, 2))
    for bad in (7, 0, 1, 8.0, True, "8"):
        with pytest.raises(ValueError, match="even integer"):
            RandomFourierFeatures(n_features=bad).fit(X)
    with pytest.raises(ValueError, match="unknown kernel"):
        RandomFourierFeatures(kernel="periodic").fit(X)
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_matrix("periodic", X, X)
    with pytest.raises(ValueError, match="unknown kernel"):
        sample_frequencies("periodic", 2, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="positive integer"):
        sample_frequencies("rbf", 0, 4, np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="not fitted"):
        RandomFourierFeatures().transform(X)
    a = RandomFourierFeatures(n_features=20, random_state=0).fit(X)
    with pytest.raises(ValueError, match="fitted on 2 columns, got 4"):
        a.transform(np.ones((3, 4)))
    with pytest.raises(ValueError, match="NaN or infinity"):
        a.transform(np.full((3, 2), np.nan))
    with pytest.raises(ValueError, match="NaN or infinity"):
        a.fit(np.array([[0.0, np.inf]]))
    with pytest.raises(ValueError, match="2-D"):
        a.transform(np.ones(2))
    with pytest.raises(ValueError, match="lengthscale must be a scalar or have shape"):
        a.set_params(lengthscale=[1.0, 2.0, 3.0]).transform(X)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        a.set_params(lengthscale=0.0).transform(X)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        RandomFourierFeatures(lengthscale=-1.0).fit(X)
    with pytest.raises(ValueError, match="no parameter 'n_components'"):
        a.set_params(n_components=10)
    with pytest.raises(ValueError, match="same number of columns"):
        kernel_matrix("rbf", X, np.ones((3, 4)))
