"""Exceptions raised by pmkjit.

Every error names the thing at fault (a variable, a batch index, a file) so that a
user can find it without reading pmkjit's source.
"""

from __future__ import annotations

__all__ = [
    "PmkjitError",
    "ImproperMessageError",
    "OracleError",
    "OperatorFileError",
    "UnsupportedModelError",
    "InvalidDataError",
]


class PmkjitError(Exception):
    """Base class of every error pmkjit raises on purpose."""


class ImproperMessageError(PmkjitError, ValueError):
    """A message (or the result of a projection) is not a proper distribution."""


class OracleError(PmkjitError, RuntimeError):
    """An oracle could not produce a reliable answer (e.g. too small an effective sample size)."""


class OperatorFileError(PmkjitError, ValueError):
    """A saved operator file is corrupt, of another version, or does not match its use."""


class UnsupportedModelError(PmkjitError, NotImplementedError):
    """A PyMC model uses a construct pmkjit cannot turn into a factor graph."""


class InvalidDataError(UnsupportedModelError, ValueError):
    """The model's data cannot be fitted: NaN or infinite covariates or observations, or an
    observation outside its likelihood's support. A ``ValueError`` (bad input), and an
    :class:`UnsupportedModelError` (the model as given cannot be fitted) for code that catches
    those."""
