"""Reproduce the revrand report's three tables offline, plus fit-time scaling against an exact GP.

Run (about 12-20 minutes on a 2-core machine; ``--tables classification`` runs one table)::

    pip install -e ".[bench]" && python benchmarks/revrand_tables.py

Writes ``benchmarks/results/revrand_tables.json``. Data ship with scikit-learn (no
download at run time); where the report's datasets cannot be had offline the closest
bundled ones stand in:

* Table 2 (Boston housing, removed from scikit-learn): the diabetes data (442 x 10),
  5-fold CV, R^2 and MSLL; SLM and GLM against scikit-learn's GP, random forest, SVR.
* Table 3 (USPS 3 vs 5, 16x16 images): scikit-learn's 8x8 digits, 3 vs 5 (365 images),
  5-fold stratified CV, log loss and error; GLM (Bernoulli) against logistic regression on
  the same random features, SVM, GP classifier (Laplace) and random forest.
* Table 4 (SARCOS, 44,484 x 21): no large real regression set ships offline, so
  Friedman's function #1 (``make_friedman1``, 21 inputs of which 5 matter, noise s.d.
  0.25, so SMSE can fall to ~0.003), 10,000 train / 2,000 test; SMSE and MSLL of the GLM
  against approximation size 256-4096 (8192 would take the run past 15 minutes).
* Scaling: fit time of SLM and exact GP against N (Friedman #1, 10 inputs, ARD), and of
  the GLM per step against the number of bases.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.spatial.distance import pdist
from sklearn.datasets import load_diabetes, load_digits, make_friedman1
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.gaussian_process import GaussianProcessClassifier, GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, DotProduct, WhiteKernel
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, r2_score
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC, SVR
from threadpoolctl import threadpool_limits

from pmkjit.bases import LinearBasis, RandomFourierBasis
from pmkjit.features import RandomFourierFeatures
from pmkjit.models import GeneralizedLinearModel, StandardLinearModel

RESULTS = Path(__file__).parent / "results" / "revrand_tables.json"


def msll(logpdf: np.ndarray, y_test: np.ndarray, y_train: np.ndarray) -> float:
    """Mean standardised log loss (Rasmussen & Williams eq. 2.34): model minus trivial Gaussian."""
    trivial = stats.norm.logpdf(y_test, y_train.mean(), y_train.std())
    return float(np.mean(-logpdf + trivial))


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def summarise(rows: dict[str, dict[str, list]]) -> list[dict]:
    out = []
    for name, metrics in rows.items():
        row = {"model": name}
        for key, values in metrics.items():
            values = [v for v in values if v is not None]
            row[key] = float(np.mean(values)) if values else None
            row[key + "_sd"] = float(np.std(values)) if values else None
        out.append(row)
    return out


# ------------------------------------------------------------------------ regression
def regression_table(quick: bool) -> list[dict]:
    X, y = load_diabetes(return_X_y=True)
    d = X.shape[1]
    rows: dict[str, dict[str, list]] = {}

    def add(name, **metrics):
        for k, v in metrics.items():
            rows.setdefault(name, {}).setdefault(k, []).append(v)

    for fold, (tr, te) in enumerate(KFold(5, shuffle=True, random_state=0).split(X)):
        sx, sy = StandardScaler().fit(X[tr]), StandardScaler().fit(y[tr, None])
        Xtr, Xte = sx.transform(X[tr]), sx.transform(X[te])
        ytr, yte = sy.transform(y[tr, None])[:, 0], sy.transform(y[te, None])[:, 0]
        ell0 = np.full(d, np.median(pdist(Xtr)))  # ARD length scales start at the median heuristic

        # SLM: 400 ARD-RBF components + linear basis (report's setting), evidence-learned
        slm_basis = LinearBasis() + RandomFourierBasis("rbf", 100 if quick else 400, lengthscale=ell0)
        slm = StandardLinearModel(slm_basis, n_starts=5 if quick else 10, random_state=fold)
        _, t = timed(lambda: slm.fit(Xtr, ytr))
        add("SLM", r2=r2_score(yte, slm.predict(Xte)), msll=msll(slm.predict_logpdf(Xte, yte), yte, ytr), fit_s=t)

        # GLM: 100 ARD-RBF components + linear, Gaussian likelihood, SVI
        glm_basis = LinearBasis() + RandomFourierBasis("rbf", 100, lengthscale=ell0)
        glm = GeneralizedLinearModel("gaussian", glm_basis, max_iter=500 if quick else 3000, n_starts=5,
                                     learning_rate=0.01, random_state=fold)
        _, t = timed(lambda: glm.fit(Xtr, ytr))
        add("GLM", r2=r2_score(yte, glm.predict(Xte)), msll=msll(glm.predict_logpdf(Xte, yte), yte, ytr), fit_s=t)

        # GP: the same additive ARD-RBF + dot-product kernel, amplitudes and length scales start at 1
        kernel = ConstantKernel(1.0) * RBF(np.ones(d)) + ConstantKernel(1.0) * DotProduct(1.0) + WhiteKernel(1.0)
        gp = GaussianProcessRegressor(kernel, normalize_y=False, random_state=fold)
        _, t = timed(lambda: gp.fit(Xtr, ytr))
        mean, sd = gp.predict(Xte, return_std=True)
        add("GP", r2=r2_score(yte, mean), msll=msll(stats.norm.logpdf(yte, mean, sd), yte, ytr), fit_s=t)

        rf = RandomForestRegressor(40, random_state=fold)
        _, t = timed(lambda: rf.fit(Xtr, ytr))
        add("RF", r2=r2_score(yte, rf.predict(Xte)), msll=None, fit_s=t)

        svr = GridSearchCV(SVR(), {"C": [0.1, 1.0, 10.0], "gamma": [0.01, 0.03, 0.1, 0.3]}, cv=3)
        _, t = timed(lambda: svr.fit(Xtr, ytr))
        add("SVR", r2=r2_score(yte, svr.predict(Xte)), msll=None, fit_s=t)
        print(f"regression fold {fold}: " + ", ".join(f"{k} {v['r2'][-1]:.3f}" for k, v in rows.items()), flush=True)
    return summarise(rows)


# -------------------------------------------------------------------- classification
def classification_table(quick: bool) -> list[dict]:
    digits = load_digits()
    keep = np.isin(digits.target, (3, 5))
    X, y = digits.data[keep] / 16.0, (digits.target[keep] == 5).astype(float)
    ell0 = float(np.median(pdist(X)))  # median heuristic, the starting length scale
    rows: dict[str, dict[str, list]] = {}

    def add(name, p, yte, t):
        p = np.clip(p, 1e-12, 1 - 1e-12)
        for k, v in (("log_loss", log_loss(yte, p, labels=[0, 1])), ("error_pct", 100 * np.mean((p > 0.5) != yte)),
                     ("fit_s", t)):
            rows.setdefault(name, {}).setdefault(k, []).append(v)

    for fold, (tr, te) in enumerate(StratifiedKFold(5, shuffle=True, random_state=0).split(X, y)):
        Xtr, Xte, ytr, yte = X[tr], X[te], y[tr], y[te]
        basis = RandomFourierBasis("rbf", 200 if quick else 800, lengthscale=ell0)
        glm = GeneralizedLinearModel("bernoulli", basis, max_iter=500 if quick else 3000, n_starts=5,
                                     learning_rate=0.01, random_state=fold)
        _, t = timed(lambda: glm.fit(Xtr, ytr))
        add("GLM", glm.predict(Xte), yte, t)

        logit = make_pipeline(RandomFourierFeatures("rbf", 1600, lengthscale=ell0, random_state=fold),
                              LogisticRegression(max_iter=2000))
        _, t = timed(lambda: logit.fit(Xtr, ytr))
        add("Logistic", logit.predict_proba(Xte)[:, 1], yte, t)

        svm = GridSearchCV(SVC(probability=True, random_state=fold),
                           {"C": [1.0, 10.0, 100.0], "gamma": [0.003, 0.01, 0.03, 0.1]}, cv=3)
        _, t = timed(lambda: svm.fit(Xtr, ytr))
        add("SVM", svm.predict_proba(Xte)[:, 1], yte, t)

        gpc = GaussianProcessClassifier(1.0 * RBF(ell0), random_state=fold)
        _, t = timed(lambda: gpc.fit(Xtr, ytr))
        add("GP", gpc.predict_proba(Xte)[:, 1], yte, t)

        rf = RandomForestClassifier(40, random_state=fold)
        _, t = timed(lambda: rf.fit(Xtr, ytr))
        add("RF", rf.predict_proba(Xte)[:, 1], yte, t)
        print(f"classification fold {fold}: " + ", ".join(f"{k} {v['error_pct'][-1]:.2f}%" for k, v in rows.items()),
              flush=True)
    return summarise(rows)


# ----------------------------------------------------------------------- large scale
def large_scale_table(quick: bool) -> list[dict]:
    n_train, n_test = (5000, 1000) if quick else (10000, 2000)
    X, y = make_friedman1(n_train + n_test, n_features=21, noise=0.25, random_state=0)
    sx = StandardScaler().fit(X[:n_train])
    Xtr, Xte = sx.transform(X[:n_train]), sx.transform(X[n_train:])
    ym, ys = y[:n_train].mean(), y[:n_train].std()
    ytr, yte = (y[:n_train] - ym) / ys, (y[n_train:] - ym) / ys
    ell0 = np.full(21, np.median(pdist(Xtr[:1000])))
    rows = []
    for size in ([256, 1024] if quick else [256, 512, 1024, 2048, 4096]):
        basis = RandomFourierBasis("rbf", size, lengthscale=ell0)
        glm = GeneralizedLinearModel("gaussian", basis, n_mixtures=2, n_draws=2, batch_size=200,
                                     max_iter=1000 if quick else 2000, n_starts=3, start_iter=100,
                                     learning_rate=0.01, n_predict_samples=100, random_state=0)
        _, t = timed(lambda: glm.fit(Xtr, ytr))
        mean = glm.predict(Xte)
        row = {"model": "GLM", "size": size, "smse": float(np.mean((mean - yte) ** 2) / np.var(yte)),
               "msll": msll(glm.predict_logpdf(Xte, yte), yte, ytr), "fit_s": t,
               "s_per_step": t / (glm.max_iter + glm.n_starts * glm.start_iter)}
        rows.append(row)
        print(f"large scale GLM {size}: SMSE {row['smse']:.4f} MSLL {row['msll']:.3f} ({t:.0f} s)", flush=True)
    for size in ([128] if quick else [128, 256]):
        slm = StandardLinearModel(RandomFourierBasis("rbf", size, lengthscale=ell0), n_starts=3, max_iter=50,
                                  random_state=0)
        _, t = timed(lambda: slm.fit(Xtr, ytr))
        row = {"model": "SLM", "size": size, "smse": float(np.mean((slm.predict(Xte) - yte) ** 2) / np.var(yte)),
               "msll": msll(slm.predict_logpdf(Xte, yte), yte, ytr), "fit_s": t}
        rows.append(row)
        print(f"large scale SLM {size}: SMSE {row['smse']:.4f} MSLL {row['msll']:.3f} ({t:.0f} s)", flush=True)
    return rows


def scaling_table(quick: bool) -> list[dict]:
    """Fit time of SLM (200 ARD-RBF components, D = 400) and the exact GP against N."""
    rows = []
    d = 10
    for n in ([250, 500] if quick else [250, 500, 1000, 2000]):
        X, y = make_friedman1(n + 1000, n_features=d, noise=1.0, random_state=1)
        sx = StandardScaler().fit(X[:n])
        Xtr, Xte = sx.transform(X[:n]), sx.transform(X[n:])
        ytr, yte = (y[:n] - y[:n].mean()) / y[:n].std(), (y[n:] - y[:n].mean()) / y[:n].std()
        ell0 = np.full(d, np.median(pdist(Xtr[:1000])))
        slm = StandardLinearModel(RandomFourierBasis("rbf", 200, lengthscale=ell0), n_starts=5, random_state=0)
        _, t_slm = timed(lambda: slm.fit(Xtr, ytr))
        gp = GaussianProcessRegressor(ConstantKernel(1.0) * RBF(np.ones(d)) + WhiteKernel(1.0), random_state=0)
        _, t_gp = timed(lambda: gp.fit(Xtr, ytr))
        row = {"n": n, "slm_fit_s": t_slm, "gp_fit_s": t_gp, "speedup": t_gp / t_slm,
               "slm_r2": r2_score(yte, slm.predict(Xte)), "gp_r2": r2_score(yte, gp.predict(Xte))}
        rows.append(row)
        print(f"scaling N={n}: SLM {t_slm:.1f} s (R2 {row['slm_r2']:.3f}), GP {t_gp:.1f} s (R2 {row['gp_r2']:.3f})",
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--tables", default="regression,classification,large,scaling",
                        help="comma-separated subset of regression,classification,large,scaling to run; "
                             "the results file is written only when all four run (and not --quick)")
    args = parser.parse_args()
    tables = set(args.tables.split(","))
    unknown = tables - {"regression", "classification", "large", "scaling"}
    if unknown:
        parser.error(f"unknown tables: {sorted(unknown)}")
    # One BLAS thread for every method: on a shared 2-core machine, multithreaded OpenBLAS
    # on small matrices oversubscribes the cores and slows everything 10-20x.
    threadpool_limits(1)
    t0 = time.perf_counter()
    reg = regression_table(args.quick) if "regression" in tables else []
    cls = classification_table(args.quick) if "classification" in tables else []
    large = large_scale_table(args.quick) if "large" in tables else []
    scale = scaling_table(args.quick) if "scaling" in tables else []
    by = {r["model"]: r for r in reg}
    cby = {r["model"]: r for r in cls}
    best_baseline = min((r["error_pct"] for r in cls if r["model"] != "GLM"), default=None)
    out = {
        "slm_r2_gap_to_gp": by["GP"]["r2"] - by["SLM"]["r2"] if reg else None,
        "slm_speedup_vs_gp": scale[-1]["speedup"] if scale else None,
        "glm_error_minus_best_baseline": cby["GLM"]["error_pct"] - best_baseline if cls else None,
        "targets": {"slm_r2_gap_to_gp": "<= 0.01", "slm_speedup_vs_gp": ">= 10 at the largest N",
                    "glm_error_minus_best_baseline": "<= 0 (percentage points)"},
        "regression": reg,
        "classification": cls,
        "large_scale": large,
        "scaling": scale,
        "datasets": {
            "regression": "sklearn diabetes (442 x 10), 5-fold CV, standardised per fold (stands in for Boston)",
            "classification": "sklearn digits 3 vs 5 (365 x 64, pixels / 16), 5-fold stratified CV "
                              "(stands in for USPS 3 vs 5)",
            "large_scale": "make_friedman1, 21 inputs, noise s.d. 0.25, 10,000 train / 2,000 test (stands in for SARCOS)",
            "scaling": "make_friedman1, 10 inputs, noise 1, N train / 1,000 test",
        },
        "quick": args.quick,
        "total_s": time.perf_counter() - t0,
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if not args.quick and len(tables) == 4:
        RESULTS.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("slm_r2_gap_to_gp", "slm_speedup_vs_gp", "glm_error_minus_best_baseline",
                                          "total_s")}, indent=2))


if __name__ == "__main__":
    main()
