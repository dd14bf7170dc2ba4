"""Deterministic bases: linear, bias, polynomial and radial (Gaussian bumps)."""

from __future__ import annotations

import numpy as np

from pmkjit._random import RandomState
from pmkjit.bases.base import Basis, Hyperparameter, _parse_bounds
from pmkjit.features.spectral import _as_lengthscale, _check_count

__all__ = ["LinearBasis", "BiasBasis", "PolynomialBasis", "RadialBasis"]


class LinearBasis(Basis):
    """The inputs themselves, ``Phi = X`` (a dot-product kernel); no hyperparameters.

    Parameters
    ----------
    columns : array_like of int, slice or None, default None
    name : str or None, default None
        Defaults to ``"linear"``.
    """

    default_name = "linear"

    def __init__(self, columns=None, name: str | None = None) -> None:
        self.columns = columns
        self.name = name

    def _n_outputs(self) -> int:
        return self._d

    def _features(self, X, hyper):
        return np.array(X, dtype=float)


class BiasBasis(Basis):
    """A constant feature, ``Phi = 1`` (a learned intercept with a Gaussian prior).

    Parameters
    ----------
    name : str or None, default None
        Defaults to ``"bias"``.
    """

    default_name = "bias"

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    columns = None

    def _n_outputs(self) -> int:
        return 1

    def _features(self, X, hyper):
        return np.ones((X.shape[0], 1))


class PolynomialBasis(Basis):
    """Powers ``x_j, x_j^2, ..., x_j^order`` of every input column (no cross terms).

    Parameters
    ----------
    order : int, default 2
    columns : array_like of int, slice or None, default None
    name : str or None, default None
        Defaults to ``"poly"``.
    """

    default_name = "poly"

    def __init__(self, order: int = 2, columns=None, name: str | None = None) -> None:
        self.order = order
        self.columns = columns
        self.name = name

    def _fit(self, X, rng):
        _check_count(self.order, "order")
        super()._fit(X, rng)

    def _n_outputs(self) -> int:
        return self._d * int(self.order)

    def _features(self, X, hyper):
        powers = np.arange(1, int(self.order) + 1)
        return (X[:, None, :] ** powers[:, None]).reshape(X.shape[0], -1)  # column blocks by power


class RadialBasis(Basis):
    """Gaussian bumps ``phi_j(x) = exp(-||(x - c_j) / l||^2 / 2)`` around fixed centres.

    Parameters
    ----------
    centres : array_like of shape (n_centres, n_columns) or None, default None
        ``None`` picks ``n_centres`` training rows at random in :meth:`fit`.
    n_centres : int, default 50
    lengthscale : float or array_like of shape (n_columns,), default 1.0
        Isotropic or ARD; learnable.
    lengthscale_bounds : (float, float) or "fixed", default (1e-3, 1e3)
    columns, name, random_state
        As for the random bases; the default name is ``"radial"``.
    """

    default_name = "radial"

    def __init__(
        self,
        centres=None,
        n_centres: int = 50,
        lengthscale=1.0,
        lengthscale_bounds=(1e-3, 1e3),
        columns=None,
        name: str | None = None,
        random_state: RandomState = None,
    ) -> None:
        self.centres = centres
        self.n_centres = n_centres
        self.lengthscale = lengthscale
        self.lengthscale_bounds = lengthscale_bounds
        self.columns = columns
        self.name = name
        self.random_state = random_state

    def _fit(self, X, rng):
        if self.centres is None:
            m = _check_count(self.n_centres, "n_centres")
            idx = rng.choice(X.shape[0], size=min(m, X.shape[0]), replace=False)
            self.centres_ = X[idx].copy()
        else:
            self.centres_ = np.atleast_2d(np.asarray(self.centres, dtype=float))
            if self.centres_.shape[1] != X.shape[1]:
                raise ValueError(f"centres have {self.centres_.shape[1]} columns, inputs {X.shape[1]}")
        _as_lengthscale(self.lengthscale, X.shape[1])
        _parse_bounds(self.lengthscale_bounds, "lengthscale_bounds")

    def _n_outputs(self) -> int:
        return self.centres_.shape[0]

    def _hyperparameters(self):
        bounds = _parse_bounds(self.lengthscale_bounds, "lengthscale_bounds")
        if bounds is None:
            return {}
        return {"lengthscale": Hyperparameter(np.array(self.lengthscale, dtype=float), bounds)}

    def _features(self, X, hyper):
        ell = _as_lengthscale(hyper.get("lengthscale", self.lengthscale), X.shape[1])
        Xs, Cs = X / ell, self.centres_ / ell
        r2 = np.sum(Xs**2, 1)[:, None] - 2.0 * Xs @ Cs.T + np.sum(Cs**2, 1)[None, :]
        return np.exp(-0.5 * np.maximum(r2, 0.0))

    def _vjp(self, X, hyper, Phi, G):
        ell = _as_lengthscale(hyper["lengthscale"], X.shape[1])
        Xs, Cs = X / ell, self.centres_ / ell
        H = G * Phi
        # sum_nj H_nj (xs_nk - cs_jk)^2, expanded into three matrix products (no (n, m, d) array)
        sq = (Xs**2).T @ H.sum(1) - 2.0 * np.einsum("nk,nk->k", Xs, H @ Cs) + (Cs**2).T @ H.sum(0)
        per_dim = sq / ell  # d phi / d l_k = phi (xs - cs)_k^2 / l_k
        return {"lengthscale": per_dim if ell.ndim else np.asarray(per_dim.sum())}
