"""Random Fourier bases converge to their exact kernels."""

import numpy as np
import pytest

from pmkjit.features import KERNELS, RandomFourierFeatures, kernel_matrix, sample_frequencies


def _gram_error(kernel, D, seed, X, orthogonal=False):
    rff = RandomFourierFeatures(kernel, n_features=D, lengthscale=1.3, orthogonal=orthogonal, random_state=seed)
    Phi = rff.fit_transform(X)
    return np.sqrt(np.mean((Phi @ Phi.T - kernel_matrix(kernel, X, X, 1.3)) ** 2))


@pytest.mark.parametrize("kernel", KERNELS)
def test_gram_converges_like_one_over_sqrt_d(kernel):
    X = np.random.default_rng(0).normal(size=(40, 3))
    sizes = [64, 256, 1024, 4096]
    errs = [np.mean([_gram_error(kernel, D, s, X) for s in range(6)]) for D in sizes]
    slope = np.polyfit(np.log(sizes), np.log(errs), 1)[0]
    assert -0.7 < slope < -0.35, (kernel, errs, slope)
    assert errs[-1] < 0.03


@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
def test_orthogonal_features_beat_plain_features(kernel):
    X = np.random.default_rng(1).normal(size=(60, 8)) * 0.5
    plain = np.mean([_gram_error(kernel, 64, s, X) for s in range(20)])
    ortho = np.mean([_gram_error(kernel, 64, s, X, orthogonal=True) for s in range(20)])
    assert ortho < 0.9 * plain


def test_exact_kernels_closed_forms():
    X = np.array([[0.0, 0.0]])
    Y = np.array([[1.0, -2.0]])
    r = np.sqrt(5.0)
    assert kernel_matrix("rbf", X, Y)[0, 0] == pytest.approx(np.exp(-2.5))
    assert kernel_matrix("laplace", X, Y)[0, 0] == pytest.approx(np.exp(-3.0))
    assert kernel_matrix("cauchy", X, Y)[0, 0] == pytest.approx(1 / 6.0)
    assert kernel_matrix("matern32", X, Y)[0, 0] == pytest.approx((1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r))
    a = np.sqrt(5) * r
    assert kernel_matrix("matern52", X, Y)[0, 0] == pytest.approx((1 + a + a * a / 3) * np.exp(-a))
    sk = pytest.importorskip("sklearn.gaussian_process.kernels")
    Z = np.random.default_rng(2).normal(size=(5, 2))
    np.testing.assert_allclose(kernel_matrix("matern32", Z, Z, 0.7), sk.Matern(0.7, nu=1.5)(Z), rtol=1e-10)
    np.testing.assert_allclose(kernel_matrix("matern52", Z, Z, 0.7), sk.Matern(0.7, nu=2.5)(Z), rtol=1e-10)
    np.testing.assert_allclose(kernel_matrix("rbf", Z, Z, 0.7), sk.RBF(0.7)(Z), rtol=1e-10)


def test_seeding_lengthscale_and_errors():
    X = np.random.default_rng(3).normal(size=(10, 2))
    a = RandomFourierFeatures(n_features=20, random_state=5)
    assert not hasattr(a, "frequencies_")  # nothing is drawn before fit
    np.testing.assert_array_equal(a.fit_transform(X), RandomFourierFeatures(n_features=20, random_state=5).fit_transform(X))
    # the length scale acts at transform time: scaling inputs and length scale together is a no-op
    a.set_params(lengthscale=np.array([2.0, 0.5]))
    np.testing.assert_allclose(a.transform(X * [2.0, 0.5]), RandomFourierFeatures(n_features=20, random_state=5).fit(X).transform(X))
    with pytest.raises(ValueError, match="even"):
        RandomFourierFeatures(n_features=7).fit(X)
    with pytest.raises(ValueError, match="unknown kernel"):
        RandomFourierFeatures(kernel="periodic").fit(X)
    with pytest.raises(RuntimeError, match="not fitted"):
        RandomFourierFeatures().transform(X)
    with pytest.raises(ValueError, match="fitted on 2 columns"):
        a.transform(np.ones((3, 4)))
    with pytest.raises(ValueError, match="NaN"):
        a.transform(np.full((3, 2), np.nan))
    with pytest.raises(ValueError, match="isotropic"):
        sample_frequencies("laplace", 2, 4, np.random.default_rng(0), orthogonal=True)
