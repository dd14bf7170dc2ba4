"""EP against NUTS on likelihoods whose groups read their own effect beside shared scalars.

``pm.NegativeBinomial(mu=exp(a[g]), alpha=alpha)``, ``pm.Gamma(alpha=shape, beta=shape /
exp(a[g]))``, ``pm.StudentT(nu=nu, mu=a[g], sigma=sigma)``: each group's effect beside a
dispersion, shape or scale every group shares, as users write hierarchical GLMs. pmkjit fits
such a likelihood with one site (``pmkjit.ep.nested``: the shared scalars on a grid, each
group's effect integrated at each of its nodes) and draws the shared scalars from its law;
``--variants instance-by-instance`` turns that off (one site per instance, as before) for a
side-by-side ablation. The models have 4 to 10 groups, with and without a hierarchical prior
on the effects (centred and non-centred), the effects as Gaussian coordinates or as positive
elements.

The same model object goes to ``pm.sample`` (4 chains x 1,000 tuning and 2,500 draws, target
acceptance 0.9: the shared scalars' sds are the figures of interest, and 2 x 1,000 draws
move them by several percent) and to ``pmkjit.fit`` (2 x 1,000 draws). Reported per model as
in ``shared_scalars_vs_nuts.py``; the correlation is between the shared scalar and the first
group's effect.

Run: ``python benchmarks/nested_likelihoods_vs_nuts.py`` (about 15 minutes);
``--models negbin_noncentred`` for a subset. Output:
``benchmarks/results/nested_likelihoods_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pmkjit  # noqa: E402, F401  (pmkjit.fit is patched by run_variants)
from gallery_vs_nuts import hierarchical_negbin_drawn  # noqa: E402
from shared_scalars_vs_nuts import run_variants  # noqa: E402


def negbin_noncentred(rng):
    """The gallery's hierarchical_negbin: non-centred intercepts, a shared alpha."""
    return hierarchical_negbin_drawn(rng), ["alpha", "z"]


def negbin_centred(rng):
    G = 10
    g = rng.integers(0, G, 200)
    mu = np.exp(rng.normal(1.5, 0.7, G))[g]
    y = rng.negative_binomial(3, 3 / (3 + mu))
    with pm.Model(coords={"site": np.arange(G)}) as m:
        mu_a, sigma_a = pm.Normal("mu_a", 0, 3), pm.Exponential("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, dims="site")
        alpha = pm.Exponential("alpha", 0.2)
        pm.NegativeBinomial("y", mu=pm.math.exp(a[g]), alpha=alpha, observed=y)
    return m, ["alpha", "a"]


def gamma_glm(rng):
    G = 8
    g = rng.integers(0, G, 160)
    y = rng.gamma(3.0, np.exp(rng.normal(1.0, 0.6, G))[g] / 3.0)
    with pm.Model(coords={"group": np.arange(G)}) as m:
        gi = pm.Data("gi", g)
        mu_a, sigma_a = pm.Normal("mu_a", 0, 2), pm.HalfNormal("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, dims="group")
        shape = pm.Gamma("shape", 2, 0.5)
        pm.Gamma("y", alpha=shape, beta=shape / pm.math.exp(a[gi]), observed=y)
    return m, ["shape", "a"]


def student_t(rng):
    """Two shared scalars (nu and sigma) beside hierarchical group means."""
    G = 6
    g = np.repeat(np.arange(G), 15)
    y = rng.normal(0, 1, G)[g] + 0.8 * rng.standard_t(3, g.size)
    with pm.Model() as m:
        mu0, tau = pm.Normal("mu0", 0, 5), pm.HalfNormal("tau", 2)
        a = pm.Normal("a", mu0, tau, shape=G)
        nu, sigma = pm.Gamma("nu", 2, 0.1), pm.HalfNormal("sigma", 2)
        pm.StudentT("y", nu=nu, mu=a[g], sigma=sigma, observed=y)
    return m, ["nu", "a"]


def beta_precision(rng):
    G = 5
    g = rng.integers(0, G, 100)
    p = 1 / (1 + np.exp(-rng.normal(0, 1, G)))[g]
    y = rng.beta(p * 20, (1 - p) * 20)
    with pm.Model() as m:
        a = pm.Normal("a", 0, 1.5, shape=G)
        kappa = pm.Gamma("kappa", 2, 0.1)
        pm.Beta("y", mu=pm.math.invlogit(a[g]), nu=kappa, observed=y)
    return m, ["kappa", "a"]


def weibull(rng):
    G = 4
    g = np.repeat(np.arange(G), 20)
    y = np.exp(rng.normal(1, 0.5, G))[g] * rng.weibull(1.8, g.size)
    with pm.Model() as m:
        lam = pm.Normal("lam", 0, 2, shape=G)
        k = pm.Gamma("k", 2, 1)
        pm.Weibull("y", alpha=k, beta=pm.math.exp(lam[g]), observed=y)
    return m, ["k", "lam"]


def gamma_rates(rng):
    """The groups' effects are positive elements (Gamma priors), not Gaussian coordinates."""
    g = np.repeat(np.arange(5), [6, 10, 20, 8, 30])
    y = rng.gamma(2.5, 1 / np.array([0.5, 1.0, 2.0, 1.5, 0.8])[g])
    with pm.Model() as m:
        shape = pm.Gamma("shape", 2, 0.5)
        rate = pm.Gamma("rate", 2, 2, shape=5)
        pm.Gamma("y", alpha=shape, beta=rate[g], observed=y)
    return m, ["shape", "rate"]


MODELS = {f.__name__: f for f in (negbin_noncentred, negbin_centred, gamma_glm, student_t, beta_precision,
                                  weibull, gamma_rates)}


def main() -> None:
    run_variants(MODELS, lambda name, rng: MODELS[name](rng), "nestable", "nested_likelihoods_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "nested_likelihoods_vs_nuts.json", target_accept=0.9, width=18,
                 description=__doc__.splitlines()[0], nuts=(4, 2500))


if __name__ == "__main__":
    main()
