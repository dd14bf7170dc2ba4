"""What the two models share: input checks, the default basis, fitting a basis copy."""

from __future__ import annotations

import copy

import numpy as np

from pmkjit._sklearn_compat import HAVE_SKLEARN, check_is_fitted
from pmkjit.bases import Basis, BasisConcat, LinearBasis, RandomFourierBasis

__all__ = ["default_basis", "fit_basis", "check_Xy", "check_X", "prior_specs", "column_blocks", "check_probability"]


def default_basis() -> Basis:
    """``LinearBasis() + RandomFourierBasis("rbf", 100)``: a linear trend plus an RBF kernel."""
    return LinearBasis() + RandomFourierBasis("rbf", 100)


def fit_basis(basis: Basis | None, X: np.ndarray, rng: np.random.Generator) -> Basis:
    """A fitted deep copy of ``basis`` (the user's object is left untouched).

    A lone basis is wrapped in a one-component :class:`BasisConcat`, so that its
    hyperparameters carry its name (``"rbf__lengthscale"``) exactly as in a sum.
    """
    basis = default_basis() if basis is None else basis
    if not isinstance(basis, Basis):
        raise TypeError(f"basis must be a pmkjit.bases.Basis, got {type(basis).__name__}")
    basis = copy.deepcopy(basis)
    if not isinstance(basis, BasisConcat):
        basis = BasisConcat([basis])
    return basis.fit(X, rng=rng)


def prior_specs(basis: Basis, value: float, bounds=(1e-8, 1e8)) -> dict:
    """One learnable prior-variance hyperparameter per basis component, by name."""
    from pmkjit.bases import Hyperparameter

    return {f"{name}__prior_var": Hyperparameter(np.array(float(value)), bounds) for name, _, _ in basis.components()}


def column_blocks(basis: Basis) -> tuple[list[str], np.ndarray]:
    """Component names and, for every feature column, the index of its component."""
    names, owner = [], np.empty(basis.n_outputs_, dtype=int)
    for i, (name, _, s) in enumerate(basis.components()):
        names.append(name)
        owner[s] = i
    return names, owner


def check_probability(value: float, name: str) -> None:
    """Raise ``ValueError`` unless ``0 < value < 1``."""
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value}")


def check_Xy(estimator, X, y, *, y_numeric: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Validated float ``X`` (n, d) and 1-D ``y`` (n,); records ``n_features_in_``."""
    if HAVE_SKLEARN:
        from sklearn.utils.validation import check_X_y

        X, y = check_X_y(X, y, dtype=np.float64, y_numeric=y_numeric, ensure_min_samples=2)
    else:  # pragma: no cover
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
        if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
            raise ValueError(f"X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
        if not (np.isfinite(X).all() and np.isfinite(y).all()):
            raise ValueError("input contains NaN or infinity")
    estimator.n_features_in_ = X.shape[1]
    return X, np.asarray(y, dtype=float)


def check_X(estimator, X) -> np.ndarray:
    """Validated ``X`` for prediction with the fitted number of columns."""
    check_is_fitted(estimator, "basis_")
    if HAVE_SKLEARN:
        from sklearn.utils.validation import check_array

        X = check_array(X, dtype=np.float64)
    else:  # pragma: no cover
        X = np.asarray(X, dtype=float)
    if X.shape[1] != estimator.n_features_in_:
        raise ValueError(
            f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
            f"{estimator.n_features_in_} features as input"
        )
    return X
