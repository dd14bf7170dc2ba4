"""``pm.MvNormal`` as exact Gaussian factors: batched and hierarchical latents, observed rows.

The linear-Gaussian models here have closed-form posteriors, computed with numpy from the
model as written (the joint prior covariance of the latents and the observation matrix),
independently of the builder's whitened rows. No black-box factor is involved, so EP's
joint Gaussian (``idata.ep.gaussian_mean`` / ``gaussian_cov``) must match them to
numerical precision. The MvNormal prior feeding a logistic likelihood is compared with a
grid posterior.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pmkjit
from pmkjit.errors import UnsupportedModelError
from pmkjit.graph import build_factor_graph

# a correlated 3 x 3 covariance (condition number about 8)
S = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.3], [0.2, -0.3, 0.5]])
# exact factors only: EP's Gaussian is the posterior up to the rounding of its linear algebra
RTOL = 1e-8


def _fit(model: pm.Model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyMC's ImputationWarning, BLAS notices
        return pmkjit.fit(model=model, random_seed=0, progressbar=False, **kwargs)


def _ep_joint(idata, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """EP's joint Gaussian over ``names`` (each flattened in C order, in that order)."""
    offsets = dict(item.split(": ") for item in idata.ep.attrs["gaussian_offsets"].split("; "))
    index = np.concatenate([
        int(offsets[n]) + np.arange(int(np.prod(idata.posterior[n].shape[2:], dtype=int))) for n in names
    ])
    mean, cov = idata.ep["gaussian_mean"].values, idata.ep["gaussian_cov"].values
    return mean[index], cov[np.ix_(index, index)]


def _gaussian_posterior(m0: np.ndarray, C0: np.ndarray, H: np.ndarray, y: np.ndarray,
                        noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior of ``theta ~ N(m0, C0)`` given ``y = H theta + e``, ``e ~ N(0, noise)`` (Kalman form)."""
    G = H @ C0 @ H.T + noise
    gain = np.linalg.solve(G, H @ C0).T
    return m0 + gain @ (y - H @ m0), C0 - gain @ H @ C0


def _assert_matches(idata, names: list[str], mean: np.ndarray, cov: np.ndarray) -> None:
    ep_mean, ep_cov = _ep_joint(idata, names)
    scale = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(ep_mean / scale, mean / scale, rtol=0, atol=RTOL)
    np.testing.assert_allclose(ep_cov / np.outer(scale, scale), cov / np.outer(scale, scale), rtol=0, atol=RTOL)


def _selection(index: np.ndarray, J: int, K: int) -> np.ndarray:
    """Rows of ``vec(b[index])`` (C order) as a ``(len(index) * K, J * K)`` matrix on ``vec(b)``."""
    H = np.zeros((index.size * K, J * K))
    rows = np.arange(index.size * K)
    H[rows, (index[:, None] * K + np.arange(K)).ravel()] = 1.0
    return H


@pytest.mark.parametrize("form", ["cov", "chol", "tau", "batched cov", "dims", "data"])
def test_a_batched_mvnormal_prior_is_exact_in_every_parametrisation(form):
    # b (4 x 3), each row MvNormal(m0, S_j), observed through noisy copies of some rows
    rng = np.random.default_rng(1)
    J, K, N, sigma = 4, 3, 10, 0.7
    m0 = np.array([0.5, -1.0, 2.0])
    covs = np.stack([S * (1.0 + 0.5 * j) for j in range(J)]) if form == "batched cov" else np.broadcast_to(S, (J, K, K))
    group = rng.integers(0, J, N)
    y = rng.normal(size=(N, K))
    param = {"cov": {"cov": S}, "chol": {"chol": np.linalg.cholesky(S)}, "tau": {"tau": np.linalg.inv(S)},
             "batched cov": {"cov": covs}, "dims": {"cov": S}, "data": {}}[form]
    shape = {"dims": ("g", "k")} if form == "dims" else {"shape": (J, K)}
    with pm.Model(coords={"g": range(J), "k": range(K)}) as model:
        if form == "data":  # a covariance in a pm.Data container is read as it is now
            param = {"cov": pm.Data("S", S)}
        b = pm.MvNormal("b", mu=m0, **param, **shape)
        pm.Normal("y", b[group], sigma, observed=y)
    C0 = np.zeros((J * K, J * K))
    for j in range(J):
        C0[j * K:(j + 1) * K, j * K:(j + 1) * K] = covs[j]
    mean, cov = _gaussian_posterior(np.tile(m0, J), C0, _selection(group, J, K), y.ravel(),
                                    sigma**2 * np.eye(N * K))
    idata = _fit(model, draws=200)
    _assert_matches(idata, ["b"], mean, cov)
    assert idata.posterior["b"].shape[2:] == (J, K)
    if form == "dims":
        assert idata.posterior["b"].dims[2:] == ("g", "k")


def test_a_hierarchical_mvnormal_with_a_latent_mean_is_exact():
    # mu ~ N(0, 2^2 I), b_j ~ MvNormal(mu, S): b_j = mu + e_j, so the joint prior of
    # (mu, b) is T diag(4 I, S, ..., S) T^T with T the map from (mu, e_1..e_J)
    rng = np.random.default_rng(2)
    J, K, N, sigma = 5, 3, 12, 0.5
    group = rng.integers(0, J, N)
    y = rng.normal(1.0, 1.0, size=(N, K))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0, shape=K)
        b = pm.MvNormal("b", mu=mu, cov=S, shape=(J, K))
        pm.Normal("y", b[group], sigma, observed=y)
    T = np.zeros(((J + 1) * K, (J + 1) * K))
    T[:K, :K] = np.eye(K)
    T[K:, :K] = np.tile(np.eye(K), (J, 1))
    T[K:, K:] = np.eye(J * K)
    Z = np.zeros_like(T)
    Z[:K, :K] = 4.0 * np.eye(K)
    for j in range(1, J + 1):
        Z[j * K:(j + 1) * K, j * K:(j + 1) * K] = S
    C0 = T @ Z @ T.T
    H = np.hstack([np.zeros((N * K, K)), _selection(group, J, K)])
    mean, cov = _gaussian_posterior(np.zeros((J + 1) * K), C0, H, y.ravel(), sigma**2 * np.eye(N * K))
    idata = _fit(model, draws=200)
    _assert_matches(idata, ["mu", "b"], mean, cov)


def test_an_observed_mvnormal_multi_output_regression_is_exact():
    # Y[n] ~ MvNormal(a + X[n] @ B, Sigma): vec(Y) = (1 (x) I) a + (X (x) I) vec(B) + e, e ~ N(0, I (x) Sigma)
    rng = np.random.default_rng(3)
    N, P, K = 30, 2, 3
    X = rng.normal(size=(N, P))
    Sigma = 0.3 * S
    Y = rng.normal(size=(N, K)) + X @ rng.normal(size=(P, K))
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.5, shape=K)
        B = pm.Normal("B", 0.0, 1.0, shape=(P, K))
        pm.MvNormal("Y", mu=a + X @ B, cov=Sigma, observed=Y)
    C0 = np.diag(np.r_[np.full(K, 1.5**2), np.ones(P * K)])
    H = np.hstack([np.kron(np.ones((N, 1)), np.eye(K)), np.kron(X, np.eye(K))])
    mean, cov = _gaussian_posterior(np.zeros(K + P * K), C0, H, Y.ravel(), np.kron(np.eye(N), Sigma))
    idata = _fit(model, draws=200)
    _assert_matches(idata, ["a", "B"], mean, cov)
    assert "Y" in idata.log_likelihood


def test_a_single_observed_vector_with_tau_is_exact():
    # one observed vector y ~ MvNormal(w, tau^-1) with a correlated MvNormal prior on w
    y = np.array([1.0, -0.5, 2.0])
    tau = np.linalg.inv(0.5 * S + 0.1 * np.eye(3))
    with pm.Model() as model:
        w = pm.MvNormal("w", mu=np.zeros(3), cov=S)
        pm.MvNormal("y", mu=w, tau=tau, observed=y)
    mean, cov = _gaussian_posterior(np.zeros(3), S, np.eye(3), y, np.linalg.inv(tau))
    _assert_matches(_fit(model, draws=200), ["w"], mean, cov)


def test_a_gp_marginal_with_constant_hyperparameters_is_exact():
    # pm.gp.Marginal is an observed MvNormal: y ~ N(a 1, K + 0.1^2 I) with a latent mean a
    rng = np.random.default_rng(6)
    X = np.linspace(0.0, 1.0, 15)[:, None]
    y = np.sin(4.0 * X[:, 0]) + 0.1 * rng.normal(size=15)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.0)
        cov_func = pm.gp.cov.ExpQuad(1, ls=0.3)
        gp = pm.gp.Marginal(mean_func=pm.gp.mean.Constant(a), cov_func=cov_func)
        gp.marginal_likelihood("y", X=X, y=y, sigma=0.1)
    Kxx = cov_func(X).eval() + (0.1**2 + 1e-6) * np.eye(15)  # marginal_likelihood's default jitter=1e-6
    mean, cov = _gaussian_posterior(np.zeros(1), 4.0 * np.eye(1), np.ones((15, 1)), y, Kxx)
    _assert_matches(_fit(model, draws=200), ["a"], mean, cov)


def test_rows_missing_whole_give_the_complete_case_posterior_and_their_predictive():
    # a NaN row: PyMC imputes it as an MvNormal latent that nothing reads; EP's posterior is
    # the complete-case one, and the row's draws are its predictive N(x @ B, Sigma + x C x^T)
    rng = np.random.default_rng(4)
    N, K = 25, 3
    x = rng.normal(size=N)
    Y = np.outer(x, [1.0, -1.0, 0.5]) + rng.normal(size=(N, K))
    Y[7] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ImputationWarning
        with pm.Model() as model:
            beta = pm.Normal("beta", 0.0, 1.0, shape=K)
            pm.MvNormal("Y", mu=x[:, None] * beta, cov=S, observed=Y)
    keep = np.arange(N) != 7
    H = np.kron(x[keep, None], np.eye(K))
    mean, cov = _gaussian_posterior(np.zeros(K), np.eye(K), H, Y[keep].ravel(), np.kron(np.eye(keep.sum()), S))
    idata = _fit(model, draws=1000)
    _assert_matches(idata, ["beta"], mean, cov)
    draws = idata.posterior["Y_unobserved"].values.reshape(-1, K)  # 2 chains x 1000 draws
    pred_mean, pred_cov = x[7] * mean, S + x[7] ** 2 * cov
    sd = np.sqrt(np.diag(pred_cov))
    # 2,000 independent draws: a mean is within 4 standard errors, a variance within 20%
    # (its relative standard error is sqrt(2 / 2000) = 3%, so 6 of them)
    np.testing.assert_allclose(draws.mean(0), pred_mean, atol=4 * sd.max() / np.sqrt(draws.shape[0]))
    np.testing.assert_allclose(draws.var(0), np.diag(pred_cov), rtol=0.2)


def test_an_mvnormal_prior_under_a_logistic_likelihood_matches_a_grid_posterior():
    # w ~ MvNormal(m0, C) with strong correlation, Bernoulli(sigmoid(X @ w)): a black-box
    # factor on the whitened prior's Gaussian, checked against a 2-D grid posterior
    rng = np.random.default_rng(5)
    N = 40
    X = rng.normal(size=(N, 2))
    m0, C = np.array([0.5, -0.5]), np.array([[1.0, 0.8], [0.8, 1.5]])
    y = (rng.random(N) < 1.0 / (1.0 + np.exp(-X @ np.array([1.0, -0.5])))).astype(int)
    with pm.Model() as model:
        w = pm.MvNormal("w", mu=m0, chol=np.linalg.cholesky(C))
        pm.Bernoulli("y", logit_p=X @ w, observed=y)
    idata = _fit(model, draws=200)
    assert idata.ep.attrs["converged"]
    # grid: 401^2 points over +-6 prior sds, ample for a posterior narrower than the prior
    g = np.linspace(-6, 6, 401)
    W = np.stack(np.meshgrid(m0[0] + g * np.sqrt(C[0, 0]), m0[1] + g * np.sqrt(C[1, 1]), indexing="ij"), -1)
    d = W - m0
    log_prior = -0.5 * np.einsum("...i,ij,...j->...", d, np.linalg.inv(C), d)
    eta = W @ X.T
    log_lik = (y * eta - np.logaddexp(0.0, eta)).sum(-1)
    p = np.exp(log_prior + log_lik - (log_prior + log_lik).max())
    p /= p.sum()
    grid_mean = np.einsum("ij,ijk->k", p, W)
    r = W - grid_mean
    grid_cov = np.einsum("ij,ijk,ijl->kl", p, r, r)
    ep_mean, ep_cov = _ep_joint(idata, ["w"])
    sd = np.sqrt(np.diag(grid_cov))
    # measured: means 0.002 sd off, sds within 0.7%; the bounds leave room for other BLAS
    # roundings and seeds, and are far below what a wrong prior (its mean or whitening) gives
    np.testing.assert_allclose(ep_mean, grid_mean, atol=0.02 * sd.min())
    np.testing.assert_allclose(np.sqrt(np.diag(ep_cov)), sd, rtol=0.03)
    corr = lambda c: c[0, 1] / np.sqrt(c[0, 0] * c[1, 1])  # noqa: E731
    assert abs(corr(ep_cov) - corr(grid_cov)) < 0.02


# ----------------------------------------------------------------------------- refusals
def test_partly_missing_rows_of_an_observed_mvnormal_are_refused_naming_the_variable():
    Y = np.random.default_rng(0).normal(size=(20, 3))
    Y[3, 1] = np.nan
    Y[9] = np.nan  # missing whole: fine on its own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pm.Model() as model:
            pm.MvNormal("Y", pm.Normal("mu", 0.0, 1.0, shape=3), S, observed=Y)
    with pytest.raises(UnsupportedModelError, match=r"^Y: 1 rows of this observed MvNormal have some entries "
                                                    r"missing \(NaN\) and others observed \(the first is row \[3\]\)"):
        build_factor_graph(model)


def test_an_lkj_covariance_is_refused_naming_its_constructor_and_the_mvnormal_that_reads_it():
    # the message said only "chol has transform CholeskyCovPacked" (robustness round 12); it
    # is raised on the Cholesky latent, before the MvNormal is reached, and now names it too
    rng = np.random.default_rng(0)
    with pm.Model() as model:
        chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2.0, sd_dist=pm.Exponential.dist(1.0), compute_corr=True)
        ab = pm.MvNormal("ab", mu=np.zeros(2), chol=chol, shape=(5, 2))
        pm.Normal("y", ab[rng.integers(0, 5, 40), 0], 1.0, observed=rng.normal(size=40))
    with pytest.raises(UnsupportedModelError, match=r"^chol has transform CholeskyCovPacked \(a covariance from "
                                                    r"pm\.LKJCholeskyCov, which pmkjit does not support\).*it is the "
                                                    r"covariance of MvNormal ab, and pmkjit supports MvNormal latents "
                                                    r"and likelihoods with a constant covariance"):
        build_factor_graph(model)


@pytest.mark.parametrize("observed", [False, True])
def test_a_covariance_with_a_latent_scale_is_refused_naming_the_variable(observed):
    # observed, a covariance and mean of at most three latent elements are one factor of
    # them (tests/test_multivariate.py); here the mean has three and the scale a fourth
    Y = np.random.default_rng(0).normal(size=(10, 3))
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        if observed:
            pm.MvNormal("b", mu=pm.Normal("m", 0.0, 1.0, shape=3), cov=s**2 * S, observed=Y)
        else:
            b = pm.MvNormal("b", mu=np.zeros(3), cov=s**2 * S, shape=(10, 3))
            pm.Normal("y", b, 1.0, observed=Y)
    with pytest.raises(UnsupportedModelError, match=r"^b: the covariance of this MvNormal depends on latent s, "
                                                    r"which is not supported; pmkjit supports MvNormal latents and "
                                                    r"likelihoods with a constant covariance \(cov=, chol= or tau="):
        build_factor_graph(model)


@pytest.mark.parametrize("positive", [False, True])
def test_a_mean_that_is_not_affine_in_real_latents_is_refused_naming_the_variable(positive):
    with pm.Model() as model:
        m = pm.HalfNormal("m", 1.0) if positive else pm.Normal("m", 0.0, 1.0, shape=3)
        b = pm.MvNormal("b", mu=m * np.ones(3) if positive else pm.math.exp(m), cov=S)
        pm.Normal("y", b, 1.0, observed=np.zeros(3))
    why = "m is not real-valued" if positive else "it is not affine in them"
    with pytest.raises(UnsupportedModelError, match=rf"^b: the mean of this MvNormal depends on latent m, and {why}; "
                                                    r"pmkjit supports MvNormal latents"):
        build_factor_graph(model)


@pytest.mark.parametrize("cov, what", [([[1.0, 2.0], [2.0, 1.0]], "positive definite"),
                                       ([[1.0, 0.5], [0.0, 1.0]], "symmetric")])
def test_a_covariance_that_is_not_symmetric_positive_definite_is_refused_naming_the_variable(cov, what):
    # a Cholesky factorisation reads one triangle only: an asymmetric matrix would pass it
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 1.0, shape=2)
        pm.MvNormal("y", mu=m, cov=np.array(cov), observed=np.zeros((4, 2)))
    with pytest.raises(UnsupportedModelError, match=rf"^y: the covariance of this MvNormal is not {what}"):
        build_factor_graph(model)
