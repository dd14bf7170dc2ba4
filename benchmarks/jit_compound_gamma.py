"""Just-in-time learning over many compound-gamma problems (issue 5, experiment 2).

The KJIT paper's compound gamma, (s1, r1, s2) = (1, 1, 1): per problem, N is drawn
uniformly from 10..100, r ~ Gamma(1, rate 1), tau ~ Gamma(1, rate r) and
x_i ~ Normal(0, 1 / sqrt(tau)), i = 1..N, all from one ``numpy.random.default_rng(seed)``.
The model is written as a user would write it::

    with pm.Model() as model:
        r = pm.Gamma("r", alpha=1.0, beta=1.0)
        tau = pm.Gamma("tau", alpha=1.0, beta=r)
        pm.Normal("x", 0.0, sigma=1.0 / pm.math.sqrt(tau), observed=x)

pmkjit turns ``tau ~ Gamma(1, rate=r)`` into the one black-box factor (a prior with a
random rate: Gamma messages to r and to tau); the prior of r and the Normal likelihood
are conjugate. Every problem is fitted

* by KJIT-EP carrying ONE operator across all problems: ``pmkjit.fit(method="kjit",
  oracle=..., operators=store)`` with the same temporary ``store`` directory for every
  fit (the operator, or the oracle answers still too few to fit it on, is loaded at the
  start of each fit and written back at the end). The primary oracle is importance
  sampling (``oracle="importance"``, 1e5 samples: the factor known only by forward
  sampling); ``--oracles importance quadrature`` adds a second, independent operator
  stream behind the quadrature oracle;
* by quadrature EP (``method="quadrature"``), the reference.

The methods run one after the other on the same problem, in an order alternating
between problems, so that all see the same machine load. Times are the wall time of
the ``pmkjit.fit`` call (factor graph, EP, 2 x ``--draws`` posterior draws; no
log-likelihood group).

Per problem: N, wall time of each method, EP sweeps, the messages the KJIT factor
computed and how many of them the oracle answered (counted exactly from the per-sweep
``EPInfo`` of ``pmkjit.fit(..., callback=)``: ``asked`` marks the messages that went to
the oracle; every other message was a KJIT prediction or, before the operator's first
fit, a repeat of an input the oracle had already answered), the counters of the ``ep``
group as a cross-check (``oracle_calls``; ``kjit_predictions`` is the operator's
lifetime counter, so its increase per fit), the largest epistemic predictive variance
of the fit's messages, and KL[q_quadrature || q_KJIT] of the EP posteriors of tau and
of r, in closed form (``pmkjit.ep_posterior``: Gamma marginals).

Oracle-call rate = oracle messages / messages computed, over a range of problems;
``oracle_rate_after_100`` is the rate over problems 101..end (issue 5's target: at most
1%; the paper reports 0.4% after 1,000 problems).

Output: ``benchmarks/results/jit_compound_gamma.json`` (summary, every per-problem row,
command, platform) and ``docs/img/jit_compound_gamma.png``.

Run (single-threaded BLAS; the machine has 2 cores shared with others)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/jit_compound_gamma.py

(1,000 problems, importance-sampling oracle); ``--oracles importance quadrature`` for
both configurations; ``--problems 50`` for a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

import pmkjit

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 100  # problems in the rolling oracle-call rate


def make_problem(rng: np.random.Generator) -> dict:
    """One compound-gamma problem, (s1, r1, s2) = (1, 1, 1)."""
    n = int(rng.integers(10, 101))  # uniform on 10..100
    r = rng.gamma(1.0, 1.0)  # numpy's gamma takes a scale: rate 1
    tau = rng.gamma(1.0, 1.0 / r)  # rate r
    x = rng.normal(0.0, 1.0 / np.sqrt(tau), size=n)
    return {"N": n, "r_true": float(r), "tau_true": float(tau), "x": x}


def build_model(x: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        r = pm.Gamma("r", alpha=1.0, beta=1.0)
        tau = pm.Gamma("tau", alpha=1.0, beta=r)
        pm.Normal("x", 0.0, sigma=1.0 / pm.math.sqrt(tau), observed=x)
    return model


class SweepCounter:
    """Per-sweep callback: messages the KJIT factors computed and those the oracle answered."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes
        self.messages = self.oracle = 0
        self.variances: list[float] = []
        self.sweeps = 0

    def __call__(self, info) -> None:
        self.sweeps += 1
        # one black-box factor here, so the improper cavities skipped are all its own
        self.messages += sum(self.sizes.values()) - info.skipped_improper_cavity
        for name, asked in info.asked.items():
            self.oracle += int(np.sum(asked))
            var = info.variance.get(name)
            if var is not None and np.isfinite(var).any():
                self.variances.append(float(np.nanmax(var)))  # before any oracle call of the sweep

    @property
    def max_variance(self) -> float | None:
        return max(self.variances) if self.variances else None


def fit_timed(model: pm.Model, seed: int, draws: int, **kwargs):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pmkjit.fit(model=model, random_seed=seed, progressbar=False, compute_log_likelihood=False,
                           draws=draws, **kwargs)
    return idata, time.perf_counter() - t0


def posterior(idata) -> dict:
    return pmkjit.ep_posterior(idata)


def run(args) -> dict:
    rng = np.random.default_rng(args.seed)
    problems = [make_problem(rng) for _ in range(args.problems)]
    # black-box factor sizes (one instance of tau's prior per problem): from the graph
    from pmkjit.graph import build_factor_graph

    stores = {o: Path(tempfile.mkdtemp(prefix=f"jit_cg_{o}_")) for o in args.oracles}
    last_predictions = {o: 0 for o in args.oracles}
    rows = []
    t_start = time.perf_counter()
    for i, prob in enumerate(problems):
        model = build_model(prob["x"])
        sizes = {f.name: f.size for f in build_factor_graph(model).factors}
        seed = args.seed * 1_000_003 + i
        jobs = ["reference", *args.oracles]  # quadrature EP, then one KJIT stream per oracle
        if i % 2:
            jobs = jobs[::-1]  # alternate the order: no method always runs first
        row = {"problem": i + 1, "N": prob["N"], "r_true": prob["r_true"], "tau_true": prob["tau_true"]}
        fits = {}
        for job in jobs:
            if job == "reference":
                idata, sec = fit_timed(model, seed, args.draws, method="quadrature")
                row["quadrature"] = {"seconds": sec, "sweeps": int(idata.ep.attrs["sweeps"]),
                                     "converged": bool(idata.ep.attrs["converged"]),
                                     "seconds_ep": float(idata.ep.attrs.get("seconds_ep", np.nan))}
                fits["reference"] = idata
                continue
            store = stores[job]
            fitted_before = any(not p.name.endswith(".pending.npz") for p in store.glob("*.npz"))
            counter = SweepCounter(sizes)
            idata, sec = fit_timed(model, seed, args.draws, method="kjit", oracle=job, operators=store,
                                   n_importance_samples=args.importance_samples, callback=counter)
            preds = int(idata.ep["kjit_predictions"].sum())
            ep_oracle = int(idata.ep["oracle_calls"].sum())
            fits[job] = idata
            row[f"kjit_{job}"] = {
                "seconds": sec,
                "sweeps": int(idata.ep.attrs["sweeps"]),
                "converged": bool(idata.ep.attrs["converged"]),
                "messages": counter.messages,
                "oracle_messages": counter.oracle,
                "ep_oracle_calls": ep_oracle,
                "ep_kjit_predictions_increase": preds - last_predictions[job],
                "operator_fitted_at_start": fitted_before,
                "max_predictive_variance": counter.max_variance,
                "seconds_ep": float(idata.ep.attrs.get("seconds_ep", np.nan)),
                "seconds_graph": float(idata.ep.attrs.get("seconds_graph", np.nan)),
            }
            last_predictions[job] = preds
        q = posterior(fits["reference"])
        row["quadrature"]["tau_mean"], row["quadrature"]["r_mean"] = float(q["tau"].mean()[0]), float(q["r"].mean()[0])
        for job in args.oracles:
            k = posterior(fits[job])
            cell = row[f"kjit_{job}"]
            cell["kl_tau"] = float(q["tau"].kl(k["tau"])[0])
            cell["kl_r"] = float(q["r"].kl(k["r"])[0])
            cell["tau_mean"], cell["r_mean"] = float(k["tau"].mean()[0]), float(k["r"].mean()[0])
        rows.append(row)
        if (i + 1) % args.report_every == 0 or i + 1 == len(problems):
            elapsed = time.perf_counter() - t_start
            parts = []
            for job in args.oracles:
                ks = [r[f"kjit_{job}"] for r in rows[-args.report_every:]]
                parts.append(f"{job}: oracle {sum(c['oracle_messages'] for c in ks)}/"
                             f"{sum(c['messages'] for c in ks)} msgs, median KL tau "
                             f"{np.median([c['kl_tau'] for c in ks]):.1e}, t {np.median([c['seconds'] for c in ks]):.2f} s")
            tq = np.median([r["quadrature"]["seconds"] for r in rows[-args.report_every:]])
            print(f"[{i + 1:5d}/{len(problems)}] {elapsed:6.0f} s | quadrature t {tq:.2f} s | " + " | ".join(parts),
                  flush=True)
    return {"rows": rows, "wall_seconds": time.perf_counter() - t_start}


def rate(rows: list[dict], job: str, lo: int, hi: int | None = None) -> dict:
    """Oracle-call rate over problems lo..hi (1-based, inclusive)."""
    sel = [r[f"kjit_{job}"] for r in rows if r["problem"] >= lo and (hi is None or r["problem"] <= hi)]
    msgs = sum(c["messages"] for c in sel)
    orc = sum(c["oracle_messages"] for c in sel)
    return {"problems": len(sel), "messages": msgs, "oracle_messages": orc,
            "rate": orc / msgs if msgs else float("nan"),
            "problems_with_oracle_calls": int(sum(c["oracle_messages"] > 0 for c in sel))}


def rolling_rate(rows: list[dict], job: str, window: int = WINDOW) -> np.ndarray:
    msgs = np.array([r[f"kjit_{job}"]["messages"] for r in rows], float)
    orc = np.array([r[f"kjit_{job}"]["oracle_messages"] for r in rows], float)
    cm, co = np.concatenate([[0], np.cumsum(msgs)]), np.concatenate([[0], np.cumsum(orc)])
    lo = np.maximum(np.arange(1, len(rows) + 1) - window, 0)
    hi = np.arange(1, len(rows) + 1)
    return (co[hi] - co[lo]) / np.maximum(cm[hi] - cm[lo], 1)


def summarise(rows: list[dict], oracles: list[str]) -> dict:
    out = {}
    tq_all = np.array([r["quadrature"]["seconds"] for r in rows])
    for job in oracles:
        cells = [r[f"kjit_{job}"] for r in rows]
        tk_all = np.array([c["seconds"] for c in cells])
        kl_tau, kl_r = np.array([c["kl_tau"] for c in cells]), np.array([c["kl_r"] for c in cells])
        after = np.array([r["problem"] > 100 for r in rows])
        fitted = np.array([c["operator_fitted_at_start"] for c in cells])
        # the counters of the ep group agree with the per-sweep count wherever they measure the same thing
        oracle_mismatch = sum(c["oracle_messages"] != c["ep_oracle_calls"] for c in cells)
        pred_mismatch = sum(c["messages"] != c["ep_kjit_predictions_increase"] for c, f in zip(cells, fitted) if f)
        first_fit = next((r["problem"] for r, c in zip(rows, cells) if c["ep_kjit_predictions_increase"] > 0), None)
        s = {
            "oracle_rate_after_100": rate(rows, job, 101)["rate"] if len(rows) > 100 else None,
            "rate_problems_1_100": rate(rows, job, 1, 100),
            "rate_problems_101_end": rate(rows, job, 101) if len(rows) > 100 else None,
            "rate_problems_501_end": rate(rows, job, 501) if len(rows) > 500 else None,
            "rate_last_100": rate(rows, job, max(len(rows) - 99, 1)),
            "rate_all": rate(rows, job, 1),
            "first_problem_with_kjit_predictions": first_fit,
            "seconds_median_after_first": {
                "kjit": float(np.median(tk_all[1:])), "quadrature": float(np.median(tq_all[1:])),
                "ratio_kjit_over_quadrature": float(np.median(tk_all[1:]) / np.median(tq_all[1:])),
                "median_of_per_problem_ratios": float(np.median(tk_all[1:] / tq_all[1:])),
            },
            "seconds_median_after_100": {
                "kjit": float(np.median(tk_all[after])) if after.any() else None,
                "quadrature": float(np.median(tq_all[after])) if after.any() else None,
            },
            "seconds_total": {"kjit": float(tk_all.sum()), "quadrature": float(tq_all.sum())},
            "seconds_ep_median_after_first": {  # the EP loop alone (no graph building, no draws)
                "kjit": float(np.median([c["seconds_ep"] for c in cells[1:]])),
                "quadrature": float(np.median([r["quadrature"]["seconds_ep"] for r in rows[1:]]))},
            "kl_tau": {"median": float(np.median(kl_tau)), "p90": float(np.quantile(kl_tau, 0.9)),
                       "max": float(kl_tau.max()),
                       "median_after_100": float(np.median(kl_tau[after])) if after.any() else None,
                       "p90_after_100": float(np.quantile(kl_tau[after], 0.9)) if after.any() else None},
            "kl_r": {"median": float(np.median(kl_r)), "p90": float(np.quantile(kl_r, 0.9)),
                     "max": float(kl_r.max()),
                     "median_after_100": float(np.median(kl_r[after])) if after.any() else None,
                     "p90_after_100": float(np.quantile(kl_r[after], 0.9)) if after.any() else None},
            "sweeps_median": float(np.median([c["sweeps"] for c in cells])),
            "not_converged": int(sum(not c["converged"] for c in cells)),
            "counter_check": {"problems_oracle_calls_differ": int(oracle_mismatch),
                              "fitted_problems_predictions_differ": int(pred_mismatch)},
        }
        out[job] = s
    out["quadrature_ep"] = {"sweeps_median": float(np.median([r["quadrature"]["sweeps"] for r in rows])),
                            "not_converged": int(sum(not r["quadrature"]["converged"] for r in rows))}
    return out


def plot(rows: list[dict], oracles: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prob = np.array([r["problem"] for r in rows])
    colours = {"importance": "C0", "quadrature": "C2"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax = axes[0, 0]
    for job in oracles:
        rr = rolling_rate(rows, job)
        ax.plot(prob, 100 * rr, color=colours.get(job), label=f"KJIT ({job} oracle), last {WINDOW} problems")
        cm = np.cumsum([r[f"kjit_{job}"]["messages"] for r in rows])
        co = np.cumsum([r[f"kjit_{job}"]["oracle_messages"] for r in rows])
        ax.plot(prob, 100 * co / cm, color=colours.get(job), ls=":", label=f"KJIT ({job} oracle), cumulative")
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="target 1% (after problem 100)")
    ax.axvline(100.5, color="grey", lw=0.6)
    ax.set_ylim(0, 12)  # the first problems (no operator yet: 50%) are off the scale
    ax.text(0.02, 0.97, "before the first fit: 50% (off scale)", transform=ax.transAxes, va="top", fontsize=7)
    ax.set_xlabel("problem")
    ax.set_ylabel("oracle-call rate (% of messages)")
    ax.set_title("Messages answered by the oracle")
    ax.legend(fontsize=7)

    ax = axes[0, 1]
    series = [("quadrature EP", [r["quadrature"]["seconds"] for r in rows], "C3")]
    series += [(f"KJIT-EP ({job} oracle)", [r[f"kjit_{job}"]["seconds"] for r in rows], colours.get(job))
               for job in oracles]
    for label, t, colour in series:
        t = np.asarray(t)
        ax.plot(prob, t, ".", ms=2, color=colour, alpha=0.35)
        med = [np.median(t[max(0, k - 25) : k + 26]) for k in range(len(t))]
        ax.plot(prob, med, color=colour, lw=1.5, label=f"{label} (points; line: running median of 51)")
    ax.set_yscale("log")
    ax.set_xlabel("problem")
    ax.set_ylabel("wall time of pmkjit.fit (s)")
    ax.set_title("Time per problem")
    ax.legend(fontsize=7)

    ax = axes[1, 0]
    floor = 1e-14  # exact agreement (the quadrature oracle's own answers) is drawn at this floor
    for job in oracles:
        ax.plot(prob, np.maximum([r[f"kjit_{job}"]["kl_tau"] for r in rows], floor), ".", ms=2,
                color=colours.get(job), label=f"KL tau ({job} oracle)")
        ax.plot(prob, np.maximum([r[f"kjit_{job}"]["kl_r"] for r in rows], floor), "x", ms=2,
                color=colours.get(job), alpha=0.4, label=f"KL r ({job} oracle)")
    ax.set_yscale("log")
    ax.set_xlabel("problem")
    ax.set_ylabel(f"KL[q_quadrature || q_KJIT] (floored at {floor:g})")
    ax.set_title("Posterior accuracy against quadrature EP")
    ax.legend(fontsize=7, markerscale=3)

    ax = axes[1, 1]
    for job in oracles:
        v = np.array([np.nan if r[f"kjit_{job}"]["max_predictive_variance"] is None
                      else r[f"kjit_{job}"]["max_predictive_variance"] for r in rows], float)
        asked = np.array([r[f"kjit_{job}"]["oracle_messages"] > 0 for r in rows])
        ok = np.isfinite(v)
        ax.plot(prob[ok & ~asked], v[ok & ~asked], ".", ms=2, color=colours.get(job),
                label=f"{job} oracle: no oracle call")
        ax.plot(prob[ok & asked], v[ok & asked], "o", ms=4, mfc="none", color=colours.get(job),
                label=f"{job} oracle: oracle asked")
    ax.set_yscale("log")
    ax.set_xlabel("problem")
    ax.set_ylabel("largest epistemic predictive variance")
    ax.set_title("KJIT uncertainty over problems")
    ax.legend(fontsize=7, markerscale=2)
    fig.suptitle(f"Compound gamma, {len(rows)} problems, one KJIT operator carried across them")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_state() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--oracles", nargs="+", choices=("importance", "quadrature"), default=["importance"],
                        help="oracle behind each KJIT operator stream (each stream has its own operator)")
    parser.add_argument("--importance-samples", type=int, default=100_000)
    parser.add_argument("--draws", type=int, default=100, help="posterior draws per chain (2 chains)")
    parser.add_argument("--report-every", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "jit_compound_gamma.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "jit_compound_gamma.png")
    parser.add_argument("--plot-only", action="store_true", help="redraw the figure from the JSON of --out")
    args = parser.parse_args(argv)
    args.oracles = list(dict.fromkeys(args.oracles))
    if args.plot_only:
        saved = json.loads(args.out.read_text())
        plot(saved["rows"], saved["settings"]["oracles"], args.figure)
        print(f"redrew {args.figure} from {args.out}")
        return saved

    code = git_state()  # the library as run (read before the run: others may commit meanwhile)
    result = run(args)
    rows = result["rows"]
    summary = summarise(rows, args.oracles)
    primary = args.oracles[0]
    for job in args.oracles:
        s = summary[job]
        print(f"\nKJIT with the {job} oracle:")
        print(f"  oracle-call rate: problems 1-100 {s['rate_problems_1_100']['rate']:.4f}, after 100 "
              f"{s['oracle_rate_after_100']}, last 100 {s['rate_last_100']['rate']:.4f}")
        t = s["seconds_median_after_first"]
        print(f"  median s/problem after the first: KJIT {t['kjit']:.3f}, quadrature EP {t['quadrature']:.3f} "
              f"(ratio {t['ratio_kjit_over_quadrature']:.2f})")
        print(f"  KL tau median {s['kl_tau']['median']:.2e} p90 {s['kl_tau']['p90']:.2e}; "
              f"KL r median {s['kl_r']['median']:.2e} p90 {s['kl_r']['p90']:.2e}")
        print(f"  counter check: {s['counter_check']}")
    out = {
        "oracle_rate_after_100": summary[primary]["oracle_rate_after_100"],
        "primary_oracle": primary,
        "target_oracle_rate_after_100": 0.01,
        "target_met": (summary[primary]["oracle_rate_after_100"] is not None
                       and summary[primary]["oracle_rate_after_100"] <= 0.01),
        "summary": summary,
        "rolling_rate_window": WINDOW,
        "rolling_rate": {job: rolling_rate(rows, job).tolist() for job in args.oracles},
        "settings": {"problems": args.problems, "seed": args.seed, "oracles": args.oracles,
                     "n_importance_samples": args.importance_samples, "draws_per_chain": args.draws, "chains": 2,
                     "model": "r ~ Gamma(1, 1); tau ~ Gamma(1, rate=r); x_i ~ Normal(0, 1/sqrt(tau)), N ~ U{10..100}",
                     "fit": "pmkjit.fit defaults otherwise (tol 1e-3, damping auto, max_sweeps 50), "
                            "compute_log_likelihood=False"},
        "rows": rows,
        "wall_seconds": result["wall_seconds"],
        "command": "python " + " ".join([str(Path(sys.argv[0]).as_posix()), *(argv if argv is not None else sys.argv[1:])]),
        "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        "machine": {"python": platform.python_version(), "processor": platform.machine(),
                    "platform": platform.platform(), "cpus": os.cpu_count(), "numpy": np.__version__,
                    "pymc": pm.__version__},
        "code": code,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    plot(rows, args.oracles, args.figure)
    print(f"\nwrote {args.out} and {args.figure} ({result['wall_seconds']:.0f} s)")
    return out


if __name__ == "__main__":
    main()
