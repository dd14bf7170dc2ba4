"""Which factors share a latent among many instances.

A factor whose instances read one latent element (or one row of the joint Gaussian,
a projection) many times adds up its message operator's error on that latent once per
instance; :mod:`pmkjit.fit` gives such factors exact quadrature, and the diagnostics
use the same row keys to find repeated projections.
"""

from __future__ import annotations


import numpy as np

from pmkjit.graph.factor_graph import ElementSlot, LinearSlot


SHARED_INSTANCES = 10


def row_keys(slot: LinearSlot, with_offset: bool = True) -> np.ndarray:
    """One number per row of a linear slot, equal for equal rows (``A`` and, optionally, ``c``).

    A fixed random projection of each row: sorting B numbers is cheap where ``A``
    (B x n_theta) may be hundreds of megabytes.
    """
    A = np.asarray(slot.A).reshape(slot.size, -1)
    r = np.random.default_rng(0).standard_normal(A.shape[1] + 1)  # fixed: a hash, not a draw
    keys = A @ r[:-1]
    return keys + slot.c * r[-1] if with_offset else keys


def distinct_rows(slot: LinearSlot) -> int:
    """Number of distinct projections among the rows of a linear slot (``c`` ignored)."""
    return int(np.unique(row_keys(slot, with_offset=False)).size)


def shares_a_latent(factor, min_instances: int = SHARED_INSTANCES) -> bool:
    """Whether ``min_instances`` instances of ``factor`` read one latent element or projection.

    A factor with fewer instances (but at least two) shares a latent when all of them
    read it: eight schools' sites on one ``tau`` add up an operator's error like ten do.
    """
    min_instances = max(2, min(min_instances, factor.size))
    for i in factor.latent_inputs:
        slot = factor.inputs[i]
        if isinstance(slot, ElementSlot):
            keys = slot.index.reshape(slot.size, -1)
        elif isinstance(slot, LinearSlot):
            keys = row_keys(slot)[:, None]
        else:
            continue
        if slot.size >= min_instances and np.unique(keys, axis=0, return_counts=True)[1].max() >= min_instances:
            return True
    return False
