"""Bayesian generalised linear model on a basis, fitted by stochastic variational inference.

Model (revrand's ``GeneralizedLinearModel``, report section 1.3), written non-centred::

    y_n ~ p(y | g(psi_n^T v), gamma),   v ~ N(0, I),   psi_n = phi(x_n; theta) * sqrt(lambda)

so the prior variance ``lambda_b`` of each named basis component scales its features, as
in :class:`~pmkjit.models.StandardLinearModel` (``w = sqrt(lambda) v`` is the usual weight).
The posterior is a mixture of ``K`` diagonal Gaussians ``q(v) = 1/K sum_k N(m_k, diag(s_k))``.
The objective is the report's eq. (27): the expected log likelihood by the
reparameterisation trick (``L`` draws per component per step), the expected log prior in
closed form, and Gershman et al.'s lower bound on the mixture's entropy,
``-1/K sum_k log sum_j 1/K N(m_k | m_j, diag(s_k + s_j))``. It is maximised by Adam over
minibatches (the data term boosted by ``N / M``, eq. 6), jointly in the variational
parameters, the prior variances, the likelihood's parameters and the basis
hyperparameters. All gradients are analytic and vectorised over components and draws
(checked against finite differences in the tests).

Rotation (``rotate``). Mean-field in the weights' own coordinates is a poor family when
the features are strongly correlated (long length scales, a linear basis on correlated
inputs): the true posterior's precision ``I + Psi^T Lambda Psi`` is far from diagonal,
and the ELBO then prefers hyperparameters that decorrelate the features (short length
scales, small prior variances) over those that fit. Because the prior ``N(0, I)`` is
rotation invariant, the components can instead be diagonal along the right singular
vectors ``Q`` (D x r, nonzero singular values only) of the scaled training features:
``q_k(v) = N(Q m_k, Q diag(s_k) Q^T + I - Q Q^T)``, the ``D - r`` directions the training
data cannot see keeping the prior. For a Gaussian likelihood this family contains the
exact posterior (tested). ``Q`` is recomputed at the current hyperparameters every 500
steps and ``q`` carried over (means exactly, covariances by their diagonal). A step costs
three extra ``(K L) x D x r`` products, so ``"auto"`` rotates when
``r = min(n_samples, n_basis) <= 4 * batch_size``.

Prediction integrates over ``n_predict_samples`` weight draws from ``q`` made in :meth:`fit`
(so predictions are deterministic): the predictive mean (eq. 29), moments, quantiles by
vectorised bisection on the predictive CDF (eqs. 30-31) and the log predictive density.

References
----------
.. [1] D. Steinberg et al., "revrand: technical report", CSIRO Data61, 2016.
.. [2] S. Gershman, M. Hoffman, D. Blei, "Nonparametric variational inference", ICML 2012.
.. [3] D. Kingma, J. Ba, "Adam: a method for stochastic optimization", ICLR 2015.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from pmkjit._random import RandomState, as_generator
from pmkjit._sklearn_compat import BaseEstimator, RegressorMixin
from pmkjit.bases import Basis, Hyperparameter
from pmkjit.models._common import check_probability, check_X, check_Xy, column_blocks, fit_basis, prior_specs
from pmkjit.models._params import ParamVector
from pmkjit.models.likelihoods import Likelihood, get_likelihood

__all__ = ["GeneralizedLinearModel"]

_MEAN, _VAR = "posterior__mean", "posterior__var"
_REFRESH = 500  # Adam steps between recomputations of the rotation (hyperparameters move)


class GeneralizedLinearModel(RegressorMixin, BaseEstimator):
    """Bayesian GLM with a mixture-of-diagonal-Gaussians posterior fitted by SVI.

    Parameters
    ----------
    likelihood : {"gaussian", "bernoulli", "poisson", "binomial"} or Likelihood, default "gaussian"
        Observation model with canonical link; pass
        :class:`~pmkjit.models.likelihoods.Binomial` ``(n_trials=...)`` for counts out of n.
    basis : Basis or None, default None
        ``None`` means ``LinearBasis() + RandomFourierBasis("rbf", 100)``.
    prior_var : float, default 1.0
        Starting prior variance of every basis component.
    n_mixtures : int, default 5
        Components ``K`` of the variational posterior.
    n_draws : int, default 5
        Reparameterised draws per component per step (``L``).
    batch_size : int, default 100
    max_iter : int, default 3000
        Adam steps from the best random start.
    learning_rate : float, default 0.01
    n_starts : int, default 5
        Random hyperparameter starts, each run for ``start_iter`` steps; the one with the
        highest average objective over its last steps continues.
    start_iter : int, default 100
    n_predict_samples : int, default 300
        Weight draws from the posterior kept for prediction.
    rotate : bool or "auto", default "auto"
        Make the mixture components diagonal along the singular vectors of the training
        features rather than along the weights (see the module docstring); ``"auto"`` does
        so when ``min(n_samples, n_basis) <= 4 * batch_size``.
    random_state : None, int, SeedSequence or Generator, default None
        Seeds every draw (basis frequencies unless the basis has its own seed, starts,
        minibatches, reparameterisation noise, predictive samples).

    Attributes
    ----------
    basis_ : Basis
    likelihood_ : Likelihood
    hyperparameters_ : dict
        ``"<component>__prior_var"``, likelihood parameters as ``"likelihood__<name>"``,
        basis hyperparameters, in natural units.
    posterior_mean_, posterior_var_ : ndarray of shape (n_mixtures, n_basis)
        Mixture components' means and marginal variances of the standardised weights ``v``.
    rotation_ : ndarray of shape (n_basis, r) or None
        The rotation ``Q`` the components are diagonal along (None when not rotated).
    elbo_ : ndarray of shape (max_iter,)
        Objective estimate per step (per sample), for convergence checks.
    n_iter_ : int
        Adam steps taken from the best start.
    n_features_in_ : int
    """

    def __init__(
        self,
        likelihood="gaussian",
        basis: Basis | None = None,
        *,
        prior_var: float = 1.0,
        n_mixtures: int = 5,
        n_draws: int = 5,
        batch_size: int = 100,
        max_iter: int = 3000,
        learning_rate: float = 0.01,
        n_starts: int = 5,
        start_iter: int = 100,
        n_predict_samples: int = 300,
        rotate="auto",
        random_state: RandomState = None,
    ) -> None:
        self.likelihood = likelihood
        self.basis = basis
        self.prior_var = prior_var
        self.n_mixtures = n_mixtures
        self.n_draws = n_draws
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.n_starts = n_starts
        self.start_iter = start_iter
        self.n_predict_samples = n_predict_samples
        self.rotate = rotate
        self.random_state = random_state

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y) -> "GeneralizedLinearModel":
        """Fit the variational posterior and all hyperparameters by SVI.

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)
        y : array_like of shape (n_samples,)

        Returns
        -------
        GeneralizedLinearModel
            ``self``.
        """
        X, y = check_Xy(self, X, y)
        lik = get_likelihood(self.likelihood)
        lik.check_y(y)
        if not self.prior_var > 0:
            raise ValueError("prior_var must be positive")
        rng = as_generator(self.random_state)
        basis = fit_basis(self.basis, X, rng)
        objective = _Elbo(basis, lik, X, y, int(self.n_mixtures), int(self.n_draws))
        hyper_specs = {
            **prior_specs(basis, self.prior_var),
            **{f"likelihood__{k}": h for k, h in lik.specs().items()},
            **basis.hyperparameter_specs(),
        }
        K, D = int(self.n_mixtures), basis.n_outputs_
        hyper_layout = ParamVector.from_specs(hyper_specs)
        x_hyper = hyper_layout.pack({k: h.value for k, h in hyper_specs.items()})
        rotate = self.rotate
        if rotate == "auto":
            rotate = min(X.shape[0], D) <= 4 * int(self.batch_size)
        elif not isinstance(rotate, (bool, np.bool_)):
            raise ValueError(f"rotate must be True, False or 'auto', got {rotate!r}")
        objective.rotate = bool(rotate)

        def start(x_h):
            # means drawn from the prior (distinct components), variances a tenth of it
            Q = objective.rotation(hyper_layout.unpack(x_h))
            r = D if Q is None else Q.shape[1]
            return x_h, 0.3 * rng.standard_normal((K, r)), np.full((K, r), 0.1), Q

        n_starts = max(int(self.n_starts), 1)
        candidates = [start(x_hyper)] + [start(hyper_layout.random_start(x_hyper, rng)) for _ in range(n_starts - 1)]
        if n_starts > 1:
            runs = [self._run(objective, hyper_layout, c, int(self.start_iter), rng, fresh=True) for c in candidates]
            tail = max(int(self.start_iter) // 5, 1)
            best = runs[int(np.nanargmax([np.mean(t[-tail:]) for _, t in runs]))][0]
        else:
            best = candidates[0]
        (x_h, m, s, Q), trace = self._run(objective, hyper_layout, best, int(self.max_iter), rng,
                                          fresh=n_starts == 1)

        values = {**hyper_layout.unpack(x_h), _MEAN: m, _VAR: s}
        self.basis_ = basis
        self.likelihood_ = lik
        self.elbo_ = trace
        self.n_iter_ = int(self.max_iter)
        self.rotation_ = Q
        self.posterior_mean_, self.posterior_var_ = _to_weight_space(m, s, Q)
        basis_hyper = {k: v for k, v in values.items() if k in basis.hyperparameter_specs()}
        basis.set_hyperparameters(basis_hyper)
        self._lik_params = {k.split("__", 1)[1]: v for k, v in values.items() if k.startswith("likelihood__")}
        self._scale = objective.scale(values)
        self.hyperparameters_ = {
            k: (float(v) if np.ndim(v) == 0 else v) for k, v in values.items() if k not in (_MEAN, _VAR)
        }
        # predictive weight draws, made once so that predictions are deterministic
        S = max(int(self.n_predict_samples), 1)
        comp = rng.integers(0, K, S)
        self._weights = _draw_weights(m[comp], np.sqrt(s[comp]), Q, rng.standard_normal((S, D)))
        return self

    def _run(self, objective, hyper_layout, state, n_iter, rng, fresh=False):
        """Adam from ``state = (x_hyper, m, s, Q)``; with rotation, ``Q`` is recomputed at the
        current hyperparameters every ``_REFRESH`` steps (and first, unless ``fresh``: ``Q``
        was just computed there) and ``q`` is carried over to it."""
        x_h, m, s, Q = state
        traces, done = [], 0
        while done < n_iter:
            if objective.rotate and (done or not fresh):
                Q_new = objective.rotation(hyper_layout.unpack(x_h))
                m, s, Q = *_change_rotation(m, s, Q, Q_new), Q_new
            steps = min(n_iter - done, _REFRESH if objective.rotate else n_iter)
            objective.Q = Q
            K, r = m.shape
            layout = ParamVector.from_specs({
                **{n: Hyperparameter(np.zeros(shape), b, lg) for n, shape, lg, b in
                   zip(hyper_layout.names, hyper_layout.shapes, hyper_layout.logs, hyper_layout.bounds)},
                _MEAN: Hyperparameter(np.zeros((K, r)), (None, None), log=False),
                _VAR: Hyperparameter(np.ones((K, r)), (1e-10, 1e4)),
            })
            x = layout.pack({**hyper_layout.unpack(x_h), _MEAN: m, _VAR: s})
            x, trace = self._adam(objective, layout, x, steps, rng)
            values = layout.unpack(x)
            x_h, m, s = hyper_layout.pack(values), values[_MEAN], values[_VAR]
            traces.append(trace)
            done += steps
        return (x_h, m, s, Q), np.concatenate(traces) if traces else np.zeros(0)

    def _adam(self, objective, layout, x, n_iter, rng, beta1=0.9, beta2=0.999, eps=1e-8):
        """``n_iter`` Adam ascent steps from ``x``; returns the end point and the objective trace."""
        N, M = objective.X.shape[0], min(int(self.batch_size), objective.X.shape[0])
        m1, m2 = np.zeros_like(x), np.zeros_like(x)
        trace = np.empty(n_iter)
        order, pos = rng.permutation(N), 0
        lr = float(self.learning_rate)
        for t in range(1, n_iter + 1):
            if pos + M > N:  # new epoch: minibatches without replacement within an epoch
                order, pos = rng.permutation(N), 0
            batch = order[pos : pos + M]
            pos += M
            value, grad = objective(x, layout, batch, rng)
            trace[t - 1] = value / N
            m1 = beta1 * m1 + (1 - beta1) * grad
            m2 = beta2 * m2 + (1 - beta2) * grad**2
            step = lr * (m1 / (1 - beta1**t)) / (np.sqrt(m2 / (1 - beta2**t)) + eps)
            x = layout.clip(x + step)
        return x, trace

    # --------------------------------------------------------------- prediction
    def _latent(self, X) -> np.ndarray:
        """Latent ``f`` at every predictive weight draw, shape (n_samples, n_predict_samples)."""
        X = check_X(self, X)
        return (self.basis_.transform(X) * self._scale) @ self._weights.T

    def predict(self, X) -> np.ndarray:
        """Predictive expectation ``E[y]`` (for Bernoulli: the probability of 1).

        Parameters
        ----------
        X : array_like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        F = self._latent(X)  # checks fitted-ness first
        return self.likelihood_.mean(F, self._lik_params).mean(axis=1)

    def predict_moments(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean and variance of ``y`` (law of total variance over the posterior).

        Returns
        -------
        mean, var : ndarray of shape (n_samples,)
        """
        F = self._latent(X)
        mu = self.likelihood_.mean(F, self._lik_params)
        return mu.mean(1), self.likelihood_.var(F, self._lik_params).mean(1) + mu.var(1)

    def predict_logpdf(self, X, y) -> np.ndarray:
        """Log predictive density (mass) of ``y`` at ``X``, ``log 1/S sum_s p(y | f_s)``."""
        F = self._latent(X)
        ll = self.likelihood_.logpdf(np.asarray(y, dtype=float).ravel(), F, self._lik_params)
        return special.logsumexp(ll, axis=1) - np.log(ll.shape[1])

    def predict_quantile(self, X, q: float, *, n_bisect: int = 60) -> np.ndarray:
        """Predictive ``q``-quantile by bisection on the predictive CDF (all rows at once).

        Returns
        -------
        ndarray of shape (n_samples,)
            The smallest ``a`` with ``P(y <= a) >= q`` (an integer for count likelihoods).
        """
        check_probability(q, "q")
        F = self._latent(X)
        mean, var = self.predict_moments(X)
        width = 10.0 * np.sqrt(var) + 1.0
        lo, hi = mean - width, mean + width
        if self.likelihood_.discrete:
            lo = np.minimum(lo, -1.0)  # CDF(-1) = 0 for every count likelihood
        for _ in range(int(n_bisect)):  # vectorised over rows; each step halves every bracket
            mid = 0.5 * (lo + hi)
            above = self.likelihood_.cdf(mid, F, self._lik_params).mean(1) >= q
            hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
        return np.floor(hi + 1e-9) if self.likelihood_.discrete else 0.5 * (lo + hi)

    def predict_interval(self, X, coverage: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval from the ``(1 -+ coverage) / 2`` quantiles.

        Returns
        -------
        lower, upper : ndarray of shape (n_samples,)
        """
        check_probability(coverage, "coverage")
        return self.predict_quantile(X, 0.5 - coverage / 2), self.predict_quantile(X, 0.5 + coverage / 2)


class _Elbo:
    """Minibatch estimate of the objective (eq. 27) and its gradient in flat coordinates."""

    def __init__(self, basis: Basis, lik: Likelihood, X, y, K: int, L: int):
        self.basis, self.lik, self.X, self.y, self.K, self.L = basis, lik, X, y, K, L
        self.names, self.owner = column_blocks(basis)
        self.basis_names = set(basis.hyperparameter_specs())
        self.rotate = False
        self.Q = None  # (D, r) orthonormal columns: q is mean-field in v's coordinates along them

    def rotation(self, values: dict) -> np.ndarray | None:
        """Right singular vectors of the scaled training features ``Psi`` at ``values`` (the
        numerically nonzero singular values only), or None when not rotating."""
        if not self.rotate:
            return None
        hyper = {k: v for k, v in values.items() if k in self.basis_names}
        Psi = self.basis._features_all(self.X, hyper) * self.scale(values)
        _, sv, Vt = np.linalg.svd(Psi, full_matrices=False)
        keep = sv > sv[0] * max(Psi.shape) * np.finfo(float).eps if sv.size and sv[0] > 0 else np.zeros(0, bool)
        return np.ascontiguousarray(Vt[keep].T)

    def scale(self, values: dict) -> np.ndarray:
        return np.sqrt(np.array([float(values[f"{n}__prior_var"]) for n in self.names]))[self.owner]

    def __call__(self, x, layout: ParamVector, batch, rng, eps=None) -> tuple[float, np.ndarray]:
        values = layout.unpack(x)
        D = self.basis.n_outputs_
        value, grads = self.evaluate(values, batch, rng.standard_normal((self.K, self.L, D)) if eps is None else eps)
        return value, layout.flat_gradient(grads, values)

    def evaluate(self, values: dict, batch: np.ndarray, eps: np.ndarray) -> tuple[float, dict]:
        """Objective (whole-data scale) and natural-unit gradients, for fixed draws ``eps``.

        ``eps`` has shape (K, L, D) (standard normal in weight space). With a rotation ``Q``
        (D, r), the means and variances live in the coordinates ``u = Q^T v`` and the
        remaining ``D - r`` directions keep the prior: ``v = z + Q (m + (sd - 1) Q^T z)``
        is a draw from ``N(Q m, Q diag(s) Q^T + I - Q Q^T)`` for ``z ~ N(0, I)``.
        """
        K, L = self.K, self.L
        Q = self.Q
        N, M = self.X.shape[0], batch.size
        m, s = values[_MEAN], values[_VAR]
        hyper = {k: v for k, v in values.items() if k in self.basis_names}
        lik_params = {k.split("__", 1)[1]: v for k, v in values.items() if k.startswith("likelihood__")}
        Xb, yb = self.X[batch], self.y[batch]
        scale = self.scale(values)
        Phi = self.basis._features_all(Xb, hyper)
        Psi = Phi * scale
        sd = np.sqrt(s)
        if Q is None:
            z = eps
            W = (m[:, None, :] + sd[:, None, :] * eps).reshape(K * L, -1)  # (KL, D)
        else:
            z = eps @ Q  # (K, L, r): the draws' coordinates along Q, standard normal
            W = (eps + (m[:, None, :] + (sd[:, None, :] - 1.0) * z) @ Q.T).reshape(K * L, -1)
        F = Psi @ W.T  # (M, KL)
        boost = N / (M * K * L)  # eq. (6): minibatch sum -> whole-data sum, averaged over draws
        value = boost * np.sum(self.lik.logpdf(yb, F, lik_params))
        gF = boost * self.lik.dlogpdf_df(yb, F, lik_params)
        dW = (gF.T @ Psi).reshape(K, L, -1)
        if Q is not None:
            dW = dW @ Q  # (K, L, r)
        g_m = dW.sum(1)
        g_s = np.einsum("kld,kld->kd", dW, z) / (2 * sd)
        grads = {f"likelihood__{k}": boost * v for k, v in self.lik.dlogpdf_dparams(yb, F, lik_params).items()}
        dPsi = gF @ W
        per_col = np.einsum("nj,nj->j", Phi, dPsi)  # d/d scale_j
        for i, n in enumerate(self.names):
            lam = float(values[f"{n}__prior_var"])
            grads[f"{n}__prior_var"] = per_col[self.owner == i].sum() / (2 * np.sqrt(lam))
        if hyper:
            grads.update(self.basis._vjp_all(Xb, hyper, Phi, dPsi * scale))

        # expected log prior under each component, N(0, I): closed form (the D - r
        # directions outside the rotation have q = prior: mean 0, variance 1)
        D = self.basis.n_outputs_
        rest = D - m.shape[1]
        value += np.mean(-0.5 * np.sum(m**2 + s, axis=1) - 0.5 * D * np.log(2 * np.pi)) - 0.5 * rest
        g_m -= m / K
        g_s -= 0.5 / K

        # entropy lower bound: -1/K sum_k logsumexp_j [log N(m_k | m_j, s_k + s_j)] + log K
        S = s[:, None, :] + s[None, :, :]  # (K, K, D)
        diff = m[:, None, :] - m[None, :, :]
        a = -0.5 * np.sum(diff**2 / S + np.log(2 * np.pi * S), axis=2)  # (K, K)
        # (outside the rotation every pair contributes N(0 | 0, 2 I): a constant)
        value += -np.mean(special.logsumexp(a, axis=1)) + np.log(K) + 0.5 * rest * np.log(4 * np.pi)
        C = -special.softmax(a, axis=1) / K  # d value / d a_kj
        u = diff / S
        # a_kj depends on (m_k, s_k) and (m_j, s_j); collect both ends of every pair
        g_m += -np.einsum("kj,kjd->kd", C, u) + np.einsum("kj,kjd->jd", C, u)
        da_ds = 0.5 * (u**2 - 1.0 / S)
        g_s += np.einsum("kj,kjd->kd", C, da_ds) + np.einsum("kj,kjd->jd", C, da_ds)
        grads[_MEAN], grads[_VAR] = g_m, g_s
        return float(value), grads


def _draw_weights(m: np.ndarray, sd: np.ndarray, Q: np.ndarray | None, z: np.ndarray) -> np.ndarray:
    """Weight draws ``v`` from components ``(m, sd)`` (rows) given standard normal ``z`` (rows, D)."""
    if Q is None:
        return m + sd * z
    return z + (m + (sd - 1.0) * (z @ Q)) @ Q.T


def _to_weight_space(m: np.ndarray, s: np.ndarray, Q: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each component's mean and marginal variances in the coordinates of ``v``."""
    if Q is None:
        return m, s
    return m @ Q.T, 1.0 + (s - 1.0) @ (Q.T**2)


def _change_rotation(m, s, Q_old, Q_new) -> tuple[np.ndarray, np.ndarray]:
    """Components ``N(Q_old m, Q_old diag(s) Q_old^T + I - Q_old Q_old^T)`` re-expressed in
    ``Q_new``'s coordinates: the mean exactly, the covariance by its diagonal there."""
    R = Q_new.T @ Q_old  # (r_new, r_old)
    return m @ R.T, 1.0 + (s - 1.0) @ (R.T**2)
