"""Bayesian linear regression on a basis with every hyperparameter learned by evidence.

Model (revrand's ``StandardLinearModel``, report section 1.2)::

    y = Phi(X; theta) w + c + eps,   w_b ~ N(0, lambda_b I) per basis component b,
    eps ~ N(0, sigma^2)

The noise variance ``sigma^2``, the prior variance ``lambda_b`` of each named basis
component and the basis hyperparameters ``theta`` maximise the exact log marginal
likelihood. The posterior is :class:`pmkjit.regression.BayesianLinearRegression` (one
implementation): its precision ``A = I + Psi^T Psi`` with scaled features
``Psi = Phi diag(sqrt(r))``, ``r_b = lambda_b / sigma^2``, is held as a Cholesky factor,
and ``sigma^2`` is profiled (set to its exact maximiser given the ratios ``r``), so the
optimiser searches over ``(log r, log theta)`` only.

Gradient of the profiled log evidence
``L = -n/2 (log 2 pi s + 1) - 1/2 log|A|`` with ``m = A^-1 Psi^T y``, ``e = y - Psi m``,
``s = e^T y / n``::

    dL/dPsi = e m^T / s - Psi A^-1

(``d log|A| = 2 tr(A^-1 Psi^T dPsi)``; ``d(y^T Psi A^-1 Psi^T y) = 2 e^T dPsi m``). The chain
rule through ``Psi = Phi diag(sqrt r)`` gives the ratios' gradients, and the basis's
vector-Jacobian product gives ``theta``'s. It is checked against finite differences in
the tests.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg, optimize, stats

from pmkjit._random import RandomState, as_generator
from pmkjit._sklearn_compat import BaseEstimator, RegressorMixin
from pmkjit.bases import Basis
from pmkjit.models._common import check_probability, check_X, check_Xy, column_blocks, fit_basis, prior_specs
from pmkjit.models._params import ParamVector
from pmkjit.regression import BayesianLinearRegression

__all__ = ["StandardLinearModel"]


class StandardLinearModel(RegressorMixin, BaseEstimator):
    """Bayesian linear regression with evidence-learned noise, prior and basis hyperparameters.

    Parameters
    ----------
    basis : Basis or None, default None
        Feature map; ``None`` means ``LinearBasis() + RandomFourierBasis("rbf", 100)``.
        Learnable basis hyperparameters (e.g. ``"rbf__lengthscale"``) start from the
        basis's own values.
    noise_var : float, default 1.0
        Starting noise variance ``sigma^2``.
    prior_var : float, default 1.0
        Starting weight prior variance ``lambda_b`` of every basis component.
    n_starts : int, default 10
        Hyperparameter settings tried (the start above and ``n_starts - 1`` random
        perturbations of it, a factor ``e^{+-1}`` typical on each scale); optimisation
        proceeds from the one with the highest evidence.
    max_iter : int, default 200
        L-BFGS-B iterations.
    tol : float, default 1e-7
        L-BFGS-B tolerance on the per-sample negative log evidence.
    random_state : None, int, SeedSequence or Generator, default None
        Seeds the random starts and any random basis whose own ``random_state`` is None.

    Attributes
    ----------
    basis_ : Basis
        Fitted copy of ``basis`` holding the learned hyperparameters.
    regression_ : BayesianLinearRegression
        Posterior over the weights of the scaled features.
    hyperparameters_ : dict
        ``"noise_var"``, ``"<component>__prior_var"`` per basis component, and the basis
        hyperparameters (``"<component>__<name>"``), all in natural units.
    log_evidence_ : float
        Log marginal likelihood at ``hyperparameters_``.
    n_iter_ : int
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from pmkjit.bases import LinearBasis, RandomFourierBasis
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-3, 3, size=(200, 1))
    >>> y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=200)
    >>> slm = StandardLinearModel(LinearBasis() + RandomFourierBasis("rbf", 50), random_state=0).fit(X, y)
    >>> round(float(np.sqrt(slm.hyperparameters_["noise_var"])), 1)
    0.1
    """

    def __init__(
        self,
        basis: Basis | None = None,
        *,
        noise_var: float = 1.0,
        prior_var: float = 1.0,
        n_starts: int = 10,
        max_iter: int = 200,
        tol: float = 1e-7,
        random_state: RandomState = None,
    ) -> None:
        self.basis = basis
        self.noise_var = noise_var
        self.prior_var = prior_var
        self.n_starts = n_starts
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y) -> "StandardLinearModel":
        """Learn the hyperparameters by maximising the log evidence, then the posterior.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)
        y : array_like of shape (n_samples,)

        Returns
        -------
        StandardLinearModel
            ``self``.
        """
        X, y = check_Xy(self, X, y)
        if not (self.noise_var > 0 and self.prior_var > 0):
            raise ValueError("noise_var and prior_var must be positive")
        rng = as_generator(self.random_state)
        basis = fit_basis(self.basis, X, rng)
        # profiled: the ratio prior_var / noise_var is what the optimiser sees
        specs = {**prior_specs(basis, self.prior_var / self.noise_var), **basis.hyperparameter_specs()}
        layout = ParamVector.from_specs(specs)
        _, owner = column_blocks(basis)
        objective = _Evidence(basis, layout, owner, X, y)

        x0 = layout.pack({k: h.value for k, h in specs.items()})
        starts = [x0] + [layout.random_start(x0, rng) for _ in range(max(int(self.n_starts), 1) - 1)]
        values = [objective.value(x) for x in starts]
        best = starts[int(np.nanargmin(values))]
        self.n_iter_ = 0
        if layout.size:
            res = optimize.minimize(
                objective, best, jac=True, method="L-BFGS-B", bounds=layout.flat_bounds(),
                options={"maxiter": int(self.max_iter), "ftol": float(self.tol)},
            )
            best, self.n_iter_ = (res.x if res.fun <= np.nanmin(values) else best), int(res.nit)

        values = layout.unpack(best)
        blr, scale = objective.posterior(values)
        noise = float(blr.noise_var_[0])
        basis_hyper = {k: v for k, v in values.items() if not k.endswith("__prior_var")}
        basis.set_hyperparameters(basis_hyper)
        self.basis_ = basis
        self.regression_ = blr
        self._scale = scale
        self.log_evidence_ = float(blr.log_evidence_[0])
        self.hyperparameters_ = {"noise_var": noise}
        self.hyperparameters_.update(
            {k: float(v) * noise for k, v in values.items() if k.endswith("__prior_var")}
        )
        self.hyperparameters_.update(basis_hyper)
        return self

    # --------------------------------------------------------------- prediction
    def _features(self, X) -> np.ndarray:
        X = check_X(self, X)
        return self.basis_.transform(X) * self._scale

    def predict(self, X) -> np.ndarray:
        """Posterior predictive mean.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        Phi = self._features(X)  # checks fitted-ness first
        return self.regression_.predict(Phi)

    def predict_moments(self, X, *, include_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean and variance ``sigma^2 + phi^T C phi`` (revrand's eq. 15-17).

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)
        include_noise : bool, default True
            ``False`` gives the variance of the latent function only.

        Returns
        -------
        mean, var : ndarray of shape (n_samples,)
        """
        Phi = self._features(X)
        return self.regression_.predict(Phi, return_var=True, include_noise=include_noise)

    def predict_interval(self, X, coverage: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval holding ``coverage`` of the (Gaussian) predictive mass.

        Returns
        -------
        lower, upper : ndarray of shape (n_samples,)
        """
        check_probability(coverage, "coverage")
        mean, var = self.predict_moments(X)
        half = stats.norm.ppf(0.5 + coverage / 2) * np.sqrt(var)
        return mean - half, mean + half

    def predict_logpdf(self, X, y) -> np.ndarray:
        """Log predictive density of ``y`` at ``X`` (noise included)."""
        mean, var = self.predict_moments(X)
        return stats.norm.logpdf(np.asarray(y, dtype=float), mean, np.sqrt(var))


class _Evidence:
    """Negative profiled log evidence per sample and its gradient in flat coordinates."""

    def __init__(self, basis: Basis, layout: ParamVector, owner: np.ndarray, X: np.ndarray, y: np.ndarray):
        self.basis, self.layout, self.owner, self.X, self.y = basis, layout, owner, X, y
        self.prior_names = [n for n in layout.names if n.endswith("__prior_var")]

    def _split(self, values: dict) -> tuple[np.ndarray, dict]:
        ratios = np.array([float(values[n]) for n in self.prior_names])
        return ratios, {k: v for k, v in values.items() if not k.endswith("__prior_var")}

    def posterior(self, values: dict):
        ratios, hyper = self._split(values)
        scale = np.sqrt(ratios)[self.owner]
        Phi = self.basis._features_all(self.X, hyper)
        blr = BayesianLinearRegression(regularization=1.0).fit(Phi * scale, self.y)
        return blr, scale

    def value(self, x: np.ndarray) -> float:
        blr, _ = self.posterior(self.layout.unpack(x))
        return float(-blr.log_evidence_.sum() / self.X.shape[0])

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        values = self.layout.unpack(x)
        ratios, hyper = self._split(values)
        scale = np.sqrt(ratios)[self.owner]
        Phi = self.basis._features_all(self.X, hyper)
        Psi = Phi * scale
        blr = BayesianLinearRegression(regularization=1.0).fit(Psi, self.y)
        G = evidence_gradient(blr, Psi, self.y)  # dL/dPsi
        # Psi_nj = Phi_nj sqrt(r_b(j)): dL/dr_b = sum_{j in b} sum_n Psi_nj G_nj / (2 r_b)
        per_col = np.einsum("nj,nj->j", Psi, G)
        grads = {n: np.bincount(self.owner, per_col, len(self.prior_names))[i] / (2 * ratios[i])
                 for i, n in enumerate(self.prior_names)}
        if hyper:
            grads.update(self.basis._vjp_all(self.X, hyper, Phi, G * scale))
        n = self.X.shape[0]
        return float(-blr.log_evidence_.sum() / n), -self.layout.flat_gradient(grads, values) / n


def evidence_gradient(blr: BayesianLinearRegression, Phi: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Gradient of the summed profiled log evidence of a fitted regression w.r.t. its features.

    Parameters
    ----------
    blr : BayesianLinearRegression
        Fitted on ``(Phi, Y)`` with a fixed ``regularization``.
    Phi : ndarray of shape (n, D)
    Y : ndarray of shape (n,) or (n, K)

    Returns
    -------
    ndarray of shape (n, D)
        ``sum_k e_k m_k^T / s_k - K lam^0 Phi A^-1`` (see the module docstring), where the
        mean offset is held fixed.
    """
    Y = np.asarray(Y, dtype=float).reshape(Phi.shape[0], -1)
    E = (Y - blr.offset_) - Phi @ blr.coef_  # residuals (n, K)
    K = E.shape[1]
    # Phi A^-1 = (R^-1 R^-T Phi^T)^T: two triangular solves, no inverse
    V = linalg.solve_triangular(blr.R_, Phi.T, trans="T", lower=False, check_finite=False)
    PhiAinv = linalg.solve_triangular(blr.R_, V, lower=False, check_finite=False).T
    return (E / blr.noise_var_) @ blr.coef_.T - K * PhiAinv
