"""EP against NUTS on likelihoods whose groups of observations each read their own two scalars.

``pm.Gamma("y", alpha=shape[g], beta=rate[g])``, ``pm.NegativeBinomial(mu=mu[g],
alpha=alpha[g])``, ``pm.BetaBinomial(alpha=mu[g] * kappa[g], ...)``: each group's
observations put a strong correlation between its two parameters. pmkjit fits such a
likelihood with one site per group (``pmkjit.ep.grouped``: every group's law on its own
rotated grid, all groups at once) and draws each group's pair from its law;
``--variants instance-by-instance`` turns that off (one site per instance, as before) for a
side-by-side ablation. The models are written as a PyMC user would, with ``dims``,
``pm.Data`` indices and per-observation trial counts, from 3
groups to 150.

The same model object goes to ``pm.sample`` (2 chains x 1,000 tuning and 1,000 draws, target
acceptance 0.9) and to ``pmkjit.fit`` (2 x 1,000 draws). Reported per model as in
``shared_scalars_vs_nuts.py``; the correlation is between the two parameters of the first group.

Run: ``python benchmarks/grouped_likelihoods_vs_nuts.py`` (about 8 minutes);
``--models gamma negbin`` for a subset. Output: ``benchmarks/results/grouped_likelihoods_vs_nuts.json``.
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


def gamma(rng):
    G = 4
    g = np.repeat(np.arange(G), 25)
    y = rng.gamma(np.array([2.0, 4.0, 6.0, 3.0])[g], 1 / np.array([1.0, 2.0, 1.0, 0.5])[g])
    with pm.Model(coords={"g": np.arange(G)}) as m:
        shape = pm.Gamma("shape", 2, 0.5, dims="g")
        rate = pm.Gamma("rate", 2, 1, dims="g")
        pm.Gamma("y", alpha=shape[g], beta=rate[g], observed=y)
    return m, ["shape", "rate"]


def negbin(rng):
    G = 5
    g = rng.integers(0, G, 150)
    mu_t, a_t = rng.gamma(4, 1, G), rng.gamma(2, 1, G)
    y = rng.negative_binomial(a_t[g], a_t[g] / (a_t[g] + mu_t[g]))
    with pm.Model(coords={"g": np.arange(G)}) as m:
        mu = pm.Gamma("mu", 2, 0.5, dims="g")
        alpha = pm.Exponential("alpha", 0.5, dims="g")
        pm.NegativeBinomial("y", mu=mu[g], alpha=alpha[g], observed=y)
    return m, ["mu", "alpha"]


def negbin_150_sites(rng):
    G = 150
    g = rng.integers(0, G, 1500)
    mu_t, a_t = rng.gamma(5, 1, G), rng.gamma(4, 0.5, G)
    y = rng.negative_binomial(a_t[g], a_t[g] / (a_t[g] + mu_t[g]))
    with pm.Model(coords={"site": np.arange(G)}) as m:
        mu = pm.Gamma("mu", 2, 0.4, dims="site")
        alpha = pm.Gamma("alpha", 2, 1, dims="site")
        pm.NegativeBinomial("y", mu=mu[g], alpha=alpha[g], observed=y)
    return m, ["mu", "alpha"]


def weibull(rng):
    G = 3
    g = np.repeat(np.arange(G), 40)
    y = rng.weibull(np.array([1.5, 2.5, 0.9])[g]) * np.array([2.0, 1.0, 3.0])[g]
    with pm.Model() as m:
        k = pm.HalfNormal("k", 3, shape=G)
        lam = pm.HalfNormal("lam", 5, shape=G)
        pm.Weibull("y", alpha=k[g], beta=lam[g], observed=y)
    return m, ["k", "lam"]


def betabinom(rng):
    G = 6
    g = rng.integers(0, G, 90)
    n = rng.integers(5, 40, 90)
    y = rng.binomial(n, rng.beta(np.linspace(1, 6, G)[g], np.linspace(6, 2, G)[g]))
    with pm.Model(coords={"clinic": np.arange(G)}) as m:
        gi = pm.Data("gi", g)
        mu = pm.Beta("mu", 1, 1, dims="clinic")
        kappa = pm.Gamma("kappa", 2, 0.1, dims="clinic")
        pm.BetaBinomial("y", alpha=mu[gi] * kappa[gi], beta=(1 - mu[gi]) * kappa[gi], n=n, observed=y)
    return m, ["mu", "kappa"]


MODELS = {f.__name__: f for f in (gamma, negbin, negbin_150_sites, weibull, betabinom)}


def main() -> None:
    run_variants(MODELS, lambda name, rng: MODELS[name](rng), "groupable", "grouped_likelihoods_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "grouped_likelihoods_vs_nuts.json", target_accept=0.9, width=18,
                 description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
