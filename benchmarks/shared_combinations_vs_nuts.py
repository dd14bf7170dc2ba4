"""EP against NUTS on likelihoods of shared scalars of which two inputs read one in common.

Models whose every observation reads the same few scalars, some of them through a
combination another input shares a scalar with, as PyMC users write them: a power curve
``exp(a + (b - a) * x**p)`` (Poisson counts, and a Gamma likelihood of that mean with a
latent shape), a smooth switch ``l1 + (l2 - l1) * sigmoid(2 (t - tau))`` between two Poisson
log-rates, a threshold ``base + k * (x - x0 - base)`` in a logistic regression, and Poisson
counts of ``exp(a + b) * x**2 + exp(a - b)``. The likelihood is one site
(``pmkjit.ep.collapsed``), and the Gaussian inputs that read a scalar in common get one joint
site on them (``pair_shared_scalars``, robustness round 44). ``--variants separate-sites`` is
the ablation: ``pair_shared_scalars`` doing nothing, so that each input gets the law's
projection onto it alone, as before.

The same model object goes to ``pm.sample`` (4 chains x 1,000 tuning and 2,000 draws,
``target_accept`` 0.95) and to ``pmkjit.fit`` (2 x 1,000 draws). The correlation column is
that of the two latents named per model (``PAIRS``): the Gaussian scalars of the joint site, and
for the Gamma power curve ``a`` and the exponent ``p``, whose draws come from the law with them.

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/shared_combinations_vs_nuts.py``
(about 5 minutes). Output: ``benchmarks/results/shared_combinations_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_scalars_vs_nuts import run_variants  # noqa: E402


def power_curve(rng):
    x = rng.uniform(0, 3, 80)
    y = rng.poisson(np.exp(0.3 + 0.8 * x**0.7))
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        p = pm.Gamma("p", 2, 2)
        pm.Poisson("y", pm.math.exp(a + (b - a) * x**p), observed=y)
    return model


def gamma_power_curve(rng):
    x = rng.uniform(0, 3, 100)
    y = rng.gamma(4.0, np.exp(0.3 + 0.8 * x**0.7) / 4.0)
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        p = pm.Gamma("p", 2, 2)
        alpha = pm.Gamma("alpha", 2, 0.5)
        pm.Gamma("y", alpha=alpha, beta=alpha / pm.math.exp(a + (b - a) * x**p), observed=y)
    return model


def smooth_switch(rng):
    t = np.arange(60.0)
    y = rng.poisson(np.where(t < 35, 3.0, 1.0))
    with pm.Model() as model:
        l1, l2 = pm.Normal("l1", 0, 2), pm.Normal("l2", 0, 2)
        tau = pm.Uniform("tau", 0, 60)
        pm.Poisson("y", pm.math.exp(l1 + (l2 - l1) * pm.math.sigmoid(2 * (t - tau))), observed=y)
    return model


def logistic_threshold(rng):
    x = rng.uniform(0, 10, 150)
    y = rng.binomial(1, 1 / (1 + np.exp(-1.2 * (x - 4))))
    with pm.Model() as model:
        x0 = pm.Normal("x0", 5, 3)
        k = pm.HalfNormal("k", 2)
        base = pm.Normal("base", 0, 1)
        pm.Bernoulli("y", logit_p=base + k * (x - x0 - base), observed=y)
    return model


def sum_and_difference(rng):
    x = rng.uniform(-1, 1, 120)
    y = rng.poisson(np.exp(0.8) * x**2 + np.exp(0.2))
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, 1), pm.Normal("b", 0, 1)
        pm.Poisson("y", pm.math.exp(a + b) * x**2 + pm.math.exp(a - b), observed=y)
    return model


MODELS = {f.__name__: f for f in (power_curve, gamma_power_curve, smooth_switch, logistic_threshold,
                                  sum_and_difference)}
PAIRS = {"power_curve": ["a", "b"], "gamma_power_curve": ["a", "p"], "smooth_switch": ["l1", "l2"],
         "logistic_threshold": ["x0", "base"], "sum_and_difference": ["a", "b"]}


def main() -> None:
    def build(name, rng):
        return MODELS[name](rng), PAIRS[name]

    run_variants(MODELS, build, "pair_shared_scalars", "shared_combinations_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "shared_combinations_vs_nuts.json", target_accept=0.95,
                 description=__doc__.splitlines()[0], nuts=(4, 2000), ablated=lambda *args: None,
                 variant_names=("joint-site", "separate-sites"))


if __name__ == "__main__":
    main()
