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
from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian, PointMass
from pmkjit.features import GaussianJointEmbeddingFeatures
from pmkjit.graph.factor_graph import FEW_INSTANCES, BlackBoxFactor, DataSlot
from pmkjit.operators import ImportanceSamplingOracle, KJITOperator, QuadratureOracle
from pmkjit.operators.grid import GRID_NODES, GridOracle
from pmkjit.operators.kjit import default_feature_sizes, pack_answers

# A message is outside the operator's experience in scale when its log standard deviation
# (unconstrained coordinates) is more than log 2 beyond the remembered range: twice as wide
# or half as narrow as any message it has an oracle answer for.
_SCALE_SLACK = np.log(2.0)


def _log_scales(messages: Sequence[ExponentialFamily]) -> np.ndarray:
    """``(B, k)``: log standard deviation, in unconstrained coordinates, of every message with a spread."""
    cols = [0.5 * np.log(m.unconstrained_moments()[1]) for m in messages if not isinstance(m, PointMass)]
    return np.stack(cols, axis=1) if cols else np.zeros((len(messages[0]), 0))


__all__ = ["FactorOracle", "KJITMethod", "Answer", "quadrature_possible", "grid_possible", "concatenate_answers"]


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


def quadrature_possible(factor: BlackBoxFactor) -> bool:
    """Quadrature handles one or two latent variables (per-instance data ride along)."""
    n_inputs = len(factor.latent_inputs)
    if factor.kind == "deterministic":
        return n_inputs == 1 and factor.density_source == "deterministic"
    n_latent = n_inputs + (1 if factor.kind == "prior" else 0)
    return factor.logp is not None and 1 <= n_latent <= 2


def grid_possible(factor: BlackBoxFactor) -> bool:
    """A density of three to six latent variables: the Gauss-Hermite grid oracle's domain."""
    if factor.kind == "deterministic" or factor.logp is None:
        return False
    n_latent = len(factor.latent_inputs) + (1 if factor.kind == "prior" else 0)
    families = [factor.inputs[i].family for i in factor.latent_inputs]
    if factor.kind == "prior":
        families.append(factor.output_family)
    return n_latent in GRID_NODES and all(fam in (Gaussian, Gamma, Beta) for fam in families)


class FactorOracle:
    """Quadrature or importance-sampling oracle for one black-box factor.

    Parameters
    ----------
    factor : BlackBoxFactor
    kind : {"quadrature", "grid", "importance"}
        Adaptive quadrature (one or two latent variables), a Gauss-Hermite grid (three
        to six, :class:`~pmkjit.operators.grid.GridOracle`) or importance sampling.
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
        if kind == "grid" and not grid_possible(factor):
            raise UnsupportedModelError(
                f"{factor.name}: the grid oracle needs a density of three to six Gaussian, Gamma or Beta latent "
                f"variables; this factor is {factor.description}"
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
        messages = tuple(messages)
        B = len(messages[0])
        self.n_calls += B
        if self.kind in ("quadrature", "grid") and B > 1:
            # Instances with identical inputs (repeated covariate rows and outcomes, whose
            # cavities EP keeps identical) have identical tilted moments: integrate each
            # distinct tuple once. Deterministic, so exact; sampling keeps every entry.
            keys = np.column_stack([np.asarray(m.natural, dtype=float).reshape(B, -1) for m in messages])
            _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
            if first.size < B:
                answer = self._answer(tuple(m[first] for m in messages))
                inverse = inverse.ravel()
                return Answer(tuple(b[inverse] for b in answer.beliefs), answer.accepted[inverse])
        return self._answer(messages)

    def _answer(self, messages: tuple) -> Answer:
        f = self.factor
        B = len(messages[0])
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
            beliefs, accepted = self._quadrature(msgs, fams, observed, data)
            if latent:
                # quadrature refuses tilted laws it cannot resolve (e.g. a funnel); sampling can
                beliefs, accepted = self._fall_back(beliefs, accepted, importance)
        elif self.kind == "grid":
            beliefs, accepted = self._fall_back(*self._grid(msgs, fams, observed, data), importance)
        else:
            beliefs, accepted = importance(np.arange(B))
        # beliefs in target order: latent inputs, then a latent output
        out = list(beliefs[: len(latent)])
        if f.kind == "prior":
            out.append(beliefs[-1])
        return Answer(tuple(out), accepted)

    def _quadrature(self, msgs, fams, observed, data: dict):
        """Quadrature of the whole batch; per-instance data enter as per-entry covariates."""
        f = self.factor
        column = {k: j for j, k in enumerate(sorted(data))}
        table = np.stack([data[k] for k in sorted(data)], axis=1) if data else None

        def inputs(ins, *cov):  # the factor's inputs in order: latents from ins, data from cov
            it = iter(ins)
            return tuple(cov[0][..., column[i]] if i in column else next(it) for i in range(len(f.inputs)))

        if f.kind == "deterministic":
            fn = f.scipy_function if f.scipy_function is not None and table is None else (
                lambda x, *cov: f.function(inputs((x,), *cov), None))
            oracle = QuadratureOracle(fn, fams, kind="deterministic", covariates=table)
        else:
            oracle = QuadratureOracle(lambda x, ins, *cov: f.logp(x, inputs(ins, *cov)), fams, kind="density",
                                      observed=observed, covariates=table)
        result = oracle(tuple(msgs))
        return tuple(result.beliefs), np.asarray(result.accepted, bool)

    def _fall_back(self, beliefs: tuple, accepted: np.ndarray, importance) -> tuple[tuple, np.ndarray]:
        """Entries a deterministic oracle refused, answered by ``importance(entries)`` instead."""
        refused = np.flatnonzero(~accepted)
        if refused.size == 0:
            return beliefs, accepted
        self.n_fallback += refused.size
        b_is, a_is = importance(refused)
        accepted = accepted.copy()
        accepted[refused] = a_is
        return tuple(b.scatter(refused, bi) for b, bi in zip(beliefs, b_is)), accepted

    def _grid(self, msgs, fams, observed, data: dict):
        """Gauss-Hermite grid over the latent variables; data and observed values ride along per entry."""
        f = self.factor
        latent = f.latent_inputs

        def log_factor(xs, rows):
            shape = xs[0].shape
            ins = tuple(np.broadcast_to(data[i][rows][:, None], shape) if i in data else xs[latent.index(i)]
                        for i in range(len(f.inputs)))
            out = np.broadcast_to(observed[rows][:, None], shape) if observed is not None else xs[-1]
            return np.broadcast_to(np.asarray(f.logp(out, ins), dtype=float), shape)

        result = GridOracle(log_factor, fams)(tuple(msgs))
        return tuple(result.beliefs), np.asarray(result.accepted, bool)

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
    Before the fit, the oracle is asked once per distinct message tuple: a tuple
    answered before (a factor whose cavity does not move between sweeps, identical
    cavities of many instances) reuses that answer, so ``min_fit`` counts distinct
    inputs, as a regression needs, and a noisy oracle cannot keep EP from converging by
    answering the same question differently every sweep. ``pending`` (messages,
    beliefs) are answers of earlier fits that were too few to fit on (see
    :meth:`pending_answers`), so a factor with a single instance accumulates them over
    problems. Afterwards the operator decides alone: it asks the oracle where unsure, learns
    online, and refits itself on its memory of answers when they show its
    hyperparameters no longer fit (see :class:`~pmkjit.operators.KJITOperator`).
    """

    def __init__(self, factor: BlackBoxFactor, oracle: FactorOracle, operator: KJITOperator | None, *,
                 first_batch: int = 100, min_fit: int = FEW_INSTANCES, tolerance: float = 1e-3,
                 memory: int = 4000, rng: np.random.Generator, pending: tuple | None = None,
                 n_check: int = 16, distrust: float = 4.0):
        self.factor = factor
        self.oracle = oracle
        self.operator = operator if operator is not None else KJITOperator(
            # EP needs the outgoing message accurate, not the belief: "site" targets keep
            # it so when cavities are narrow (large data sets)
            factor.families, targets=factor.targets, target_form="site", memory=memory,
            features=GaussianJointEmbeddingFeatures(*default_feature_sizes(factor.families, factor.size)),
            random_state=int(rng.integers(2**63 - 1))
        )
        self.operator.tolerance = float(tolerance)
        self.first_batch = int(first_batch)
        self.min_fit = max(int(min_fit), 10)
        self.rng = rng
        self.n_check = int(n_check)
        self.distrust = float(distrust)
        self.n_distrusted = 0
        self._recheck = False  # distrusted at the last check: check the next batch whatever its scales
        self._check_order: dict[int, np.ndarray] = {}
        self._scale_range: tuple | None = None  # (memory state, low, high) of remembered log scales
        self._seen: list[tuple[tuple, tuple]] = []
        self._answered: dict[bytes, np.ndarray] = {}  # distinct input tuple -> belief naturals
        if pending is not None and not self.fitted and len(pending[0][0]):
            msgs, bels = (tuple(pending[0]), tuple(pending[1]))
            self._seen.append((msgs, bels))
            for key, row in zip(_input_keys(msgs), np.stack([b.natural for b in bels], axis=1)):
                self._answered[key] = row

    def pending_answers(self) -> tuple[tuple, tuple] | None:
        """The oracle's answers kept for a first fit that has not happened yet (or None)."""
        if self.fitted or not self._seen:
            return None
        return self._collected()

    def _spot_check(self, messages: tuple, answer: Answer) -> Answer:
        """Check a few of the operator's own predictions against the oracle; distrust it if wrong.

        The operator trusts a prediction whose epistemic variance is below its threshold,
        but that variance only measures how far an input is from the answers it learned
        from, in its kernel's metric. Fitted on a first sweep of very wide cavities (vague
        priors, ``Normal(0, 100)`` coefficients), its kernel widths are set by those, every
        later, narrow cavity looks familiar, and its predictions were confidently wrong:
        a logistic regression (N = 60) "converged" 3.9 posterior sds from the exact
        posterior with sds 1.3-1.4 times too large, the oracle asked about no entry after
        the fourth sweep (robustness round 18). So up to ``n_check`` predictions (of fixed,
        randomly chosen entries) are also answered by the oracle, and their errors measured against the
        thresholds the operator itself accepts (its squared regression outputs' error over
        :meth:`~pmkjit.operators.KJITOperator.current_thresholds`, the largest over the
        outputs). Where the median of those ratios exceeds ``distrust`` (errors twice
        what the operator would accept, on half of the checked entries: a calibrated
        operator's ratios are mostly below 1), the oracle answers every other prediction
        of the batch too and the operator learns all those answers (which refits it when
        they show it stale). Otherwise only the checked entries take the oracle's answers.
        """
        predicted = np.flatnonzero(~answer.asked & answer.accepted)
        if predicted.size < 4 or self.n_check < 1:
            return answer
        op = self.operator
        # Behind an expensive oracle (importance sampling, ~40 ms an answer at 1e5 samples)
        # only where the batch leaves the range of message scales the operator has answers
        # for: that is where its kernel, whose widths were chosen on those answers, can be
        # blind (narrow cavities all alike to widths set by wide ones), while within that
        # range its variance is the paper's measure of novelty. Checking every sweep there
        # would make the oracle calls the operator exists to save (the logistic stream of
        # experiment 1: 16 a sweep against 474 in 30 problems). After a check that found the
        # operator wrong, the next batch is checked whatever its scales (the oracle's answers
        # to the distrusted batch have widened the remembered range, not fixed the operator),
        # until a check passes. Quadrature's and the grid's answers cost milliseconds: those
        # operators are checked every sweep.
        gated = getattr(self.oracle, "kind", None) == "importance" and not self._recheck
        outside = self._beyond_memory_scales(messages) if gated else None
        if outside is not None:
            predicted = predicted[outside[predicted]]
            if predicted.size == 0:
                return answer
        # the same entries every sweep (the first predicted ones in a fixed random order of
        # the batch): checking fresh random entries each sweep gave each of them the oracle's
        # answer in one sweep and the operator's in the next, moving its site by the
        # prediction's error every sweep (a heteroscedastic regression no longer converged
        # in 50 sweeps, 37 before; the chimpanzees model took 43 sweeps, 15 before)
        order = self._check_order.get(len(messages[0]))
        if order is None:
            order = self._check_order[len(messages[0])] = np.argsort(self.rng.random(len(messages[0])))
        pick = np.sort(order[np.isin(order, predicted)][: self.n_check])
        sub = tuple(m[pick] for m in messages)
        check = self.oracle(sub)
        op.n_oracle_calls += pick.size
        ok = np.asarray(check.accepted, bool)
        # the oracle's answers replace the checked predictions (entries it refused keep
        # theirs); every entry it was asked about counts as asked, as in the operator
        beliefs = [b.scatter(pick[ok], a[ok]) for b, a in zip(answer.beliefs, check.beliefs)]
        asked = answer.asked.copy()
        asked[pick] = True
        with np.errstate(all="ignore"):
            err = op._encode(check.beliefs, sub) - op._encode(tuple(b[pick] for b in answer.beliefs), sub)
            ratio = np.max(err[ok] ** 2 / op.current_thresholds(), axis=1)
        if ok.sum() < 3 or not np.median(ratio) > self.distrust:
            self._recheck = False
            # kept for the operator's next refit like every other answer, but not learned
            # now: a rank-k update every sweep would move every prediction a little and
            # keep EP from settling
            if ok.any():
                op._remember(pack_answers(tuple(m[ok] for m in sub), tuple(b[ok] for b in check.beliefs)))
            return Answer(tuple(beliefs), answer.accepted, answer.variance, asked)
        self.n_distrusted += 1
        self._recheck = True
        batches = [(sub, check, ok)]
        rest = np.setdiff1d(predicted, pick)
        if rest.size:
            sub_rest = tuple(m[rest] for m in messages)
            more = self.oracle(sub_rest)
            op.n_oracle_calls += rest.size
            good = np.asarray(more.accepted, bool)
            beliefs = [b.scatter(rest[good], a[good]) for b, a in zip(beliefs, more.beliefs)]
            asked[rest] = True
            batches.append((sub_rest, more, good))
        for msgs, ans, good in batches:
            if good.any():
                op.update(tuple(m[good] for m in msgs), tuple(a[good] for a in ans.beliefs))
        return Answer(tuple(beliefs), answer.accepted, answer.variance, asked)

    def _beyond_memory_scales(self, messages: tuple) -> np.ndarray | None:
        """Entries with a message more than twice as wide or narrow (in sd) as any remembered one.

        Scales are the messages' standard deviations in their unconstrained coordinates,
        per input variable, against the range over the operator's memory of oracle answers,
        read after the operator has answered the batch: the entries it was unsure of and
        asked about are in that memory, so a batch it learned from in part counts as known
        ground (its kernel has answers there). None when the operator keeps no memory (then
        every sweep is checked).
        """
        op = self.operator
        memory = getattr(op, "memory_", None)
        if memory is None or memory.shape[0] == 0:
            return None
        key = (memory.shape[0], op._n_offered)
        if self._scale_range is None or self._scale_range[0] != key:
            remembered, _ = op._unpack(memory)
            s = _log_scales(remembered)
            self._scale_range = (key, s.min(axis=0), s.max(axis=0))
        _, lo, hi = self._scale_range
        s = _log_scales(messages)
        return np.any((s < lo - _SCALE_SLACK) | (s > hi + _SCALE_SLACK), axis=1)

    def _collected(self) -> tuple[tuple, tuple]:
        """The answers in ``_seen`` as one batch per variable: (messages, beliefs)."""
        return concatenate_answers(self._seen)

    def _ask_distinct(self, first: tuple) -> Answer:
        """The oracle's answers for ``first``, asking once per input tuple not answered before."""
        n = len(first[0])
        keys = _input_keys(first)
        new: dict[bytes, int] = {}
        for i, key in enumerate(keys):
            if key not in self._answered and key not in new:
                new[key] = i
        ask = np.fromiter(new.values(), dtype=int, count=len(new))
        if ask.size:
            sub = tuple(m[ask] for m in first)
            answer = self.oracle(sub)
            ok = np.flatnonzero(answer.accepted)
            self._seen.append((tuple(m[ok] for m in sub), tuple(b[ok] for b in answer.beliefs)))
            rows = np.stack([b.natural for b in answer.beliefs], axis=1)
            for j in ok:
                self._answered[keys[ask[j]]] = rows[j]
        self.operator.n_oracle_calls += ask.size
        fams = [self.factor.families[t] for t in self.factor.targets]
        natural = np.full((n, len(fams), 2), np.nan)
        accepted = np.zeros(n, bool)
        for i, key in enumerate(keys):
            row = self._answered.get(key)
            if row is not None:
                natural[i], accepted[i] = row, True
        asked = np.zeros(n, bool)
        asked[ask] = True
        beliefs = tuple(fam.from_natural(natural[:, k]) for k, fam in enumerate(fams))
        return Answer(beliefs, accepted, None, asked)

    @property
    def n_refits(self) -> int:
        return self.operator.n_refits

    @property
    def fitted(self) -> bool:
        return hasattr(self.operator, "regression_")

    def __call__(self, messages: Sequence[ExponentialFamily]) -> Answer:
        messages = tuple(messages)
        B = len(messages[0])
        call = self.oracle.as_operator_oracle()
        if self.fitted:
            result = self.operator(messages, call)
            answer = Answer(tuple(result.beliefs), np.asarray(result.accepted, bool), result.variance,
                            np.asarray(result.uncertain, bool))
            return self._spot_check(messages, answer)
        n = min(B, self.first_batch)
        sub = np.sort(self.rng.choice(B, n, replace=False)) if n < B else np.arange(B)
        first = tuple(m[sub] for m in messages)
        answer = self._ask_distinct(first)
        if sum(len(msgs[0]) for msgs, _ in self._seen) >= self.min_fit:
            msgs, bels = self._collected()
            if len(msgs[0]) > self.first_batch:
                keep = np.sort(self.rng.choice(len(msgs[0]), self.first_batch, replace=False))
                msgs, bels = tuple(m[keep] for m in msgs), tuple(b[keep] for b in bels)
            self.operator.fit(msgs, bels)
            self._seen, self._answered = [], {}
        n_out = 2 * len(self.factor.targets)
        if n == B:
            return answer._replace(variance=np.full((B, n_out), np.nan))
        # the rest of a large first batch: the freshly fitted operator (or the oracle)
        rest = np.setdiff1d(np.arange(B), sub)
        tail = self(tuple(m[rest] for m in messages))
        beliefs = []
        for b_first, b_rest in zip(answer.beliefs, tail.beliefs):
            natural = np.empty((B, 2))
            natural[sub], natural[rest] = b_first.natural, b_rest.natural
            beliefs.append(type(b_first).from_natural(natural))
        accepted, variance, asked = np.empty(B, bool), np.full((B, n_out), np.nan), np.empty(B, bool)
        accepted[sub], accepted[rest] = answer.accepted, tail.accepted
        asked[sub] = answer.asked
        variance[rest], asked[rest] = tail.variance, tail.asked
        return Answer(tuple(beliefs), accepted, variance, asked)



def concatenate_answers(batches: Sequence[tuple[tuple, tuple]]) -> tuple[tuple, tuple]:
    """Several (messages, beliefs) batches of one factor as one: each variable's batches joined."""
    msgs = tuple(type(parts[0]).concatenate(parts) for parts in zip(*(m for m, _ in batches)))
    bels = tuple(type(parts[0]).concatenate(parts) for parts in zip(*(b for _, b in batches)))
    return msgs, bels


def _input_keys(messages: tuple) -> list[bytes]:
    """One exact key per message tuple (its natural parameters), to recognise repeats."""
    packed = np.concatenate([np.asarray(m.natural, dtype=float).reshape(len(m), -1) for m in messages], axis=1)
    return [row.tobytes() for row in np.ascontiguousarray(packed + 0.0)]  # + 0.0: -0.0 -> 0.0


def point_masses(values: np.ndarray) -> PointMass:
    """Observed values or per-instance data as a batch of point masses."""
    return PointMass(np.asarray(values, dtype=float))
