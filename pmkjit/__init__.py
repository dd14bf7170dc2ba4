"""pmkjit: expectation propagation with kernel-based just-in-time message operators for PyMC.

Subpackages: ``families`` (batched exponential-family messages), ``features`` (random
features on vectors and on messages), ``regression`` (online Bayesian linear regression)
and ``operators`` (importance-sampling and quadrature oracles, the KJIT operator).
"""

from pmkjit.errors import (
    ImproperMessageError,
    InvalidDataError,
    OperatorFileError,
    OracleError,
    PmkjitError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

from pmkjit.fit import EPNotConvergedWarning, ep_posterior, fit  # noqa: E402
from pmkjit.models import GeneralizedLinearModel, StandardLinearModel  # noqa: E402  (the revrand layer)

__all__ = [
    "PmkjitError",
    "ImproperMessageError",
    "OracleError",
    "OperatorFileError",
    "UnsupportedModelError",
    "InvalidDataError",
    "__version__",
    "fit",
    "ep_posterior",
    "EPNotConvergedWarning",
    "StandardLinearModel",
    "GeneralizedLinearModel",
]
