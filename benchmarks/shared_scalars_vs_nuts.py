"""EP against NUTS on likelihoods whose every observation reads the same two or three latents.

Two-parameter likelihoods with both parameters latent (``pm.NegativeBinomial(n, p)``,
``pm.BetaBinomial(alpha, beta)``, ``pm.Gamma(alpha, beta)``, Weibull, inverse gamma,
Kumaraswamy, discrete Weibull, Rice), location-scale models (a truncated Normal, Laplace and
Student-t with latent location and scale, an ex-Gaussian), and nonlinear regressions of a few
latents (``LogNormal(mu=log(A) + b * x)``, Michaelis-Menten, an exponential decay, a logistic
regression with a ``LogNormal`` slope), and regressions ``a + b * x`` beside a latent scale or
shape (Tobit, truncated, Gamma, Weibull, Student-t and negative-binomial; a Student-t with latent
degrees of freedom; Gamma regressions on two and three predictors, and on 12,000 observations;
negative-binomial and Student-t regressions on three predictors), written as a PyMC user would. pmkjit gives each such
likelihood one site (``pmkjit.ep.collapsed``) and draws its latents jointly from that site's
law; ``--instance-by-instance`` turns that off (one site per observation, independent draws, as
before) for a side-by-side ablation.

The same model object goes to ``pm.sample`` (2 chains x 1,000 tuning and 1,000 draws) and to
``pmkjit.fit`` (2 x 1,000 draws). Reported per model: the largest |mean_EP - mean_NUTS| /
sd_NUTS and the range of sd_EP / sd_NUTS over the free latents, the correlation of the first two
latents' draws under both (of the intercept and the scale for the regressions), EP's sweeps, convergence, factor methods and warnings, and both wall
times.

Run: ``python benchmarks/shared_scalars_vs_nuts.py`` (about 20 minutes with both variants:
``--variants collapsed instance-by-instance``); ``--models negbin gamma`` for a subset.
Output: ``benchmarks/results/shared_scalars_vs_nuts.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pmkjit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from jit_compound_gamma import git_state  # noqa: E402


def negbin(rng):
    y = rng.negative_binomial(3, 0.4, size=80)
    with pm.Model() as m:
        pm.NegativeBinomial("y", n=pm.Gamma("n", 2, 0.5), p=pm.Beta("p", 2, 2), observed=y)
    return m


def betabinom(rng):
    n = rng.integers(10, 40, 30)
    k = rng.binomial(n, rng.beta(2, 5, 30))
    with pm.Model() as m:
        pm.BetaBinomial("k", alpha=pm.Exponential("a", 0.1), beta=pm.Exponential("b", 0.1), n=n, observed=k)
    return m


def gamma(rng):
    y = rng.gamma(3.0, 1 / 2.0, size=40)
    with pm.Model() as m:
        pm.Gamma("y", alpha=pm.Exponential("a", 0.5), beta=pm.Exponential("b", 0.5), observed=y)
    return m


def weibull(rng):
    y = rng.weibull(1.5, 60) * 2.0
    with pm.Model() as m:
        pm.Weibull("y", alpha=pm.Gamma("alpha", 2, 1), beta=pm.Gamma("beta", 2, 1), observed=y)
    return m


def inverse_gamma(rng):
    y = 1 / rng.gamma(4, 1 / 3.0, 80)
    with pm.Model() as m:
        pm.InverseGamma("y", alpha=pm.Gamma("a", 2, 0.5), beta=pm.Gamma("b", 2, 0.5), observed=y)
    return m


def kumaraswamy(rng):
    y = rng.beta(2, 5, 100)
    with pm.Model() as m:
        pm.Kumaraswamy("y", a=pm.Gamma("a", 2, 1), b=pm.Gamma("b", 2, 0.5), observed=y)
    return m


def discrete_weibull(rng):
    y = np.floor(rng.weibull(1.3, 100) * 4).astype(int)
    with pm.Model() as m:
        pm.DiscreteWeibull("y", q=pm.Beta("q", 2, 2), beta=pm.Gamma("beta", 2, 1), observed=y)
    return m


def rice(rng):
    y = np.abs(rng.normal(1.0, 1.0, 80) + 1j * rng.normal(0, 1.0, 80))
    with pm.Model() as m:
        pm.Rice("y", nu=pm.HalfNormal("nu", 3), sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def truncated_normal(rng):
    y = rng.normal(0.2, 0.8, 200)
    y = y[(y > -1) & (y < 1.5)][:60]
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 2)
        pm.Truncated("y", pm.Normal.dist(mu, pm.HalfNormal("s", 2)), lower=-1, upper=1.5, observed=y)
    return m


def laplace(rng):
    y = rng.laplace(1.0, 0.5, 30)
    with pm.Model() as m:
        pm.Laplace("y", pm.Normal("mu", 0, 5), pm.HalfNormal("s", 2), observed=y)
    return m


def studentt(rng):
    y = rng.standard_t(4, 60) * 0.7 + 1
    with pm.Model() as m:
        pm.StudentT("y", nu=4, mu=pm.Normal("mu", 0, 5), sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def exgaussian(rng):
    y = rng.normal(1.0, 0.5, 100) + rng.exponential(1.5, 100)
    with pm.Model() as m:
        pm.ExGaussian("y", mu=pm.Normal("mu", 0, 5), sigma=pm.HalfNormal("sigma", 2), nu=pm.HalfNormal("nu", 3),
                      observed=y)
    return m


def lognormal_power(rng):
    x = rng.uniform(0, 2, 70)
    y = np.exp(np.log(3.0) + 0.5 * x + 0.3 * rng.standard_normal(70))
    with pm.Model() as m:
        A = pm.HalfNormal("A", 5)
        pm.LogNormal("y", mu=pm.math.log(A) + pm.Normal("b", 0, 1) * x, sigma=pm.HalfNormal("s", 1), observed=y)
    return m


def michaelis_menten(rng):
    x = rng.uniform(0.1, 5, 40)
    y = 2.0 * x / (1.0 + x) + 0.1 * rng.standard_normal(40)
    with pm.Model() as m:
        vmax, K = pm.HalfNormal("vmax", 5), pm.HalfNormal("K", 5)
        pm.Normal("y", vmax * x / (K + x), pm.HalfNormal("s", 1), observed=y)
    return m


def exponential_decay(rng):
    t = np.linspace(0.05, 5, 40)
    y = 4 * np.exp(-0.7 * t) + rng.normal(0, 0.2, 40)
    with pm.Model() as m:
        k = pm.HalfNormal("k", 2)
        pm.Normal("y", pm.HalfNormal("A", 10) * pm.math.exp(-k * t), pm.HalfNormal("s", 1), observed=y)
    return m


def logistic_positive_slope(rng):
    x = rng.normal(size=100)
    y = rng.binomial(1, 1 / (1 + np.exp(-(0.2 + 1.3 * x))))
    with pm.Model() as m:
        pm.Bernoulli("y", logit_p=pm.Normal("a", 0, 1.5) + pm.LogNormal("b", 0, 1) * x, observed=y)
    return m


# Regressions a + b * x beside a shared scale or shape: the predictor's two coordinates and
# the scale make one three-latent law (the correlation that matters is the intercept's with
# the scale, reported for these instead of the first two latents')


def tobit_regression(rng):
    x = rng.normal(size=100)
    y = np.maximum(0.5 + 1.0 * x + rng.normal(0, 1.0, 100), 0.0)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5)
        pm.Censored("y", pm.Normal.dist(a + b * x, pm.HalfNormal("s", 2)), lower=0, upper=None, observed=y)
    return m


def truncated_regression(rng):
    x = rng.normal(size=100)
    y = 0.5 + 1.0 * x + rng.normal(0, 1.0, 100)
    keep = y > 0
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5)
        pm.TruncatedNormal("y", mu=a + b * x[keep], sigma=pm.HalfNormal("s", 2), lower=0, observed=y[keep])
    return m


def gamma_regression(rng):
    x = rng.normal(size=100)
    y = rng.gamma(4.0, np.exp(0.3 + 0.5 * x) / 4.0)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        pm.Gamma("y", mu=pm.math.exp(a + b * x), sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def weibull_regression(rng):
    x = rng.normal(size=100)
    y = np.exp(1.0 + 0.5 * x) * rng.weibull(1.5, 100)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        pm.Weibull("y", alpha=pm.Gamma("k", 2, 1), beta=pm.math.exp(a + b * x), observed=y)
    return m


def studentt_regression(rng):
    x = rng.normal(size=100)
    y = 1 + 2 * x + rng.standard_t(3, 100)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5)
        pm.StudentT("y", nu=3, mu=a + b * x, sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def negbin_regression(rng):
    x = rng.normal(size=100)
    mu = np.exp(1.0 + 0.5 * x)
    y = rng.negative_binomial(2.0, 2.0 / (2.0 + mu))
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        pm.NegativeBinomial("y", mu=pm.math.exp(a + b * x), alpha=pm.Exponential("alpha", 0.5), observed=y)
    return m


def robust_regression(rng):
    # Student-t with latent degrees of freedom: the predictor's two coordinates, s and nu
    x = rng.normal(size=100)
    y = 1 + 2 * x + 0.7 * rng.standard_t(4, 100)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5)
        pm.StudentT("y", nu=pm.Gamma("nu", 2, 0.1), mu=a + b * x, sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def gamma_two_predictor_regression(rng):
    # a + X @ b with two predictors beside the scale: four coordinates
    X = rng.normal(size=(100, 2))
    y = rng.gamma(4.0, np.exp(0.3 + X @ [0.5, -0.3]) / 4.0)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2, shape=2)
        pm.Gamma("y", mu=pm.math.exp(a + pm.math.dot(X, b)), sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def gamma_three_predictor_regression(rng):
    # a + X @ b with three predictors beside the scale: five coordinates, by nested Laplace
    X = rng.normal(size=(200, 3))
    y = rng.gamma(3.0, np.exp(0.8 + X @ [0.5, -0.3, 0.2]) / 3.0)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 1, shape=3)
        pm.Gamma("y", mu=pm.math.exp(a + pm.math.dot(X, b)), sigma=pm.HalfNormal("s", 2), observed=y)
    return m


def negbin_three_predictor_regression(rng):
    X = rng.normal(size=(200, 3))
    mu = np.exp(1.0 + X @ [0.5, -0.3, 0.2])
    y = rng.negative_binomial(2.0, 2.0 / (2.0 + mu))
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 1, shape=3)
        pm.NegativeBinomial("y", mu=pm.math.exp(a + pm.math.dot(X, b)), alpha=pm.Exponential("alpha", 0.5),
                            observed=y)
    return m


def robust_three_predictor_regression(rng):
    # Student-t with latent degrees of freedom on three predictors: two elements beside them
    X = rng.normal(size=(200, 3))
    y = 1 + X @ [0.5, -0.3, 0.2] + 0.5 * rng.standard_t(3, 200)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 1, shape=3)
        pm.StudentT("y", nu=pm.Gamma("nu", 2, 0.1), mu=a + pm.math.dot(X, b), sigma=pm.HalfNormal("s", 2),
                    observed=y)
    return m


def gamma_large_regression(rng):
    # the Gamma regression on 12,000 observations: beyond the rotated grid's cost guard
    x = rng.normal(size=12_000)
    y = rng.gamma(4.0, np.exp(0.3 + 0.5 * x) / 4.0)
    with pm.Model() as m:
        a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
        pm.Gamma("y", mu=pm.math.exp(a + b * x), sigma=pm.HalfNormal("s", 2), observed=y)
    return m


MODELS = {f.__name__: f for f in (negbin, betabinom, gamma, weibull, inverse_gamma, kumaraswamy, discrete_weibull,
                                   rice, truncated_normal, laplace, studentt, exgaussian, lognormal_power,
                                   michaelis_menten, exponential_decay, logistic_positive_slope,
                                   tobit_regression, truncated_regression, gamma_regression, weibull_regression,
                                   studentt_regression, negbin_regression, robust_regression,
                                   gamma_two_predictor_regression, gamma_three_predictor_regression,
                                   negbin_three_predictor_regression, robust_three_predictor_regression,
                                   gamma_large_regression)}


def compare_model(model, name: str, pair: list[str], seed: int, variant: str, target_accept: float = 0.8,
                  nuts: tuple[int, int] = (2, 1000), deterministics: bool = False) -> dict:
    """EP (``pmkjit.fit``) against NUTS (``nuts``: chains and draws, after 1,000 tuning
    steps) on ``model``: the row of one model and variant, the correlation taken between the
    first entries of the two variables named in ``pair``; the model's ``pm.Deterministic``
    variables compared too where ``deterministics``."""
    names = [v.name for v in model.free_RVs] + ([v.name for v in model.deterministics] if deterministics else [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        idata = pmkjit.fit(model=model, random_seed=seed, progressbar=False, compute_log_likelihood=False)
        t_ep = time.perf_counter() - t0
    ep_warnings = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught
                          if issubclass(w.category, UserWarning) and "BLAS" not in str(w.message)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        with model:
            reference = pm.sample(nuts[1], tune=1000, chains=nuts[0], random_seed=seed, progressbar=False,
                                  target_accept=target_accept)
        t_nuts = time.perf_counter() - t0
    # unrounded: ArviZ rounds to two significant digits, 4% of an sd of 0.012 and the whole
    # difference between two sds of 0.005 (a regression on 12,000 observations)
    ep = az.summary(idata, var_names=names, kind="stats", round_to="none")
    ref = az.summary(reference, var_names=names, round_to="none")
    z = (ep["mean"] - ref["mean"]).abs() / ref["sd"]
    ratio = ep["sd"] / ref["sd"]

    def corr(data):
        a, b = (data.posterior[v].values.reshape(-1, data.posterior[v].values[0, 0].size)[:, 0] for v in pair)
        return float(np.corrcoef(a, b)[0, 1])

    return {
        "model": name, "variant": variant, "free_variables": names, "correlated_pair": pair, "max_z_err": float(z.max()),
        "max_z_at": str(z.idxmax()), "sd_ratio_min": float(ratio.min()), "sd_ratio_max": float(ratio.max()),
        "corr_ep": corr(idata), "corr_nuts": corr(reference),
        "sweeps": int(idata.ep.attrs["sweeps"]), "converged": bool(idata.ep.attrs["converged"]),
        "factor_methods": idata.ep.attrs["factor_methods"], "warnings": ep_warnings,
        "seconds_ep": t_ep, "seconds_nuts": t_nuts, "nuts_divergences": int(reference.sample_stats["diverging"].sum()),
        "nuts_min_ess_bulk": float(ref["ess_bulk"].min()),
        "z_err": {k: float(v) for k, v in z.items()}, "sd_ratio": {k: float(v) for k, v in ratio.items()},
    }


def run_variants(models: dict, build, switch: str, script: str, out: Path, target_accept: float = 0.8,
                 width: int = 26, description: str = "", nuts: tuple[int, int] = (2, 1000),
                 ablated=lambda *args: False, deterministics: bool = False,
                 variant_names: tuple[str, str] = ("collapsed", "instance-by-instance")) -> None:
    """The side-by-side run of a benchmark script: ``build(name, rng) -> (model, pair)`` for each
    of ``models``, fitted with the library as it is (``collapsed``) and with ``pmkjit.fit``'s
    function ``switch`` (which says whether a factor gets one site) answering ``ablated`` (the
    ablation: False by default; ``lambda *args: None`` for a switch whose "no" is None, as
    ``order_constraints``), each against NUTS (with the models' Deterministics where
    ``deterministics``); rows printed and written to ``out`` as JSON with the command
    (``script`` and its arguments) and the code's commit. ``variant_names`` name the two
    variants (the library's, then the ablation) in the rows and on the command line."""
    library = variant_names[0]
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", nargs="+", choices=list(models), default=list(models))
    parser.add_argument("--variants", nargs="+", choices=list(variant_names), default=list(variant_names))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    fit_module = sys.modules["pmkjit.fit"]
    one_site = getattr(fit_module, switch)
    rows = []
    print(f"{'model':{width}s} {'variant':21s} {'max |z|':>8s} {'sd ratio':>11s} {'corr EP/NUTS':>13s} "
          f"{'sweeps':>6s} {'EP s':>6s} {'NUTS s':>6s}")
    for name in args.models:
        for variant in args.variants:
            # the ablation: no factor of this kind gets one site, as before it did
            setattr(fit_module, switch, one_site if variant == library else ablated)
            model, pair = build(name, np.random.default_rng(args.seed))
            r = compare_model(model, name, pair, args.seed, variant, target_accept, nuts, deterministics)
            rows.append(r)
            print(f"{name:{width}s} {variant:21s} {r['max_z_err']:8.3f} {r['sd_ratio_min']:5.2f}-{r['sd_ratio_max']:4.2f} "
                  f"{r['corr_ep']:6.2f}/{r['corr_nuts']:5.2f} {r['sweeps']:5d}{'' if r['converged'] else '*'} "
                  f"{r['seconds_ep']:6.1f} {r['seconds_nuts']:6.1f}{'  warned' if r['warnings'] else ''}",
                  flush=True)
    setattr(fit_module, switch, one_site)
    print("* not converged in max_sweeps")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": f"python benchmarks/{script}"
        + (" --models " + " ".join(args.models) if args.models != list(models) else "")
        + (" --variants " + " ".join(args.variants) if args.variants != list(variant_names) else ""),
        "code": git_state(), "seed": args.seed, "nuts_chains_draws": list(nuts), "rows": rows,
        "machine": {"python": platform.python_version(), "pymc": pm.__version__, "cpus": __import__("os").cpu_count()},
    }, indent=1))
    print(f"wrote {args.out}")


def main() -> None:
    def build(name, rng):
        model = MODELS[name](rng)
        names = [v.name for v in model.free_RVs]
        pair = [names[0], "s" if "s" in names else names[2]] if name.endswith("_regression") else names[:2]
        return model, pair

    run_variants(MODELS, build, "collapsible", "shared_scalars_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "shared_scalars_vs_nuts.json",
                 description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
