"""Compiled feature kernels and blocked prediction agree with the float64 numpy reference."""

import threading
import time

import numpy as np
import pytest
from scipy import special

from pmkjit import _parallel
from pmkjit.families import Beta, Gamma, Gaussian, PointMass
from pmkjit.features import GaussianJointEmbeddingFeatures, RandomFourierFeatures
from pmkjit.features import _elementwise as ew
from pmkjit.features.embeddings import _JointEmbedding
from pmkjit.features.random_fourier import _cos_sin_numpy, cos_sin
from pmkjit.operators import KJITOperator, QuadratureOracle
from pmkjit.operators import kjit as kjit_module

# fdlibm-quality sin/cos: results within 2 ulp of 1 of numpy's (libm) values
TRIG_ATOL = 4.5e-16


@pytest.mark.parametrize("width", [1.0, 300.0, 1e5, ew.TRIG_LIMIT])
def test_cos_sin_kernel_matches_numpy(width):
    rng = np.random.default_rng(0)
    Z = rng.uniform(-width, width, (257, 129))
    Z[0, :6] = [0.0, -0.0, np.pi / 4, -np.pi / 4, 3 * np.pi / 2, 1e-300]
    out, ref = np.empty((257, 258)), np.empty((257, 258))
    cos_sin(Z, out, scale=0.7)
    _cos_sin_numpy(Z, ref, 0.7, None)
    np.testing.assert_allclose(out, ref, rtol=0, atol=0.7 * TRIG_ATOL)


def test_cos_sin_falls_back_beyond_the_reduction_range_and_for_other_layouts():
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(40, 30))
    Z[7, 3] = 3e7  # beyond TRIG_LIMIT: row 7 is recomputed with numpy
    Z[9, 0] = -1e12
    amp = rng.uniform(size=(40, 30))
    out, ref = np.empty((40, 60)), np.empty((40, 60))
    cos_sin(Z, out, scale=2.0, amplitude=amp)
    _cos_sin_numpy(Z, ref, 2.0, amp)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2 * TRIG_ATOL)
    np.testing.assert_array_equal(out[[7, 9]], ref[[7, 9]])
    # a non-contiguous argument takes the numpy path and gives the same values
    out2 = np.empty((40, 60))
    cos_sin(np.asfortranarray(Z), out2, scale=2.0, amplitude=amp)
    np.testing.assert_allclose(out2, ref, rtol=0, atol=2 * TRIG_ATOL)


def test_threads_do_not_change_results():
    rng = np.random.default_rng(2)
    Z = rng.uniform(-50, 50, (1001, 250))  # above the threading threshold
    a, b = np.empty((1001, 500)), np.empty((1001, 500))
    cos_sin(Z, a, threads=True)
    cos_sin(Z, b, threads=False)
    np.testing.assert_array_equal(a, b)


def test_random_fourier_features_transform_matches_formula():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 4))
    rff = RandomFourierFeatures("rbf", 200, lengthscale=0.3, random_state=0).fit(X)
    Z = X @ (rff.frequencies_ / 0.3)  # transform's order of operations, so Z agrees exactly
    expected = np.hstack([np.cos(Z), np.sin(Z)]) / np.sqrt(100)
    np.testing.assert_allclose(rff.transform(X), expected, rtol=0, atol=TRIG_ATOL / 10)


def gaussian_cf_reference(M, V, omega):
    """Joint characteristic function of independent Gaussians, numpy complex arithmetic."""
    log_amp = -0.5 * sum(V[:, [c]] * omega[c] ** 2 for c in range(M.shape[1]))
    phase = sum(M[:, [c]] * omega[c] for c in range(M.shape[1]))
    return np.where(log_amp < -345.0, 0.0, np.exp(log_amp)) * np.exp(1j * phase)


@pytest.mark.parametrize("n_vars", [1, 3])
def test_phase_cf_kernel_matches_complex_numpy(n_vars):
    rng = np.random.default_rng(4)
    n, K = 200, 64
    M = rng.normal(0, 20, (n, n_vars))
    V = np.exp(rng.uniform(-8, 4, (n, n_vars)))
    V[0] = 0.0  # point masses: unit amplitude
    V[1] = 1e6  # amplitudes far below 1e-150 are flushed to exactly zero
    omega = rng.normal(0, 2, (n_vars, K))
    ref = 0.3 * gaussian_cf_reference(M, V, omega)
    # phases summed over variables round differently (FMA): allow a few ulp of the phase
    atol = 1e-15 + 0.3 * 4 * np.finfo(float).eps * np.max(np.abs(M) @ np.abs(omega))
    out = np.empty((n, 2 * K))
    assert ew.phase_cf_kernel(M, V, np.empty((0, 0)), out, omega, 0.5 * omega**2, 0.3) == 0
    np.testing.assert_allclose(out[:, :K], ref.real, rtol=0, atol=atol)
    np.testing.assert_allclose(out[:, K:], ref.imag, rtol=0, atol=atol)
    assert np.all(out[1] == 0.0)
    # multiplying into other characteristic functions, also in place
    other = rng.normal(size=(n, 2 * K))
    prod = ref * (other[:, :K] + 1j * other[:, K:])
    ew.phase_cf_kernel(M, V, other, out, omega, 0.5 * omega**2, 0.3)
    np.testing.assert_allclose(out, np.hstack([prod.real, prod.imag]), rtol=0, atol=10 * atol)
    ew.phase_cf_kernel(M, V, other, other, omega, 0.5 * omega**2, 0.3)
    np.testing.assert_array_equal(other, out)


def test_exp_amplitude_is_accurate_and_never_subnormal():
    K = 2000
    log_amp = -np.linspace(0, 400, K)
    omega = np.sqrt(2 * -log_amp)[None, :]  # V = 1, M = 0: amplitude exp(log_amp)
    out = np.empty((1, 2 * K))
    ew.phase_cf_kernel(np.zeros((1, 1)), np.ones((1, 1)), np.empty((0, 0)), out, omega, 0.5 * omega**2, 1.0)
    kept = log_amp >= -345.0
    expected = np.exp(0.5 * -(omega[0] ** 2))
    np.testing.assert_allclose(out[0, :K][kept], expected[kept], rtol=5e-16, atol=0)
    assert np.all(out[0, :K][~kept] == 0.0) and np.all(out[0, K:] == 0.0)


def messages_of_kind(kind, rng, n):
    y = rng.integers(0, 2, n).astype(float)
    g = Gaussian(rng.normal(0, 3, n), np.exp(rng.uniform(-4, 2, n)))
    g2 = Gaussian(rng.normal(1, 1, n), np.exp(rng.uniform(-2, 1, n)))
    b = Beta(1 + y + rng.uniform(0, 5, n), 2 - y + rng.uniform(0, 5, n))
    gam = Gamma(rng.uniform(0.5, 5, n), rng.uniform(0.5, 3, n))
    p = PointMass(rng.normal(0, 2, n))
    return {
        "gaussian-beta": (g, b),
        "beta-gaussian": (b, g),
        "gaussian-gaussian-beta": (g, g2, b),
        "gaussian-gamma-beta": (g, gam, b),
        "beta": (b,),
        "gamma-beta": (gam, b),
        "gaussian": (g,),
        "pointmass-gaussian": (p, g),
    }[kind]


KINDS = ["gaussian-beta", "beta-gaussian", "gaussian-gaussian-beta", "gaussian-gamma-beta",
         "beta", "gamma-beta", "gaussian", "pointmass-gaussian"]


@pytest.mark.parametrize("kind", KINDS)
def test_joint_embedding_matches_numpy_reference(kind):
    rng = np.random.default_rng(5)
    messages = messages_of_kind(kind, rng, 300)
    families = [type(m).name for m in messages]
    emb = _JointEmbedding(rng.normal(size=(len(messages), 120)), np.full(len(messages), 0.7), families)
    fast = emb.transform(messages)
    ref = emb.transform_reference(messages)
    # entries are O(1/sqrt(K)); the kernels' error is a few ulp of that
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(fast, emb.transform(messages, threads=False))


def test_joint_embedding_recomputes_rows_with_huge_phases():
    rng = np.random.default_rng(6)
    n = 50
    mean = rng.normal(0, 1, n)
    mean[[3, 17]] = [4e7, -2e9]  # phases beyond the kernel's reduction range
    messages = (Gaussian(mean, np.full(n, 1e-6)), Beta(np.full(n, 2.0), np.full(n, 3.0)))
    emb = _JointEmbedding(rng.normal(size=(2, 40)), np.ones(2), ("Gaussian", "Beta"))
    fast, ref = emb.transform(messages), emb.transform_reference(messages)
    np.testing.assert_array_equal(fast[[3, 17]], ref[[3, 17]])
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-15)


def test_for_row_blocks_covers_every_row_once_and_propagates_errors():
    hits = np.zeros(1003, int)
    names = set()

    def fn(lo, hi):
        hits[lo:hi] += 1
        names.add(threading.current_thread().name)
        time.sleep(0.002)  # blocks are handed out dynamically: give the second thread its turn
        _parallel.for_row_blocks(lambda a, b: None, 10, 3)  # nested calls run serially

    _parallel.for_row_blocks(fn, 1003, 64, workers=2)
    assert np.all(hits == 1) and len(names) == 2

    def bad(lo, hi):
        if lo >= 500:
            raise ValueError("block failed")

    with pytest.raises(ValueError, match="block failed"):
        _parallel.for_row_blocks(bad, 1003, 64, workers=2)
    assert _parallel._blas_users == 0  # the BLAS thread limit was released


@pytest.fixture(scope="module")
def small_operator():
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 500).astype(float)
    msgs = (Gaussian(rng.normal(0, 2, 500), np.exp(rng.uniform(-2, 2, 500))), Beta(1 + y, 2 - y))
    oracle = QuadratureOracle(special.expit, (Gaussian, Beta), unconstrained_function=lambda z: z)
    op = KJITOperator((Gaussian, Beta), targets=(0,), features=GaussianJointEmbeddingFeatures(100, 300),
                      search={"inner_scale": (1.0,), "outer_scale": (1.0,)}, random_state=0)
    op(msgs, oracle)
    return op


def test_blocked_prediction_is_independent_of_blocking(small_operator, monkeypatch):
    op = small_operator
    # double precision throughout, so that blocking is the only difference
    monkeypatch.setattr(op, "variance_precision", "double")
    rng = np.random.default_rng(8)
    y = rng.integers(0, 2, 1000).astype(float)
    msgs = (Gaussian(rng.normal(0, 2, 1000), np.exp(rng.uniform(-2, 2, 1000))), Beta(1 + y, 2 - y))
    # the unblocked computation: whole-batch features, then the regression
    Phi = op.features_.transform(msgs)
    mean, var = op.regression_.predict(Phi, return_var=True, include_noise=False)
    expected_beliefs = op._decode(mean, msgs)
    results = []
    for rows in (37, 512, 5000):
        monkeypatch.setattr(kjit_module, "_PREDICT_BLOCK_ROWS", rows)
        (belief,), v = op.predict(msgs)
        results.append((belief, v))
        np.testing.assert_allclose(v, var, rtol=1e-9)
        np.testing.assert_allclose(belief.natural, expected_beliefs[0].natural, rtol=1e-9)
    np.testing.assert_allclose(results[0][1], results[2][1], rtol=1e-9)


def test_single_precision_variance_matches_double(small_operator, monkeypatch):
    op = small_operator
    rng = np.random.default_rng(9)
    y = rng.integers(0, 2, 500).astype(float)
    msgs = (Gaussian(rng.normal(0, 2, 500), np.exp(rng.uniform(-2, 2, 500))), Beta(1 + y, 2 - y))
    assert op.variance_precision == "auto" and op.regression_.single_precision_factor() is not None
    (b32,), v32 = op.predict(msgs)
    monkeypatch.setattr(op, "variance_precision", "double")
    (b64,), v64 = op.predict(msgs)
    np.testing.assert_array_equal(b32.natural, b64.natural)  # messages stay in float64
    cond = np.linalg.cond(op.regression_.R_)
    np.testing.assert_allclose(v32, v64, rtol=10 * cond * np.finfo(np.float32).eps)
    with pytest.raises(ValueError, match="variance_precision"):
        KJITOperator((Gaussian, Beta), variance_precision="single")
