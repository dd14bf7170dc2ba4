"""BayesianLinearRegression against independent closed forms."""

import numpy as np
import pytest
from scipy import stats

from pmkjit.regression import BayesianLinearRegression


def _data(n=60, D=12, K=2, seed=0):
    rng = np.random.default_rng(seed)
    Phi = rng.normal(size=(n, D)) / np.sqrt(D)
    W = rng.normal(size=(D, K))
    Y = Phi @ W + 0.1 * rng.normal(size=(n, K))
    return Phi, Y


def test_online_equals_batch():
    Phi, Y = _data()
    batch = BayesianLinearRegression(regularization=0.3, center=False).fit(Phi, Y)
    online = BayesianLinearRegression(regularization=0.3, center=False).fit(Phi[:1], Y[:1])
    for i in range(1, Phi.shape[0]):
        online.partial_fit(Phi[i : i + 1], Y[i : i + 1])
    Xt, _ = _data(seed=1)
    m1, v1 = batch.predict(Xt, return_var=True)
    m2, v2 = online.predict(Xt, return_var=True)
    np.testing.assert_allclose(m2, m1, rtol=0, atol=1e-8)
    np.testing.assert_allclose(v2, v1, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(online.R_.T @ online.R_, batch.R_.T @ batch.R_, atol=1e-8)
    np.testing.assert_allclose(online.log_evidence(), batch.log_evidence(), rtol=1e-9)


def test_online_blocks_keep_first_offset():
    Phi, Y = _data(K=3)
    Y = Y + 5.0
    model = BayesianLinearRegression(regularization=1.0).fit(Phi[:20], Y[:20])
    model.partial_fit(Phi[20:45], Y[20:45]).partial_fit(Phi[45:], Y[45:])
    c = Y[:20].mean(0)
    A = Phi.T @ Phi + np.eye(Phi.shape[1])
    W = np.linalg.solve(A, Phi.T @ (Y - c))
    np.testing.assert_allclose(model.coef_, W, atol=1e-10)


def test_predictions_equal_dual_gp():
    Phi, Y = _data(n=40, D=25)
    lam = 0.5
    model = BayesianLinearRegression(regularization=lam, center=False).fit(Phi, Y)
    Xt, _ = _data(n=7, D=25, seed=3)
    mean, var = model.predict(Xt, return_var=True, include_noise=False)
    # Dual (GP) form with the finite-feature kernel k = Phi Phi^T / lam, noise 1 (units of s_k).
    K = Phi @ Phi.T / lam + np.eye(Phi.shape[0])
    Ks = Xt @ Phi.T / lam
    gp_mean = Ks @ np.linalg.solve(K, Y)
    gp_cov = Xt @ Xt.T / lam - Ks @ np.linalg.solve(K, Ks.T)
    np.testing.assert_allclose(mean, gp_mean, atol=1e-10)
    np.testing.assert_allclose(var, np.diag(gp_cov)[:, None] * model.noise_var_, rtol=1e-8)


def test_evidence_equals_n_by_n_closed_form():
    Phi, Y = _data(n=50, D=10, K=2)
    model = BayesianLinearRegression(regularization=0.7).fit(Phi, Y)
    Yc = Y - Y.mean(0)
    for k in range(2):
        s = model.noise_var_[k]
        cov = s * (np.eye(50) + Phi @ Phi.T / 0.7)
        ref = stats.multivariate_normal(np.zeros(50), cov).logpdf(Yc[:, k])
        assert model.log_evidence()[k] == pytest.approx(ref, rel=1e-10)
    # profiled noise is the maximiser: perturbing s lowers the closed-form evidence
    s = model.noise_var_[0]
    for f in (0.9, 1.1):
        cov = f * s * (np.eye(50) + Phi @ Phi.T / 0.7)
        assert stats.multivariate_normal(np.zeros(50), cov).logpdf(Yc[:, 0]) < model.log_evidence()[0]


def test_evidence_selects_lambda_near_truth():
    rng = np.random.default_rng(5)
    n, D = 2000, 30
    Phi = rng.normal(size=(n, D))
    sigma0, sigma_y = 1.0, 0.5
    w = sigma0 * rng.normal(size=D)
    y = Phi @ w + sigma_y * rng.normal(size=n)
    model = BayesianLinearRegression(center=False).fit(Phi, y)
    assert model.noise_var_ == pytest.approx(sigma_y**2, rel=0.1)
    # the chosen lambda maximises the evidence over a grid of fixed alternatives
    best = model.log_evidence()
    for lam in (0.01, 0.1, 1.0, 10.0):
        other = BayesianLinearRegression(regularization=lam, center=False).fit(Phi, y)
        assert other.log_evidence() <= best + 1e-9


def test_state_roundtrip_and_errors():
    Phi, Y = _data()
    model = BayesianLinearRegression().fit(Phi, Y)
    clone = BayesianLinearRegression.from_state_dict(model.state_dict())
    np.testing.assert_allclose(clone.predict(Phi), model.predict(Phi), atol=1e-12)
    with pytest.raises(ValueError, match="rows"):
        model.partial_fit(Phi[:3], Y[:2])
    bad = Phi.copy()
    bad[4, 0] = np.nan
    with pytest.raises(ValueError, match=r"rows \[4\]"):
        BayesianLinearRegression().fit(bad, Y)
    with pytest.raises(RuntimeError, match="not fitted"):
        BayesianLinearRegression().predict(Phi)


def test_auto_precision_leverage_is_accurate_and_falls_back_when_ill_conditioned():
    Phi, Y = _data(n=200, D=40)
    model = BayesianLinearRegression(regularization=0.1).fit(Phi, Y)
    Xt, _ = _data(n=30, D=40, seed=5)
    exact = np.einsum("nd,nd->n", Xt, np.linalg.solve(model.R_.T @ model.R_, Xt.T).T)
    double = model.leverage(Xt)
    auto = model.leverage(Xt, precision="auto")
    np.testing.assert_allclose(double, exact, rtol=1e-10)
    assert not np.array_equal(auto, double)  # the single-precision solve did run
    cond = np.linalg.cond(model.R_)
    np.testing.assert_allclose(auto, exact, rtol=10 * cond * np.finfo(np.float32).eps)
    _, v_auto = model.predict(Xt, return_var=True, variance_precision="auto")
    np.testing.assert_allclose(v_auto, (auto[:, None] + 1) * model.noise_var_, rtol=1e-12)

    # Nearly collinear features and a tiny regulariser: cond(R) ~ 1e6, beyond float32.
    rng = np.random.default_rng(1)
    base = rng.normal(size=(200, 1))
    Phi_bad = base + 1e-6 * rng.normal(size=(200, 40))
    bad = BayesianLinearRegression(regularization=1e-12).fit(Phi_bad, Y)
    assert np.linalg.cond(bad.R_) * np.finfo(np.float32).eps > 0.05
    np.testing.assert_array_equal(bad.leverage(Xt, precision="auto"), bad.leverage(Xt))
    with pytest.raises(ValueError, match="precision"):
        model.leverage(Xt, precision="half")


def test_smallest_rule_fits_the_strong_output_when_signal_to_noise_ratios_differ():
    # One lam gives every output the same signal-to-noise ratio 1/lam. A strong output
    # (weights of s.d. 3, noise 0.01) beside a weak one (s.d. 0.01, same noise): the summed
    # evidence compromises and over-smooths the strong one; "smallest" keeps it.
    rng = np.random.default_rng(7)
    n, D = 200, 150
    Phi = rng.normal(size=(2 * n, D)) / np.sqrt(D)
    W = np.column_stack([3.0 * rng.normal(size=D), 0.01 * rng.normal(size=D)])
    F = Phi @ W
    Y = F + 0.01 * rng.normal(size=F.shape)
    fits = {rule: BayesianLinearRegression(regularization_rule=rule).fit(Phi[:n], Y[:n])
            for rule in ("summed", "smallest")}
    per_output = [BayesianLinearRegression().fit(Phi[:n], Y[:n, k]).regularization_ for k in range(2)]
    assert fits["smallest"].regularization_ == pytest.approx(min(per_output), rel=1e-6)
    assert fits["smallest"].regularization_ < 0.1 * fits["summed"].regularization_
    err = {rule: np.sqrt(np.mean((m.predict(Phi[n:]) - F[n:]) ** 2, axis=0)) for rule, m in fits.items()}
    assert err["smallest"][0] < 0.5 * err["summed"][0]  # the strong output, measured: 0.37 against 1.21
    # the cost: the weak output partly fits its noise (s.d. 0.01): measured 0.022 against 0.009
    assert err["smallest"][1] < 3 * 0.01
    # the profiled noise of the strong output is the noise, not the summed fit's misfit
    assert fits["smallest"].noise_var_[0] < 0.3 * fits["summed"].noise_var_[0]
    with pytest.raises(ValueError, match="regularization_rule"):
        BayesianLinearRegression(regularization_rule="mean")
