"""EP (pmkjit) against NUTS (``pm.sample``) on the models of issue 4, side by side.

For each model the same PyMC model object is given to ``pm.sample`` and to
``pmkjit.fit`` twice: first with an empty operator directory (*cold*: KJIT operators
learned from scratch during the fit) and then with the directory the first fit wrote
(*warm*: operators loaded from the previous fit). Reported per model:

* ``max_z_err``: largest |mean_EP - mean_NUTS| / sd_NUTS over every scalar latent;
* ``sd_ratio_min`` / ``sd_ratio_max``: range of sd_EP / sd_NUTS;
* ``speedup_cold`` / ``speedup_warm``: wall time of ``pm.sample`` over that of
  ``pmkjit.fit``, measured in the same run (medians over ``--repeats`` warm fits).

Both wall times are what a user waits for, compilation included; neither side
computes the log-likelihood group (``pm.sample`` does not by default, so
``compute_log_likelihood=False`` for EP too). NUTS: 1000 tuning and 1000 draws in
each of 2 chains; EP: 2 x 1000 draws. The NUTS reference has Monte Carlo error of
its own: with ~1000 effective draws the standard error of a NUTS mean is ~0.03 sd.

Prints a table and saves ``benchmarks/results/ep_vs_nuts.json``.

Run: ``python benchmarks/ep_vs_nuts.py`` (about 2-4 minutes on 2 cores);
``--models logistic_400 probit`` for a subset.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pymc as pm

import pmkjit

ROOT = Path(__file__).resolve().parents[1]


def logistic(n: int, d: int = 20) -> Callable[[np.random.Generator], pm.Model]:
    def build(rng: np.random.Generator) -> pm.Model:
        X = rng.standard_normal((n, d))
        w_true = rng.normal(0.0, 0.5, d)
        y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(X @ w_true))))
        with pm.Model() as model:
            w = pm.Normal("w", 0.0, 1.0, shape=d)
            pm.Bernoulli("y", logit_p=pm.math.dot(X, w), observed=y)
        return model

    return build


def probit(rng: np.random.Generator, n: int = 400, d: int = 10) -> pm.Model:
    X = rng.standard_normal((n, d))
    w_true = rng.normal(0.0, 0.5, d)
    from scipy.special import ndtr

    y = rng.binomial(1, ndtr(X @ w_true))
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 1.0, shape=d)
        pm.Bernoulli("y", p=pm.math.invprobit(pm.math.dot(X, w)), observed=y)
    return model


def poisson(rng: np.random.Generator, n: int = 400, d: int = 10) -> pm.Model:
    X = rng.standard_normal((n, d))
    w_true = rng.normal(0.0, 0.3, d)
    y = rng.poisson(np.exp(0.5 + X @ w_true))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0)
        w = pm.Normal("w", 0.0, 1.0, shape=d)
        pm.Poisson("y", mu=pm.math.exp(b + pm.math.dot(X, w)), observed=y)
    return model


def compound_gamma(rng: np.random.Generator, n: int = 100) -> pm.Model:
    """The KJIT paper's compound gamma: r ~ Gamma(1, 1), tau ~ Gamma(1, rate=r), x ~ N(0, 1/sqrt(tau))."""
    r = rng.gamma(1.0, 1.0)
    tau = rng.gamma(1.0, 1.0 / r)
    x = rng.normal(0.0, 1.0 / np.sqrt(tau), n)
    with pm.Model() as model:
        r = pm.Gamma("r", alpha=1.0, beta=1.0)
        tau = pm.Gamma("tau", alpha=1.0, beta=r)
        pm.Normal("x", 0.0, sigma=1.0 / pm.math.sqrt(tau), observed=x)
    return model


MODELS: dict[str, Callable[[np.random.Generator], pm.Model]] = {
    "logistic_400": logistic(400),
    "logistic_10000": logistic(10_000),
    "probit": probit,
    "poisson": poisson,
    "compound_gamma": compound_gamma,
}
ACCURACY_TARGETS = ("logistic_400", "logistic_10000", "probit", "poisson")


def flat_moments(idata, names) -> tuple[np.ndarray, np.ndarray]:
    post = idata.posterior
    mean = np.concatenate([np.ravel(post[v].mean(("chain", "draw")).values) for v in names])
    sd = np.concatenate([np.ravel(post[v].std(("chain", "draw")).values) for v in names])
    return mean, sd


def compare(ep, nuts, names) -> dict:
    m_ep, s_ep = flat_moments(ep, names)
    m_nuts, s_nuts = flat_moments(nuts, names)
    z = np.abs(m_ep - m_nuts) / s_nuts
    ratio = s_ep / s_nuts
    return {"max_z_err": float(z.max()), "sd_ratio_min": float(ratio.min()), "sd_ratio_max": float(ratio.max())}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_model(name: str, seed: int, repeats: int) -> dict:
    model = MODELS[name](np.random.default_rng(seed))
    names = [v.name for v in model.free_RVs]
    with tempfile.TemporaryDirectory() as ops, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyMC's "run at least 4 chains" and similar advice

        def ep_fit():
            return pmkjit.fit(model=model, random_seed=seed, progressbar=False, operators=ops,
                              compute_log_likelihood=False)

        nuts, t_nuts = timed(lambda: pm.sample(model=model, random_seed=seed, progressbar=False, chains=2,
                                               compute_convergence_checks=False))
        cold, t_cold = timed(ep_fit)
        warm_runs = [timed(ep_fit) for _ in range(repeats)]
    warm = warm_runs[-1][0]
    t_warm = float(np.median([t for _, t in warm_runs]))
    row = {
        "n_latent": int(sum(np.prod(nuts.posterior[v].shape[2:], dtype=int) for v in names)),
        "nuts_seconds": t_nuts,
        "ep_cold_seconds": t_cold,
        "ep_warm_seconds": t_warm,
        "ep_warm_seconds_all": [t for _, t in warm_runs],
        "speedup_cold": t_nuts / t_cold,
        "speedup_warm": t_nuts / t_warm,
        **compare(cold, nuts, names),
        "warm": compare(warm, nuts, names),
        "cold_sweeps": int(cold.ep.attrs["sweeps"]),
        "warm_sweeps": int(warm.ep.attrs["sweeps"]),
        "cold_converged": bool(cold.ep.attrs["converged"]),
        "warm_converged": bool(warm.ep.attrs["converged"]),
        "cold_oracle_calls": int(cold.ep["oracle_calls"].sum()),
        "warm_oracle_calls": int(warm.ep["oracle_calls"].sum()),
        "warm_kjit_predictions": int(warm.ep["kjit_predictions"].sum()),
        "warm_seconds_by_part": {k[8:]: float(v) for k, v in warm.ep.attrs.items() if k.startswith("seconds_")},
        "nuts_min_ess_bulk": float(min(float(pm.stats.ess(nuts, var_names=[v]).to_array().min()) for v in names)),
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="warm EP fits per model (median reported)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ep_vs_nuts.json")
    args = parser.parse_args()

    t_start = time.perf_counter()
    results = {}
    header = (f"{'model':16s} {'max_z':>6s} {'sd_ratio':>13s} {'warm z':>6s} {'NUTS s':>7s} {'EP cold s':>9s} "
              f"{'EP warm s':>9s} {'x cold':>6s} {'x warm':>6s} {'sweeps c/w':>10s} {'oracle c/w':>12s}")
    print(header)
    for name in args.models:
        r = run_model(name, args.seed, args.repeats)
        results[name] = r
        print(f"{name:16s} {r['max_z_err']:6.3f} [{r['sd_ratio_min']:.3f},{r['sd_ratio_max']:.3f}] "
              f"{r['warm']['max_z_err']:6.3f} {r['nuts_seconds']:7.1f} {r['ep_cold_seconds']:9.2f} "
              f"{r['ep_warm_seconds']:9.2f} {r['speedup_cold']:6.2f} {r['speedup_warm']:6.2f} "
              f"{r['cold_sweeps']:4d}/{r['warm_sweeps']:<5d} {r['cold_oracle_calls']:6d}/{r['warm_oracle_calls']:<5d}",
              flush=True)
    targets = {}
    for name in ACCURACY_TARGETS:
        if name in results:
            r = results[name]
            targets[f"{name}_accuracy"] = bool(r["max_z_err"] <= 0.1 and 0.9 <= r["sd_ratio_min"]
                                               and r["sd_ratio_max"] <= 1.1)
    if "logistic_10000" in results:
        targets["logistic_10000_speedup_warm_ge_20"] = bool(results["logistic_10000"]["speedup_warm"] >= 20)
    print("targets:", targets)
    out = {
        **results,
        "targets": targets,
        "settings": {"seed": args.seed, "repeats": args.repeats, "nuts": "pm.sample defaults: 1000 tune + 1000 draws "
                     "x 2 chains", "ep": "pmkjit.fit defaults, compute_log_likelihood=False"},
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "numpy": np.__version__,
                    "pymc": pm.__version__},
        "wall_seconds": time.perf_counter() - t_start,
        "command": "python benchmarks/ep_vs_nuts.py",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out} in {out['wall_seconds']:.0f} s")


if __name__ == "__main__":
    main()
