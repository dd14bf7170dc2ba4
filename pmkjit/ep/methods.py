"""Where a black-box factor's projected tilted beliefs come from.

Every method takes the incoming messages of a batch of factor instances in the
operator convention ``(*inputs, output)`` (data and observed values as point masses,
a deterministic factor's output as its constant conjugate message) and returns an
:class:`~pmkjit.operators.OracleResult`-like answer for the factor's *target*
variables (its latent slots).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from pmkjit.errors import UnsupportedModelError
from pmkjit.families import ExponentialFamily, PointMass
from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot
from pmkjit.operators import ImportanceSamplingOracle, KJITOperator, QuadratureOracle

__all__ = ["FactorOracle", "KJITMethod", "Answer", "quadrature_possible"]


class Answer(NamedTuple):
    """Beliefs of the factor's targets (one batch per target), and which entries are answered.

    ``variance`` (B, n_outputs) and ``asked`` (B,) are set by methods that predict: the
    epistemic variance of each prediction (NaN where there was no operator yet) and
    whether the oracle answered that entry.
    """

    beliefs: tuple
    accepted: np.ndarray
    variance: np.ndarray | None = None
    asked: np.ndarray | None = None


_MAX_DATA_GROUPS = 64


def _data_matrix(factor: BlackBoxFactor) -> np.ndarray:
    cols = [s.values for s in factor.inputs if isinstance(s, DataSlot)]
    return np.stack(cols, axis=1) if cols else np.zeros((factor.size, 0))


def quadrature_possible(factor: BlackBoxFactor) -> bool:
    """Quadrature handles one or two latent variables, and per-instance data taking few values."""
    n_data_groups = np.unique(_data_matrix(factor), axis=0).shape[0]
    if n_data_groups > _MAX_DATA_GROUPS:
        return False
    n_inputs = len(factor.latent_inputs)
    if factor.kind == "deterministic":
        return n_inputs == 1 and factor.density_source == "deterministic"
    n_latent = n_inputs + (1 if factor.kind == "prior" else 0)
    return factor.logp is not None and 1 <= n_latent <= 2


class FactorOracle:
    """Quadrature or importance-sampling oracle for one black-box factor.

    Parameters
    ----------
    factor : BlackBoxFactor
    kind : {"quadrature", "importance"}
    n_samples : int
        Importance samples per message tuple.
    rng : numpy.random.Generator
    """

    def __init__(self, factor: BlackBoxFactor, kind: str, *, n_samples: int = 100_000,
                 rng: np.random.Generator):
        if kind == "quadrature" and not quadrature_possible(factor):
            raise UnsupportedModelError(
                f"{factor.name}: quadrature needs one or two latent variables, a density and no per-instance "
                f"data; this factor ({factor.description}) has {len(factor.inputs)} inputs"
            )
        if kind == "importance" and not factor.latent_inputs and factor.kind != "prior":
            raise UnsupportedModelError(f"{factor.name}: importance sampling needs a latent variable")
        self.factor = factor
        self.kind = kind
        self.n_samples = int(n_samples)
        self.rng = rng
        self.n_calls = 0
        self.n_fallback = 0

    def __call__(self, messages: Sequence[ExponentialFamily]) -> Answer:
        f = self.factor
        messages = tuple(messages)
        B = len(messages[0])
        self.n_calls += B
        latent = f.latent_inputs
        data = {i: messages[i].value for i, s in enumerate(f.inputs) if isinstance(s, DataSlot)}
        fams = [f.inputs[i].family for i in latent]
        msgs = [messages[i] for i in latent]
        observed = messages[-1].value if f.kind == "likelihood" else None
        if f.kind != "likelihood":
            fams.append(f.output_family)
            msgs.append(messages[-1])

        def importance(sel):
            # data travel as point-mass inputs: the oracle "samples" them with the rest, so
            # its chunks and retries keep every entry's data aligned with its samples
            in_fams = [PointMass if i in data else f.inputs[i].family for i in range(len(f.inputs))]
            in_msgs = [messages[i][sel] for i in range(len(f.inputs))]
            if f.kind != "likelihood":
                in_fams.append(f.output_family)
                in_msgs.append(messages[-1][sel])
            oracle = ImportanceSamplingOracle(f.sampler, in_fams, logp=f.logp,
                                              observed=None if observed is None else observed[sel],
                                              n_samples=self.n_samples, random_state=self.rng)
            result = oracle(tuple(in_msgs))
            picked = [result.beliefs[i] for i in latent]
            if f.kind != "likelihood":
                picked.append(result.beliefs[-1])
            return tuple(picked), np.asarray(result.accepted, bool)

        if self.kind == "quadrature" or not latent:
            # a factor with no latent input (a prior with constant parameters) is a 1-D integral
            beliefs, accepted = self._quadrature(msgs, fams, observed, data, B)
            refused = np.flatnonzero(~accepted)
            if refused.size and latent:
                # quadrature refuses tilted laws it cannot resolve (e.g. a funnel); sampling can
                self.n_fallback += refused.size
                b_is, a_is = importance(refused)
                beliefs = tuple(b.scatter(refused, bi) for b, bi in zip(beliefs, b_is))
                accepted = accepted.copy()
                accepted[refused] = a_is
        else:
            beliefs, accepted = importance(np.arange(B))
        # beliefs in target order: latent inputs, then a latent output
        out = list(beliefs[: len(latent)])
        if f.kind == "prior":
            out.append(beliefs[-1])
        return Answer(tuple(out), accepted)

    def _quadrature(self, msgs, fams, observed, data: dict, B: int):
        """Quadrature, one call per distinct row of per-instance data (few: checked at construction)."""
        f = self.factor
        keys = sorted(data)
        table = np.stack([data[k] for k in keys], axis=1) if keys else np.zeros((B, 0))
        rows, group = np.unique(table, axis=0, return_inverse=True)
        group = np.ravel(group)
        naturals = [np.full((B, 2), np.nan) for _ in fams]
        accepted = np.zeros(B, bool)
        for g, row in enumerate(rows):
            sel = np.flatnonzero(group == g)
            consts = dict(zip(keys, row))

            def full(ins, shape, _c=consts):
                it = iter(ins)
                return tuple(np.full(shape, _c[i]) if i in _c else next(it) for i in range(len(f.inputs)))

            if f.kind == "deterministic":
                fn = f.scipy_function or (lambda x, _full=full: f.function(_full((x,), np.shape(x)), None))
                oracle = QuadratureOracle(fn, fams, kind="deterministic")
            else:
                def density(x, ins, _full=full):
                    return f.logp(x, _full(tuple(ins), np.shape(x)))
                obs = None if observed is None else observed[sel]
                oracle = QuadratureOracle(density, fams, kind="density", observed=obs)
            result = oracle(tuple(m[sel] for m in msgs))
            for k, b in enumerate(result.beliefs):
                naturals[k][sel] = b.natural
            accepted[sel] = result.accepted
        return tuple(fam.from_natural(n) for fam, n in zip(fams, naturals)), accepted

    def as_operator_oracle(self):
        """The oracle in the form a :class:`KJITOperator` calls: beliefs of every variable."""

        def call(messages):
            ans = self(messages)
            beliefs = list(messages)
            for t, b in zip(self.factor.targets, ans.beliefs):
                beliefs[t] = b
            return Answer(tuple(beliefs), ans.accepted)

        return call


class KJITMethod:
    """A KJIT operator in front of a :class:`FactorOracle`.

    Until the operator is fitted, the oracle answers and its answers are kept; once
    ``min_fit`` answers have accumulated (from one large batch or from several small
    ones, e.g. a factor with a single instance over many sweeps or problems), the
    operator is fitted on at most ``first_batch`` of them. A large first batch is
    answered by the oracle on a random ``first_batch`` subset only; the operator,
    fitted on those, answers the rest (asking the oracle where it is unsure).

    Every oracle answer is also offered to a bounded memory (a uniform reservoir).
    When the regression's noise variance, re-estimated with each online update, grows
    ``refit_ratio``-fold over its value at the last fit, the evidence says the feature
    widths chosen then no longer fit the messages now arriving (in EP: the wide
    cavities of the first sweep against the narrow ones of later sweeps), and the
    operator is refitted, hyperparameter search included, on a sample of the memory.
    """

    def __init__(self, factor: BlackBoxFactor, oracle: FactorOracle, operator: KJITOperator | None, *,
                 first_batch: int = 1000, min_fit: int = 50, tolerance: float = 1e-3,
                 refit_ratio: float = 10.0, max_refits: int = 5, memory: int = 4000,
                 rng: np.random.Generator):
        self.factor = factor
        self.oracle = oracle
        self.operator = operator if operator is not None else KJITOperator(
            # EP needs the outgoing message accurate, not the belief: "site" targets keep
            # it so when cavities are narrow (large data sets)
            factor.families, targets=factor.targets, target_form="site", random_state=int(rng.integers(2**63 - 1))
        )
        self.operator.tolerance = float(tolerance)
        self.first_batch = int(first_batch)
        self.min_fit = max(int(min_fit), 10)
        self.rng = rng
        self.last_variance: np.ndarray | None = None
        self._seen: list[tuple[tuple, tuple]] = []
        self.refit_ratio = float(refit_ratio)
        self.max_refits = int(max_refits)
        self.n_refits = 0
        self._memory_size = int(memory)
        self._memory: tuple | None = None  # (messages, beliefs) batches
        self._n_offered = 0  # answers offered to the reservoir so far
        self._n_since_fit = 0
        self._noise_at_fit = self._noise() if self.fitted else None

    def _noise(self) -> np.ndarray:
        return np.array(self.operator.regression_.noise_var_, dtype=float)

    def _remember(self, msgs: tuple, bels: tuple) -> None:
        """Offer answers to the reservoir (every answer offered so far is kept with equal probability)."""
        n = len(msgs[0])
        if n == 0:
            return
        size = 0 if self._memory is None else len(self._memory[0][0])
        fill = min(self._memory_size - size, n)
        if fill > 0:
            head = (tuple(m[:fill] for m in msgs), tuple(b[:fill] for b in bels))
            self._memory = head if self._memory is None else tuple(
                tuple(type(a).concatenate([a, b]) for a, b in zip(part, new)) for part, new in zip(self._memory, head)
            )
            self._n_offered += fill
            msgs, bels = tuple(m[fill:] for m in msgs), tuple(b[fill:] for b in bels)
            n -= fill
        if n <= 0:
            return
        # Reservoir sampling, vectorised: the k-th further answer takes a random slot with
        # probability size / (answers offered so far); a slot drawn twice keeps the later.
        offered = self._n_offered + np.arange(1, n + 1)
        slot = np.floor(self.rng.random(n) * offered).astype(int)
        self._n_offered += n
        hit = np.flatnonzero(slot < self._memory_size)
        if hit.size == 0:
            return
        slots, last = np.unique(slot[hit][::-1], return_index=True)
        src = hit[::-1][last]
        self._memory = tuple(
            tuple(a.scatter(slots, b[src]) for a, b in zip(part, new))
            for part, new in zip(self._memory, (msgs, bels))
        )

    def _refit_if_stale(self) -> None:
        if self.n_refits >= self.max_refits or self._n_since_fit < self.min_fit or self._memory is None:
            return
        if not np.any(self._noise() > self.refit_ratio * self._noise_at_fit):
            return
        msgs, bels = self._memory
        n = len(msgs[0])
        if n > self.first_batch:
            keep = np.sort(self.rng.choice(n, self.first_batch, replace=False))
            msgs, bels = tuple(m[keep] for m in msgs), tuple(b[keep] for b in bels)
        calls, preds = self.operator.n_oracle_calls, self.operator.n_predictions
        self.operator.fit(msgs, bels)
        self.operator.n_oracle_calls, self.operator.n_predictions = calls, preds
        self.n_refits += 1
        self._n_since_fit = 0
        self._noise_at_fit = self._noise()

    @property
    def fitted(self) -> bool:
        return hasattr(self.operator, "regression_")

    def __call__(self, messages: Sequence[ExponentialFamily]) -> Answer:
        messages = tuple(messages)
        B = len(messages[0])
        call = self.oracle.as_operator_oracle()
        if self.fitted:
            if self._noise_at_fit is None:
                self._noise_at_fit = self._noise()
            result = self.operator(messages, call)
            self.last_variance = result.variance
            uncertain = np.asarray(result.uncertain, bool)
            asked = np.flatnonzero(uncertain & np.asarray(result.accepted, bool))
            if asked.size:
                self._remember(tuple(m[asked] for m in messages), tuple(b[asked] for b in result.beliefs))
                self._n_since_fit += asked.size
                self._refit_if_stale()
            return Answer(tuple(result.beliefs), np.asarray(result.accepted, bool), result.variance, uncertain)
        n = min(B, self.first_batch)
        sub = np.sort(self.rng.choice(B, n, replace=False)) if n < B else np.arange(B)
        first = tuple(m[sub] for m in messages)
        answer = self.oracle(first)
        ok = np.flatnonzero(answer.accepted)
        self._seen.append((tuple(m[ok] for m in first), tuple(b[ok] for b in answer.beliefs)))
        if sum(len(msgs[0]) for msgs, _ in self._seen) >= self.min_fit:
            msgs = tuple(type(parts[0]).concatenate(parts) for parts in zip(*(m for m, _ in self._seen)))
            bels = tuple(type(parts[0]).concatenate(parts) for parts in zip(*(b for _, b in self._seen)))
            if len(msgs[0]) > self.first_batch:
                keep = np.sort(self.rng.choice(len(msgs[0]), self.first_batch, replace=False))
                msgs, bels = tuple(m[keep] for m in msgs), tuple(b[keep] for b in bels)
            self._remember(msgs, bels)
            self.operator.fit(msgs, bels)
            self.operator.n_oracle_calls += n
            self._seen = []
            self._noise_at_fit = self._noise()
        else:
            self.operator.n_oracle_calls += n
        n_out = 2 * len(self.factor.targets)
        if n == B:
            return answer._replace(variance=np.full((B, n_out), np.nan), asked=np.ones(B, bool))
        # the rest of a large first batch: the freshly fitted operator (or the oracle)
        rest = np.setdiff1d(np.arange(B), sub)
        tail = self(tuple(m[rest] for m in messages))
        beliefs = []
        for b_first, b_rest in zip(answer.beliefs, tail.beliefs):
            natural = np.empty((B, 2))
            natural[sub], natural[rest] = b_first.natural, b_rest.natural
            beliefs.append(type(b_first).from_natural(natural))
        accepted, variance, asked = np.empty(B, bool), np.full((B, n_out), np.nan), np.ones(B, bool)
        accepted[sub], accepted[rest] = answer.accepted, tail.accepted
        variance[rest], asked[rest] = tail.variance, tail.asked
        return Answer(tuple(beliefs), accepted, variance, asked)



def point_masses(values: np.ndarray) -> PointMass:
    """Observed values or per-instance data as a batch of point masses."""
    return PointMass(np.asarray(values, dtype=float))
