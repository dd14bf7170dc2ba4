"""A directory of learned KJIT operators, one ``.npz`` file per factor form."""

from __future__ import annotations

import io
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from pmkjit.errors import OperatorFileError
from pmkjit.graph.factor_graph import BlackBoxFactor
from pmkjit.operators import KJITOperator
from pmkjit.operators.kjit import pack_answers, unpack_answers

__all__ = ["OperatorStore"]


class OperatorStore:
    """Persist KJIT operators between fits and processes (versioned ``.npz``, no pickle).

    Operators are keyed by the factor's *form* (:attr:`BlackBoxFactor.key`: the
    distribution, the graph of its parameters and the message families), not by the
    model's variable names, so a second model with the same kind of factor reuses it.
    Oracle answers of a factor whose operator has not been fitted yet (too few, e.g. a
    factor with one instance whose EP converged in two sweeps) are kept next to it
    (``<key>.pending.npz``) and handed to the next fit, until enough accumulate.

    Each file also records the key of the factor it was written for, so a file copied or
    renamed onto another factor's name is refused on loading instead of being used as that
    factor's operator (files written before the key was recorded are read as before).

    Parameters
    ----------
    directory : path
        Created if missing; it must be writable, since every fit writes its operators back.

    Raises
    ------
    OperatorFileError
        If ``directory`` is an existing file, cannot be created or cannot be written to
        (checked here, before a fit spends its time on EP, rather than when the operators
        are written back at its end).
    """

    def __init__(self, directory: str | Path):
        try:
            self.directory = Path(directory)
        except TypeError as exc:
            raise TypeError(f"operators must be a directory path (str or os.PathLike), got {directory!r}") from exc
        if self.directory.exists() and not self.directory.is_dir():
            raise OperatorFileError(f"operator store {self.directory} exists and is not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.directory, suffix=".probe")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise OperatorFileError(
                f"operator store {self.directory} cannot be written to ({exc}); learned operators are written "
                "back after every fit: pass a writable directory"
            ) from exc

    def path(self, factor: BlackBoxFactor) -> Path:
        """The operator file of ``factor``: ``<directory>/<factor.key>.npz``."""
        return self.directory / f"{factor.key}.npz"

    def load(self, factor: BlackBoxFactor) -> KJITOperator | None:
        """The stored operator for ``factor``, or ``None``; a corrupt or mismatched file raises."""
        path = self.path(factor)
        if not path.exists():
            return None
        op = KJITOperator.load(path, families=factor.families)
        key = _stored_key(path)
        if key is not None and key != factor.key:
            raise OperatorFileError(
                f"{path} holds the operator of another factor (key {key}), not of factor {factor.name} (key "
                f"{factor.key}): the file was copied or renamed; delete it to learn a new operator"
            )
        if tuple(op.targets) != tuple(factor.targets):
            raise OperatorFileError(f"{path} predicts variables {op.targets}, factor {factor.name} needs "
                                    f"{factor.targets}")
        return op

    def save(self, factor: BlackBoxFactor, operator: KJITOperator) -> Path:
        """Write atomically (a crash never leaves a half-written operator behind)."""
        def write(tmp):
            operator.save(tmp)
            with zipfile.ZipFile(tmp, "a") as archive:  # the factor it was written for
                buffer = io.BytesIO()
                np.save(buffer, np.asarray(factor.key))
                archive.writestr(_KEY_ENTRY + ".npy", buffer.getvalue())

        return self._write(self.path(factor), write)

    def _write(self, path: Path, write) -> Path:
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".npz.tmp")
            os.close(fd)
            write(tmp)
            os.replace(tmp, path)
        except OSError as exc:
            raise OperatorFileError(f"could not write operator file {path}: {exc}") from exc
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        return path

    # ---------------------------------------------- answers awaiting a first fit
    def pending_path(self, factor: BlackBoxFactor) -> Path:
        """The file of ``factor``'s answers awaiting a first fit: ``<directory>/<factor.key>.pending.npz``."""
        return self.directory / f"{factor.key}.pending.npz"

    def save_pending(self, factor: BlackBoxFactor, messages, beliefs) -> Path:
        """Keep oracle answers (message batches ``(*inputs, output)``, target beliefs) for a later fit."""
        packed = pack_answers(messages, beliefs)
        arrays = {
            "format": np.asarray(_PENDING_FORMAT),
            "version": np.asarray(_PENDING_VERSION),
            "families": np.asarray([f.name for f in factor.families]),
            "targets": np.asarray(factor.targets, dtype=int),
            "key": np.asarray(factor.key),
            "answers": packed,
        }

        def write(tmp):
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)

        return self._write(self.pending_path(factor), write)

    def load_pending(self, factor: BlackBoxFactor) -> tuple[tuple, tuple] | None:
        """Answers kept by :meth:`save_pending` for ``factor``, or ``None``; a bad file raises."""
        path = self.pending_path(factor)
        if not path.exists():
            return None
        fams = (*factor.families, *(factor.families[t] for t in factor.targets))
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
            if str(arrays["format"]) != _PENDING_FORMAT or int(arrays["version"]) != _PENDING_VERSION:
                raise OperatorFileError(f"{path} is not a pmkjit pending-answers file of version {_PENDING_VERSION}")
            names = [str(n) for n in arrays["families"]]
            if names != [f.name for f in factor.families] or arrays["targets"].tolist() != list(factor.targets):
                raise OperatorFileError(f"{path} holds answers for variables {names}, targets "
                                        f"{arrays['targets'].tolist()}; factor {factor.name} has "
                                        f"{[f.name for f in factor.families]}, targets {list(factor.targets)}")
            if "key" in arrays and str(arrays["key"]) != factor.key:
                raise OperatorFileError(f"{path} holds answers for another factor (key {arrays['key']}), not for "
                                        f"factor {factor.name} (key {factor.key}): the file was copied or renamed")
            packed = np.asarray(arrays["answers"], dtype=float)
            if packed.ndim != 2 or packed.shape[1] != 2 * len(fams) or not np.isfinite(packed).all():
                raise OperatorFileError(f"{path}: answers of shape {packed.shape} (or non-finite) do not fit "
                                        f"factor {factor.name}")
        except OperatorFileError:
            raise
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise OperatorFileError(f"{path} is not a readable pending-answers file: {exc}") from exc
        return unpack_answers(packed, factor.families, [factor.families[t] for t in factor.targets])

    def drop_pending(self, factor: BlackBoxFactor) -> None:
        """Forget kept answers (the operator has been fitted on them)."""
        self.pending_path(factor).unlink(missing_ok=True)


def _stored_key(path: Path) -> str | None:
    """The factor key :meth:`OperatorStore.save` recorded in ``path``, or ``None`` (an older file)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return str(archive[_KEY_ENTRY]) if _KEY_ENTRY in archive.files else None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise OperatorFileError(f"operator file {path} is corrupt: {exc}") from exc


_KEY_ENTRY = "store/factor_key"
_PENDING_FORMAT = "pmkjit.PendingAnswers"
_PENDING_VERSION = 1
