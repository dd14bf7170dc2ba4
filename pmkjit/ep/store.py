"""A directory of learned KJIT operators, one ``.npz`` file per factor form."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pmkjit.errors import OperatorFileError
from pmkjit.graph.factor_graph import BlackBoxFactor
from pmkjit.operators import KJITOperator

__all__ = ["OperatorStore"]


class OperatorStore:
    """Persist KJIT operators between fits and processes (versioned ``.npz``, no pickle).

    Operators are keyed by the factor's *form* (:attr:`BlackBoxFactor.key`: the
    distribution, the graph of its parameters and the message families), not by the
    model's variable names, so a second model with the same kind of factor reuses it.

    Parameters
    ----------
    directory : path
        Created if missing.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise OperatorFileError(f"operator store {self.directory} exists and is not a directory")
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, factor: BlackBoxFactor) -> Path:
        return self.directory / f"{factor.key}.npz"

    def load(self, factor: BlackBoxFactor) -> KJITOperator | None:
        """The stored operator for ``factor``, or ``None``; a corrupt or mismatched file raises."""
        path = self.path(factor)
        if not path.exists():
            return None
        op = KJITOperator.load(path, families=factor.families)
        if tuple(op.targets) != tuple(factor.targets):
            raise OperatorFileError(f"{path} predicts variables {op.targets}, factor {factor.name} needs "
                                    f"{factor.targets}")
        return op

    def save(self, factor: BlackBoxFactor, operator: KJITOperator) -> Path:
        """Write atomically (a crash never leaves a half-written operator behind)."""
        path = self.path(factor)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".npz.tmp")
        os.close(fd)
        try:
            operator.save(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path
