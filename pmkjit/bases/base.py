"""Basis functions that compose by name: the base class and concatenation.

A basis maps inputs ``X`` of shape ``(n, d)`` to features ``Phi`` of shape ``(n, D)``.
Its hyperparameters (length scales, frequencies' means ...) are constructor arguments,
addressed by name, and the models learn them by gradient: every basis can return the
vector-Jacobian product ``dL/dtheta = sum_ij G_ij dPhi_ij/dtheta`` for a gradient ``G =
dL/dPhi`` without ever forming the ``(n, D, |theta|)`` Jacobian.

``basis_a + basis_b`` concatenates features (a sum of kernels, each weighted by its own
prior variance in the models). Components are addressed by their ``name`` (by default
the kernel or basis kind): a concatenation's hyperparameter ``"rbf__lengthscale"`` is the
``lengthscale`` of the component named ``"rbf"``, wherever it sits in the sum, and
``set_params(rbf__lengthscale=2.0)`` changes it, as in scikit-learn pipelines.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from pmkjit._random import RandomState, as_generator
from pmkjit._sklearn_compat import BaseEstimator, TransformerMixin
from pmkjit.features.random_fourier import RandomFourierFeatures

__all__ = ["Basis", "BasisConcat", "Hyperparameter"]

Bounds = "tuple[float | None, float | None] | str"


@dataclass(frozen=True)
class Hyperparameter:
    """A learnable basis hyperparameter.

    Attributes
    ----------
    value : ndarray
        Current value (a 0-d array for a scalar).
    bounds : tuple of (float or None, float or None)
        Box constraint in natural units (``None``: unbounded side).
    log : bool
        Optimise ``log(value)`` (positive scales) rather than ``value``.
    """

    value: np.ndarray
    bounds: tuple
    log: bool = True


def _parse_bounds(bounds, name: str) -> tuple | None:
    """``"fixed"`` -> None; otherwise a validated ``(low, high)`` pair."""
    if isinstance(bounds, str):
        if bounds != "fixed":
            raise ValueError(f"{name} must be a (low, high) pair or 'fixed', got {bounds!r}")
        return None
    lo, hi = bounds
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"{name} must have low < high, got {bounds!r}")
    return (lo, hi)


class Basis(TransformerMixin, BaseEstimator):
    """Base class: a feature map ``X -> Phi`` with named, differentiable hyperparameters.

    Subclasses implement ``_fit(X, rng)`` (draw random parts, record sizes),
    ``_hyperparameters()`` (learnable values by name), ``_features(X, hyper)`` and
    ``_vjp(X, hyper, Phi, G)``; ``X`` there is already restricted to :attr:`columns`.

    Parameters common to every basis
    --------------------------------
    columns : array_like of int, slice or None
        Input columns the basis reads (partial application); ``None`` for all.
    name : str or None
        Name of this component in a concatenation; defaults to :attr:`default_name`.
    """

    default_name = "basis"

    # ---------------------------------------------------------------- naming
    @property
    def name_(self) -> str:
        """The component name: ``name`` if given, else :attr:`default_name`."""
        return self.name if self.name is not None else self.default_name

    def __add__(self, other: "Basis") -> "BasisConcat":
        if not isinstance(other, Basis):
            return NotImplemented
        left = list(self.bases) if isinstance(self, BasisConcat) else [self]
        right = list(other.bases) if isinstance(other, BasisConcat) else [other]
        return BasisConcat(left + right)

    # ------------------------------------------------------------ public API
    def fit(self, X: ArrayLike, y=None, *, rng: RandomState = None) -> "Basis":
        """Validate ``X`` and draw any random parts (frequencies, centres).

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features_in)
        y : ignored
        rng : numpy.random.Generator, optional
            Used when ``random_state`` is None (how the models pass their own stream).

        Returns
        -------
        Basis
            ``self``.
        """
        X = _as_2d(X)
        self.n_features_in_ = X.shape[1]
        seed = getattr(self, "random_state", None)
        self._fit(self._select(X), as_generator(rng if seed is None and rng is not None else seed))
        self.n_outputs_ = int(self._n_outputs())
        return self

    def transform(self, X: ArrayLike) -> np.ndarray:
        """Features at the current hyperparameters.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features_in_)

        Returns
        -------
        ndarray of shape (n_samples, n_outputs_)
        """
        return self._features_all(self._check_X(X), self.hyperparameters())

    def get_feature_names_out(self, input_features=None) -> np.ndarray:
        """Names ``"<name>_<j>"`` of the output columns."""
        self._require_fitted()
        return np.array([f"{self.name_}_{j}" for j in range(self.n_outputs_)], dtype=object)

    def hyperparameters(self) -> dict[str, np.ndarray]:
        """Current values of the learnable hyperparameters, by name (after ``fit``)."""
        return {k: h.value for k, h in self.hyperparameter_specs().items()}

    def hyperparameter_specs(self) -> dict[str, Hyperparameter]:
        """Learnable hyperparameters with bounds, by name; fixed ones are left out."""
        self._require_fitted()
        return self._hyperparameters()

    def set_hyperparameters(self, hyper: dict[str, np.ndarray]) -> "Basis":
        """Write learned values back as constructor parameters (so ``transform`` uses them)."""
        self.set_params(**{k: _as_param(v) for k, v in hyper.items()})
        return self

    def components(self) -> list[tuple[str, "Basis", slice]]:
        """``(name, basis, output columns)`` for each component (one for a plain basis)."""
        self._require_fitted()
        return [(self.name_, self, slice(0, self.n_outputs_))]

    # ------------------------------------------------ differentiable internals
    def _features_all(self, X: np.ndarray, hyper: dict[str, np.ndarray]) -> np.ndarray:
        """Features of full-width ``X`` at hyperparameters ``hyper`` (names as here)."""
        return self._features(self._select(X), hyper)

    def _vjp_all(
        self, X: np.ndarray, hyper: dict[str, np.ndarray], Phi: np.ndarray, G: np.ndarray
    ) -> dict[str, np.ndarray]:
        """``sum_ij G_ij dPhi_ij / dtheta`` for each learnable ``theta`` in ``hyper``."""
        if not hyper:
            return {}
        return self._vjp(self._select(X), hyper, Phi, G)

    def _select(self, X: np.ndarray) -> np.ndarray:
        cols = getattr(self, "columns", None)
        if cols is None:
            return X
        return X[:, cols] if isinstance(cols, slice) else X[:, np.asarray(cols, dtype=int)]

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        self._require_fitted()
        X = _as_2d(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"{type(self).__name__} was fitted on {self.n_features_in_} columns, got {X.shape[1]}")
        return X

    def _require_fitted(self) -> None:
        if not hasattr(self, "n_outputs_"):
            from pmkjit._sklearn_compat import HAVE_SKLEARN

            if HAVE_SKLEARN:
                from sklearn.exceptions import NotFittedError
            else:  # pragma: no cover
                NotFittedError = RuntimeError
            raise NotFittedError(f"{type(self).__name__} is not fitted yet; call fit first")

    # subclasses override
    def _fit(self, X: np.ndarray, rng: np.random.Generator) -> None:
        self._d = X.shape[1]

    def _n_outputs(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _hyperparameters(self) -> dict[str, Hyperparameter]:
        return {}

    def _features(self, X: np.ndarray, hyper: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _vjp(self, X, hyper, Phi, G) -> dict[str, np.ndarray]:  # pragma: no cover
        raise NotImplementedError


class BasisConcat(Basis):
    """Concatenation ``[phi_1(X), phi_2(X), ...]`` of named bases (a kernel sum).

    Usually built with ``+``. Hyperparameters and nested parameters are named
    ``"<component name>__<parameter>"``; component names must be unique.

    Parameters
    ----------
    bases : list of Basis
    """

    def __init__(self, bases: Sequence[Basis]) -> None:
        self.bases = bases

    default_name = "concat"
    name = None

    def _named(self) -> list[tuple[str, Basis]]:
        named = [(b.name_, b) for b in self.bases]
        names = [n for n, _ in named]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(
                f"bases in a concatenation need distinct names; {dup} repeat. Pass name=... "
                "to tell them apart (hyperparameters are addressed by these names)"
            )
        return named

    def get_params(self, deep: bool = True) -> dict:
        out = {"bases": self.bases}
        if deep:
            for name, b in self._named():
                out[name] = b
                out.update({f"{name}__{k}": v for k, v in b.get_params(deep=True).items()})
        return out

    def set_params(self, **params) -> "BasisConcat":
        if "bases" in params:
            self.bases = params.pop("bases")
        named = dict(self._named())
        nested: dict[str, dict] = {}
        for key, value in params.items():
            head, _, sub = key.partition("__")
            if head not in named:
                raise ValueError(f"no basis named {head!r} in this concatenation; names: {sorted(named)}")
            if sub:
                nested.setdefault(head, {})[sub] = value
            else:  # replace a whole component, keeping its position
                self.bases = [value if b is named[head] else b for b in self.bases]
        for head, sub_params in nested.items():
            dict(self._named())[head].set_params(**sub_params)
        return self

    def fit(self, X: ArrayLike, y=None, *, rng: RandomState = None) -> "BasisConcat":
        X = _as_2d(X)
        self._named()  # fail early on repeated names
        gen = as_generator(rng)
        # fit copies, as scikit-learn meta-estimators do, so the user's bases stay unfitted
        self.fitted_bases_ = [copy.deepcopy(b).fit(X, rng=child) for b, child in zip(self.bases, gen.spawn(len(self.bases)))]
        self.n_features_in_ = X.shape[1]
        sizes = [b.n_outputs_ for b in self.fitted_bases_]
        edges = np.concatenate([[0], np.cumsum(sizes)])
        self._slices = [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
        self.n_outputs_ = int(edges[-1])
        return self

    def components(self) -> list[tuple[str, Basis, slice]]:
        self._require_fitted()
        return [(b.name_, b, s) for b, s in zip(self.fitted_bases_, self._slices)]

    def hyperparameter_specs(self) -> dict[str, Hyperparameter]:
        self._require_fitted()
        return {f"{n}__{k}": h for n, b, _ in self.components() for k, h in b.hyperparameter_specs().items()}

    def set_hyperparameters(self, hyper: dict[str, np.ndarray]) -> "BasisConcat":
        originals = dict(self._named())
        for name, b, _ in self.components():
            values = _sub(hyper, name)
            b.set_hyperparameters(values)
            originals[name].set_hyperparameters(values)  # so get_params shows them too
        return self

    def _features_all(self, X: np.ndarray, hyper: dict[str, np.ndarray]) -> np.ndarray:
        out = np.empty((X.shape[0], self.n_outputs_))
        for name, b, s in self.components():  # loop over a handful of components, not rows
            out[:, s] = b._features_all(X, _sub(hyper, name))
        return out

    def _vjp_all(self, X, hyper, Phi, G) -> dict[str, np.ndarray]:
        grads = {}
        for name, b, s in self.components():
            sub = _sub(hyper, name)
            if sub:
                grads.update({f"{name}__{k}": v for k, v in b._vjp_all(X, sub, Phi[:, s], G[:, s]).items()})
        return grads

    def get_feature_names_out(self, input_features=None) -> np.ndarray:
        return np.concatenate([b.get_feature_names_out() for _, b, _ in self.components()])


def _sub(hyper: dict, name: str) -> dict:
    prefix = name + "__"
    return {k[len(prefix):]: v for k, v in hyper.items() if k.startswith(prefix)}


def _as_param(v: np.ndarray):
    v = np.asarray(v, dtype=float)
    return float(v) if v.ndim == 0 else v.copy()


# one input check for every feature map (the random Fourier transformer's)
_as_2d = RandomFourierFeatures._as_2d
