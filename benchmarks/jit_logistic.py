"""Just-in-time learning over a stream of logistic-regression problems (issue 5, experiment 1).

The KJIT paper's synthetic experiment (section 6.3, figures 5 and 8): 30 logistic
regression problems, one after the other, each with d = 20 weights w ~ N(0, I) and
N = 300 observations x ~ N(0, I), y ~ Bernoulli(sigmoid(x^T w)). Each problem is the
PyMC model a user writes,

    with pm.Model():
        w = pm.Normal("w", 0.0, 1.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, w), observed=y)

fitted by ``pmkjit.fit`` with at most 10 EP sweeps (fewer when EP converges first,
the same rule for every method) by

* **KJIT-EP**: ``method="kjit"`` with the importance-sampling oracle behind the operator
  (``oracle="importance"``, 1e5 samples, the paper's setting), and ONE operator carried
  across all problems through an operator directory (``operators=``): loaded at the
  start of each fit, written back at its end;
* **importance-sampling EP**: ``method="oracle"`` (every message by importance sampling
  with the same 1e5 samples; Barthelme and Chopin's EP-ABC-style EP);
* **quadrature EP**: ``method="quadrature"`` (the hand-crafted-quality reference that
  the paper's Infer.NET factor stands for).

The three fits of a problem run back to back, so all see the same machine load.
Reported per problem: classification error of the posterior-mean weights on 10,000
test points drawn from the true weights, wall time of the whole ``pmkjit.fit`` call
(factor-graph construction and posterior draws included), sweeps, and KJIT's oracle
calls. Through ``pmkjit.fit(callback=...)`` the script also records the epistemic
predictive variance of every message KJIT answered (the paper's uncertainty-over-time
figure) and which messages went to the oracle.

Summary figures (``benchmarks/results/jit_logistic.json``):

* ``speedup_vs_importance``: total time of importance-sampling EP over the problems /
  total time of KJIT-EP (first problem, with the operator's learning, included);
* ``slowdown_vs_quadrature``: total time of KJIT-EP / total time of quadrature EP over
  problems 2..P (after the first problem), and the median per-problem ratio;
* the mean test error of each method and the largest per-problem difference of KJIT's
  error from quadrature EP's.

Figure: ``docs/img/jit_logistic.png``.

Run: ``python benchmarks/jit_logistic.py`` (about 50 minutes: importance-sampling EP
takes ~90 s per problem); ``--skip-importance`` for KJIT and quadrature only (~2 min).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
from scipy import special

import pmkjit

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("kjit", "quadrature", "importance")


def problem(rng: np.random.Generator, n: int, d: int, n_test: int):
    w = rng.standard_normal(d)
    X = rng.standard_normal((n, d))
    y = rng.binomial(1, special.expit(X @ w))
    X_test = rng.standard_normal((n_test, d))
    y_test = rng.binomial(1, special.expit(X_test @ w))
    with pm.Model() as model:
        weights = pm.Normal("w", 0.0, 1.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, weights), observed=y)
    return model, X_test, y_test


def run_fit(model, method: str, args, store: str, seed: int, log: list | None):
    kwargs = {"method": "oracle"} if method == "importance" else {"method": method}
    if method == "kjit":
        kwargs.update(oracle=args.kjit_oracle, operators=store, callback=log.append)
    t0 = time.perf_counter()
    idata = pmkjit.fit(model=model, max_sweeps=args.sweeps, random_seed=seed, progressbar=False,
                       compute_log_likelihood=False, draws=500, n_importance_samples=args.importance_samples,
                       **kwargs)
    return idata, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=30)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--d", type=int, default=20)
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--n-test", type=int, default=10_000)
    parser.add_argument("--importance-samples", type=int, default=100_000)
    parser.add_argument("--kjit-oracle", choices=("importance", "quadrature"), default="importance")
    parser.add_argument("--skip-importance", action="store_true", help="KJIT and quadrature EP only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "jit_logistic.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "jit_logistic.png")
    args = parser.parse_args()
    methods = [m for m in METHODS if not (args.skip_importance and m == "importance")]

    rng = np.random.default_rng(args.seed)
    rows, variance_trace = [], []
    with tempfile.TemporaryDirectory() as store, warnings.catch_warnings():
        # EP warns when 10 sweeps do not reach its tolerance (importance sampling's noise)
        warnings.simplefilter("ignore", pmkjit.EPNotConvergedWarning)
        for p in range(args.problems):
            model, X_test, y_test = problem(rng, args.n, args.d, args.n_test)
            seed = int(rng.integers(2**31 - 1))
            row = {"problem": p + 1}
            for method in methods:
                log: list = []
                idata, seconds = run_fit(model, method, args, store, seed, log)
                w_mean = idata.posterior["w"].mean(("chain", "draw")).values
                row[method] = {
                    "seconds": seconds,
                    "error": float(np.mean((X_test @ w_mean > 0) != y_test)),
                    "sweeps": int(idata.ep.attrs["sweeps"]),
                    "oracle_calls": int(idata.ep["oracle_calls"].sum()),
                }
                if method == "kjit":
                    # exact per-message accounting from the sweeps (the operator's own
                    # counters run on across problems)
                    row[method]["messages"] = int(sum(info.asked[n].size for info in log for n in info.asked))
                    row[method]["asked"] = int(sum(info.asked[n].sum() for info in log for n in info.asked))
                    for info in log:
                        (name,) = info.variance
                        variance_trace.append({"problem": p + 1, "sweep": info.sweep,
                                               "variance": info.variance[name], "asked": info.asked[name]})
            rows.append(row)
            print(f"problem {p + 1:2d}: " + "  ".join(
                f"{m} {row[m]['seconds']:6.2f}s err {row[m]['error']:.4f} calls {row[m]['oracle_calls']:5d}"
                for m in methods), flush=True)

    summary = summarise(rows, methods)
    print(json.dumps(summary, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": "python benchmarks/jit_logistic.py" + (" --skip-importance" if args.skip_importance else ""),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"python": platform.python_version(), "processor": platform.machine(),
                    "numpy": np.__version__, "pymc": pm.__version__},
        **summary,
        "problems": rows,
    }
    args.out.write_text(json.dumps(result, indent=1))
    plot(rows, methods, variance_trace, args.figure)
    print(f"saved {args.out} and {args.figure}")


def summarise(rows: list[dict], methods: list[str]) -> dict:
    t = {m: np.array([r[m]["seconds"] for r in rows]) for m in methods}
    err = {m: np.array([r[m]["error"] for r in rows]) for m in methods}
    calls = np.array([r["kjit"]["oracle_calls"] for r in rows])
    messages = np.array([r["kjit"]["messages"] for r in rows])
    out = {
        "mean_error": {m: float(err[m].mean()) for m in methods},
        "max_abs_error_diff_kjit_vs_quadrature": float(np.max(np.abs(err["kjit"] - err["quadrature"]))),
        "total_seconds": {m: float(t[m].sum()) for m in methods},
        "median_seconds_after_first": {m: float(np.median(t[m][1:])) for m in methods},
        "kjit_oracle_calls_total": int(calls.sum()),
        "kjit_oracle_calls_first_problem": int(calls[0]),
        "kjit_oracle_rate_after_first": float(calls[1:].sum() / max(messages[1:].sum(), 1)),
        "slowdown_vs_quadrature": float(t["kjit"][1:].sum() / t["quadrature"][1:].sum()),
        "slowdown_vs_quadrature_median_ratio": float(np.median(t["kjit"][1:] / t["quadrature"][1:])),
        "speedup_vs_importance": None,
    }
    if "importance" in methods:
        out["speedup_vs_importance"] = float(t["importance"].sum() / t["kjit"].sum())
        out["speedup_vs_importance_after_first"] = float(t["importance"][1:].sum() / t["kjit"][1:].sum())
        out["max_abs_error_diff_kjit_vs_importance"] = float(np.max(np.abs(err["kjit"] - err["importance"])))
    return out


def plot(rows: list[dict], methods: list[str], trace: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"kjit": "KJIT-EP", "quadrature": "quadrature EP", "importance": "importance-sampling EP"}
    colours = {"kjit": "C0", "quadrature": "C2", "importance": "C3"}
    prob = np.array([r["problem"] for r in rows])
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    for m in methods:
        ax[0, 0].plot(prob, [r[m]["error"] for r in rows], "o-", ms=3, color=colours[m], label=labels[m])
        ax[0, 1].semilogy(prob, [r[m]["seconds"] for r in rows], "o-", ms=3, color=colours[m], label=labels[m])
    ax[0, 0].set(xlabel="problem", ylabel="test error (10,000 points)", title="Classification error")
    ax[0, 1].set(xlabel="problem", ylabel="seconds per fit", title="Wall time per problem")
    ax[0, 0].legend(fontsize=8)
    ax[0, 1].legend(fontsize=8)

    # predictive variance of every message, in the order EP sent them
    var = np.concatenate([t["variance"][:, 0] for t in trace])
    asked = np.concatenate([t["asked"] for t in trace])
    starts = np.cumsum([0] + [len(t["asked"]) for t in trace])[:-1]
    first_of_problem = [s for s, t in zip(starts, trace) if t["sweep"] == 1]
    x = np.arange(var.size)
    ok = np.isfinite(var)
    ax[1, 0].scatter(x[ok & ~asked], var[ok & ~asked], s=1, color="C0", label="answered by KJIT")
    ax[1, 0].scatter(x[ok & asked], var[ok & asked], s=2, color="C3", label="sent to the oracle")
    for s in first_of_problem:
        ax[1, 0].axvline(s, color="k", ls=":", lw=0.5)
    ax[1, 0].set_yscale("log")
    ax[1, 0].set(xlabel="message (time)", ylabel="predictive variance (output 1)",
                 title="KJIT uncertainty over time (dotted: new problem)")
    ax[1, 0].legend(fontsize=8, markerscale=5)

    calls = np.array([r["kjit"]["oracle_calls"] for r in rows])
    messages = np.array([r["kjit"]["messages"] for r in rows])
    ax[1, 1].semilogy(prob, np.maximum(calls / messages, 1e-4), "o-", ms=3, color="C0")
    ax[1, 1].set(xlabel="problem", ylabel="fraction of messages sent to the oracle",
                 title="KJIT oracle-call rate")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
