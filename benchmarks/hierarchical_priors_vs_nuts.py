"""EP against NUTS on hierarchical priors whose instances share one or two latent hyperparameters.

A prior ``sigma[g] ~ HalfNormal(s)``, ``theta[i] ~ Gamma(alpha, beta)``,
``theta[j] ~ Beta(phi * kappa, (1 - phi) * kappa)`` or ``w[k] ~ Laplace(0, lam)`` reads the same
hyperparameters in every instance. pmkjit fits such a prior as one site
(``pmkjit.ep.hierarchy``: a grid over the hyperparameters, a 1-D integral per instance and node)
and draws the hyperparameters from that site's law; ``--variants instance-by-instance`` turns
that off (one site per instance, as before) for a side-by-side ablation. The models are
written as a PyMC user would: a LogNormal regression with group scales under a hyper-scale
(six groups), the BUGS pumps, a rats-style beta-binomial hierarchy with a Pareto
concentration, a Bayesian-lasso logistic regression, a Gaussian regression with a
Student-t shrinkage prior under a HalfCauchy scale, and a Bayesian lasso on scikit-learn's
diabetes data with a latent noise sd.

The same model object goes to ``pm.sample`` (2 chains x 1,000 tuning and 1,000 draws, target
acceptance 0.95) and to ``pmkjit.fit`` (2 x 1,000 draws). Reported per model as in
``shared_scalars_vs_nuts.py``; the correlation is between the hyperparameter and the first
instance's output.

Run: ``python benchmarks/hierarchical_priors_vs_nuts.py`` (about 15 minutes);
``--models pumps rats`` for a subset. Output: ``benchmarks/results/hierarchical_priors_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pmkjit  # noqa: E402, F401  (pmkjit.fit is patched by run_variants)
from shared_scalars_vs_nuts import run_variants  # noqa: E402


def group_scales(rng):
    G, N = 6, 180
    g = np.repeat(np.arange(G), N // G)
    x = rng.normal(size=N)
    y = np.exp(rng.normal(1 + 0.5 * x, rng.gamma(4, 0.1, size=G)[g]))
    with pm.Model(coords={"group": np.arange(G)}) as m:
        a, b = pm.Normal("a", 0, 3), pm.Normal("b", 0, 2)
        s_scale = pm.HalfNormal("s_scale", 1)
        sigma = pm.HalfNormal("sigma", s_scale, dims="group")
        pm.LogNormal("y", a + b * x, sigma[g], observed=y)
    return m, ["s_scale", "sigma"]


def pumps(rng):
    t = np.array([94.3, 15.7, 62.9, 126, 5.24, 31.4, 1.05, 1.05, 2.1, 10.5])
    y = np.array([5, 1, 5, 14, 3, 19, 1, 1, 4, 22])
    with pm.Model() as m:
        alpha = pm.Exponential("alpha", 1.0)
        beta = pm.Gamma("beta", 0.1, 1.0)
        theta = pm.Gamma("theta", alpha, beta, shape=10)
        pm.Poisson("y", theta * t, observed=y)
    return m, ["alpha", "theta"]


def rats(rng):
    J = 60
    n = rng.integers(15, 50, size=J)
    y = rng.binomial(n, rng.beta(0.15 * 14, 0.85 * 14, size=J))
    with pm.Model(coords={"trial": np.arange(J)}) as m:
        phi = pm.Uniform("phi", 0.0, 1.0)
        kappa = pm.Pareto("kappa", alpha=1.5, m=1)
        theta = pm.Beta("theta", alpha=phi * kappa, beta=(1.0 - phi) * kappa, dims="trial")
        pm.Binomial("y", n=n, p=theta, observed=y, dims="trial")
    return m, ["kappa", "theta"]


def lasso_logistic(rng):
    N, K = 250, 6
    X = rng.normal(size=(N, K))
    y = rng.binomial(1, 1 / (1 + np.exp(-(0.2 + X @ np.array([1.5, 0, 0, -1.0, 0, 0.5])))))
    with pm.Model() as m:
        lam = pm.HalfCauchy("lam", 1)
        a = pm.Normal("a", 0, 2)
        w = pm.Laplace("w", 0, lam, shape=K)
        pm.Bernoulli("y", logit_p=a + pm.math.dot(X, w), observed=y)
    return m, ["lam", "w"]


def studentt_shrinkage(rng):
    N, K = 60, 10
    X = rng.normal(size=(N, K))
    y = X @ np.r_[2.0, -1.0, np.zeros(K - 2)] + rng.normal(size=N)
    with pm.Model() as m:
        tau = pm.HalfCauchy("tau", 1)
        b = pm.StudentT("b", nu=3, mu=0, sigma=tau, shape=K)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", pm.math.dot(X, b), sigma, observed=y)
    return m, ["tau", "b"]


def lasso_diabetes(rng):
    # a Bayesian lasso on scikit-learn's diabetes data (150 patients, 10 standardised covariates)
    # with a latent noise sd: lam's HalfCauchy site leaves its law a long tail (robustness round 30)
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    X, y = X[:150], y[:150]
    with pm.Model() as m:
        lam = pm.HalfCauchy("lam", 1)
        beta = pm.Laplace("beta", 0, lam, shape=10)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", pm.math.dot(X, beta), sigma, observed=y)
    return m, ["lam", "beta"]


MODELS = {f.__name__: f for f in (group_scales, pumps, rats, lasso_logistic, studentt_shrinkage, lasso_diabetes)}


def main() -> None:
    run_variants(MODELS, lambda name, rng: MODELS[name](rng), "collapsible_prior", "hierarchical_priors_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "hierarchical_priors_vs_nuts.json", target_accept=0.95, width=20,
                 description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
