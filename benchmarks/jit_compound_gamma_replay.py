"""Replay of the compound-gamma KJIT stream without PyMC: how the oracle-call rate varies.

Issue 5, experiment 2 (``benchmarks/jit_compound_gamma.py``) fits 1,000 PyMC models; here the
same 1,000 problems (same generator and seed) are replayed against one ``KJITMethod``
directly, which is what EP does on this model: the factor ``tau ~ Gamma(1, rate=r)`` is the
only non-conjugate one, so its incoming messages are fixed per problem (r: its prior
Gamma(1, 1); tau: the likelihood's conjugate message Gamma(1 + N/2, sum(x^2)/2)) and EP's two
sweeps send the same tuple twice. The quadrature answers of all problems are computed once
(the reference, and the oracle of the quadrature stream); the importance stream asks a real
importance-sampling oracle (1e5 samples). A replay takes a minute instead of 20, so the rate
can be measured over several operator seeds (the random features and the held-out split):
the full benchmark is one draw of them.

Variants (``--variants``), all with the library's defaults otherwise:

* ``default``: the operator as shipped;
* ``kl-rule``: the oracle is asked when the expected KL error of the predicted beliefs,
  1/2 sum_k F_kk var_k (F: Fisher information of the target family in the regression-output
  coordinates, by finite differences of the family's KL; var: the epistemic predictive
  variance), exceeds the same three floors expressed in KL (calibrated thresholds, noise
  variance, EP's tolerance as tol^2 / 2);
* ``log-embedding``: the prototype that preceded the library's log-space embedding: Gamma
  messages enter the feature map as the Gaussian of log x with the same mean and variance
  (digamma(a) - log b, trigamma(a)); the library now embeds them in log x exactly
  (``GaussianJointEmbeddingFeatures(gamma_space="log")``, the default);
* ``linear-embedding``: Gamma messages embedded as laws of x, the library's map before
  ``gamma_space`` existed (``gamma_space="linear"``);
* ``summed-evidence``: the regulariser chosen by the evidence summed over the outputs, the
  library's rule before ``regularization_rule="smallest"``;
* ``previous``: both of the above, the library before them (commit df07073);
* ``noise-floor-F``: the operator trusts predictions up to ``F`` times as uncertain as one
  oracle answer (``KJITOperator(noise_floor=F)``; the library's is 1).

Run (one core, about 10 minutes for the default grid: 8 operator seeds, both oracles, 4 variants)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/jit_compound_gamma_replay.py

Output: ``benchmarks/results/jit_compound_gamma_replay.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import special

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import jit_compound_gamma as bench  # noqa: E402

from pmkjit.ep.methods import Answer, FactorOracle, KJITMethod, _input_keys  # noqa: E402
from pmkjit.families import Gamma, Gaussian  # noqa: E402
from pmkjit.graph import build_factor_graph  # noqa: E402
from pmkjit.operators import kjit  # noqa: E402


def inputs(p: dict) -> tuple:
    x = p["x"]
    return (Gamma(np.array([1.0]), np.array([1.0])),
            Gamma(np.array([1.0 + x.size / 2]), np.array([np.sum(x**2) / 2])))


# ------------------------------------------------------------------ variants
class _LogGammaFeatures:
    """Feature map wrapper: Gamma messages enter as the Gaussian of log x (same two moments)."""

    def __init__(self, inner):
        self.__dict__["inner"] = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @staticmethod
    def _map(messages):
        return tuple(Gaussian(special.digamma(m.shape) - np.log(m.rate), special.polygamma(1, m.shape))
                     if isinstance(m, Gamma) else m for m in messages)

    def transform(self, messages, **kwargs):
        return self.inner.transform(self._map(messages))

    def fit(self, messages):
        self.inner.fit(self._map(messages))
        return self

    def _validate(self, messages, fitting=False):
        return self.inner._validate(self._map(messages), fitting=fitting)

    def set_params(self, **params):
        self.inner.set_params(**params)
        return self


def _fisher_diag(op, beliefs, messages, h=1e-3):
    """Diagonal of the Fisher information in the regression-output coordinates (finite differences of KL)."""
    with np.errstate(all="ignore"):
        Y = op._encode(beliefs, messages)
        F = np.empty_like(Y)
        for k in range(Y.shape[1]):
            j = k // 2
            total = 0.0
            for sign in (1.0, -1.0):
                Yp = Y.copy()
                Yp[:, k] += sign * h
                total = total + beliefs[j].kl(op._decode(Yp, messages)[j])
            F[:, k] = total / h**2
    return F


def _kl_excess(op, beliefs, messages, var):
    F = _fisher_diag(op, beliefs, messages)
    s = op.regression_.noise_var_
    floor = np.maximum(0.5 * np.sum(F * op.thresholds_, axis=1), 0.5 * np.sum(F * op.noise_floor * s, axis=1))
    floor = np.maximum(floor, 0.5 * op.tolerance**2)
    out = 0.5 * np.sum(F * var, axis=1) / np.maximum(floor, np.finfo(float).tiny)
    return np.where(np.isfinite(out), out, np.inf)


def install(variant: str) -> None:
    if variant == "log-embedding":
        make = kjit.KJITOperator._make_features  # the map the library would use, wrapped
        kjit.KJITOperator._make_features = lambda self: _LogGammaFeatures(make(self))
        select = kjit.KJITOperator._select

        def _select(self, features, messages, Y):
            if self.search is None:  # the wrapper hides the class the default search is keyed by
                self.search = kjit._DEFAULT_SEARCH["GaussianJointEmbeddingFeatures"]
            return select(self, features, messages, Y)

        kjit.KJITOperator._select = _select
    elif variant in ("linear-embedding", "summed-evidence", "previous"):
        if variant != "summed-evidence":
            make = kjit.KJITOperator._make_features
            kjit.KJITOperator._make_features = lambda self: make(self).set_params(gamma_space="linear")
        if variant != "linear-embedding":
            kjit._REGULARIZATION_RULE = "summed"
    elif variant == "kl-rule":
        def current_excess(self, beliefs, messages, var):
            return _kl_excess(self, beliefs, messages, var)

        kjit.KJITOperator._excess = current_excess
        call = kjit.KJITOperator.__call__

        def __call__(self, messages, oracle):
            # the operator's own loop, with var / thresholds replaced by the expected-KL ratio
            if not hasattr(self, "regression_"):
                return call(self, messages, oracle)
            messages = self._check_messages(messages)
            B = len(messages[0])
            beliefs, var = self.predict(messages)
            first_var = var
            excess = self._excess(beliefs, messages, var)
            pending = np.flatnonzero(excess > 1.0)
            asked, accepted = np.zeros(B, bool), np.ones(B, bool)
            while pending.size:
                k = pending.size if pending.size <= kjit._MIN_QUERY_ROUND else max(
                    kjit._MIN_QUERY_ROUND, int(np.ceil(self.query_fraction * pending.size)))
                order = np.argsort(-excess[pending], kind="stable")
                idx, rest = np.sort(pending[order[:k]]), np.sort(pending[order[k:]])
                sub = kjit._take(messages, idx)
                result = oracle(sub)
                self.n_oracle_calls += idx.size
                asked[idx] = True
                answers = tuple(result.beliefs[t] for t in self.targets)
                ok = kjit._answered(answers)
                accepted[idx[~ok]] = False
                if ok.any():
                    self.update(kjit._take(sub, np.flatnonzero(ok)), tuple(a[ok] for a in answers))
                beliefs = tuple(b.scatter(idx, a) for b, a in zip(beliefs, answers))
                if rest.size == 0:
                    break
                rest_msgs = kjit._take(messages, rest)
                new, var_rest = self.predict(rest_msgs)
                self.n_predictions -= rest.size
                beliefs = tuple(b.scatter(rest, a) for b, a in zip(beliefs, new))
                excess[rest] = self._excess(new, rest_msgs, var_rest)
                pending = rest[excess[rest] > 1.0]
            return kjit.KJITResult(beliefs, first_var, asked, accepted)

        kjit.KJITOperator.__call__ = __call__
    elif variant.startswith("noise-floor-"):
        floor = float(variant[len("noise-floor-"):])
        init = kjit.KJITOperator.__init__

        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.noise_floor = floor  # KJITMethod builds the operator with the default

        kjit.KJITOperator.__init__ = __init__
    elif variant != "default":
        raise ValueError(variant)


# ---------------------------------------------------------------------- run
def replay(problems, factor, reference, oracle_kind: str, seed: int) -> dict:
    table = {_input_keys(inputs(p))[0]: reference[i] for i, p in enumerate(problems)}

    class Cached:
        """The quadrature oracle's answers, computed once for all problems."""
        kind = "quadrature"
        as_operator_oracle = FactorOracle.as_operator_oracle

        def __init__(self):
            self.factor = factor

        def __call__(self, messages):
            nat = np.stack([table[k] for k in _input_keys(tuple(messages))])
            return Answer(tuple(Gamma.from_natural(nat[:, j]) for j in range(2)), np.ones(len(nat), bool))

    rng = np.random.default_rng([seed, 1])
    oracle = Cached() if oracle_kind == "quadrature" else FactorOracle(
        factor, "importance", n_samples=100_000, rng=np.random.default_rng([seed, 2]))
    method = KJITMethod(factor, oracle, None, tolerance=1e-3, rng=rng)
    asked, kl = [], []
    for i, p in enumerate(problems):
        msgs = inputs(p)
        n = 0
        for _ in range(2):  # EP's two sweeps send the same tuple
            ans = method(msgs)
            n += int(np.sum(ans.asked))
        asked.append(n)
        kl.append([float(Gamma.from_natural(reference[i:i + 1, j]).kl(ans.beliefs[j])[0]) for j in range(2)])
    asked, kl = np.array(asked), np.array(kl)
    mean_tau = np.array([Gamma.from_natural(reference[i:i + 1, 1]).mean()[0] for i in range(len(problems))])
    after = slice(100, None)
    big = mean_tau[after] > 10
    return {
        "oracle_rate_after_100": float(asked[after].sum() / (2 * asked[after].size)),
        "oracle_calls_after_100": int(asked[after].sum()),
        "kl_tau": {"median": float(np.median(kl[:, 1])), "p90": float(np.quantile(kl[:, 1], 0.9)),
                   "max": float(kl[:, 1].max()),
                   "median_after_100_mean_tau_above_10": float(np.median(kl[after, 1][big]))},
        "kl_r": {"median": float(np.median(kl[:, 0])), "p90": float(np.quantile(kl[:, 0], 0.9)),
                 "max": float(kl[:, 0].max())},
        "refits": int(method.n_refits),
        "asked_per_problem": asked.tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="problem generator (the benchmark's)")
    parser.add_argument("--operator-seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--oracles", nargs="+", default=["quadrature", "importance"])
    parser.add_argument("--variants", nargs="+",
                        default=["default", "summed-evidence", "linear-embedding", "previous"])
    parser.add_argument("--importance-seeds", type=int, default=8, help="operator seeds run with importance")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "jit_compound_gamma_replay.json")
    args = parser.parse_args()

    code = bench.git_state()  # the library as run (read before the run: others may commit meanwhile)
    rng = np.random.default_rng(args.seed)
    problems = [bench.make_problem(rng) for _ in range(args.problems)]
    graph = build_factor_graph(bench.build_model(problems[0]["x"]), random_seed=1)
    (factor,) = [f for f in graph.factors if f.analytic is None and f.latent_inputs]
    quad = FactorOracle(factor, "quadrature", rng=np.random.default_rng(0))
    allm = [inputs(p) for p in problems]
    ans = quad(tuple(Gamma.concatenate([m[j] for m in allm]) for j in range(2)))
    reference = np.stack([b.natural for b in ans.beliefs], axis=1)  # (P, 2 targets, 2)

    saved = dict(kjit.KJITOperator.__dict__)
    rule = kjit._REGULARIZATION_RULE
    print(f"default feature map of this factor: {kjit.default_feature_sizes(factor.families, factor.size)}", flush=True)
    results = []
    for variant in args.variants:
        for oracle in args.oracles:
            seeds = args.operator_seeds if oracle == "quadrature" else args.operator_seeds[: args.importance_seeds]
            for seed in seeds:
                for name in ("_make_features", "_select", "__call__", "__init__"):
                    setattr(kjit.KJITOperator, name, saved[name])  # undo the previous variant
                kjit._REGULARIZATION_RULE = rule
                install(variant)
                t0 = time.perf_counter()
                r = replay(problems, factor, reference, oracle, seed)
                r.update(variant=variant, oracle=oracle, operator_seed=seed, seconds=time.perf_counter() - t0)
                results.append(r)
                print(f"{variant:14s} {oracle:10s} seed {seed}: rate after 100 {r['oracle_rate_after_100']:.4f} "
                      f"({r['oracle_calls_after_100']}), KL tau median {r['kl_tau']['median']:.1e} "
                      f"p90 {r['kl_tau']['p90']:.1e} max {r['kl_tau']['max']:.2g}, "
                      f"tail median {r['kl_tau']['median_after_100_mean_tau_above_10']:.1e}; "
                      f"KL r median {r['kl_r']['median']:.1e} max {r['kl_r']['max']:.2g}", flush=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/jit_compound_gamma_replay.py " + " ".join(sys.argv[1:]),
        "code": code, "settings": {k: str(v) for k, v in vars(args).items()},
        "results": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
