"""EP against NUTS on small regressions: fewer observations than a KJIT operator's first fit.

Textbook models of a few dozen observations whose likelihood reads a regression's linear
predictor alone, with their ``pm.Deterministic`` curves: the bioassay of Gelman et al.
(BDA, section 3.7), the Challenger O-rings as written in "Probabilistic Programming and
Bayesian Methods for Hackers" (``p = 1 / (1 + exp(beta * t + alpha))`` on uncentred
temperatures, ``tau = 0.001`` priors), a Poisson regression of 20 counts, a logistic
regression of 40 observations and three covariates, a probit dose-response of six Binomial
counts, and a two-arm trial (two predictor directions only: kept instance by instance,
since one site on ``(a, d)`` is not a sum of the instances' sites). Few observations leave
the posterior skewed, which a Gaussian's moments hold but its draws, and the curves drawn
from them, do not. Such a likelihood is one site whose law is exact on a grid
(``pmkjit.ep.collapsed``, robustness round 42); ``--variants instance-by-instance`` is the
ablation (``collapsible`` answering no).

The same model object goes to ``pm.sample`` (4 chains x 1,000 tuning and 2,000 draws,
``target_accept`` 0.95) and to ``pmkjit.fit`` (2 x 1,000 draws); the Deterministics are
compared too. NUTS does not mix on the Challenger model as written (bulk ESS of a few: the
uncentred temperature makes ``alpha`` and ``beta`` correlated at -0.99 under vague
priors); ``tests/test_robustness.py`` checks EP there against the exact posterior on a grid.

Run: ``python benchmarks/small_regressions_vs_nuts.py`` (about 3 minutes).
Output: ``benchmarks/results/small_regressions_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_scalars_vs_nuts import run_variants  # noqa: E402

# the Challenger flights before 1986: temperature (F) and whether an O-ring was damaged
CHALLENGER_TEMP = np.array([66, 70, 69, 68, 67, 72, 73, 70, 57, 63, 70, 78, 67, 53, 67, 75, 70, 81, 76, 79, 75, 76, 58.])
CHALLENGER_DAMAGE = np.array([0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1])


def bioassay(rng):
    dose, deaths = np.array([-0.86, -0.3, -0.05, 0.73]), np.array([0, 1, 3, 5])
    with pm.Model() as model:
        alpha = pm.Normal("alpha", 0, 10)
        beta = pm.Normal("beta", 0, 10)
        theta = pm.Deterministic("theta", pm.math.invlogit(alpha + beta * dose))
        pm.Deterministic("LD50", -alpha / beta)
        pm.Binomial("deaths", n=5, p=theta, observed=deaths)
    return model


def challenger(rng):
    with pm.Model() as model:
        beta = pm.Normal("beta", mu=0, tau=0.001)
        alpha = pm.Normal("alpha", mu=0, tau=0.001)
        p = pm.Deterministic("p", 1.0 / (1.0 + pm.math.exp(beta * CHALLENGER_TEMP + alpha)))
        pm.Bernoulli("obs", p, observed=CHALLENGER_DAMAGE)
    return model


def small_poisson(rng):
    x = rng.uniform(0.0, 10.0, 20)
    y = rng.poisson(np.exp(0.2 + 0.15 * x))
    with pm.Model() as model:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 1)
        lam = pm.Deterministic("lam", pm.math.exp(a + b * x))
        pm.Poisson("y", lam, observed=y)
    return model


def small_logistic(rng):
    X = rng.normal(size=(40, 3))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(0.5 + X @ np.array([1.5, -1.0, 0.5])))))
    with pm.Model() as model:
        a = pm.Normal("a", 0, 2.5)
        b = pm.Normal("b", 0, 2.5, shape=3)
        pm.Bernoulli("y", logit_p=a + pm.math.dot(X, b), observed=y)
    return model


def probit_dose(rng):
    dose, n, k = np.array([0.5, 1, 2, 4, 8, 16.]), np.full(6, 10), np.array([0, 1, 3, 6, 9, 10])
    with pm.Model() as model:
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3)
        p = pm.Deterministic("p", pm.math.invprobit(a + b * np.log(dose)))
        pm.Binomial("k", n=n, p=p, observed=k)
    return model


def two_arm(rng):
    arm = np.repeat([0, 1], 15)
    y = rng.binomial(1, np.where(arm == 1, 0.7, 0.35))
    with pm.Model() as model:
        a = pm.Normal("a", 0, 2)
        d = pm.Normal("d", 0, 2)
        pm.Bernoulli("y", p=pm.math.invlogit(a + d * arm), observed=y)
    return model


MODELS = {f.__name__: f for f in (bioassay, challenger, small_poisson, small_logistic, probit_dose, two_arm)}


def main() -> None:
    def build(name, rng):
        model = MODELS[name](rng)
        names = [v.name for v in model.free_RVs]
        return model, names[:2]

    run_variants(MODELS, build, "collapsible", "small_regressions_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "small_regressions_vs_nuts.json", target_accept=0.95,
                 description=__doc__.splitlines()[0], nuts=(4, 2000), deterministics=True)


if __name__ == "__main__":
    main()
