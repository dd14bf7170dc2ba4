"""One place where user seeds become numpy Generators."""

from __future__ import annotations

from typing import Union

import numpy as np

RandomState = Union[None, int, np.integer, np.random.SeedSequence, np.random.Generator]


def as_generator(random_state: RandomState, name: str = "random_state") -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for ``random_state``.

    Parameters
    ----------
    random_state : None, int, SeedSequence or Generator
        ``None`` gives fresh OS entropy; an int or ``SeedSequence`` seeds a new
        generator; a ``Generator`` is returned unchanged (so callers share its stream).
    name : str
        The argument's name, for the error message.

    Returns
    -------
    numpy.random.Generator
    """
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        raise TypeError(
            "pmkjit takes a numpy.random.Generator or an integer seed, not the legacy "
            "numpy.random.RandomState"
        )
    try:
        return np.random.default_rng(random_state)
    except (TypeError, ValueError) as exc:
        raise type(exc)(
            f"{name} must be None, a non-negative integer (or a sequence of them), a SeedSequence or a "
            f"numpy.random.Generator, got {random_state!r}: {exc}"
        ) from exc


def spawn(rng: np.random.Generator, n: int) -> list[np.random.Generator]:
    """Split ``rng`` into ``n`` independent child generators (reproducibly)."""
    return list(rng.spawn(n))
