"""One site for a Normal likelihood of shared scalars whose Gaussian ones integrate out
(pmkjit.ep.collapsed_linear), against the exact posterior on a dense grid."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import special, stats

import pmkjit
from pmkjit.ep.collapsed import CollapsedLikelihood, collapsible, integrates_gaussian_inputs
from pmkjit.ep.collapsed_linear import CollapsedLinearNormal
from pmkjit.families import Gamma
from pmkjit.graph import build_factor_graph

T = np.linspace(0.2, 5.0, 40)
PRIORS = {"c": (0.0, 1.0), "A": (3.0, 2.0)}  # Normal (mean, sd)
K_PRIOR, S_PRIOR = (2.0, 2.0), (2.0, 8.0)  # Gamma (shape, rate)


def _data(seed=3):
    rng = np.random.default_rng(seed)
    return 0.5 + 4.0 * np.exp(-0.7 * T) + rng.normal(0.0, 0.2, T.size)


def _decay(y):
    with pm.Model() as model:
        c = pm.Normal("c", *PRIORS["c"])
        A = pm.Normal("A", *PRIORS["A"])
        k = pm.Gamma("k", alpha=K_PRIOR[0], beta=K_PRIOR[1])
        s = pm.Gamma("s", alpha=S_PRIOR[0], beta=S_PRIOR[1])
        pm.Normal("y", c + A * pm.math.exp(-k * T), s, observed=y)
    return model


def _exact(y, n=160, design=None, m0=None, V0=None):
    """The exact posterior of (c, A, k, s): a dense grid over (k, s), and given them the
    marginal likelihood N(y; X m0, s^2 I + X V0 X') with (c, A) integrated out, their
    conditional posterior the linear regression's. Means and sds of each, and the
    correlations of (c, A), (A, k) and (c, k). ``design(K) -> X (G, N, p)``, ``m0`` and ``V0``
    replace the decay's ``[1, exp(-k t)]`` and the priors of (c, A); then the means and sds are
    of the ``p`` Gaussian coordinates (as ``"z"``), ``k`` and ``s``."""
    custom = design is not None
    if not custom:
        m0 = np.array([PRIORS["c"][0], PRIORS["A"][0]])
        V0 = np.diag([PRIORS["c"][1] ** 2, PRIORS["A"][1] ** 2])

        def design(K):
            return np.stack([np.ones((K.size, T.size)), np.exp(-K[:, None] * T)], axis=-1)

    def on(ks, ss):
        K, S = np.meshgrid(ks, ss, indexing="ij")
        K, S = K.ravel(), S.ravel()
        X = design(K)  # (G, N, p)
        N = X.shape[1]
        cov = S[:, None, None] ** 2 * np.eye(N) + X @ V0 @ np.swapaxes(X, 1, 2)
        r = y - X @ m0
        _, logdet = np.linalg.slogdet(cov)
        logw = (-0.5 * logdet - 0.5 * np.einsum("gn,gn->g", r, np.linalg.solve(cov, r[..., None])[..., 0])
                + stats.gamma.logpdf(K, K_PRIOR[0], scale=1 / K_PRIOR[1])
                + stats.gamma.logpdf(S, S_PRIOR[0], scale=1 / S_PRIOR[1]))
        w = np.exp(logw - logw.max())
        w /= w.sum()
        prec = np.linalg.inv(V0) + np.swapaxes(X, 1, 2) @ X / S[:, None, None] ** 2
        Sig = np.linalg.inv(prec)
        mu = (Sig @ (np.linalg.solve(V0, m0) + np.einsum("gni,gn->gi", X, y[None] / S[:, None] ** 2))[..., None])[..., 0]
        return K, S, w, mu, Sig

    # a coarse grid over the priors' bulk finds the law, a fine one over its +-7 sds integrates it
    K, S, w, *_ = on(np.linspace(0.05, 3.0, 60), np.linspace(0.02, 1.0, 60))
    edges = [(v @ w - 7 * np.sqrt(w @ (v - v @ w) ** 2), v @ w + 7 * np.sqrt(w @ (v - v @ w) ** 2)) for v in (K, S)]
    K, S, w, mu, Sig = on(np.linspace(max(edges[0][0], 1e-3), edges[0][1], n), np.linspace(max(edges[1][0], 1e-3),
                                                                                          edges[1][1], n))
    if custom:
        z_mean = w @ mu
        z_sd = np.sqrt(w @ (np.diagonal(Sig, axis1=1, axis2=2) + mu**2) - z_mean**2)
        logs = {f"log_{v}": np.log(x) for v, x in (("k", K), ("s", S))}
        return ({"z": z_mean, "k": w @ K, "s": w @ S, **{v: w @ x for v, x in logs.items()}},
                {"z": z_sd, "k": np.sqrt(w @ K**2 - (w @ K) ** 2), "s": np.sqrt(w @ S**2 - (w @ S) ** 2),
                 **{v: np.sqrt(w @ x**2 - (w @ x) ** 2) for v, x in logs.items()}})
    mean = {"c": w @ mu[:, 0], "A": w @ mu[:, 1], "k": w @ K, "s": w @ S}
    second = {"c": w @ (Sig[:, 0, 0] + mu[:, 0] ** 2), "A": w @ (Sig[:, 1, 1] + mu[:, 1] ** 2),
              "k": w @ K**2, "s": w @ S**2}
    sd = {v: np.sqrt(second[v] - mean[v] ** 2) for v in mean}
    corr_cA = (w @ (Sig[:, 0, 1] + mu[:, 0] * mu[:, 1]) - mean["c"] * mean["A"]) / (sd["c"] * sd["A"])
    corr_Ak = (w @ (mu[:, 1] * K) - mean["A"] * mean["k"]) / (sd["A"] * sd["k"])
    corr_ck = (w @ (mu[:, 0] * K) - mean["c"] * mean["k"]) / (sd["c"] * sd["k"])
    return mean, sd, {"cA": corr_cA, "Ak": corr_Ak, "ck": corr_ck}


def _likelihood(model, name="y"):
    (f,) = [f for f in build_factor_graph(model).factors if f.name == name]
    return f


def test_which_likelihoods_integrate_their_gaussian_scalars():
    y = _data()
    f = _likelihood(_decay(y))
    assert collapsible(f) and integrates_gaussian_inputs(f)
    with pytest.raises(ValueError, match="CollapsedLinearNormal"):
        CollapsedLikelihood(f, None)
    # three shared scalars: the ordinary one site (a grid over all three)
    with pm.Model() as three:
        A = pm.Normal("A", 3.0, 2.0)
        k = pm.Gamma("k", 2.0, 2.0)
        pm.Normal("y", A * pm.math.exp(-k * T), pm.HalfNormal("s", 1.0), observed=y)
    f3 = _likelihood(three)
    assert collapsible(f3) and not integrates_gaussian_inputs(f3)
    with pytest.raises(ValueError, match="CollapsedLikelihood"):
        CollapsedLinearNormal(f3, None)
    # a latent per observation (a measurement-error regression) is no shared scalar
    with pm.Model() as me:
        x = pm.Normal("x", 0.0, 1.0, shape=T.size)
        pm.Normal("x_obs", x, 0.3, observed=T - T.mean())
        pm.Normal("y", pm.Normal("a", 0.0, 5.0) + pm.Normal("b", 0.0, 5.0) * x, pm.HalfNormal("s", 2.0), observed=y)
    assert not collapsible(_likelihood(me))


def test_a_decay_towards_a_latent_level_matches_the_exact_posterior():
    # c + A exp(-k t): four shared scalars. Instance by instance EP crawled and stopped 0.7
    # posterior sd off (robustness round 33); as one site with (c, A) integrated in closed
    # form, EP's marginals are the exact ones' projections (the likelihood is the model's
    # only factor beside the priors, whose families are the messages'), and its draws the
    # exact law's, correlations included
    y = _data()
    mean, sd, corr = _exact(y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pmkjit.fit(model=_decay(y), random_seed=2, progressbar=False, draws=2000, chains=2,
                           compute_log_likelihood=False)
    attrs = idata.ep.attrs
    assert attrs["converged"] and attrs["sweeps"] <= 10
    assert "y: collapsed grid, Gaussian inputs in closed form" in attrs["factor_methods"]
    assert not [w for w in caught if issubclass(w.category, UserWarning)], [str(w.message) for w in caught]
    # EP's marginals: the Gaussian block's (c, A), the Gamma messages of k and s, whose
    # projection keeps E[x] and E[log x] (so its sd differs a little from the law's)
    offsets = dict(o.split(": ") for o in attrs["gaussian_offsets"].split("; "))
    mu, cov = idata.ep["gaussian_mean"].values, idata.ep["gaussian_cov"].values
    for v in ("c", "A"):
        i = int(offsets[v])
        assert abs(mu[i] - mean[v]) < 0.02 * sd[v], v
        assert abs(np.sqrt(cov[i, i]) / sd[v] - 1) < 0.02, v
    for v in ("k", "s"):
        msg = Gamma.from_natural(idata.ep[f"natural__{v}"].values)
        assert abs(float(msg.mean()[0]) - mean[v]) < 0.02 * sd[v], v
        assert abs(float(np.sqrt(msg.var()[0])) / sd[v] - 1) < 0.05, v
    # its draws, the exact law's: 4,000 of them, whose means err by about 0.016 sd
    post = idata.posterior
    for v in ("c", "A", "k", "s"):
        draws = post[v].values.ravel()
        assert abs(draws.mean() - mean[v]) < 0.06 * sd[v], v
        assert abs(draws.std() / sd[v] - 1) < 0.06, v
    c, A, k = (post[v].values.ravel() for v in ("c", "A", "k"))
    assert abs(corr["ck"]) > 0.5  # strongly correlated: independent draws would fail
    for (a, b), pair in (((c, A), "cA"), ((A, k), "Ak"), ((c, k), "ck")):
        assert abs(np.corrcoef(a, b)[0, 1] - corr[pair]) < 0.05, pair


def test_a_likelihood_whose_gaussian_scalars_another_factor_correlates_is_warned_about():
    # a + b exp(-k t) + c t: the entry at t = 0 reads a + b alone and is a factor of its own,
    # which correlates a and b; the likelihood correlates a, b and c too, and EP's one site per
    # scalar cannot carry that: 0.14 NUTS sd off, a's sd 0.77 of NUTS's (robustness round 34)
    rng = np.random.default_rng(1)
    t = np.linspace(0.0, 6.0, 30)
    y = 1 + 3 * np.exp(-0.8 * t) + 0.2 * t + rng.normal(0, 0.2, t.size)
    with pm.Model() as model:
        a, b, c = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5), pm.Normal("c", 0, 1)
        k, s = pm.LogNormal("k", 0, 1), pm.HalfNormal("s", 1)
        pm.Normal("y", a + b * pm.math.exp(-k * t) + c * t, s, observed=y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=10, chains=1,
                           compute_log_likelihood=False)
    assert "y (29 of 30 entries): collapsed grid, Gaussian inputs in closed form" in idata.ep.attrs["factor_methods"]
    hits = [str(w.message) for w in caught if "cannot carry that correlation" in str(w.message)]
    assert len(hits) == 1 and hits[0].startswith("y (29 of 30 entries): EP fits this likelihood with one site, a, b, c")
    # (and not again by the check of the draws, which says that they are independent)
    assert not [w for w in caught if "are the projections of their joint law" in str(w.message)]


def test_a_decay_with_one_amplitude_per_group_matches_the_exact_posterior():
    # A[g] exp(-k t), three groups: the groups' effects are one linear slot, each observation
    # reading its group's; integrated out jointly, with one site per group. Instance by
    # instance EP converged with k's sd 0.69 of NUTS's (robustness round 34)
    rng = np.random.default_rng(4)
    t = np.tile(np.linspace(0.2, 5.0, 15), 3)
    g = np.repeat(np.arange(3), 15)
    y = np.array([2.0, 3.0, 4.0])[g] * np.exp(-0.7 * t) + rng.normal(0.0, 0.2, t.size)
    with pm.Model() as model:
        A = pm.Normal("A", 3.0, 2.0, shape=3)
        k = pm.Gamma("k", alpha=K_PRIOR[0], beta=K_PRIOR[1])
        s = pm.Gamma("s", alpha=S_PRIOR[0], beta=S_PRIOR[1])
        pm.Normal("y", A[g] * pm.math.exp(-k * t), s, observed=y)

    def design(K):
        X = np.zeros((K.size, t.size, 3))
        X[:, np.arange(t.size), g] = np.exp(-K[:, None] * t)
        return X

    mean, sd = _exact(y, design=design, m0=np.full(3, 3.0), V0=4.0 * np.eye(3))
    # (its draws are EP's, independent: the groups' effects are not drawn from the law)
    with pytest.warns(UserWarning, match="posterior draws of them are independent"):
        idata = pmkjit.fit(model=model, random_seed=2, progressbar=False, draws=10, chains=1,
                           compute_log_likelihood=False)
    attrs = idata.ep.attrs
    assert attrs["converged"] and "y: collapsed grid, Gaussian inputs in closed form" in attrs["factor_methods"]
    offsets = dict(o.split(": ") for o in attrs["gaussian_offsets"].split("; "))
    i = int(offsets["A"])
    mu, cov = idata.ep["gaussian_mean"].values[i:i + 3], idata.ep["gaussian_cov"].values[i:i + 3, i:i + 3]
    np.testing.assert_array_less(np.abs(mu - mean["z"]), 0.03 * sd["z"])
    np.testing.assert_array_less(np.abs(np.sqrt(np.diag(cov)) / sd["z"] - 1), 0.03)
    for v in ("k", "s"):
        msg = Gamma.from_natural(idata.ep[f"natural__{v}"].values)
        assert abs(float(msg.mean()[0]) - mean[v]) < 0.03 * sd[v], v
        assert abs(float(np.sqrt(msg.var()[0])) / sd[v] - 1) < 0.05, v


def _hsgp_design(m=12, c=1.5):
    """An HSGP's basis ``phi`` ``(N, m)`` on ``T`` and its spectral density's square root as a
    function of the length scale (PyMC's own, for an ExpQuad of amplitude 1)."""
    import pytensor
    import pytensor.tensor as pt

    ls = pt.dscalar("ls")
    phi, sqrt_psd = pm.gp.HSGP(m=[m], c=c, cov_func=pm.gp.cov.ExpQuad(1, ls=ls)).prior_linearized(T[:, None])
    return pytensor.function([], phi)(), np.vectorize(pytensor.function([ls], sqrt_psd), signature="()->(m)")


@pytest.mark.slow  # 30 s: the HSGP's exact posterior on a grid (as the trend beside it: run with -m slow)
def test_an_hsgp_with_a_latent_length_scale_matches_the_exact_posterior():
    # phi @ (beta * sqrt(psd(ls))): not affine in beta as a whole, refused until the builder
    # wrote it out column by column (pmkjit.graph.expansion); then twelve Gaussian inputs
    # integrate out given (ls, s). Against the exact law of (ls, s) on a dense grid, the
    # coefficients' given them the linear regression's (PyMC's basis and spectral density)
    rng = np.random.default_rng(5)
    y = np.sin(2.0 * T) + rng.normal(0.0, 0.2, T.size)
    phi, sqrt_psd = _hsgp_design()
    with pm.Model() as model:
        ls = pm.Gamma("ls", alpha=K_PRIOR[0], beta=K_PRIOR[1])
        s = pm.Gamma("s", alpha=S_PRIOR[0], beta=S_PRIOR[1])
        f = pm.gp.HSGP(m=[12], c=1.5, cov_func=pm.gp.cov.ExpQuad(1, ls=ls)).prior("f", X=T[:, None])
        pm.Normal("y", f, s, observed=y)
    mean, sd = _exact(y, design=lambda K: phi[None] * sqrt_psd(K)[:, None, :], m0=np.zeros(12), V0=np.eye(12))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pmkjit.fit(model=model, random_seed=2, progressbar=False, draws=1000, chains=2,
                           compute_log_likelihood=False)
    attrs = idata.ep.attrs
    assert attrs["converged"] and "y: collapsed grid, Gaussian inputs in closed form" in attrs["factor_methods"]
    # (PyTensor's BLAS notice comes with the process's first compilation, which may be here)
    assert not [w for w in caught if issubclass(w.category, UserWarning) and "BLAS" not in str(w.message)]
    mu, cov = idata.ep["gaussian_mean"].values, idata.ep["gaussian_cov"].values
    np.testing.assert_array_less(np.abs(mu - mean["z"]), 0.03 * sd["z"])
    np.testing.assert_array_less(np.abs(np.sqrt(np.diag(cov)) / sd["z"] - 1), 0.03)
    for v, name in (("k", "ls"), ("s", "s")):
        # the Gamma messages keep E[x] and E[log x] (the law of ls is no Gamma: its
        # projection's sd is 15% above the law's)
        msg = Gamma.from_natural(idata.ep[f"natural__{name}"].values)
        a, b = float(msg.shape[0]), float(msg.rate[0])
        assert abs(a / b - mean[v]) < 0.03 * sd[v], name
        assert abs(special.digamma(a) - np.log(b) - mean[f"log_{v}"]) < 0.03 * sd[f"log_{v}"], name
    # the draws are the law's: 2,000 of them, whose means err by about 0.02 sd
    post = idata.posterior
    for v, name in (("k", "ls"), ("s", "s")):
        draws = post[name].values.ravel()
        assert abs(draws.mean() - mean[v]) < 0.08 * sd[v], name
        assert abs(draws.std() / sd[v] - 1) < 0.08, name
    beta = post["f_hsgp_coeffs"].values.reshape(-1, 12)
    np.testing.assert_array_less(np.abs(beta.mean(axis=0) - mean["z"]), 0.08 * sd["z"])
    np.testing.assert_array_less(np.abs(beta.std(axis=0) / sd["z"] - 1), 0.08)


@pytest.mark.slow  # 17 s
def test_a_trend_beside_an_hsgp_matches_the_exact_posterior():
    # a + b * t + f(t): the trend is a regression's predictor (two coordinates per instance)
    # among the Gaussian inputs, whose joint site the instances' sites hold; it was fitted
    # instance by instance before robustness round 35 (on a 50-point probe: not converged in
    # 50 sweeps, 1.29 NUTS sd off). Its coordinates and the coefficients are drawn from the law
    rng = np.random.default_rng(6)
    y = 0.5 + 0.4 * T + np.sin(2.0 * T) + rng.normal(0.0, 0.2, T.size)
    phi, sqrt_psd = _hsgp_design(m=8)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 1.0)
        ls = pm.Gamma("ls", alpha=K_PRIOR[0], beta=K_PRIOR[1])
        s = pm.Gamma("s", alpha=S_PRIOR[0], beta=S_PRIOR[1])
        f = pm.gp.HSGP(m=[8], c=1.5, cov_func=pm.gp.cov.ExpQuad(1, ls=ls)).prior("f", X=T[:, None])
        pm.Normal("y", a + b * T + f, s, observed=y)

    def design(K):
        trend = np.broadcast_to(np.stack([np.ones(T.size), T], axis=1), (K.size, T.size, 2))
        return np.concatenate([trend, phi[None] * sqrt_psd(K)[:, None, :]], axis=-1)

    mean, sd = _exact(y, design=design, m0=np.zeros(10), V0=np.diag([4.0, 1.0] + [1.0] * 8))
    idata = pmkjit.fit(model=model, random_seed=3, progressbar=False, draws=1000, chains=2,
                       compute_log_likelihood=False)
    attrs = idata.ep.attrs
    assert attrs["converged"] and "y: collapsed grid, Gaussian inputs in closed form" in attrs["factor_methods"]
    offsets = dict(o.split(": ") for o in attrs["gaussian_offsets"].split("; "))
    mu, cov = idata.ep["gaussian_mean"].values, idata.ep["gaussian_cov"].values
    places = [int(offsets["a"]), int(offsets["b"])] + list(range(int(offsets["f_hsgp_coeffs"]),
                                                                 int(offsets["f_hsgp_coeffs"]) + 8))
    np.testing.assert_array_less(np.abs(mu[places] - mean["z"]), 0.03 * sd["z"])
    np.testing.assert_array_less(np.abs(np.sqrt(np.diag(cov)[places]) / sd["z"] - 1), 0.03)
    post = idata.posterior
    draws = np.column_stack([post["a"].values.ravel(), post["b"].values.ravel(),
                             post["f_hsgp_coeffs"].values.reshape(-1, 8)])
    np.testing.assert_array_less(np.abs(draws.mean(axis=0) - mean["z"]), 0.08 * sd["z"])
    np.testing.assert_array_less(np.abs(draws.std(axis=0) / sd["z"] - 1), 0.08)
    for v, name in (("k", "ls"), ("s", "s")):
        x = post[name].values.ravel()
        assert abs(x.mean() - mean[v]) < 0.08 * sd[v], name
        assert abs(x.std() / sd[v] - 1) < 0.08, name
