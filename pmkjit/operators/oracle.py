"""What every oracle returns."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["OracleResult"]


class OracleResult(NamedTuple):
    """Projected tilted beliefs for a batch of incoming-message tuples.

    Attributes
    ----------
    beliefs : tuple of family batches
        One per variable of the factor (observed outputs have none), batch shape (B,).
        Entries that are not accepted hold NaN natural parameters.
    ess : ndarray (B,)
        Effective sample size (importance sampling) or number of quadrature nodes.
    accepted : ndarray of bool (B,)
        False where the oracle could not give a reliable answer.
    """

    beliefs: tuple
    ess: np.ndarray
    accepted: np.ndarray
