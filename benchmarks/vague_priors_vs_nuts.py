"""EP against NUTS on models with BUGS-style vague priors, and the rat tumours' hyperprior.

Priors as BUGS users write them, translated to PyMC as they are: ``pm.Gamma(0.001, 0.001)`` on
a Normal likelihood's precision (``tau=``), on a hierarchical prior's precision and on a noise
scale; ``pm.InverseGamma(0.001, 0.001)`` on a variance; ``pm.Normal(0, tau=1e-6)`` coefficients;
the BUGS pumps model with ``Gamma(0.01, 0.01)`` hyperpriors; and PyMC's rat tumours example,
whose hyperprior ``pm.Potential("p(a, b)", -2.5 * log(pm.math.sum(ab)))`` reads a sum over a
vector latent (robustness round 45: refused before, now written out entry by entry).

A vague Gamma cavity is a thousand units wide in ``log s``; the semi-analytic Normal factor
(``pmkjit.ep.normal_scale``) zooms its nodes onto the tilted law and integrates a scale's flat
tail in closed form. ``--variants no-zoom`` is the ablation: ``NormalScaleMethod`` with both
turned off (``max_zooms = 0``, ``max_log_noise_step = inf``), its nodes spread over the cavity as
before round 45 (with round 45's guards against overflow, so that it fails by resolution only).

The same model object goes to ``pm.sample`` (4 chains x 1,000 tuning and 2,000 draws,
``target_accept`` 0.9) and to ``pmkjit.fit`` (2 x 1,000 draws).

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/vague_priors_vs_nuts.py``
(about 3 minutes). Output: ``benchmarks/results/vague_priors_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm

from pmkjit.ep.normal_scale import NormalScaleMethod

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_scalars_vs_nuts import run_variants  # noqa: E402


class NoZoom(NormalScaleMethod):
    """The ablation: nodes over the cavity's window only, as before robustness round 45."""

    max_zooms = 0
    max_log_noise_step = np.inf


def _regression_data(rng):
    x = rng.normal(size=50)
    return x, 1.0 + 2.0 * x + rng.normal(0.0, 0.8, 50)


def precision_regression(rng):
    x, y = _regression_data(rng)
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, tau=1e-4), pm.Normal("b", 0, tau=1e-4)
        tau = pm.Gamma("tau", 0.001, 0.001)
        pm.Normal("y", a + b * x, tau=tau, observed=y)
    return model


def scale_regression(rng):
    x, y = _regression_data(rng)
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, 100), pm.Normal("b", 0, 100)
        sigma = pm.Gamma("sigma", 0.001, 0.001)
        pm.Normal("y", a + b * x, sigma, observed=y)
    return model


def variance_regression(rng):
    x, y = _regression_data(rng)
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, 100), pm.Normal("b", 0, 100)
        s2 = pm.InverseGamma("s2", 0.001, 0.001)
        pm.Normal("y", a + b * x, pm.math.sqrt(s2), observed=y)
    return model


def hierarchical_precisions(rng):
    g = np.repeat(np.arange(8), 5)
    y = rng.normal(3.0 + rng.normal(0.0, 2.0, 8)[g], 1.0)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, tau=1e-6)
        tau_a = pm.Gamma("tau_a", 0.001, 0.001)
        tau_y = pm.Gamma("tau_y", 0.001, 0.001)
        a = pm.Normal("a", mu, tau=tau_a, shape=8)
        pm.Normal("y", a[g], tau=tau_y, observed=y)
    return model


def pumps(rng):  # the BUGS example's data (rng unused)
    t = np.array([94.3, 15.7, 62.9, 126, 5.24, 31.4, 1.05, 1.05, 2.1, 10.5])
    y = np.array([5, 1, 5, 14, 3, 19, 1, 1, 4, 22])
    with pm.Model() as model:
        alpha = pm.Gamma("alpha", 0.01, 0.01)
        beta = pm.Gamma("beta", 0.01, 0.01)
        theta = pm.Gamma("theta", alpha, beta, shape=10)
        pm.Poisson("y", theta * t, observed=y)
    return model


def rat_tumours(rng):
    n = rng.integers(15, 30, 20)
    y = rng.binomial(n, rng.beta(2.0, 12.0, 20))
    with pm.Model() as model:
        ab = pm.HalfNormal("ab", 10, shape=2)
        pm.Potential("p(a, b)", -2.5 * pm.math.log(pm.math.sum(ab)))
        theta = pm.Beta("theta", alpha=ab[0], beta=ab[1], shape=20)
        pm.Binomial("y", p=theta, observed=y, n=n)
    return model


MODELS = {f.__name__: f for f in (precision_regression, scale_regression, variance_regression,
                                   hierarchical_precisions, pumps, rat_tumours)}
PAIRS = {"precision_regression": ["a", "tau"], "scale_regression": ["a", "sigma"],
         "variance_regression": ["a", "s2"], "hierarchical_precisions": ["mu", "tau_a"],
         "pumps": ["alpha", "beta"], "rat_tumours": ["ab", "theta"]}


def main() -> None:
    def build(name, rng):
        return MODELS[name](rng), PAIRS[name]

    run_variants(MODELS, build, "NormalScaleMethod", "vague_priors_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "vague_priors_vs_nuts.json", target_accept=0.9,
                 description=__doc__.splitlines()[0], nuts=(4, 2000), ablated=NoZoom,
                 variant_names=("zoomed", "no-zoom"))


if __name__ == "__main__":
    main()
