"""scikit-learn base classes when it is installed, small stand-ins when it is not.

scikit-learn is an optional dependency (the ``bench`` extra). With it, the bases and
models subclass its ``BaseEstimator`` and mixins, so ``clone``, pipelines, grid search and
``check_estimator`` see ordinary estimators. Without it, the stand-ins below give the same
constructor-parameter protocol (``get_params``/``set_params`` with nested ``a__b`` names),
so the estimators stay usable on their own.
"""

from __future__ import annotations

import inspect

import numpy as np

__all__ = ["BaseEstimator", "RegressorMixin", "TransformerMixin", "check_is_fitted", "HAVE_SKLEARN"]

try:  # pragma: no cover - which branch runs depends on the environment
    from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin
    from sklearn.utils.validation import check_is_fitted

    HAVE_SKLEARN = True
except ImportError:  # pragma: no cover
    HAVE_SKLEARN = False

    class BaseEstimator:  # type: ignore[no-redef]
        """Constructor-argument protocol of ``sklearn.base.BaseEstimator``."""

        @classmethod
        def _get_param_names(cls) -> list[str]:
            sig = inspect.signature(cls.__init__)
            return sorted(p.name for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD)

        def get_params(self, deep: bool = True) -> dict:
            out = {}
            for key in self._get_param_names():
                value = getattr(self, key)
                if deep and hasattr(value, "get_params") and not isinstance(value, type):
                    out.update({f"{key}__{k}": v for k, v in value.get_params().items()})
                out[key] = value
            return out

        def set_params(self, **params):
            valid = self.get_params(deep=True)
            nested: dict[str, dict] = {}
            for key, value in params.items():
                head, _, sub = key.partition("__")
                if head not in valid:
                    raise ValueError(f"invalid parameter {head!r} for {type(self).__name__}")
                if sub:
                    nested.setdefault(head, {})[sub] = value
                else:
                    setattr(self, head, value)
            for head, sub_params in nested.items():
                getattr(self, head).set_params(**sub_params)
            return self

        def __repr__(self) -> str:
            args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
            return f"{type(self).__name__}({args})"

    class RegressorMixin:  # type: ignore[no-redef]
        """``score`` as the coefficient of determination, like scikit-learn's."""

        def score(self, X, y, sample_weight=None) -> float:
            y = np.asarray(y, dtype=float)
            resid = y - self.predict(X)
            w = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, dtype=float)
            ybar = np.average(y, weights=w)
            return float(1.0 - np.sum(w * resid**2) / np.sum(w * (y - ybar) ** 2))

    class TransformerMixin:  # type: ignore[no-redef]
        """``fit_transform`` as ``fit`` then ``transform``."""

        def fit_transform(self, X, y=None, **fit_params):
            return self.fit(X, y, **fit_params).transform(X)

    class NotFittedError(ValueError, AttributeError):
        """Raised when an estimator is used before ``fit``."""

    def check_is_fitted(estimator, attributes=None) -> None:  # type: ignore[no-redef]
        fitted = [a for a in vars(estimator) if a.endswith("_") and not a.startswith("__")]
        if not fitted:
            raise NotFittedError(f"{type(estimator).__name__} is not fitted yet; call fit first")
