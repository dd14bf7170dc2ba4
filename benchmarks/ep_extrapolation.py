"""EP's jump over slow linear modes: sweeps with and without it, and the fixed points reached.

A local-level model (``pm.GaussianRandomWalk`` with a latent step size and a latent
observation noise, T time points) converges slowly under parallel EP: the step size's
sites and the walk's spread pull on each other like coordinate ascent, about 0.9 of the
gap left after every sweep. :mod:`pmkjit.ep.schedule` jumps to the fixed point of such a
mode once six clean sweeps identify it (minimal polynomial extrapolation of order one or
two). For each data set (y = cumsum(0.3 e) + 0.5 e', seeds 0..n-1) the model is fitted
twice from the same seed: with the schedule as shipped and with the jump turned off
(``schedule._SLOW_MODULUS = (1, 1)``), both with ``max_sweeps=300`` so that both converge.
Reported: sweeps of each, jumps made and undone, and the largest difference between the
two fixed points (EP marginals: means in posterior sds, and log sds).

Run: ``python benchmarks/ep_extrapolation.py`` (about 1-2 minutes); output
``benchmarks/results/ep_extrapolation.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

import pmkjit
from pmkjit.ep import schedule

ROOT = Path(__file__).resolve().parents[1]


def local_level(y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        step, noise = pm.HalfNormal("step", 1.0), pm.HalfNormal("noise", 1.0)
        level = pm.GaussianRandomWalk("level", sigma=step, init_dist=pm.Normal.dist(0, 5), shape=len(y))
        pm.Normal("y", level, noise, observed=y)
    return model


def fit(y: np.ndarray, jump: bool, max_sweeps: int) -> tuple[dict, dict, float]:
    shipped = schedule._SLOW_MODULUS
    if not jump:
        schedule._SLOW_MODULUS = (1.0, 1.0)  # no mode is ever slow enough: sweeps alone
    try:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the walk's latent-step warning
            idata = pmkjit.fit(model=local_level(y), random_seed=1, progressbar=False, draws=10,
                               max_sweeps=max_sweeps, compute_log_likelihood=False)
        seconds = time.perf_counter() - t0
    finally:
        schedule._SLOW_MODULUS = shipped
    return dict(idata.ep.attrs), pmkjit.ep_posterior(idata), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=10)
    parser.add_argument("--T", type=int, default=60)
    parser.add_argument("--max-sweeps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ep_extrapolation.json")
    args = parser.parse_args()

    rows = []
    fit(np.zeros(args.T), True, 2)  # compile once, outside the comparison
    print(f"{'seed':>4} {'sweeps':>7} {'no jump':>8} {'jumps':>6} {'undone':>7} {'max |dmean|/sd':>15} {'max |dlog sd|':>14}")
    for seed in range(args.datasets):
        rng = np.random.default_rng(seed)
        y = np.cumsum(0.3 * rng.normal(size=args.T)) + 0.5 * rng.normal(size=args.T)
        a, q, t = fit(y, True, args.max_sweeps)
        b, r, t_ref = fit(y, False, args.max_sweeps)
        dmean = max(float(np.max(np.abs(q[v].mean() - r[v].mean()) / np.sqrt(r[v].var()))) for v in r)
        dlogsd = max(float(np.max(np.abs(0.5 * np.log(q[v].var() / r[v].var())))) for v in r)
        row = dict(seed=seed, sweeps=int(a["sweeps"]), converged=bool(a["converged"]),
                   sweeps_without=int(b["sweeps"]), converged_without=bool(b["converged"]),
                   extrapolations=int(a["extrapolations"]), extrapolations_undone=int(a["extrapolations_undone"]),
                   max_mean_diff_sd=dmean, max_log_sd_diff=dlogsd, seconds=t, seconds_without=t_ref)
        rows.append(row)
        print(f"{seed:>4} {row['sweeps']:>7} {row['sweeps_without']:>8} {row['extrapolations']:>6} "
              f"{row['extrapolations_undone']:>7} {dmean:>15.2e} {dlogsd:>14.2e}", flush=True)
    summary = dict(
        sweeps_total=sum(r["sweeps"] for r in rows), sweeps_total_without=sum(r["sweeps_without"] for r in rows),
        all_converged=all(r["converged"] and r["converged_without"] for r in rows),
        max_mean_diff_sd=max(r["max_mean_diff_sd"] for r in rows),
        max_log_sd_diff=max(r["max_log_sd_diff"] for r in rows),
    )
    print(f"sweeps in all: {summary['sweeps_total']} with the jump, {summary['sweeps_total_without']} without; "
          f"fixed points within {summary['max_mean_diff_sd']:.1e} sd (means), {summary['max_log_sd_diff']:.1e} (log sds)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(
        command="python benchmarks/ep_extrapolation.py", settings=vars(args) | {"out": str(args.out)},
        machine=platform.platform(), summary=summary, rows=rows), indent=1))


if __name__ == "__main__":
    main()
