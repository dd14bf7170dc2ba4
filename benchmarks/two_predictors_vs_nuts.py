"""EP against NUTS on likelihoods of two linear predictors (distributional regressions).

Models whose likelihood has covariates on two of its parameters, as PyMC users write
them: a zero-inflated Poisson with covariates on ``psi`` and ``mu``, a Gamma regression of
its mean and sd, a Normal with a log-linear scale (with and without varying intercepts), a
Beta regression with a regression on its precision, a NegativeBinomial with a regression
on ``alpha``, a Student-t with a log-linear scale, a Weibull with covariates on its shape
and scale, and a hurdle Poisson with covariates on both parts. Each observation's two
predictors are correlated under the likelihood; one joint Gaussian site per observation
over them holds that (``pmkjit.ep.joint``, robustness round 43). ``--variants
rank-one-sites`` is the ablation: ``joinable`` answering no, so that the factor gets one
rank-one site per predictor, from a KJIT operator or its oracle, as before.

The same model object goes to ``pm.sample`` (4 chains x 1,000 tuning and 2,000 draws,
``target_accept`` 0.95) and to ``pmkjit.fit`` (2 x 1,000 draws). The correlation column is
that of the first coefficients of the two predictors.

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/two_predictors_vs_nuts.py``
(about 10 minutes). Output: ``benchmarks/results/two_predictors_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm
from scipy import special

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_scalars_vs_nuts import run_variants  # noqa: E402


def _coefficients(scale: float = 2.0):
    """Intercepts and slopes of the two predictors: ``a + b x`` and ``c0 + c1 x``."""
    return (pm.Normal("a", 0, scale), pm.Normal("b", 0, scale), pm.Normal("c0", 0, 2), pm.Normal("c1", 0, 2))


def zero_inflated_poisson(rng):
    x = rng.normal(size=200)
    y = np.where(rng.uniform(size=200) < special.expit(1.0 - 0.8 * x), rng.poisson(np.exp(0.5 + 0.4 * x)), 0)
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients()
        pm.ZeroInflatedPoisson("y", psi=pm.math.invlogit(c0 + c1 * x), mu=pm.math.exp(a + b * x), observed=y)
    return model


def gamma_mean_sd(rng):
    x = rng.uniform(-1, 1, 120)
    m, s = np.exp(1 + 0.6 * x), np.exp(0.5 * x)
    y = rng.gamma((m / s) ** 2, s**2 / m)
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients()
        pm.Gamma("y", mu=pm.math.exp(a + b * x), sigma=pm.math.exp(c0 + c1 * x), observed=y)
    return model


def heteroscedastic(rng):
    x = rng.uniform(-2, 2, 100)
    y = 1 + 0.5 * x + rng.normal(0, np.exp(-0.5 + 0.4 * x))
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients(5.0)
        pm.Normal("y", a + b * x, pm.math.exp(c0 + c1 * x), observed=y)
    return model


def varying_intercepts_heteroscedastic(rng):
    g, x = rng.integers(0, 8, 240), rng.normal(size=240)
    y = rng.normal(rng.normal(0, 1, 8)[g] + 0.5 * x, np.exp(-0.2 + 0.4 * x))
    with pm.Model(coords={"group": np.arange(8)}) as model:
        mu_a, sd_a = pm.Normal("mu_a", 0, 2), pm.HalfNormal("sd_a", 1)
        a = pm.Normal("a", mu_a, sd_a, dims="group")
        b, c0, c1 = pm.Normal("b", 0, 2), pm.Normal("c0", 0, 2), pm.Normal("c1", 0, 2)
        pm.Normal("y", a[g] + b * x, pm.math.exp(c0 + c1 * x), observed=y)
    return model


def beta_precision(rng):
    x = rng.uniform(-1, 1, 150)
    mu, phi = special.expit(0.3 + x), np.exp(2.5 + x)
    y = np.clip(rng.beta(mu * phi, (1 - mu) * phi), 1e-4, 1 - 1e-4)
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients()
        mu, phi = pm.math.invlogit(a + b * x), pm.math.exp(c0 + c1 * x)
        pm.Beta("y", alpha=mu * phi, beta=(1 - mu) * phi, observed=y)
    return model


def negative_binomial_dispersion(rng):
    x = rng.normal(size=150)
    mu, alpha = np.exp(1 + 0.5 * x), np.exp(0.5 + 0.7 * x)
    y = rng.negative_binomial(alpha, alpha / (alpha + mu))
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients()
        pm.NegativeBinomial("y", mu=pm.math.exp(a + b * x), alpha=pm.math.exp(c0 + c1 * x), observed=y)
    return model


def student_t_scale(rng):
    x = rng.normal(size=120)
    y = 2 - x + np.exp(-0.3 + 0.5 * x) * rng.standard_t(4, 120)
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients(5.0)
        pm.StudentT("y", nu=4, mu=a + b * x, sigma=pm.math.exp(c0 + c1 * x), observed=y)
    return model


def weibull_shape_scale(rng):
    x = rng.uniform(-1, 1, 100)
    y = rng.weibull(np.exp(0.5 + 0.3 * x)) * np.exp(1 + 0.5 * x)
    with pm.Model() as model:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        c0, c1 = pm.Normal("c0", 0, 1), pm.Normal("c1", 0, 1)
        pm.Weibull("y", alpha=pm.math.exp(c0 + c1 * x), beta=pm.math.exp(a + b * x), observed=y)
    return model


def hurdle_poisson(rng):
    x = rng.normal(size=200)
    zero = rng.uniform(size=200) < special.expit(0.2 + 0.8 * x)
    y = np.where(zero, 0, 1 + rng.poisson(np.exp(0.7 + 0.3 * x)))
    with pm.Model() as model:
        a, b, c0, c1 = _coefficients()
        pm.HurdlePoisson("y", psi=pm.math.invlogit(c0 + c1 * x), mu=pm.math.exp(a + b * x), observed=y)
    return model


MODELS = {f.__name__: f for f in (zero_inflated_poisson, gamma_mean_sd, heteroscedastic,
                                  varying_intercepts_heteroscedastic, beta_precision, negative_binomial_dispersion,
                                  student_t_scale, weibull_shape_scale, hurdle_poisson)}


def main() -> None:
    def build(name, rng):
        model = MODELS[name](rng)
        return model, ["b", "c0"] if name == "varying_intercepts_heteroscedastic" else ["a", "c0"]

    run_variants(MODELS, build, "joinable", "two_predictors_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "two_predictors_vs_nuts.json", target_accept=0.95,
                 description=__doc__.splitlines()[0], nuts=(4, 2000), variant_names=("joint-sites", "rank-one-sites"))


if __name__ == "__main__":
    main()
