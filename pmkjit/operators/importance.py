"""Importance-sampling oracle built from a factor's vectorised forward sampler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.special import logsumexp

from pmkjit._random import as_generator
from pmkjit.errors import OracleError
from pmkjit.families import ExponentialFamily
from pmkjit.operators.oracle import OracleResult
from pmkjit.operators.quadrature import _safe_project

__all__ = ["ImportanceSamplingOracle"]

_MAX_DOUBLES = 20_000_000  # samples x batch entries held at once (~160 MB per array)


class ImportanceSamplingOracle:
    """Projected tilted beliefs by self-normalised importance sampling.

    The proposal for a tuple of incoming messages is the product of the input messages
    times the factor itself: inputs are drawn from their messages and the output from
    ``sampler``. The importance weight is then the output's incoming message at the
    sampled output, or, for an observed output, the factor's log-density ``logp`` at
    the observed value.

    Parameters
    ----------
    sampler : callable
        ``sampler(inputs, rng) -> x_out``: ``inputs`` is a tuple of arrays of identical
        shape ``(S, b)``; returns the output with the same shape. Vectorised.
    families : sequence of family classes
        ``(*inputs, output)``, or only the inputs when ``observed`` is given.
    logp : callable, optional
        ``logp(x_out, inputs) -> log psi(x_out | inputs)``; required with ``observed``.
    observed : array (B,), optional
        Observed output per message tuple (a likelihood factor).
    n_samples : int, default 100_000
    min_ess : float, default 100
        Entries with a smaller effective sample size are retried with twice the
        samples, up to ``max_retries`` times; then refused.
    max_retries : int, default 2
    on_failure : {"mask", "raise"}, default "mask"
        Refused entries get NaN beliefs and ``accepted=False``, or raise OracleError.
    random_state : int, Generator or None
    """

    def __init__(self, sampler: Callable, families: Sequence[type[ExponentialFamily]], *,
                 logp: Callable | None = None, observed=None, n_samples: int = 100_000, min_ess: float = 100.0,
                 max_retries: int = 2, on_failure: str = "mask", random_state=None):
        if on_failure not in ("mask", "raise"):
            raise ValueError(f"on_failure must be 'mask' or 'raise', got {on_failure!r}")
        if observed is not None and logp is None:
            raise ValueError("an observed output needs the factor's log-density `logp` to weight samples")
        self.sampler = sampler
        self.families = tuple(families)
        self.logp = logp
        self.observed = None if observed is None else np.asarray(observed, dtype=float)
        self.n_samples = int(n_samples)
        self.min_ess = float(min_ess)
        self.max_retries = int(max_retries)
        self.on_failure = on_failure
        self.rng = as_generator(random_state)
        self.n_calls = 0
        self.n_samples_drawn = 0

    @property
    def n_inputs(self) -> int:
        return len(self.families) - (0 if self.observed is not None else 1)

    def __call__(self, messages: Sequence[ExponentialFamily], observed=None) -> OracleResult:
        messages = tuple(messages)
        if len(messages) != len(self.families):
            raise ValueError(f"expected {len(self.families)} message batches, got {len(messages)}")
        for i, (m, fam) in enumerate(zip(messages, self.families)):
            if not isinstance(m, fam):
                raise TypeError(f"message {i} should be {fam.name}, got {type(m).__name__}")
            m.check_proper(f"incoming message {i}")
        obs = self.observed if observed is None else np.asarray(observed, dtype=float)
        B = len(messages[0])
        n_vars = len(self.families)
        ess_stats = np.full((n_vars, B, 2), np.nan)
        ess = np.zeros(B)
        todo = np.arange(B)
        S = self.n_samples
        for _attempt in range(self.max_retries + 1):
            stats_t, ess_t = self._estimate(messages, obs, todo, S)
            ess_stats[:, todo] = stats_t
            ess[todo] = ess_t
            todo = todo[ess_t < self.min_ess]
            if todo.size == 0:
                break
            S *= 2
        accepted = ess >= self.min_ess
        if not accepted.all() and self.on_failure == "raise":
            bad = np.flatnonzero(~accepted)
            raise OracleError(
                f"importance sampling effective sample size below {self.min_ess:g} for {bad.size} message tuples "
                f"(batch indices {bad[:10].tolist()}{'...' if bad.size > 10 else ''}); the incoming messages make "
                "the proposal a poor match for the tilted distribution"
            )
        beliefs = []
        for v, fam in enumerate(self.families):
            stats_v = np.where(accepted[:, None], ess_stats[v], np.nan)
            belief, ok = _safe_project(fam, stats_v, f"variable {v}")
            beliefs.append(belief)
            accepted &= ok
        self.n_calls += B
        return OracleResult(tuple(beliefs), ess, accepted)

    def _estimate(self, messages, obs, idx, S):
        """Weighted sufficient statistics ``(n_vars, b, 2)`` and ESS ``(b,)`` for entries ``idx``."""
        n_vars = len(self.families)
        out = np.empty((n_vars, idx.size, 2))
        ess = np.empty(idx.size)
        chunk = max(1, _MAX_DOUBLES // S)
        for start in range(0, idx.size, chunk):
            sel = idx[start : start + chunk]
            ins = tuple(messages[v][sel].sample(self.rng, S) for v in range(self.n_inputs))  # (S, b) each
            x_out = np.asarray(self.sampler(ins, self.rng), dtype=float)
            if x_out.shape != ins[0].shape:
                raise ValueError(f"sampler returned shape {x_out.shape}, expected {ins[0].shape}")
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                if obs is None:
                    logw = messages[-1][sel].logpdf(x_out)
                else:
                    logw = self.logp(np.broadcast_to(obs[sel], x_out.shape), ins)
            logw = np.where(np.isnan(logw), -np.inf, logw)
            lse = logsumexp(logw, axis=0)
            with np.errstate(invalid="ignore"):
                w = np.exp(logw - lse)
            w = np.nan_to_num(w, nan=0.0)
            ess[start : start + sel.size] = 1.0 / np.maximum(np.sum(w * w, axis=0), 1e-300) * (np.isfinite(lse))
            values = list(ins) + ([x_out] if obs is None else [])
            for v, fam in enumerate(self.families):
                with np.errstate(divide="ignore", invalid="ignore"):
                    T = fam.sufficient_statistics(values[v])
                T = np.where(w[..., None] > 0, T, 0.0)  # zero-weight samples may sit off the support
                out[v, start : start + sel.size] = np.einsum("sb,sbk->bk", w, T)
            self.n_samples_drawn += S * sel.size
        return out, ess
