"""What every oracle returns, and the checks and projections the oracles share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from pmkjit.errors import ImproperMessageError
from pmkjit.families import ExponentialFamily, Gaussian

__all__ = ["OracleResult"]


class OracleResult(NamedTuple):
    """Projected tilted beliefs for a batch of incoming-message tuples.

    Attributes
    ----------
    beliefs : tuple of family batches
        One per variable of the factor, in the order ``(*inputs, output)`` (an observed
        output has none), each of batch shape ``(B,)``: the KL projection of the tilted
        marginal of that variable. Entries that are not accepted hold NaN natural
        parameters in every belief.
    ess : ndarray (B,)
        Effective sample size (importance sampling) or number of quadrature nodes.
    accepted : ndarray of bool (B,)
        False where the oracle could not give a reliable answer.
    """

    beliefs: tuple
    ess: np.ndarray
    accepted: np.ndarray


def check_messages(messages: Sequence[ExponentialFamily], families: Sequence[type]) -> tuple:
    """Messages as a tuple, checked against ``families``: proper batches of one shape ``(B,)``.

    Raises
    ------
    ValueError, TypeError
        Wrong number, family or shape of the batches (naming the message).
    ImproperMessageError
        An incoming message is improper (naming the message and the first bad index).
    """
    messages = tuple(messages)
    if len(messages) != len(families):
        raise ValueError(f"expected {len(families)} message batches (one per variable), got {len(messages)}")
    for i, (m, fam) in enumerate(zip(messages, families)):
        if not isinstance(m, fam):
            raise TypeError(f"message {i} should be {fam.name}, got {type(m).__name__}")
        if len(m.batch_shape) != 1:
            raise ValueError(f"message {i} must be a batch of shape (B,), got batch shape {m.batch_shape}")
        m.check_proper(f"incoming message {i}")
    lengths = [len(m) for m in messages]
    if len(set(lengths)) != 1:
        raise ValueError(f"message batches differ in length: {lengths}")
    return messages


def project_beliefs(families: Sequence[type], stats: np.ndarray, accepted: np.ndarray) -> tuple[tuple, np.ndarray]:
    """Project expected statistics of every variable; refused entries become NaN everywhere.

    Parameters
    ----------
    families : sequence of family classes
    stats : ndarray (n_vars, B, 3)
        ``E[T]`` in the first two columns; for a Gaussian variable the third holds the
        central variance, used instead of ``E[x^2] - E[x]^2`` (which loses digits
        when ``|mean| >> sd``). NaN elsewhere.
    accepted : ndarray of bool (B,)
        Entries answered so far; entries whose projection fails are removed.

    Returns
    -------
    beliefs : tuple of family batches (B,)
    accepted : ndarray of bool (B,)
    """
    accepted = accepted.copy()
    naturals = []
    for v, fam in enumerate(families):
        ess = np.where(accepted[:, None], stats[v], np.nan)
        if issubclass(fam, Gaussian):
            ok = np.isfinite(ess[:, 0]) & np.isfinite(ess[:, 2]) & (ess[:, 2] > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                natural = fam(np.where(ok, ess[:, 0], 0.0), np.where(ok, ess[:, 2], 1.0)).natural
        else:
            natural, ok = _safe_project(fam, ess[:, :2], f"variable {v} ({fam.name})")
        ok &= np.isfinite(natural).all(axis=-1)
        naturals.append(natural)
        accepted &= ok
    beliefs = tuple(fam.from_natural(np.where(accepted[:, None], nat, np.nan)) for fam, nat in zip(families, naturals))
    return beliefs, accepted


def _safe_project(fam, ess: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Natural parameters of ``fam.project(ess)`` (B, 2) and success (B,); failures are NaN, never raised."""
    ok = np.isfinite(ess).all(axis=-1)
    natural = np.full(ess.shape[:-1] + (2,), np.nan)
    if ok.any():
        try:
            natural[ok] = fam.project(ess[ok], name).natural
        except ImproperMessageError:
            for i in np.flatnonzero(ok):  # rare: isolate the offending entries
                try:
                    natural[i] = fam.project(ess[i : i + 1], name).natural[0]
                except ImproperMessageError:
                    ok[i] = False
    return natural, ok
