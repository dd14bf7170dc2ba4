"""Composable bases: kernel convergence, structured samplers, gradients, naming, sklearn protocol."""

import numpy as np
import pytest

from pmkjit.bases import (
    BasisConcat,
    BiasBasis,
    LinearBasis,
    PolynomialBasis,
    RadialBasis,
    RandomFourierBasis,
    SpectralMixtureBasis,
)
from pmkjit.features import RandomFourierFeatures, kernel_matrix
from pmkjit.features.spectral import ISOTROPIC, KERNELS
from pmkjit.features.structured import fwht, sample_structured_frequencies


def _X(n=40, d=4, seed=0, scale=0.5):
    return np.random.default_rng(seed).normal(size=(n, d)) * scale


def _rms(basis, X, K_exact):
    P = basis.fit(X).transform(X)
    return np.sqrt(np.mean((P @ P.T - K_exact) ** 2))


# ------------------------------------------------------------------ kernel convergence
@pytest.mark.parametrize(
    ("kernel", "sampler"),
    [(k, s) for k in KERNELS for s in ("iid", "orthogonal", "sorf", "fastfood") if s == "iid" or k in ISOTROPIC],
)
def test_gram_converges_to_exact_kernel(kernel, sampler):
    X = _X()
    ell = np.array([0.8, 1.0, 1.5, 2.0])  # ARD
    K = kernel_matrix(kernel, X, X, ell)
    errs = [np.mean([_rms(RandomFourierBasis(kernel, m, ell, sampler=sampler, random_state=s), X, K) for s in range(3)])
            for m in (32, 512)]
    # Monte Carlo error falls like 1/sqrt(m): a 16x size gives ~4x lower error (allow 2.5x)
    assert errs[1] < errs[0] / 2.5
    assert errs[1] < 0.06


def test_random_fourier_basis_is_random_fourier_features():
    """One feature map: the basis equals RandomFourierFeatures with the same frequencies."""
    X = _X()
    b = RandomFourierBasis("matern52", 64, lengthscale=[1.0, 2.0, 0.5, 1.0], random_state=3).fit(X)
    rff = RandomFourierFeatures("matern52", 128, lengthscale=[1.0, 2.0, 0.5, 1.0], random_state=3).fit(X)
    np.testing.assert_allclose(b.frequencies_, rff.frequencies_)
    np.testing.assert_allclose(b.transform(X), rff.transform(X), atol=1e-12)


def test_spectral_mixture_converges_to_its_kernel():
    X = _X(d=3)
    sm = SpectralMixtureBasis(4, 2, lengthscale=[[0.7, 1.0, 2.0], [1.5, 1.5, 1.5]], means=[[0.5, 0, 0], [0, 1.0, -1.0]])
    errs = []
    for m in (32, 2048):
        e = []
        for s in range(3):
            b = sm.set_params(n_components=m, random_state=s)
            e.append(_rms(b, X, b.fit(X).kernel_matrix(X, X)))
        errs.append(np.mean(e))
    assert errs[1] < errs[0] / 4 and errs[1] < 0.03
    # a single component with zero mean is the RBF kernel
    one = SpectralMixtureBasis(2, 1, lengthscale=1.3, means=[[0.0, 0.0, 0.0]]).fit(X)
    np.testing.assert_allclose(one.kernel_matrix(X, X), kernel_matrix("rbf", X, X, 1.3), atol=1e-12)


def test_structured_samplers_beat_iid_at_equal_size():
    """Orthogonal and SORF frequencies lower the error (their reason to exist); Fastfood's
    reason is speed: its error stays within a small factor of i.i.d. features."""
    X = _X(n=60, d=16, scale=0.2)
    K = kernel_matrix("rbf", X, X)
    err = {s: np.mean([_rms(RandomFourierBasis("rbf", 128, sampler=s, random_state=r), X, K) for r in range(8)])
           for s in ("iid", "orthogonal", "sorf", "fastfood")}
    assert err["orthogonal"] < 0.7 * err["iid"]
    assert err["sorf"] < 0.7 * err["iid"]
    assert err["fastfood"] < 1.5 * err["iid"]


def test_fwht_is_hadamard_product():
    from scipy.linalg import hadamard

    x = np.random.default_rng(0).normal(size=(3, 5, 16))
    np.testing.assert_allclose(fwht(x), x @ hadamard(16), atol=1e-12)
    with pytest.raises(ValueError, match="power-of-2"):
        fwht(np.ones(6))


def test_structured_frequency_laws():
    W = sample_structured_frequencies("rbf", 64, 64 * 200, 0, "sorf")
    # columns are marginally ~N(0, I): unit variance per coordinate
    assert abs(W.var() - 1.0) < 0.03
    blk = W[:, :64]  # one block of SORF directions (p = d = 64) is orthogonal
    G = blk.T @ blk
    np.testing.assert_allclose(G - np.diag(np.diag(G)), 0, atol=1e-10)
    Wf = sample_structured_frequencies("rbf", 32, 32 * 400, 1, "fastfood")
    assert abs(Wf.var() - 1.0) < 0.05
    with pytest.raises(ValueError, match="isotropic"):
        sample_structured_frequencies("laplace", 4, 8, 0)
    with pytest.raises(ValueError, match="isotropic"):
        RandomFourierBasis("laplace", sampler="orthogonal").fit(_X())


# -------------------------------------------------------------------------- gradients
def _check_vjp(basis, X, rtol=1e-5):
    basis.fit(X)
    hyper = basis.hyperparameters()
    rng = np.random.default_rng(9)
    G = rng.normal(size=(X.shape[0], basis.n_outputs_))
    Phi = basis._features_all(X, hyper)
    grads = basis._vjp_all(X, hyper, Phi, G)
    assert set(grads) == set(hyper)
    for name, value in hyper.items():
        value = np.asarray(value, dtype=float)
        fd = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            h = 1e-6 * max(1.0, abs(value[idx]))
            up, dn = value.copy(), value.copy()
            up[idx] += h
            dn[idx] -= h
            f = lambda v: np.sum(G * basis._features_all(X, {**hyper, name: v}))  # noqa: E731
            fd[idx] = (f(up) - f(dn)) / (2 * h)
        np.testing.assert_allclose(grads[name], fd, rtol=rtol, atol=1e-6 * np.abs(fd).max())


@pytest.mark.parametrize("ell", [1.3, [0.7, 1.1, 2.0]])
@pytest.mark.parametrize("kernel", ["rbf", "laplace", "matern32"])
def test_random_fourier_gradient_matches_finite_differences(kernel, ell):
    _check_vjp(RandomFourierBasis(kernel, 20, ell, random_state=0), _X(n=15, d=3))


def test_other_gradients_match_finite_differences():
    X = _X(n=15, d=3)
    _check_vjp(SpectralMixtureBasis(12, 3, random_state=1), X)
    _check_vjp(RadialBasis(n_centres=5, lengthscale=[0.5, 1.0, 2.0], random_state=2), X)
    _check_vjp(RadialBasis(n_centres=5, lengthscale=0.8, random_state=2), X)
    both = RandomFourierBasis("rbf", 10, 0.9, columns=[0, 2], random_state=0) + LinearBasis() + RadialBasis(
        n_centres=4, columns=[1], random_state=0)
    _check_vjp(both, X)
    assert set(both.hyperparameters()) == {"rbf__lengthscale", "radial__lengthscale"}


# ---------------------------------------------------------- composition and naming
def test_concatenation_partial_application_and_names():
    X = _X(d=5)
    rbf = RandomFourierBasis("rbf", 30, lengthscale=[1.0, 2.0], columns=[1, 3], random_state=0)
    basis = LinearBasis(columns=slice(0, 2)) + rbf + BiasBasis() + PolynomialBasis(3, columns=[4])
    assert isinstance(basis, BasisConcat) and len(basis.bases) == 4  # flat, not nested
    Phi = basis.fit(X).transform(X)
    assert Phi.shape == (40, 2 + 60 + 1 + 3)
    np.testing.assert_array_equal(Phi[:, :2], X[:, :2])
    np.testing.assert_allclose(Phi[:, 2:62], rbf.fit(X).transform(X))  # same seed, same columns
    np.testing.assert_allclose(Phi[:, 2:62], RandomFourierBasis("rbf", 30, [1.0, 2.0], random_state=0)
                               .fit(X[:, [1, 3]]).transform(X[:, [1, 3]]))
    np.testing.assert_array_equal(Phi[:, 62], 1.0)
    np.testing.assert_allclose(Phi[:, 63:], X[:, [4]] ** np.arange(1, 4))
    names = basis.get_feature_names_out()
    assert names[0] == "linear_0" and names[2] == "rbf_0" and names[-1] == "poly_2"
    # hyperparameters by name, independent of the order of concatenation
    other = BiasBasis() + rbf + PolynomialBasis(3, columns=[4]) + LinearBasis(columns=slice(0, 2))
    assert set(other.fit(X).hyperparameters()) == set(basis.hyperparameters()) == {"rbf__lengthscale"}
    basis.set_params(rbf__lengthscale=[3.0, 3.0])
    assert basis.get_params()["rbf__lengthscale"] == [3.0, 3.0]
    np.testing.assert_allclose(basis.fit(X).transform(X)[:, 2:62],
                               RandomFourierBasis("rbf", 30, 3.0, columns=[1, 3], random_state=0).fit(X).transform(X))


def test_repeated_names_are_refused_and_resolved_by_name():
    X = _X()
    with pytest.raises(ValueError, match="distinct names"):
        (RandomFourierBasis() + RandomFourierBasis()).fit(X)
    ok = RandomFourierBasis(name="short", lengthscale=0.5) + RandomFourierBasis(name="long", lengthscale=5.0)
    specs = ok.fit(X).hyperparameter_specs()
    assert float(specs["short__lengthscale"].value) == 0.5 and float(specs["long__lengthscale"].value) == 5.0
    with pytest.raises(ValueError, match="no basis named"):
        ok.set_params(rbf__lengthscale=1.0)


def test_fixed_hyperparameters_are_not_learnable():
    X = _X()
    b = RandomFourierBasis(lengthscale_bounds="fixed", random_state=0).fit(X)
    assert b.hyperparameters() == {}
    with pytest.raises(ValueError, match="fixed"):
        RandomFourierBasis(lengthscale_bounds="free").fit(X)


def test_sklearn_protocol_and_random_state():
    sklearn = pytest.importorskip("sklearn")
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = _X()
    b = RandomFourierBasis("cauchy", 16, random_state=None)
    assert not hasattr(b, "frequencies_")  # nothing drawn in __init__
    with pytest.raises(NotFittedError):
        b.transform(X)
    seeded = RandomFourierBasis("cauchy", 16, random_state=7)
    np.testing.assert_array_equal(seeded.fit(X).transform(X), clone(seeded).fit(X).transform(X))
    gen = np.random.default_rng(0)
    shared = RandomFourierBasis("cauchy", 16, random_state=gen)
    assert not np.array_equal(shared.fit(X).frequencies_, shared.fit(X).frequencies_)  # generator advances
    pipe = make_pipeline(StandardScaler(), LinearBasis() + RandomFourierBasis(n_components=8, random_state=0))
    assert pipe.fit_transform(X).shape == (40, 4 + 16)
    c = clone(LinearBasis() + RadialBasis(n_centres=3))
    assert c.get_params()["radial__n_centres"] == 3
    assert sklearn.__version__
