"""Kernel-based just-in-time (KJIT) message operator.

A KJIT operator stands in for an expensive oracle (importance sampling, quadrature)
on one factor. Given the incoming messages of a factor, one batch per neighbouring
variable, it predicts the projected tilted belief of chosen target variables:

1. random features of the message tuple (by default a Gaussian kernel on joint
   mean embeddings, :class:`~pmkjit.features.GaussianJointEmbeddingFeatures`);
2. multi-output Bayesian linear regression onto the belief's regression targets
   (Gaussian: mean and log variance; Beta: log alpha, log beta; Gamma: log shape and
   log rate), by default relative to the incoming message of the same variable, or,
   for Gaussian targets in EP, as the outgoing message itself (``target_form="site"``);
3. the regression's epistemic variance per output decides which inputs it trusts;
   the others go to the oracle, and its answers update the regression online.

Unlike the original KJIT code, nothing here is a hand-set absolute log-variance
threshold: on the first minibatch the operator holds out a fifth of the oracle's
answers, and the threshold of each output is a quantile of the epistemic variance
on those held-out inputs, i.e. "as uncertain as an input drawn from the data I have
seen is allowed to be". That threshold is floored at the regression's current noise
variance, re-estimated with every online update: the scatter of the oracle's own
answers (the paper's sigma_y^2, "the intrinsic stochasticity of the importance
sampler") plus what the features cannot fit. Below it an oracle answer would be no
more accurate than the prediction, so asking would only cost time. Kernel widths and
the regulariser are chosen by the log evidence on the first minibatch.

The operator keeps a bounded uniform sample (a reservoir) of the oracle's answers and
re-selects its hyperparameters on it (kernel widths, regulariser, thresholds) when
(a) the regression's noise variance, re-estimated with every online update, has grown
``refit_ratio``-fold since the last fit: the evidence says the widths chosen then no
longer fit the messages now arriving (in EP: the wide cavities of a first sweep
against the narrow ones of later sweeps; in a stream of problems: a new data set); or
(b) it has learned as many answers since the last fit as that fit was made on (a
doubling schedule: a logarithmic number of refits, each on more data). Nothing
learned is dropped beyond what the bounded memory forgets, and the memory is saved
with the operator, so a loaded operator can still adapt.
"""

from __future__ import annotations

import itertools
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pmkjit._parallel import for_row_blocks, n_workers, single_threaded_blas
from pmkjit._random import as_generator
from pmkjit.errors import ImproperMessageError, OperatorFileError
from pmkjit.families import ExponentialFamily, Gaussian, family_by_name
from pmkjit.features import embeddings as _emb
from pmkjit.regression import BayesianLinearRegression

__all__ = ["KJITOperator", "KJITResult", "default_feature_sizes"]

FILE_FORMAT = "pmkjit.KJITOperator"
FILE_VERSION = 3
_TARGET_FORMS = ("relative", "site", "absolute")
_FEATURE_CLASSES = {
    cls.__name__: cls
    for cls in (
        _emb.GaussianJointEmbeddingFeatures,
        _emb.ExpectedProductFeatures,
        _emb.MeanVarianceFeatures,
    )
}
# Rows per block of a batched prediction: a block's features (8 MB at D_out = 1000) stay
# in the shared cache from the feature kernels through the mean and the triangular solve,
# and each BLAS call is still large enough to run near peak (measured on the shared 2-core
# machine: 512 to 2500 rows within a few percent, 256 rows 10-20% slower).
_PREDICT_BLOCK_ROWS = 1024
_MIN_SPLIT_ROWS = 32
# Smallest number of inputs sent to the oracle in one round of a batch (below it, all).
_MIN_QUERY_ROUND = 8
# Answers learned since the last fit before a refit is considered.
_MIN_REFIT_ANSWERS = 50
_FULL_MAP_OUTER = 1000  # outer features of the default map (inner: half)
_FULL_MAP_INSTANCES = 1000  # factors with more instances get a smaller map (default_feature_sizes)
# A held-out prediction counts as accurate when its squared error is within the 99% point
# of chi-square(1) times the regression's noise variance: as good as an oracle answer.
_ACCURATE_CHI2 = 6.63
# One regulariser serves all outputs; the smallest of their evidence maximisers, so that an
# output with a strong signal (a Gamma belief's log rate, moving by units) is not
# over-smoothed to suit weak ones (its log shape, moving by hundredths) when answers are
# noisy: the summed evidence chose 400x more smoothing on the compound-gamma stream, and
# the operator took its misfit there for importance-sampling noise (docs/benchmarks.md).
_REGULARIZATION_RULE = "smallest"
_DEFAULT_SEARCH = {
    "GaussianJointEmbeddingFeatures": {"inner_scale": (0.5, 1.0, 2.0), "outer_scale": (0.5, 1.0, 2.0)},
    "ExpectedProductFeatures": {"scale": (0.25, 0.5, 1.0, 2.0)},
    "MeanVarianceFeatures": {"scale": (0.5, 1.0, 2.0)},
}


class KJITResult(NamedTuple):
    """What a KJIT operator returns for a batch of incoming-message tuples.

    Attributes
    ----------
    beliefs : tuple of family batches
        Projected tilted belief of each target variable, batch shape (B,). Entries the
        oracle was asked about and could not answer are NaN.
    variance : ndarray (B, n_outputs)
        Epistemic predictive variance of every regression output before any oracle call.
    uncertain : ndarray of bool (B,)
        Inputs sent to the oracle: uncertain when first predicted and still uncertain
        after the oracle's answers to more uncertain inputs of the batch were learned.
    accepted : ndarray of bool (B,)
        False where the answer is missing (oracle refused); callers skip those updates.
    """

    beliefs: tuple
    variance: np.ndarray
    uncertain: np.ndarray
    accepted: np.ndarray


class KJITOperator:
    """Learn a factor's message operator just in time, asking an oracle when unsure.

    Parameters
    ----------
    families : sequence of family classes
        Message family of each variable of the factor, ordered ``(*inputs, output)``
        as the oracle's.
    targets : sequence of int, optional
        Variables whose beliefs are predicted (default: all).
    features : message feature map, optional
        Unfitted feature map (default: ``GaussianJointEmbeddingFeatures`` sized by
        :func:`default_feature_sizes`: 500 inner and 1000 outer features).
    search : mapping of parameter name to candidate values, optional
        Hyperparameters of the feature map searched by log evidence on the first
        minibatch; defaults depend on the feature class. ``{}`` disables the search.
    target_form : {"relative", "site", "absolute"}, default "relative"
        What is regressed. ``"relative"``: the belief relative to the incoming message
        of the same variable (Gaussian: mean shift in incoming standard deviations and
        log variance ratio; others: differences of regression targets), so the belief
        starts from the message it refines and the targets are small and smooth.
        ``"site"``: for Gaussian targets, the outgoing message (the EP site) through
        g = (mu_b - mu_c) / v_c and t = log(v_c / v_b) / v_c, with (mu_c, v_c) the
        incoming and (mu_b, v_b) the belief's moments (other families as "relative").
        These tend to the derivatives of the log partition function as v_c -> 0, so a
        narrow cavity (a large data set) keeps the site's relative accuracy, where the
        relative form's targets shrink to zero like v_c and its absolute errors blow up
        in the site's precision; the belief variance v_c exp(-v_c t) is always proper.
        ``"absolute"``: the belief's own targets (the original KJIT code).
    threshold_quantile : float, default 0.9
        Quantile of held-out epistemic variance that sets each output's threshold,
        taken over the held-out predictions that were as accurate as an oracle answer
        (see :func:`calibrated_thresholds`).
    holdout : float, default 0.2
        Fraction of the first minibatch held out to calibrate the thresholds.
    noise_floor : float, default 1.0
        Predictions whose epistemic variance is below ``noise_floor`` times the
        regression's current noise variance (per output) are trusted even above the
        calibrated thresholds: their error is already no larger than an oracle
        answer's. Since the epistemic variance is the input's leverage times the noise
        variance, this asks the oracle only for inputs of leverage above
        ``noise_floor``. ``0`` keeps the calibrated thresholds alone (the paper's rule).
    query_fraction : float in (0, 1], default 0.25
        Uncertain inputs of a batch go to the oracle in rounds: each round answers
        this fraction of those still uncertain (the most uncertain first, at least 8),
        updates the regression and re-predicts the rest, which are asked about in
        the next round only if still uncertain. ``1.0`` asks about all of them at once.
    memory : int, default 4000
        Oracle answers kept (uniform reservoir) for refitting; ``0`` never refits.
    refit_ratio : float, default 10
        Refit when the noise variance of an output grows this many times over its
        value at the last fit (after at least 50 new answers).
    refit_size : int, default 1000
        Answers from the memory on which a refit searches hyperparameters (the final
        regression uses the whole memory).
    tolerance : float, default 0
        Predictions whose epistemic standard deviation is below ``tolerance`` in every
        output are trusted even above the calibrated thresholds: the accuracy the caller
        needs (EP passes its convergence tolerance). The calibrated thresholds alone
        measure novelty against the first minibatch, which in EP comes from the first
        sweep; without a floor, inputs of later sweeps would all look novel however
        accurate their predictions are.
    variance_precision : {"auto", "double"}, default "auto"
        Precision of the triangular solve behind the epistemic variance, two thirds
        of a batched prediction's flops. ``"auto"`` uses float32 whenever the
        regression's condition number bounds the variance's relative error by 5%
        (:meth:`BayesianLinearRegression.leverage`); the variance only meets a
        threshold, so this halves the solve's cost at no cost in decisions. Predicted
        messages are always computed in double precision. A computation setting, not
        learned state: it is not saved with the operator.
    random_state : int, Generator or None
        Seeds feature frequencies and the held-out split.
    """

    def __init__(
        self,
        families: Sequence[type[ExponentialFamily]],
        targets: Sequence[int] | None = None,
        *,
        features=None,
        search: Mapping[str, Sequence[float]] | None = None,
        target_form: str = "relative",
        threshold_quantile: float = 0.9,
        holdout: float = 0.2,
        noise_floor: float = 1.0,
        query_fraction: float = 0.25,
        memory: int = 4000,
        refit_ratio: float = 10.0,
        refit_size: int = 1000,
        tolerance: float = 0.0,
        variance_precision: str = "auto",
        random_state=None,
    ) -> None:
        self.families = tuple(families)
        self.targets = tuple(range(len(self.families))) if targets is None else tuple(int(t) for t in targets)
        self.features = features
        self.search = search
        if target_form not in _TARGET_FORMS:
            raise ValueError(f"target_form must be one of {_TARGET_FORMS}, got {target_form!r}")
        self.target_form = target_form
        self.threshold_quantile = threshold_quantile
        self.holdout = holdout
        if not noise_floor >= 0.0:
            raise ValueError(f"noise_floor must be >= 0, got {noise_floor}")
        self.noise_floor = float(noise_floor)
        if not 0.0 < query_fraction <= 1.0:
            raise ValueError(f"query_fraction must be in (0, 1], got {query_fraction}")
        self.query_fraction = float(query_fraction)
        self.memory = int(memory)
        self.refit_ratio = float(refit_ratio)
        self.refit_size = int(refit_size)
        if self.memory < 0 or self.refit_size < 10 or not self.refit_ratio > 1.0:
            raise ValueError("need memory >= 0, refit_size >= 10 and refit_ratio > 1")
        self.tolerance = float(tolerance)
        if variance_precision not in ("auto", "double"):
            raise ValueError(f"variance_precision must be 'auto' or 'double', got {variance_precision!r}")
        self.variance_precision = variance_precision
        self.random_state = random_state
        for t in self.targets:
            if not 0 <= t < len(self.families):
                raise ValueError(f"target {t} is not one of the factor's {len(self.families)} variables")
        self.n_oracle_calls = 0
        self.n_predictions = 0
        self.n_refits = 0

    # ------------------------------------------------------------ encoding
    @property
    def n_outputs(self) -> int:
        return 2 * len(self.targets)

    def _encode(self, beliefs: Sequence[ExponentialFamily], messages: Sequence[ExponentialFamily]) -> np.ndarray:
        cols = []
        for t, belief in zip(self.targets, beliefs):
            y = np.asarray(belief.regression_targets(), dtype=float)
            if self.target_form != "absolute":
                y = y - _reference(messages[t])
                if self.families[t] is Gaussian:
                    v_c = messages[t].var()
                    shift = belief.mean() - messages[t].mean()
                    if self.target_form == "site":
                        y[:, 0] = shift / v_c
                        y[:, 1] = -y[:, 1] / v_c  # log(v_c / v_b) / v_c
                    else:
                        y[:, 0] = shift / np.sqrt(v_c)
            cols.append(y)
        return np.concatenate(cols, axis=1)

    def _decode(self, Y: np.ndarray, messages: Sequence[ExponentialFamily]) -> tuple:
        beliefs = []
        for j, t in enumerate(self.targets):
            y = np.array(Y[:, 2 * j : 2 * j + 2], dtype=float)
            fam = self.families[t]
            if self.target_form != "absolute":
                if fam is Gaussian:
                    v_c = messages[t].var()
                    if self.target_form == "site":
                        shift = y[:, 0] * v_c
                        y[:, 1] = -y[:, 1] * v_c
                    else:
                        shift = y[:, 0] * np.sqrt(v_c)
                    y = y + _reference(messages[t])
                    y[:, 0] = messages[t].mean() + shift
                else:
                    y = y + _reference(messages[t])
            beliefs.append(fam.from_regression_targets(y))
        return tuple(beliefs)

    # -------------------------------------------------------------- fitting
    def fit(
        self, messages: Sequence[ExponentialFamily], beliefs: Sequence[ExponentialFamily]
    ) -> "KJITOperator":
        """Fit on a first minibatch of (incoming messages, oracle beliefs of the targets).

        Chooses the feature hyperparameters and regulariser by log evidence on the
        non-held-out part, calibrates the thresholds on the held-out part, then refits
        on everything. The memory restarts from this minibatch.
        """
        messages = self._check_messages(messages)
        beliefs = tuple(beliefs)
        if len(beliefs) != len(self.targets):
            raise ValueError(f"expected {len(self.targets)} belief batches, got {len(beliefs)}")
        Y = self._encode(beliefs, messages)
        if not np.isfinite(Y).all():
            raise ValueError("beliefs contain non-finite entries; drop rejected oracle answers first")
        if Y.shape[0] < 10:
            raise ValueError(f"the first minibatch needs at least 10 message tuples, got {Y.shape[0]}")
        rng = as_generator(self.random_state)
        self._feature_seed = int(rng.integers(2**63 - 1))
        self._memory_seed = int(rng.integers(2**63 - 1))
        self.__dict__.pop("thresholds_", None)  # a fresh fit starts its calibration afresh
        self.memory_ = np.empty((0, self._packed_width))
        self._n_offered = 0
        self._remember(pack_answers(messages, beliefs))
        with single_threaded_blas():
            self._fit_core(messages, Y, rng)
        return self

    def _fit_core(self, messages: tuple, Y: np.ndarray, rng: np.random.Generator, final: tuple | None = None) -> None:
        """Select hyperparameters, calibrate thresholds, fit; ``final`` = (messages, Y) for the last fit."""
        B = Y.shape[0]
        perm = rng.permutation(B)
        n_hold = max(2, int(round(self.holdout * B)))
        hold, train = perm[:n_hold], perm[n_hold:]

        features = self._make_features()
        self.hyperparameters_ = self._select(features, _take(messages, train), Y[train])
        features.set_params(**self.hyperparameters_)
        # Calibrate on the held-out fifth with a model that has not seen it.
        features = self._fit_features(features, _take(messages, train))
        blr = BayesianLinearRegression(regularization_rule=_REGULARIZATION_RULE).fit(
            features.transform(_take(messages, train)), Y[train])
        Phi_h = features.transform(_take(messages, hold))
        mean_h, var_h = blr.predict(Phi_h, return_var=True, include_noise=False)
        err2 = (mean_h - Y[hold]) ** 2
        thresholds = calibrated_thresholds(var_h, err2, blr.noise_var_, self.threshold_quantile)
        # A refit never loosens the thresholds: its held-out part, drawn from a memory
        # that mixes regions, can make "typical" variance look larger than the first
        # fit's, and more data should make the operator more demanding, not less.
        self.thresholds_ = thresholds if not hasattr(self, "thresholds_") else np.minimum(self.thresholds_, thresholds)
        total = var_h + blr.noise_var_
        self.calibration_ = np.median(err2 / total, axis=0)  # ~0.45 when well calibrated (chi2_1 median)
        self.holdout_rmse_ = np.sqrt(err2.mean(axis=0))
        # Refit on all of the first minibatch (or the memory) with the regulariser chosen above.
        messages, Y = final if final is not None else (messages, Y)
        self.features_ = self._fit_features(features, messages)
        self.regression_ = BayesianLinearRegression(regularization=blr.regularization_).fit(
            self.features_.transform(messages), Y
        )
        self._n_at_fit = int(messages[0].natural.shape[0])
        self._n_since_fit = 0
        self._noise_at_fit = np.array(self.regression_.noise_var_)

    # ------------------------------------------------------------- memory
    @property
    def _packed_width(self) -> int:
        return 2 * (len(self.families) + len(self.targets))

    def _unpack(self, packed: np.ndarray) -> tuple[tuple, tuple]:
        return unpack_answers(packed, self.families, [self.families[t] for t in self.targets])

    def _remember(self, packed: np.ndarray) -> None:
        """Offer answers to the reservoir: every answer offered so far is kept with equal probability."""
        if self.memory == 0 or packed.shape[0] == 0:
            return
        fill = min(self.memory - self.memory_.shape[0], packed.shape[0])
        if fill > 0:
            self.memory_ = np.concatenate([self.memory_, packed[:fill]])
            self._n_offered += fill
            packed = packed[fill:]
        n = packed.shape[0]
        if n == 0:
            return
        # Vectorised reservoir sampling (Algorithm R): the k-th further answer takes a
        # random slot with probability size / (answers offered so far); a slot drawn
        # twice keeps the later answer. The stream of draws is a function of the seed and
        # the number of answers offered, so a saved and reloaded operator continues it.
        rng = np.random.default_rng([self._memory_seed, self._n_offered])
        offered = self._n_offered + np.arange(1, n + 1)
        slot = np.floor(rng.random(n) * offered).astype(np.int64)
        self._n_offered += n
        hit = np.flatnonzero(slot < self.memory)
        if hit.size:
            slots, last = np.unique(slot[hit][::-1], return_index=True)
            self.memory_[slots] = packed[hit[::-1][last]]

    def _stale(self) -> bool:
        if self.memory == 0 or self._n_since_fit < _MIN_REFIT_ANSWERS:
            return False
        if self._n_since_fit >= self._n_at_fit:
            return True
        return bool(np.any(self.regression_.noise_var_ > self.refit_ratio * self._noise_at_fit))

    def refit(self) -> "KJITOperator":
        """Re-select hyperparameters, recalibrate thresholds and refit on the memory."""
        self._check_fitted()
        if self.memory_.shape[0] < 10:
            raise RuntimeError("the operator's memory holds fewer than 10 answers; nothing to refit on")
        rng = np.random.default_rng([self._memory_seed, self._n_offered, self.n_refits + 1])
        messages, beliefs = self._unpack(self.memory_)
        Y = self._encode(beliefs, messages)
        n = Y.shape[0]
        sel = np.sort(rng.choice(n, self.refit_size, replace=False)) if n > self.refit_size else np.arange(n)
        with single_threaded_blas():
            self._fit_core(_take(messages, sel), Y[sel], rng, final=(messages, Y))
        self.n_refits += 1
        return self

    def _make_features(self):
        if self.features is None:
            return _emb.GaussianJointEmbeddingFeatures(*default_feature_sizes(self.families))
        params = self.features.get_params()
        return type(self.features)(**params)

    def _fit_features(self, features, messages):
        # The same integer seed on every refit: widths change, the random bases do not.
        return features.set_params(random_state=self._feature_seed).fit(messages)

    def _select(self, features, messages, Y) -> dict:
        search = self.search if self.search is not None else _DEFAULT_SEARCH.get(type(features).__name__, {})
        if not search:
            return {}
        names = list(search)
        best, best_value = {}, -np.inf
        self.search_trace_ = []
        for values in itertools.product(*(search[n] for n in names)):
            params = dict(zip(names, values))
            features.set_params(**params)
            Phi = self._fit_features(features, messages).transform(messages)
            blr = BayesianLinearRegression(regularization_rule=_REGULARIZATION_RULE).fit(Phi, Y)
            value = float(blr.log_evidence().sum())
            self.search_trace_.append((params, value))
            if value > best_value:
                best, best_value = params, value
        return best

    # ------------------------------------------------------------ prediction
    def current_thresholds(self) -> np.ndarray:
        """Epistemic variance per output above which the oracle is asked, as of now.

        The calibrated :attr:`thresholds_`, floored at ``noise_floor`` times the
        regression's current noise variance and at ``tolerance**2``.
        """
        self._check_fitted()
        floor = np.maximum(self.noise_floor * self.regression_.noise_var_, self.tolerance**2)
        return np.maximum(np.maximum(self.thresholds_, floor), np.finfo(float).tiny)

    def predict(self, messages: Sequence[ExponentialFamily]) -> tuple[tuple, np.ndarray]:
        """Predicted beliefs of the targets and the epistemic variance ``(B, n_outputs)``."""
        self._check_fitted()
        messages = self._check_messages(messages)
        B = len(messages[0])
        if isinstance(self.features_, _emb.GaussianJointEmbeddingFeatures):
            # Reuse one feature buffer across calls (and let the variance overwrite it):
            # fresh 80 MB arrays per batch cost more in page faults than the arithmetic.
            D = self.features_.n_features_out_
            if getattr(self, "_workspace", np.empty((0, 0))).shape[0] < B or self._workspace.shape[1] != D:
                self._workspace = np.empty((B, D))
            K = self.n_outputs
            mean, var = np.empty((B, K)), np.empty((B, K))

            def block(lo: int, hi: int) -> None:
                # features -> mean -> triangular solve on a block that stays in cache;
                # for_row_blocks gives each core its own blocks, so no nested threading
                sub = [m[lo:hi] for m in messages]
                Phi = self.features_.transform(sub, out=self._workspace[lo:hi], threads=False)
                m_blk, v_blk = self.regression_.predict(
                    Phi, return_var=True, include_noise=False, overwrite_features=True,
                    variance_precision=self.variance_precision,
                )
                mean[lo:hi] = np.reshape(m_blk, (hi - lo, K))
                var[lo:hi] = np.reshape(v_blk, (hi - lo, K))

            self.features_._validate(messages, fitting=False)  # fail before any thread starts
            # A batch smaller than two blocks is still split between the cores: one
            # block would run on OpenBLAS's own threads, which spin and slow down several
            # times over whenever another process holds a core.
            rows = max(_MIN_SPLIT_ROWS, min(_PREDICT_BLOCK_ROWS, -(-B // n_workers())))
            for_row_blocks(block, B, rows)
        else:
            Phi = self.features_.transform(messages)
            mean, var = self.regression_.predict(
                Phi, return_var=True, include_noise=False, variance_precision=self.variance_precision
            )
        self.n_predictions += B
        with np.errstate(over="ignore", invalid="ignore"):
            beliefs = self._decode(mean, messages)
        # A prediction that decodes to no proper message (far extrapolation) is maximally uncertain.
        bad = ~_answered(beliefs)
        if bad.any():
            var = np.where(bad[:, None], np.inf, var)
        return beliefs, var

    def update(self, messages: Sequence[ExponentialFamily], beliefs: Sequence[ExponentialFamily]) -> "KJITOperator":
        """Add oracle answers to the regression (rank-k Cholesky update)."""
        self._check_fitted()
        messages = self._check_messages(messages)
        beliefs = tuple(beliefs)
        Y = self._encode(beliefs, messages)
        ok = np.flatnonzero(np.isfinite(Y).all(axis=1))
        if ok.size == 0:
            return self
        msgs = _take(messages, ok)
        Phi = self.features_.transform(msgs)
        with single_threaded_blas():
            self.regression_.partial_fit(Phi, Y[ok])
        self._n_since_fit += ok.size
        self._remember(pack_answers(msgs, tuple(b[ok] for b in beliefs)))
        if self._stale():
            self.refit()
        return self

    def __call__(self, messages: Sequence[ExponentialFamily], oracle: Callable) -> KJITResult:
        """Answer a batch: predict where confident, ask ``oracle`` elsewhere and learn.

        ``oracle(messages)`` returns an object with ``beliefs`` (one batch per variable)
        and ``accepted`` (bool mask), e.g. :class:`~pmkjit.operators.OracleResult`.
        The first call fits the operator on the oracle's answers to the whole batch.
        """
        messages = self._check_messages(messages)
        B = len(messages[0])
        if not hasattr(self, "regression_"):
            result = oracle(messages)
            self.n_oracle_calls += B
            answers = tuple(result.beliefs[t] for t in self.targets)
            good = _answered(answers)
            self.fit(_take(messages, np.flatnonzero(good)), tuple(b[good] for b in answers))
            _, var = self.predict(messages)
            return KJITResult(answers, var, np.ones(B, bool), good)
        beliefs, var = self.predict(messages)
        first_var = var
        excess = np.max(var / self.current_thresholds(), axis=1)  # > 1: uncertain
        pending = np.flatnonzero(excess > 1.0)
        asked = np.zeros(B, bool)
        accepted = np.ones(B, bool)
        while pending.size:
            # Ask about the most uncertain part of the pending inputs, learn, and re-predict
            # the rest: inputs of a batch resemble each other, so a few answers often make
            # the operator sure of many others (as it would be if they came one by one).
            k = pending.size if pending.size <= _MIN_QUERY_ROUND else max(
                _MIN_QUERY_ROUND, int(np.ceil(self.query_fraction * pending.size)))
            order = np.argsort(-excess[pending], kind="stable")
            idx, rest = np.sort(pending[order[:k]]), np.sort(pending[order[k:]])
            sub = _take(messages, idx)
            result = oracle(sub)
            self.n_oracle_calls += idx.size
            asked[idx] = True
            answers = tuple(result.beliefs[t] for t in self.targets)
            ok = _answered(answers)
            accepted[idx[~ok]] = False
            if ok.any():
                self.update(_take(sub, np.flatnonzero(ok)), tuple(a[ok] for a in answers))
            beliefs = tuple(b.scatter(idx, a) for b, a in zip(beliefs, answers))
            if rest.size == 0:
                break
            new_beliefs, var_rest = self.predict(_take(messages, rest))
            self.n_predictions -= rest.size  # a re-prediction, not a new message
            beliefs = tuple(b.scatter(rest, a) for b, a in zip(beliefs, new_beliefs))
            excess[rest] = np.max(var_rest / self.current_thresholds(), axis=1)
            pending = rest[excess[rest] > 1.0]
        return KJITResult(beliefs, first_var, asked, accepted)

    # ----------------------------------------------------------------- I/O
    def save(self, path: str | Path) -> Path:
        """Write the fitted operator to a versioned ``.npz`` file (no pickle)."""
        self._check_fitted()
        path = Path(path)
        arrays = {
            "meta/format": np.asarray(FILE_FORMAT),
            "meta/version": np.asarray(FILE_VERSION),
            "meta/families": np.asarray([f.name for f in self.families]),
            "meta/targets": np.asarray(self.targets),
            "meta/target_form": np.asarray(self.target_form),
            "meta/feature_class": np.asarray(type(self.features_).__name__),
            "meta/threshold_quantile": np.asarray(self.threshold_quantile),
            "meta/noise_floor": np.asarray(self.noise_floor),
            "meta/query_fraction": np.asarray(self.query_fraction),
            "thresholds": self.thresholds_,
            "calibration": self.calibration_,
            "meta/memory": np.asarray([self.memory, self.refit_size]),
            "meta/refit_ratio": np.asarray(self.refit_ratio),
            "counts": np.asarray([self.n_oracle_calls, self.n_predictions, self.n_refits, self._n_offered]),
            "seeds": np.asarray([self._feature_seed, self._memory_seed], dtype=np.int64),
            "memory": self.memory_,
            "refit_state": np.concatenate([[self._n_at_fit, self._n_since_fit], self._noise_at_fit]),
        }
        arrays.update({f"features/{k}": v for k, v in self.features_.state_dict().items()})
        arrays.update({f"regression/{k}": v for k, v in self.regression_.state_dict().items()})
        with open(path, "wb") as fh:  # keep the exact name (np.savez appends .npz to str paths)
            np.savez(fh, **arrays)
        return path

    @classmethod
    def load(
        cls, path: str | Path, families: Sequence[type[ExponentialFamily]] | None = None
    ) -> "KJITOperator":
        """Read an operator written by :meth:`save`.

        Parameters
        ----------
        path : path of the ``.npz`` file
        families : sequence of family classes, optional
            The factor's families; a file made for other families is refused.

        Raises
        ------
        OperatorFileError
            If the file is missing, corrupt, of another format or version, or does not
            match ``families``.
        """
        path = Path(path)
        try:
            # Open the file ourselves so that a corrupt archive never leaks the handle.
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except FileNotFoundError as exc:
            raise OperatorFileError(f"operator file {path} does not exist") from exc
        except (OSError, ValueError, TypeError, AttributeError, zipfile.BadZipFile, EOFError) as exc:
            raise OperatorFileError(f"operator file {path} is corrupt or not an .npz file: {exc}") from exc
        try:
            fmt = str(arrays["meta/format"])
            if fmt != FILE_FORMAT:
                raise OperatorFileError(f"{path} holds {fmt!r}, not a {FILE_FORMAT}")
            version = int(arrays["meta/version"])
            if version != FILE_VERSION:
                raise OperatorFileError(
                    f"{path} was written by operator file version {version}; this pmkjit reads version {FILE_VERSION}"
                )
            fams = tuple(family_by_name(str(n)) for n in arrays["meta/families"])
            if families is not None and tuple(f.name for f in families) != tuple(f.name for f in fams):
                raise OperatorFileError(
                    f"{path} is an operator for variables {[f.name for f in fams]}, "
                    f"not {[f.name for f in families]}"
                )
            op = cls(
                fams,
                targets=arrays["meta/targets"].tolist(),
                target_form=str(arrays["meta/target_form"]),
                threshold_quantile=float(arrays["meta/threshold_quantile"]),
                noise_floor=float(arrays["meta/noise_floor"]),
                query_fraction=float(arrays["meta/query_fraction"]),
                memory=int(arrays["meta/memory"][0]),
                refit_size=int(arrays["meta/memory"][1]),
                refit_ratio=float(arrays["meta/refit_ratio"]),
            )
            feature_cls = _FEATURE_CLASSES[str(arrays["meta/feature_class"])]
            op.features_ = feature_cls.from_state_dict(_section(arrays, "features/"))
            op.regression_ = BayesianLinearRegression.from_state_dict(_section(arrays, "regression/"))
            op.thresholds_ = np.asarray(arrays["thresholds"], dtype=float)
            op.calibration_ = np.asarray(arrays["calibration"], dtype=float)
            op.n_oracle_calls, op.n_predictions, op.n_refits, op._n_offered = (int(c) for c in arrays["counts"])
            op._feature_seed, op._memory_seed = (int(c) for c in arrays["seeds"])
            op.memory_ = np.array(arrays["memory"], dtype=float)
            op._n_at_fit, op._n_since_fit = (int(c) for c in arrays["refit_state"][:2])
            op._noise_at_fit = np.asarray(arrays["refit_state"][2:], dtype=float)
            if op._noise_at_fit.shape != (op.n_outputs,):
                raise OperatorFileError(f"{path}: refit state does not match {op.n_outputs} outputs")
            if op.memory_.ndim != 2 or op.memory_.shape[1] != op._packed_width or op.memory_.shape[0] > op.memory:
                raise OperatorFileError(f"{path}: memory of shape {op.memory_.shape} does not fit the operator")
            if op.thresholds_.shape != (op.n_outputs,) or op.regression_.coef_.shape != (
                op.features_.n_features_out_,
                op.n_outputs,
            ):
                raise OperatorFileError(f"{path}: regression, features and outputs have inconsistent sizes")
            if not (np.isfinite(op.regression_.coef_).all() and np.isfinite(op.thresholds_).all()
                    and np.isfinite(op.memory_).all()):
                raise OperatorFileError(f"{path}: non-finite weights, thresholds or memory")
            if len(op.memory_):
                # the feature map's own arrays must fit together: run it on one remembered
                # message tuple (a damaged map failed only at the first prediction, mid-fit,
                # with an error that did not name the file)
                msgs, _ = unpack_answers(op.memory_[:1], op.families, [op.families[t] for t in op.targets])
                phi = op.features_.transform(msgs)
                if phi.shape != (1, op.features_.n_features_out_) or not np.isfinite(phi).all():
                    raise OperatorFileError(f"{path}: the feature map gives features of shape {phi.shape}")
        except OperatorFileError:
            raise
        except KeyError as exc:
            raise OperatorFileError(f"{path} is missing entry {exc.args[0]!r}") from exc
        except (ValueError, TypeError, IndexError, AttributeError, np.linalg.LinAlgError) as exc:
            raise OperatorFileError(f"{path} is corrupt: {exc}") from exc
        return op

    # ------------------------------------------------------------- helpers
    def _check_fitted(self) -> None:
        if not hasattr(self, "regression_"):
            raise RuntimeError("KJITOperator is not fitted yet; call it with an oracle or call fit")

    def _check_messages(self, messages: Sequence[ExponentialFamily]) -> tuple:
        messages = tuple(messages)
        if len(messages) != len(self.families):
            raise ValueError(
                f"the factor has {len(self.families)} variables ({[f.name for f in self.families]}); "
                f"got {len(messages)} message batches"
            )
        for i, (m, fam) in enumerate(zip(messages, self.families)):
            if not isinstance(m, fam):
                raise TypeError(f"message {i} should be {fam.name}, got {type(m).__name__}")
            if not m.is_proper().all():
                raise ImproperMessageError(
                    f"incoming message {i} ({fam.name}) has {int((~m.is_proper()).sum())} improper entries"
                )
        return messages

    def __repr__(self) -> str:
        state = "fitted" if hasattr(self, "regression_") else "unfitted"
        return (
            f"KJITOperator(families={[f.name for f in self.families]}, targets={list(self.targets)}, {state}, "
            f"oracle_calls={self.n_oracle_calls}, predictions={self.n_predictions})"
        )


def default_feature_sizes(families: Sequence[type[ExponentialFamily]], n_instances: int | None = None) -> tuple[int, int]:
    """``(n_inner, n_outer)`` of the default feature map for a factor.

    The full map, 500 inner and 1000 outer features, is the accurate one: on the UCI
    logistic-regression sets, KJIT-EP's posterior means lie within 0.02-0.06 sd of
    quadrature EP's with it, against up to 0.17 sd with (200, 400) (``docs/benchmarks.md``).
    A factor with ``n_instances`` instances makes that many predictions per EP sweep,
    each costing O(n_outer^2) for its predictive variance; above ``_FULL_MAP_INSTANCES``
    instances the map shrinks as ``1 / sqrt(n_instances)``, keeping a sweep's predictions
    at the cost of that many full-size ones, but never below 100 outer features per
    message parameter (two per message, one per point mass). Many instances also make
    the cavities narrow, where the outgoing messages are smooth functions of them: on
    logistic regression with N = 10,000 the (200, 400) map this gives keeps EP within
    0.01 sd of quadrature EP. Half as many inner as outer features, as in the paper.
    ``n_instances=None`` (a stand-alone operator) gives the full map.
    """
    p = sum(1 if fam.name == "PointMass" else 2 for fam in families)
    n_outer = _FULL_MAP_OUTER
    if n_instances is not None and n_instances > _FULL_MAP_INSTANCES:
        budget = _FULL_MAP_OUTER * np.sqrt(_FULL_MAP_INSTANCES / n_instances)
        n_outer = int(np.clip(budget, min(100 * p, _FULL_MAP_OUTER), _FULL_MAP_OUTER))
    n_inner = 2 * (n_outer // 4)
    return n_inner, 2 * (n_outer // 2)


def calibrated_thresholds(var: np.ndarray, err2: np.ndarray, noise_var: np.ndarray, quantile: float) -> np.ndarray:
    """Per-output variance threshold from held-out predictions ``(n_hold, K)``.

    The ``quantile`` of the epistemic variance over the held-out predictions that were
    accurate (squared error at most 6.63 times the noise variance, chi-square(1)'s 99%
    point), 0 for an output without any. Inaccurate predictions are left out because
    their variance is exactly the level that must not be trusted: one far-out message
    among the few held out (a heavy tail's draw) would otherwise set the quantile, and
    the operator would trust every prediction below its variance from then on.
    """
    accurate = err2 <= _ACCURATE_CHI2 * np.asarray(noise_var)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an output without accurate predictions
        t = np.nanquantile(np.where(accurate, var, np.nan), quantile, axis=0)
    return np.nan_to_num(t, nan=0.0)


def pack_answers(messages: Sequence[ExponentialFamily], beliefs: Sequence[ExponentialFamily]) -> np.ndarray:
    """Oracle answers as one array: the natural parameters of every message, then every belief."""
    return np.concatenate([np.asarray(m.natural, float) for m in (*messages, *beliefs)], axis=1)


def unpack_answers(packed: np.ndarray, message_families: Sequence[type[ExponentialFamily]],
                   belief_families: Sequence[type[ExponentialFamily]]) -> tuple[tuple, tuple]:
    """Inverse of :func:`pack_answers`: (message batches, belief batches)."""
    fams = (*message_families, *belief_families)
    parts = tuple(f.from_natural(packed[:, 2 * i : 2 * i + 2]) for i, f in enumerate(fams))
    return parts[: len(message_families)], parts[len(message_families) :]


def _answered(beliefs: Sequence[ExponentialFamily]) -> np.ndarray:
    """Entries where every target belief is a proper message (the oracle answered)."""
    ok = np.ones(len(beliefs[0]), bool)
    for b in beliefs:
        ok &= b.is_proper()
    return ok


def _reference(message: ExponentialFamily) -> np.ndarray:
    """Regression targets of the incoming message a relative target is measured from."""
    return np.asarray(message.regression_targets(), dtype=float)


def _take(messages: Sequence[ExponentialFamily], index: np.ndarray) -> tuple:
    return tuple(m[index] for m in messages)



def _section(arrays: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
