"""Uncertainty where there is no data (KJIT paper, section 5; issue 5, experiment 4).

Does a message operator know when an incoming message lies outside everything it was
trained on? The factor is the logistic factor of ``benchmarks/message_prediction.py``,
f(p | z) = delta(p - sigmoid(z)) with incoming N(z; mu, sigma^2) and Beta(p; 1 + y, 2 - y)
for a Bernoulli observation y. Messages are collected exactly as there (parallel EP on
20 toy logistic-regression problems, first 5 iterations; the same seeded 5,000 training
tuples); targets are the quadrature oracle's projected beliefs q(z).

Three regressors are fitted on the same training tuples and the same targets (the
belief relative to the incoming Gaussian: mean shift in incoming standard deviations
and log variance ratio, the KJIT operator's default):

* the KJIT operator (Gaussian kernel on joint mean embeddings, D_in = 500,
  D_out = 1000); uncertainty = its epistemic predictive variance;
* scikit-learn's ``RandomForestRegressor`` and ``ExtraTreesRegressor`` on the inputs
  (mu, log sigma^2, y); uncertainty = variance of the per-tree predictions.

Uncertainties are summed over the two outputs. Two paths of incoming Gaussians (y = 1)
leave the region of the training messages: the mean grows from the training median far
beyond the largest training mean at the median variance, and the log variance grows
from its training median far beyond its largest training value at mean 0. Along each
path the script reports, per method, how the uncertainty grows with the distance from
the training set (nearest-neighbour distance in the standardised input space; the
Mahalanobis distance to the training inputs is saved too), the fraction of consecutive
steps on which it does not decrease, its Spearman correlation with distance, and its
Spearman correlation with the true error log KL[q || q_hat] (the metric of
message_prediction.py). The quadrature oracle along the paths, which go beyond the
range it is tested on, is checked against a brute-force grid.

Prints a table and saves ``benchmarks/results/uncertainty_unexplored.json`` and
``docs/img/uncertainty_unexplored.png``.

BLAS runs on one thread throughout: on the shared 2-core machine, a multi-threaded
OpenBLAS eigendecomposition (the regression's evidence search) slowed down up to 30-fold
whenever another process held a core; the figures do not depend on it.

Run: ``python benchmarks/uncertainty_unexplored.py`` (about 1 minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import special, stats
from scipy.spatial import cKDTree
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark, also when imported
from message_prediction import ROOT, collect_split, log_kl, messages_of  # noqa: E402

from pmkjit.families import Beta, Gaussian  # noqa: E402
from pmkjit.features import GaussianJointEmbeddingFeatures  # noqa: E402
from pmkjit.operators import KJITOperator  # noqa: E402

METHODS = ("KJIT", "random forest", "extra trees")


# ------------------------------------------------------------------ targets
def relative_targets(belief: Gaussian, incoming: Gaussian) -> np.ndarray:
    """KJIT's relative regression targets: mean shift in incoming sds, log variance ratio."""
    sd = np.sqrt(incoming.var())
    return np.stack([(belief.mean() - incoming.mean()) / sd, np.log(belief.var() / incoming.var())], axis=1)


def from_relative_targets(Y: np.ndarray, incoming: Gaussian) -> Gaussian:
    return Gaussian(incoming.mean() + Y[:, 0] * np.sqrt(incoming.var()), incoming.var() * np.exp(Y[:, 1]))


def inputs_of(mu: np.ndarray, var: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The forests' inputs, and the space distances are measured in: (mu, log var, y)."""
    return np.column_stack([mu, np.log(var), y])


# ------------------------------------------------------------------ methods
def forest_predict(forest, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean prediction and variance across trees, shapes (n, n_outputs)."""
    per_tree = np.stack([tree.predict(X) for tree in forest.estimators_])  # (T, n, K)
    return per_tree.mean(axis=0), per_tree.var(axis=0)


def predict_all(models: dict, mu, var, y) -> dict:
    """Per method: predicted belief q_hat and uncertainty (summed over outputs)."""
    msgs = messages_of(mu, var, y)
    out = {}
    (pred,), v = models["KJIT"].predict(msgs)
    out["KJIT"] = (pred, v.sum(axis=1))  # inf where a prediction decodes to no proper Gaussian
    X = inputs_of(mu, var, y)
    for name in METHODS[1:]:
        m, v = forest_predict(models[name], X)
        out[name] = (from_relative_targets(m, msgs[0]), v.sum(axis=1))
    return out


def errors_of(truth: Gaussian, predictions: dict) -> dict:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return {name: log_kl(truth, pred) for name, (pred, _) in predictions.items()}


# ---------------------------------------------------------------- statistics
def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman rank correlation over the entries where both are finite (None if undefined)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(a[ok], b[ok]).statistic)


def path_summary(dist: np.ndarray, unc: np.ndarray, err: np.ndarray, reference: float, outside: np.ndarray) -> dict:
    """Growth, monotonicity and error correlation of one method's uncertainty along one path."""
    steps = np.diff(unc)
    rel = steps / np.maximum(np.abs(unc[:-1]), 1e-300)
    out_steps = outside[1:] & outside[:-1]
    return {
        "uncertainty_start": float(unc[0]),
        "uncertainty_end": float(unc[-1]),
        "uncertainty_max": float(np.max(unc)),
        "end_over_start": float(unc[-1] / unc[0]) if unc[0] > 0 else None,
        "end_over_in_distribution_median": float(unc[-1] / reference) if reference > 0 else None,
        "fraction_steps_not_decreasing": float(np.mean(steps >= 0)),
        "fraction_steps_increasing": float(np.mean(steps > 0)),
        "fraction_steps_not_decreasing_outside_training_range": (
            float(np.mean(steps[out_steps] >= 0)) if out_steps.any() else None
        ),
        "largest_relative_decrease": float(max(0.0, -np.min(rel))),
        "spearman_uncertainty_distance": spearman(unc, dist),
        "spearman_uncertainty_error": spearman(unc, err),
        "mean_log_kl": float(np.mean(err[np.isfinite(err)])),
        "n_infinite_uncertainty": int(np.sum(~np.isfinite(unc))),
    }


def brute_force_beliefs(mu: np.ndarray, var: np.ndarray, y: np.ndarray, n: int = 400_001) -> Gaussian:
    """Projected tilted beliefs on a dense uniform grid over +-60 sds (checks the oracle)."""
    means, variances = np.empty(mu.size), np.empty(mu.size)
    t = np.linspace(-60.0, 60.0, n)
    for i, (m, v, yi) in enumerate(zip(mu, var, y)):
        z = m + np.sqrt(v) * t
        logw = -0.5 * t**2 + (special.log_expit(z) if yi == 1 else special.log_expit(-z))
        w = np.exp(logw - logw.max())
        w /= w.sum()
        means[i] = w @ z
        variances[i] = w @ (z - means[i]) ** 2
    return Gaussian(means, variances)


# --------------------------------------------------------------------- main
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--n-train", type=int, default=5000)
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--n-inner", type=int, default=500)
    parser.add_argument("--n-outer", type=int, default=1000)
    parser.add_argument("--orthogonal-outer", action="store_true", help="orthogonal random outer frequencies")
    parser.add_argument("--n-trees", type=int, default=200)
    parser.add_argument("--n-path", type=int, default=50)
    parser.add_argument("--path-y", type=float, default=1.0, help="observation on both paths")
    parser.add_argument("--mean-end", type=float, default=60.0, help="last mean of the mean path")
    parser.add_argument("--logvar-end", type=float, default=12.0, help="last log variance of the variance path")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "uncertainty_unexplored.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "uncertainty_unexplored.png")
    args = parser.parse_args(argv)
    with threadpool_limits(limits=1, user_api="blas"):
        return run(args)


def run(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    from sklearn import __version__ as sklearn_version
    from sklearn.ensemble import ExtraTreesRegressor, RandomForestRegressor

    # -- training messages: the same collection and the same seeded split as message_prediction.py
    split = collect_split(args.problems, args.seed, args.n_train, args.n_test)
    mu, var, y, tr, te, quad = split.mu, split.var, split.y, split.tr, split.te, split.oracle
    train, truth_train, truth_test = split.train, split.truth_train, split.truth_test
    X_train = inputs_of(mu[tr], var[tr], y[tr])
    Y_train = relative_targets(truth_train, train[0])
    lo, hi = X_train.min(axis=0), X_train.max(axis=0)
    print(f"  {mu.size} tuples collected, {args.n_train} for training: means in [{lo[0]:.1f}, {hi[0]:.1f}], "
          f"log variances in [{lo[1]:.2f}, {hi[1]:.2f}]")

    # -- the three regressors, same inputs and targets
    print("fitting ...", flush=True)
    fit_seconds = {}
    t0 = time.perf_counter()
    op = KJITOperator((Gaussian, Beta), targets=(0,), features=GaussianJointEmbeddingFeatures(
        args.n_inner, args.n_outer, orthogonal_outer=args.orthogonal_outer),
                      random_state=args.seed)
    # The forests are fitted on relative_targets below: make sure they are also the operator's.
    form = getattr(op, "target_form", "relative" if getattr(op, "relative", True) else "absolute")
    if form != "relative":
        raise RuntimeError(f"KJITOperator's default targets are now {form!r}; update relative_targets")
    op.fit(train, (truth_train,))
    fit_seconds["KJIT"] = time.perf_counter() - t0
    forest_rng = np.random.default_rng(args.seed + 3)
    forest_seeds = {name: int(forest_rng.integers(2**31 - 1)) for name in METHODS[1:]}  # sklearn takes ints
    models = {"KJIT": op}
    for name, cls in (("random forest", RandomForestRegressor), ("extra trees", ExtraTreesRegressor)):
        t0 = time.perf_counter()
        models[name] = cls(n_estimators=args.n_trees, random_state=forest_seeds[name], n_jobs=2).fit(X_train, Y_train)
        fit_seconds[name] = time.perf_counter() - t0
    print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in fit_seconds.items()))

    # -- in-distribution reference: held-out test tuples
    pred_test = predict_all(models, mu[te], var[te], y[te])
    err_test = errors_of(truth_test, pred_test)
    in_dist = {
        name: {
            "median_uncertainty": float(np.median(pred_test[name][1])),
            "mean_log_kl": float(np.mean(err_test[name])),
            "sd_log_kl": float(np.std(err_test[name])),
            "spearman_uncertainty_error": spearman(pred_test[name][1], err_test[name]),
        }
        for name in METHODS
    }

    # -- two paths out of the training region, and distances to the training inputs
    x_mean, x_sd = X_train.mean(axis=0), X_train.std(axis=0)
    tree = cKDTree((X_train - x_mean) / x_sd)
    cov_inv = np.linalg.inv(np.cov(X_train, rowvar=False))
    med_mu, med_lv = float(np.median(mu[tr])), float(np.median(np.log(var[tr])))
    n = args.n_path
    paths = {
        "mean": (np.linspace(med_mu, args.mean_end, n), np.full(n, med_lv), 0, hi[0]),
        "log variance": (np.full(n, 0.0), np.linspace(med_lv, args.logvar_end, n), 1, hi[1]),
    }
    path_results, path_data = {}, {}
    oracle_check = []
    for pname, (p_mu, p_lv, axis, edge) in paths.items():
        p_var, p_y = np.exp(p_lv), np.full(n, args.path_y)
        X = inputs_of(p_mu, p_var, p_y)
        nn_dist = tree.query((X - x_mean) / x_sd)[0]
        diff = X - x_mean
        maha = np.sqrt(np.einsum("ni,ij,nj->n", diff, cov_inv, diff))
        outside = X[:, axis] > edge
        msgs = messages_of(p_mu, p_var, p_y)
        truth = quad(msgs).beliefs[0]
        brute = brute_force_beliefs(p_mu, p_var, p_y)
        oracle_check.append(np.max(np.abs(relative_targets(truth, msgs[0]) - relative_targets(brute, msgs[0]))))
        preds = predict_all(models, p_mu, p_var, p_y)
        errs = errors_of(truth, preds)
        path_results[pname] = {
            name: path_summary(nn_dist, preds[name][1], errs[name], in_dist[name]["median_uncertainty"], outside)
            for name in METHODS
        }
        path_data[pname] = {
            "mean": p_mu.tolist(), "log_variance": p_lv.tolist(), "y": p_y.tolist(),
            "nearest_neighbour_distance": nn_dist.tolist(), "mahalanobis_distance": maha.tolist(),
            "outside_training_range": outside.tolist(),
            "first_index_outside": int(np.argmax(outside)) if outside.any() else None,
            "true_relative_targets": relative_targets(truth, msgs[0]).tolist(),
            "uncertainty": {name: [float(v) for v in preds[name][1]] for name in METHODS},
            "log_kl": {name: [float(v) for v in errs[name]] for name in METHODS},
        }
        for name in METHODS:
            path_data[pname][f"spearman_uncertainty_mahalanobis_{name}"] = spearman(preds[name][1], maha)
    oracle_check = float(max(oracle_check))

    # -- error correlation pooled over both paths (the unexplored region as a whole)
    pooled = {}
    for name in METHODS:
        unc = np.concatenate([path_data[p]["uncertainty"][name] for p in paths])
        err = np.concatenate([path_data[p]["log_kl"][name] for p in paths])
        pooled[name] = spearman(unc, err)

    # -- table
    print(f"\nquadrature oracle vs brute-force grid along the paths: max |difference of relative targets| "
          f"= {oracle_check:.1e}")
    print(f"\nin-distribution test set ({args.n_test} tuples): median uncertainty, log KL, Spearman(unc, log KL)")
    for name in METHODS:
        r = in_dist[name]
        print(f"  {name:14s} {r['median_uncertainty']:10.3g}   {r['mean_log_kl']:7.2f} ± {r['sd_log_kl']:.2f}"
              f"   {_fmt(r['spearman_uncertainty_error'])}")
    head = (f"  {'method':14s} {'unc start':>10s} {'unc end':>10s} {'end/in-dist':>11s} {'not decr':>8s} "
            f"{'(outside)':>9s} {'incr':>6s} {'rho(dist)':>9s} {'rho(err)':>8s} {'log KL':>7s}")
    for pname in paths:
        d = path_data[pname]
        print(f"\npath: {pname} (y = {args.path_y:g}); nearest-neighbour distance {d['nearest_neighbour_distance'][0]:.2f}"
              f" -> {d['nearest_neighbour_distance'][-1]:.2f}; leaves the training range at step "
              f"{d['first_index_outside']} of {n}")
        print(head)
        for name in METHODS:
            r = path_results[pname][name]
            print(f"  {name:14s} {r['uncertainty_start']:10.3g} {r['uncertainty_end']:10.3g} "
                  f"{r['end_over_in_distribution_median']:11.3g} {r['fraction_steps_not_decreasing']:8.2f} "
                  f"{_fmt(r['fraction_steps_not_decreasing_outside_training_range']):>9s} "
                  f"{r['fraction_steps_increasing']:6.2f} {_fmt(r['spearman_uncertainty_distance']):>9s} "
                  f"{_fmt(r['spearman_uncertainty_error']):>8s} {r['mean_log_kl']:7.2f}")
    print("\nSpearman(uncertainty, log KL) pooled over both paths: "
          + ", ".join(f"{name} {_fmt(pooled[name])}" for name in METHODS))

    kjit_monotone = all(path_results[p]["KJIT"]["fraction_steps_not_decreasing"] == 1.0 for p in paths)
    def beats_forests(rhos: dict) -> bool:
        return rhos["KJIT"] is not None and all(rhos[m] is None or rhos["KJIT"] > rhos[m] for m in METHODS[1:])

    better = {p: beats_forests({m: path_results[p][m]["spearman_uncertainty_error"] for m in METHODS}) for p in paths}
    better["pooled"] = beats_forests(pooled)
    print("KJIT's Spearman(uncertainty, log KL) above both forests: "
          + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in better.items()))
    kjit_better = all(better.values())
    targets = {"kjit_uncertainty_monotone_along_both_paths": bool(kjit_monotone),
               "kjit_error_correlation_above_both_forests": bool(kjit_better)}
    print(f"targets: {targets}")

    figure_written = _figure(args.figure, path_data, path_results, in_dist, paths)

    result = {
        "targets": targets,
        "target_definitions": {
            "kjit_uncertainty_monotone_along_both_paths": "KJIT's uncertainty does not decrease on any of the "
            "n_path - 1 consecutive steps of either path",
            "kjit_error_correlation_above_both_forests": "Spearman(uncertainty, log KL) is larger for KJIT than "
            "for the random forest and for extra trees on each path and pooled over the points of both paths",
        },
        "spearman_uncertainty_error_pooled_paths": pooled,
        "kjit_error_correlation_above_both_forests": better,
        "paths": path_results,
        "in_distribution_test": in_dist,
        "path_data": path_data,
        "oracle_check_max_abs_difference_relative_targets": oracle_check,
        "training_range": {"mean": [float(lo[0]), float(hi[0])], "log_variance": [float(lo[1]), float(hi[1])]},
        "kjit": {
            "hyperparameters": {k: float(v) for k, v in op.hyperparameters_.items()},
            "regularization": float(op.regression_.regularization_),
            "thresholds": op.thresholds_.tolist(),
        },
        "fit_seconds": fit_seconds,
        "uncertainty_definition": "sum over the two relative targets (mean shift in incoming sds, log variance "
        "ratio) of KJIT's epistemic predictive variance / of the variance of the per-tree predictions",
        "error_definition": "log KL[q || q_hat], q from the quadrature oracle (as in message_prediction.py)",
        "distance_definition": "Euclidean distance to the nearest training input in (mean, log variance, y) "
        "standardised by the training mean and sd; Mahalanobis distance to the training inputs also saved",
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "split_seed": args.seed + 1,
            "kjit_random_state": args.seed,
            "forest_random_states": forest_seeds,
            "forest_seed_generator": f"numpy.random.default_rng({args.seed + 3}).integers(2**31 - 1)",
            "forest_params": {"n_estimators": args.n_trees, "other": "scikit-learn defaults"},
            "blas_threads": 1,
            "ep_collection": {"problems": args.problems, "iterations": 5, "d": 20, "n": 400, "damping": 0.5},
        },
        "n_messages_collected": int(mu.size),
        "figure": str(args.figure) if figure_written else None,
        "machine": {
            "python": platform.python_version(), "processor": platform.machine(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "numpy": np.__version__, "scikit-learn": sklearn_version,
        },
        "wall_seconds": time.perf_counter() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out} in {result['wall_seconds']:.0f} s")
    return result


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _figure(path: Path, path_data: dict, path_results: dict, in_dist: dict, paths: dict) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  matplotlib not installed: no figure")
        return False
    colours = dict(zip(METHODS, ("C0", "C1", "C2")))
    fig, axes = plt.subplots(2, len(paths), figsize=(10, 7), sharex="col")
    for j, pname in enumerate(paths):
        d = path_data[pname]
        dist = np.asarray(d["nearest_neighbour_distance"])
        for name in METHODS:
            unc = np.asarray(d["uncertainty"][name])
            unc = np.where(np.isfinite(unc), unc, np.nan)
            rho = path_results[pname][name]["spearman_uncertainty_error"]
            axes[0, j].semilogy(dist, unc, ".-", color=colours[name], label=name)
            axes[0, j].axhline(in_dist[name]["median_uncertainty"], color=colours[name], ls=":", lw=1)
            axes[1, j].plot(dist, d["log_kl"][name], ".-", color=colours[name],
                            label=f"{name} (Spearman with unc. {_fmt(rho)})")
        if d["first_index_outside"] is not None:
            for ax in axes[:, j]:
                ax.axvline(dist[d["first_index_outside"]], color="grey", ls="--", lw=1)
        axes[0, j].set_title(f"path: {pname} increasing (y = {d['y'][0]:g})")
        axes[0, j].set_ylabel("uncertainty (sum of variances)")
        axes[1, j].set_ylabel("log KL[q || q_hat]")
        axes[1, j].set_xlabel("nearest-neighbour distance to training inputs (standardised)")
        axes[1, j].legend(fontsize=7)
    axes[0, 0].legend(fontsize=8, title="dotted: in-distribution median\ndashed: leaves training range",
                      title_fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"  figure: {path}")
    return True


if __name__ == "__main__":
    main()
