"""Just-in-time learning on real data with drift: four UCI sets, one KJIT operator (issue 5, experiment 3).

The KJIT paper's real-data experiment: Bayesian logistic regression on four real binary
datasets presented one after the other, in the paper's order (banknote authentication,
blood transfusion, fertility, ionosphere), to the *same* message operator, which learns
just in time and asks its oracle where its predictive variance says it is unsure. The
incoming messages of the logistic factor change with every dataset (other features,
other numbers of observations, other posterior widths), so the operator sees its inputs
drift.

Data: the CSVs vendored in ``benchmarks/data/uci/`` (see the README there; no download).
Per dataset: a stratified train/test split seeded by ``--seed`` (the paper's protocol:
200 training points, fertility 50, the rest for testing; ``--train-fraction 0.7`` for a
70/30 split instead), features standardised with the training split's mean and sd,
columns constant on the training split dropped, and the model as a PyMC user writes it::

    with pm.Model(coords=...) as model:
        X_data = pm.Data("X", X_train, dims=("obs", "feature"))
        b = pm.Normal("b", 0.0, 2.5)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        pm.Bernoulli("y", logit_p=b + X_data @ w, observed=y_train, dims="obs")

Methods, each on the same model object:

* ``kjit``: ``pmkjit.fit(method="kjit", oracle="importance", operators=store)`` with ONE
  operator directory for all four datasets, in order (dataset 1 starts from nothing;
  each later one loads the operator the previous fit wrote back);
* ``quadrature``: ``method="quadrature"`` (the hand-crafted-quality reference: the
  tilted moments by adaptive quadrature, exact to ~1e-10);
* ``oracle``: ``method="oracle"``, importance sampling alone (1e5 samples per message,
  as the KJIT oracle), run for as many sweeps as KJIT-EP took on the same dataset (at
  ~30-50 ms per message it costs minutes per dataset, and with its Monte Carlo noise it
  does not reach ``tol=1e-3`` in 50 sweeps); ``--oracle-sweeps N`` fixes N instead;
* ``nuts``: ``pm.sample(chains=2, cores=1)``, 1000 tuning + 1000 draws per chain.

Reported per dataset and method: test error of the posterior-mean classifier
(sign of b + x w at the posterior means: EP's closed-form means, NUTS's draw means; some
test points of blood transfusion lie within 0.002 of the boundary, where the Monte Carlo
error of a mean of 2,000 draws would decide them), posterior-predictive log loss on the test set
(the mean over the 2 x 1000 posterior draws of sigmoid(b + x w)), wall time (what a user
waits for, compilation included; EP without the log-likelihood group, as
``pm.sample``), sweeps, convergence, and for KJIT the oracle calls and KJIT
predictions; the largest |mean - mean_quadrature| / sd_quadrature of every EP method's
posterior against quadrature EP; and, after the timed fit, the errors of the outgoing
messages KJIT predicted in EP's last sweep against quadrature at the same messages (bias
and sd in the operator's units, next to those of a fresh importance-sampling answer).

Uncertainty over time: ``fit(callback=...)`` gives, per sweep, the epistemic predictive
variance of every message the KJIT operator was given (NaN before the operator existed)
and which went to the oracle. Concatenated over sweeps and datasets they make one time
axis (message index), plotted with a line at each dataset start (the paper's figure). The
"jump" at a dataset start: median (and 90th percentile) over messages of log10 of the
variance summed over the two outputs, in the first sweep of the new dataset and in its
highest sweep among the first three, minus the same over the last sweep of the previous
dataset; and the oracle-call fraction per sweep of each dataset (the first sweep's cavities
are the prior's, the second sweep is the first with the dataset's own).

Output: ``benchmarks/results/jit_uci.json``, ``docs/img/jit_uci_uncertainty.png`` and
``docs/img/jit_uci_error_time.png``.

Run (about 7 minutes; single-threaded BLAS on the shared 2-core machine)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/jit_uci.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pymc as pm
from sklearn.model_selection import train_test_split

import pmkjit

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "uci"

# name -> (file, label column, value of the positive class, training points in the paper's protocol)
DATASETS = {
    "banknote": ("banknote_authentication.csv", "class", 1, 200),
    "blood_transfusion": ("blood_transfusion.csv", "donated_march_2007", 1, 200),
    "fertility": ("fertility_diagnosis.csv", "diagnosis", "O", 50),
    "ionosphere": ("ionosphere.csv", "Class", "good", 200),
}
METHODS = ("kjit", "quadrature", "oracle", "nuts")
LABELS = {"kjit": "KJIT-EP", "quadrature": "quadrature EP", "oracle": "importance-sampling EP", "nuts": "NUTS"}


def load(name: str, seed: int, train_fraction: float | None) -> dict:
    """Read, split (stratified, seeded) and standardise one dataset."""
    file, label, positive, n_paper = DATASETS[name]
    df = pd.read_csv(DATA / file)
    y = (df.pop(label) == positive).to_numpy(dtype=int)
    X = df.to_numpy(dtype=float)
    train_size = train_fraction if train_fraction is not None else n_paper
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, train_size=train_size, stratify=y, random_state=seed)
    mean, sd = X_tr.mean(0), X_tr.std(0)
    keep = sd > 0
    features = [c for c, k in zip(df.columns, keep) if k]
    X_tr = (X_tr[:, keep] - mean[keep]) / sd[keep]
    X_te = (X_te[:, keep] - mean[keep]) / sd[keep]
    return {"name": name, "X_train": X_tr, "y_train": y_tr, "X_test": X_te, "y_test": y_te, "features": features,
            "dropped": [c for c, k in zip(df.columns, keep) if not k]}


def build_model(d: dict) -> pm.Model:
    coords = {"obs": np.arange(len(d["y_train"])), "feature": d["features"]}
    with pm.Model(coords=coords) as model:
        X_data = pm.Data("X", d["X_train"], dims=("obs", "feature"))
        b = pm.Normal("b", 0.0, 2.5)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        pm.Bernoulli("y", logit_p=b + X_data @ w, observed=d["y_train"], dims="obs")
    return model


def evaluate(idata, d: dict, mean: np.ndarray | None = None) -> dict:
    """Test error of the posterior-mean classifier and posterior-predictive log loss.

    ``mean``: the posterior means of (b, w) when known exactly (EP's closed form); else
    the means of the draws. The log loss averages sigmoid(b + x w) over the draws.
    """
    post = idata.posterior
    b = post["b"].values.reshape(-1)
    w = post["w"].values.reshape(-1, post["w"].shape[-1])
    X, y = d["X_test"], d["y_test"]
    if mean is None:
        mean = np.concatenate([[b.mean()], w.mean(0)])
    err = float(np.mean(((mean[0] + X @ mean[1:]) > 0).astype(int) != y))
    margin = np.abs(mean[0] + X @ mean[1:])
    logits = b[:, None] + w @ X.T  # (draws, n_test)
    p = np.mean(1.0 / (1.0 + np.exp(-logits)), axis=0)
    p = np.clip(p, 1e-12, 1 - 1e-12)
    log_loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
    return {"test_error": err, "test_log_loss": log_loss, "mean": mean,
            "sd": np.concatenate([[b.std()], w.std(0)]), "smallest_test_margins": np.sort(margin)[:3].tolist()}


def ep_moments(idata) -> tuple[np.ndarray, np.ndarray]:
    """EP posterior means and sds of (b, w) in closed form."""
    q = pmkjit.ep_posterior(idata)
    mean = np.concatenate([np.ravel(q["b"].mean()), np.ravel(q["w"].mean())])
    sd = np.sqrt(np.concatenate([np.ravel(q["b"].var()), np.ravel(q["w"].var())]))
    return mean, sd


class LastBatchTap:
    """Instrumentation: the last batch of messages a KJIT method answered (EP's last sweep), and its answer."""

    def __init__(self):
        self.last = None

    def __enter__(self):
        from pmkjit.ep import methods

        self._methods, self._orig = methods, methods.KJITMethod.__call__
        tap, orig = self, self._orig

        def call(method, messages):
            answer = orig(method, messages)
            tap.last = (method.factor, tuple(messages), answer)
            return answer

        methods.KJITMethod.__call__ = call
        return self

    def __exit__(self, *exc):
        self._methods.KJITMethod.__call__ = self._orig
        return False


def site_errors(last, seed: int) -> dict:
    """Errors of the outgoing messages KJIT predicted in EP's last sweep, against quadrature.

    In the operator's own units (g = (mean_b - mean_c) / v_c, t = log(v_c / v_b) / v_c of
    each cavity c and belief b): mean (bias) and sd over the predicted messages; and the same
    for a fresh importance-sampling answer (1e5 samples) to the same messages, for scale.
    """
    from pmkjit.ep.methods import FactorOracle

    factor, msgs, answer = last
    rng = np.random.default_rng(seed)
    truth = FactorOracle(factor, "quadrature", rng=rng)(msgs)
    sampled = FactorOracle(factor, "importance", rng=rng)(msgs)
    cav = msgs[0]

    def g_t(belief):
        mc, vc, mb, vb = cav.mean(), cav.var(), belief.mean(), belief.var()
        return np.stack([(mb - mc) / vc, np.log(vc / vb) / vc], axis=1)

    ref = g_t(truth.beliefs[0])
    predicted = ~np.asarray(answer.asked, bool)
    e_kjit = (g_t(answer.beliefs[0]) - ref)[predicted]
    e_is = g_t(sampled.beliefs[0]) - ref
    out = {"messages": int(len(predicted)), "predicted": int(predicted.sum())}
    for label, e in (("kjit", e_kjit), ("importance", e_is)):
        if len(e):
            out[label] = {"g_bias": float(e[:, 0].mean()), "g_sd": float(e[:, 0].std()),
                          "t_bias": float(e[:, 1].mean()), "t_sd": float(e[:, 1].std())}
    return out


class Recorder:
    """fit(callback=...): the KJIT operator's predictive variance of every message, per sweep."""

    def __init__(self):
        self.sweeps: list[dict] = []
        self.dataset = ""

    def __call__(self, info) -> None:
        var = [np.asarray(v, dtype=float) for v in info.variance.values()]
        asked = [np.asarray(a, dtype=bool) for a in info.asked.values()]
        self.sweeps.append({
            "dataset": self.dataset, "sweep": int(info.sweep),
            "variance": np.concatenate(var) if var else np.zeros((0, 2)),
            "asked": np.concatenate(asked) if asked else np.zeros(0, bool),
            "max_change": float(info.max_change), "damping": float(info.damping),
        })


def run_method(method: str, model: pm.Model, d: dict, args, store: str, recorder: Recorder,
               sweeps_hint: int | None = None) -> dict:
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if method == "nuts":
            idata = pm.sample(model=model, random_seed=args.seed, progressbar=False, chains=2, cores=1,
                              compute_convergence_checks=False)
        else:
            kw = dict(model=model, method=method, random_seed=args.seed, progressbar=False,
                      compute_log_likelihood=False, max_sweeps=args.max_sweeps, tol=args.tol)
            tap = LastBatchTap()
            if method == "kjit":
                recorder.dataset = d["name"]
                kw.update(oracle="importance", operators=store, callback=recorder)
            elif method == "oracle":
                kw.update(max_sweeps=args.oracle_sweeps or sweeps_hint or args.max_sweeps)
            with tap:
                idata = pmkjit.fit(**kw)
    seconds = time.perf_counter() - t0
    row = {"dataset": d["name"], "method": method, "seconds": seconds,
           "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught
                               if not issubclass(w.category, (DeprecationWarning, FutureWarning))})}
    ep_mean_sd = ep_moments(idata) if method != "nuts" else None
    ev = evaluate(idata, d, None if ep_mean_sd is None else ep_mean_sd[0])
    row.update(test_error=ev["test_error"], test_log_loss=ev["test_log_loss"],
               test_errors=int(round(ev["test_error"] * len(d["y_test"]))),
               smallest_test_margins=ev["smallest_test_margins"])
    if method == "nuts":
        row["mean"], row["sd"] = ev["mean"], ev["sd"]
        row["min_ess_bulk"] = float(min(float(pm.stats.ess(idata, var_names=[v]).to_array().min()) for v in ("b", "w")))
        row["max_rhat"] = float(max(float(pm.stats.rhat(idata, var_names=[v]).to_array().max()) for v in ("b", "w")))
        row["divergences"] = int(idata.sample_stats["diverging"].sum())
    else:
        ep = idata.ep
        row["mean"], row["sd"] = ep_mean_sd
        row.update(sweeps=int(ep.attrs["sweeps"]), converged=bool(ep.attrs["converged"]),
                   oracle_calls=int(ep["oracle_calls"].sum()),
                   convergence=[float(c) for c in ep["convergence"].values],
                   damping_final=float(ep.attrs["damping_final"]),
                   seconds_by_part={k[8:]: float(v) for k, v in ep.attrs.items() if k.startswith("seconds_")},
                   guards={k: int(ep.attrs[k]) for k in ("skipped_improper_cavity", "damping_halvings",
                                                          "rejected_updates", "unanswered")})
    if method == "kjit":
        mine = [s for s in recorder.sweeps if s["dataset"] == d["name"]]
        asked = np.concatenate([s["asked"] for s in mine])
        row.update(messages=int(asked.size), messages_asked=int(asked.sum()),
                   kjit_predictions=int(asked.size - asked.sum()),
                   oracle_fraction=float(asked.mean()), operator=operator_state(store, args.tol))
        if tap.last is not None:  # after the timing: a check, not part of the fit
            row["last_sweep_site_errors"] = site_errors(tap.last, args.seed)
    return row


def operator_state(store: str, tol: float) -> dict:
    """The stored operator after a fit: thresholds in force, noise variance, answers learned."""
    from pmkjit.operators import KJITOperator

    files = sorted(f for f in Path(store).glob("*.npz") if not f.name.endswith(".pending.npz"))
    if not files:
        return {}
    op = KJITOperator.load(files[0])
    op.tolerance = tol  # as pmkjit.fit sets it (not stored in the file)
    return {"file": files[0].name, "thresholds": [float(v) for v in op.current_thresholds()],
            "calibrated_thresholds": [float(v) for v in op.thresholds_],
            "noise_var": [float(v) for v in np.ravel(op.regression_.noise_var_)],
            "oracle_calls_total": int(op.n_oracle_calls), "predictions_total": int(op.n_predictions)}



def log10_var(s: dict) -> np.ndarray:
    """log10 of each message's variance summed over the outputs (messages with no operator dropped)."""
    v = np.sum(s["variance"], axis=1)
    v = v[np.isfinite(v) & (v > 0)]
    return np.log10(v)


def quantile(s: dict, q: float) -> float:
    v = log10_var(s)
    return float(np.quantile(v, q)) if v.size else float("nan")


def jumps(sweeps: list[dict], names: list[str], peak_within: int = 3) -> dict:
    """Jump of the log10 variance at each dataset start, and oracle-call fractions per sweep."""
    out = {}
    per = {n: [s for s in sweeps if s["dataset"] == n] for n in names}
    for prev, cur in zip(names, names[1:]):
        if not per[prev] or not per[cur]:
            continue
        row = {}
        for label, q in (("median", 0.5), ("p90", 0.9)):
            last = quantile(per[prev][-1], q)
            early = [quantile(s, q) for s in per[cur][:peak_within]]
            k = int(np.nanargmax(early))
            row[label] = {"last_sweep_previous": last, "first_sweep": early[0], "peak": early[k],
                          "peak_sweep": k + 1, "jump_first_sweep": early[0] - last, "jump_peak": early[k] - last}
        out[cur] = row
    rates = {}
    for n in names:
        ss = per[n]
        if not ss:
            continue
        frac = [float(s["asked"].mean()) for s in ss]
        later = np.concatenate([s["asked"] for s in ss[2:]]) if len(ss) > 2 else np.zeros(0, bool)
        rates[n] = {"oracle_fraction_by_sweep": frac,
                    "oracle_fraction_sweeps_3_on": float(later.mean()) if later.size else float("nan"),
                    "oracle_calls_by_sweep": [int(s["asked"].sum()) for s in ss],
                    "median_log10_var_by_sweep": [quantile(s, 0.5) for s in ss],
                    "p90_log10_var_by_sweep": [quantile(s, 0.9) for s in ss]}
    return {"jumps": out, "per_dataset": rates, "peak_within_sweeps": peak_within}


def plot_uncertainty(sweeps: list[dict], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    var = np.concatenate([s["variance"] for s in sweeps])
    asked = np.concatenate([s["asked"] for s in sweeps])
    t = np.arange(len(var))
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    titles = ["output 1: g = (mean_b - mean_c) / v_c", "output 2: t = log(v_c / v_b) / v_c"]
    starts, pos = [], 0
    for n in names:
        starts.append(pos)
        pos += sum(len(s["variance"]) for s in sweeps if s["dataset"] == n)
    sweep_starts = np.cumsum([0] + [len(s["variance"]) for s in sweeps])[:-1]
    for k, ax in enumerate(axes):
        v = var[:, k] if var.shape[1] > k else np.full(len(var), np.nan)
        ax.scatter(t[~asked], v[~asked], s=1.5, c="tab:blue", alpha=0.5, lw=0, label="predicted by KJIT")
        ax.scatter(t[asked], v[asked], s=1.5, c="tab:red", alpha=0.6, lw=0, label="sent to the oracle")
        ax.set_yscale("log")
        ax.set_ylabel("predictive variance")
        ax.text(0.995, 0.96, titles[k], transform=ax.transAxes, ha="right", va="top", fontsize=9,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
        first = sweeps[0]["variance"]
        n_none = int(np.sum(~np.isfinite(first).all(axis=1)))
        if n_none:
            ax.axvspan(0, len(first), color="0.9", zorder=0,
                       label=f"first sweep: {n_none} of {len(first)} messages answered by the oracle\n"
                             "before any operator existed (no variance to plot)")
        for s0 in sweep_starts:
            ax.axvline(s0, color="0.85", lw=0.5, zorder=0)
        for s0, n in zip(starts, names):
            ax.axvline(s0, color="k", lw=1.2, ls="--")
            if k == 0:
                ax.text(s0, 1.02, f" * {n}", transform=ax.get_xaxis_transform(), fontsize=8, va="bottom")
    axes[0].legend(loc="lower right", fontsize=8, markerscale=6)
    axes[-1].set_xlabel("message index (all sweeps of all datasets, in order; thin lines: sweeps)")
    fig.suptitle("KJIT epistemic predictive variance of every incoming message, four UCI datasets in sequence",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_error_time(rows: list[dict], names: list[str], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(methods)
    x = np.arange(len(names))
    for j, m in enumerate(methods):
        err = [next((r["test_error"] for r in rows if r["dataset"] == n and r["method"] == m), np.nan) for n in names]
        sec = [next((r["seconds"] for r in rows if r["dataset"] == n and r["method"] == m), np.nan) for n in names]
        axes[0].bar(x + (j - (len(methods) - 1) / 2) * width, err, width, label=LABELS[m])
        axes[1].bar(x + (j - (len(methods) - 1) / 2) * width, sec, width, label=LABELS[m])
    for ax, lab in zip(axes, ["test error (posterior-mean classifier)", "wall time, s"]):
        ax.set_xticks(x, names, fontsize=8)
        ax.set_ylabel(lab)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def code_version() -> dict:
    """The commit the run used and the library files that differed from it (shared working tree)."""
    import subprocess

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD").strip(),
            "modified_library_files": [ln[3:] for ln in git("status", "--porcelain", "--", "pmkjit").splitlines()]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--train-fraction", type=float, default=None,
                        help="stratified training fraction (default: the paper's 200 points, fertility 50)")
    parser.add_argument("--max-sweeps", type=int, default=50, help="EP sweeps at most (KJIT and quadrature)")
    parser.add_argument("--tol", type=float, default=1e-3, help="EP convergence tolerance (pmkjit.fit's default)")
    parser.add_argument("--oracle-sweeps", type=int, default=None,
                        help="sweeps of importance-sampling EP (default: as many as KJIT-EP took on the dataset)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "jit_uci.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "jit_uci_uncertainty.png")
    parser.add_argument("--figure-errors", type=Path, default=ROOT / "docs" / "img" / "jit_uci_error_time.png")
    args = parser.parse_args(argv)

    t_start = time.perf_counter()
    recorder = Recorder()
    rows, data_info = [], {}
    with tempfile.TemporaryDirectory() as store:
        for name in args.datasets:
            d = load(name, args.seed, args.train_fraction)
            data_info[name] = {"n_train": int(len(d["y_train"])), "n_test": int(len(d["y_test"])),
                               "n_features": len(d["features"]), "dropped_constant": d["dropped"],
                               "positive_fraction_train": float(d["y_train"].mean())}
            model = build_model(d)
            by_method = {}
            for method in args.methods:
                hint = by_method["kjit"]["sweeps"] if "kjit" in by_method else None
                r = run_method(method, model, d, args, store, recorder, hint)
                by_method[method] = r
                rows.append(r)
            ref = by_method.get("quadrature")
            for m, r in by_method.items():
                if ref is not None and m != "quadrature":
                    r["max_z_vs_quadrature"] = float(np.max(np.abs(r["mean"] - ref["mean"]) / ref["sd"]))
                    ratio = r["sd"] / ref["sd"]
                    r["sd_ratio_vs_quadrature"] = [float(ratio.min()), float(ratio.max())]
            for r in by_method.values():
                z = f"{r['max_z_vs_quadrature']:.3f}" if "max_z_vs_quadrature" in r else "  -  "
                extra = (f" sweeps {r['sweeps']:2d} conv {int(r['converged'])} oracle {r['oracle_calls']:6d} "
                         f"pred {r.get('kjit_predictions', 0):6d}") if "sweeps" in r else ""
                print(f"{name:17s} {r['method']:10s} err {r['test_error']:.4f} logloss {r['test_log_loss']:.4f} "
                      f"{r['seconds']:7.1f} s  z_vs_quad {z}{extra}", flush=True)
    for r in rows:
        r["mean"], r["sd"] = [float(v) for v in r["mean"]], [float(v) for v in r["sd"]]

    names = list(args.datasets)
    summary = {}
    if recorder.sweeps:
        summary = jumps(recorder.sweeps, names)
        plot_uncertainty(recorder.sweeps, names, args.figure)
    plot_error_time(rows, names, list(args.methods), args.figure_errors)

    def get(m, n, key):
        return next((r[key] for r in rows if r["method"] == m and r["dataset"] == n), None)

    ratios = {}
    for n in names:
        ratios[n] = {}
        for m in ("oracle", "quadrature", "nuts"):
            if get("kjit", n, "seconds") and get(m, n, "seconds"):
                ratios[n][f"{m}_seconds_over_kjit"] = get(m, n, "seconds") / get("kjit", n, "seconds")
        if get("kjit", n, "test_error") is not None and get("quadrature", n, "test_error") is not None:
            ratios[n]["kjit_minus_quadrature_error"] = get("kjit", n, "test_error") - get("quadrature", n, "test_error")
    totals = {m: {"seconds_all": float(sum(r["seconds"] for r in rows if r["method"] == m)),
                  "seconds_after_first": float(sum(r["seconds"] for r in rows if r["method"] == m
                                                   and r["dataset"] != names[0]))}
              for m in args.methods}
    if "kjit" in totals:
        for m in totals:
            if m != "kjit":
                totals[m]["seconds_over_kjit_all"] = totals[m]["seconds_all"] / totals["kjit"]["seconds_all"]
                totals[m]["seconds_over_kjit_after_first"] = (totals[m]["seconds_after_first"]
                                                              / max(totals["kjit"]["seconds_after_first"], 1e-12))
    result = {
        "rows": rows,
        "uncertainty": summary,
        "ratios": ratios,
        "totals": totals,
        "data": data_info,
        "settings": {
            "seed": args.seed, "split": "stratified, the paper's 200 training points (fertility 50)"
            if args.train_fraction is None else f"stratified, training fraction {args.train_fraction}",
            "max_sweeps": args.max_sweeps, "tol": args.tol,
            "oracle_sweeps": args.oracle_sweeps or "as many as KJIT-EP took on the dataset",
            "priors": "b ~ N(0, 2.5^2), w ~ N(0, I) on standardised features",
            "kjit": "pmkjit.fit(method='kjit', oracle='importance', operators=<one directory for all datasets>)",
            "nuts": "pm.sample(chains=2, cores=1): 1000 tune + 1000 draws per chain",
            "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
        },
        "machine": {"python": platform.python_version(), "processor": platform.machine(),
                    "platform": platform.platform(), "numpy": np.__version__, "pymc": pm.__version__,
                    "cpus": os.cpu_count()},
        "code": code_version(),
        "wall_seconds": time.perf_counter() - t_start,
        "command": " ".join(["python", "benchmarks/jit_uci.py", *sys.argv[1:]]) if argv is None else
        " ".join(["python", "benchmarks/jit_uci.py", *argv]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for n, j in summary.get("jumps", {}).items():
        print(f"jump at {n:17s} median log10 var: first sweep {j['median']['jump_first_sweep']:+.2f}, "
              f"peak (sweep {j['median']['peak_sweep']}) {j['median']['jump_peak']:+.2f}; "
              f"90th pct: first {j['p90']['jump_first_sweep']:+.2f}, peak {j['p90']['jump_peak']:+.2f}")
    for n, v in summary.get("per_dataset", {}).items():
        print(f"oracle fraction {n:17s} by sweep {np.round(v['oracle_fraction_by_sweep'], 3).tolist()}")
    print("totals:", json.dumps(totals))
    print(f"wrote {args.out} in {result['wall_seconds']:.0f} s")
    return result


if __name__ == "__main__":
    main()
