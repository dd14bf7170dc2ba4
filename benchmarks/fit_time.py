"""Wall time of ``pmkjit.fit`` on gallery models, this checkout against another commit.

Speed changes are measured side by side: for each repeat and each model, one fit with this
checkout's library and one with the library of ``--against`` (checked out into a temporary
``git worktree``), alternating, each in a fresh process (so that no compiled function is
shared between them), on the gallery's model and seed. Each process first compiles a trivial
PyTensor function, so that loading PyTensor's compilation cache (seconds, growing with the
cache) is not counted in either library's time. Reported per model: the median wall time of
``pmkjit.fit`` for each library, their ratio, EP's sweeps, and how far apart the two libraries'
EP marginals are (``pmkjit.ep_posterior``: the largest difference of means in the first
library's sds, and the range of their sd ratios), which must be small when a change is meant
to leave the answers alone.

Run: ``python benchmarks/fit_time.py --models negbin_intercepts_covariate --against HEAD~1``;
``--suite ordered_mixtures_vs_nuts`` takes the models of that script instead of the gallery's.
Output: ``benchmarks/results/fit_time.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from jit_compound_gamma import git_state  # noqa: E402

# run in a fresh process with the library under test first on the path
_CHILD = """
import json, sys, time, warnings
sys.path.insert(0, {library!r}); sys.path.insert(1, {benchmarks!r})
warnings.simplefilter("ignore")
import pytensor.tensor as pt
import pmkjit
from pmkjit.graph.pytensor_tools import evaluate_constant
evaluate_constant(pt.constant(1.0) * 2)  # loads PyTensor's compilation cache
from {suite} import MODELS
# the gallery's models take the seed, the other benchmarks' a generator seeded by it
model = MODELS[{model!r}]({seed} if {suite!r} == "gallery_vs_nuts" else __import__("numpy").random.default_rng({seed}))
t0 = time.perf_counter()
idata = pmkjit.fit(model=model, random_seed={seed}, progressbar=False, compute_log_likelihood=False)
seconds = time.perf_counter() - t0
marginals = {{k: [q.mean().tolist(), q.var().tolist()] for k, q in pmkjit.ep_posterior(idata).items()}}
print(json.dumps({{"seconds": seconds, "sweeps": int(idata.ep.attrs["sweeps"]), "library": pmkjit.__file__,
                  "marginals": marginals}}))
"""


def _fit_once(library: Path, model: str, seed: int, suite: str = "gallery_vs_nuts") -> dict:
    code = _CHILD.format(library=str(library), benchmarks=str(ROOT / "benchmarks"), model=model, seed=seed,
                         suite=suite)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if not found["library"].startswith(str(library)):  # an installed pmkjit shadowing the one under test
        raise RuntimeError(f"the fit imported {found['library']}, not the library under {library}")
    return found


def _apart(this: dict, then: dict) -> tuple[float, list[float]]:
    """The largest difference of two fits' EP marginal means, in ``this`` fit's sds, and the
    least and largest ratio of their sds (every latent of both, element by element)."""
    if this.keys() != then.keys():
        raise RuntimeError(f"the two fits have different latents: {sorted(this)} and {sorted(then)}")
    moved, ratios = [], []
    for name, (mean, var) in this.items():
        mean_then, var_then = (np.asarray(a, dtype=float) for a in then[name])
        sd = np.sqrt(np.asarray(var, dtype=float))
        moved.append(np.max(np.abs(np.asarray(mean, dtype=float) - mean_then) / sd))
        ratios.append(sd / np.sqrt(var_then))
    ratios = np.concatenate([np.ravel(r) for r in ratios])
    return float(max(moved)), [float(ratios.min()), float(ratios.max())]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--against", required=True, help="the commit to compare with (e.g. HEAD~1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=5, help="the gallery's seed")
    parser.add_argument("--suite", default="gallery_vs_nuts",
                        help="the benchmark script (under benchmarks/) whose MODELS the models are")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fit_time.json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "against"
        subprocess.run(["git", "worktree", "add", "--detach", str(other), args.against], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            against = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout.strip()
            for model in args.models:
                runs = {"this": [], "against": []}
                for _ in range(args.repeats):
                    runs["this"].append(_fit_once(ROOT, model, args.seed, args.suite))
                    runs["against"].append(_fit_once(other, model, args.seed, args.suite))
                moved, ratios = _apart(runs["this"][0]["marginals"], runs["against"][0]["marginals"])
                this = float(np.median([r["seconds"] for r in runs["this"]]))
                then = float(np.median([r["seconds"] for r in runs["against"]]))
                row = {"model": model, "seconds_this": this, "seconds_against": then, "ratio": this / then,
                       "sweeps_this": sorted({r["sweeps"] for r in runs["this"]}),
                       "sweeps_against": sorted({r["sweeps"] for r in runs["against"]}),
                       "max_mean_difference_in_sds": moved, "sd_ratio_range": ratios,
                       "all_seconds": {k: [r["seconds"] for r in v] for k, v in runs.items()}}
                rows.append(row)
                print(f"{model}: {this:.1f} s against {then:.1f} s ({against}), ratio {this / then:.2f}, "
                      f"sweeps {row['sweeps_this']} / {row['sweeps_against']}, EP marginals apart by at most "
                      f"{moved:.2g} sd, sd ratios {ratios[0]:.4f}-{ratios[1]:.4f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, capture_output=True)
    result = {"library": git_state(), "against": against, "repeats": args.repeats, "seed": args.seed,
              "suite": args.suite, "models": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
