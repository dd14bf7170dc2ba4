"""Multi-output Bayesian linear regression in the primal, with online updates.

The model, for each output column ``k`` of ``Y`` (``n`` rows, ``D`` features)::

    y_k = Phi w_k + c_k + eps,   w_k ~ N(0, s_k / lam I),   eps ~ N(0, s_k I)

Every output shares the precision ``A = lam I + Phi^T Phi`` (held as its upper
Cholesky factor ``R``, ``A = R^T R``), so one ``D x D`` factor serves all outputs
and one triangular solve gives every predictive variance. The noise variance
``s_k`` (sigma_y^2) is profiled per output (its maximum-likelihood value given
``lam``), and the prior variance sigma_0^2 = s_k / lam; ``lam`` maximises the
summed log evidence unless given. Online updates of ``R`` use LAPACK ``tpqrt``
(a QR of ``[R; B]``), O(k D^2) for ``k`` new rows.

References
----------
.. [1] C. M. Bishop, *Pattern Recognition and Machine Learning*, sections 3.3-3.5.
.. [2] W. Jitkrittum, A. Gretton, N. Heess, S. M. A. Eslami, B. Lakshminarayanan,
       D. Sejdinovic, Z. Szabo, "Kernel-based just-in-time learning for passing
       expectation propagation messages", UAI 2015.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize
from scipy.linalg import blas, lapack

__all__ = ["BayesianLinearRegression", "EvidenceCurve"]

_LOG_LAM_BOUNDS = (-14.0, 14.0)  # lam in [1e-6, 1.2e6] relative to unit-scale features
# Largest relative error accepted in a leverage computed in single precision. The
# forward error of a triangular solve is bounded by about cond(R) * eps_32, so single
# precision serves while cond(R) <= _LEVERAGE_RTOL / eps_32 (about 8e5).
_LEVERAGE_RTOL = 0.05


@dataclass(frozen=True)
class EvidenceCurve:
    """Eigen-decomposition of ``Phi^T Phi`` that evaluates the evidence for any ``lam``."""

    eigenvalues: np.ndarray  # (D,)
    projected: np.ndarray  # (D, K): V^T b, b = Phi^T y
    yy: np.ndarray  # (K,)
    n: int

    def __call__(self, lam: float) -> np.ndarray:
        """Log evidence per output at regulariser ``lam`` (noise variance profiled)."""
        d = self.eigenvalues + lam
        quad = np.sum(self.projected**2 / d[:, None], axis=0)
        s = np.maximum(self.yy - quad, 1e-300) / self.n
        logdet = np.sum(np.log(d)) - d.size * np.log(lam)
        return -0.5 * self.n * (np.log(2 * np.pi * s) + 1.0) - 0.5 * logdet

    def best_lambda(self, rule: str = "summed") -> float:
        """The ``lam`` maximising the evidence (bounded 1-D search on log ``lam``).

        ``rule="summed"``: of the evidence summed over outputs. ``"smallest"``: the
        smallest of the per-output maximisers (see :class:`BayesianLinearRegression`).
        """
        grid = np.linspace(*_LOG_LAM_BOUNDS, 57)
        values = np.array([self(np.exp(g)) for g in grid])  # (grid, K)
        if rule == "summed":
            return self._refine(grid, values.sum(axis=1), lambda v: v.sum())
        if rule == "smallest":
            return min(self._refine(grid, values[:, k], lambda v, k=k: v[k]) for k in range(values.shape[1]))
        raise ValueError(f"rule must be 'summed' or 'smallest', got {rule!r}")

    def _refine(self, grid: np.ndarray, values: np.ndarray, pick) -> float:
        """Polish the grid's best log ``lam`` between its neighbours."""
        i = int(np.argmax(values))
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
        if hi <= lo:
            return float(np.exp(grid[i]))
        res = optimize.minimize_scalar(lambda g: -pick(self(np.exp(g))), bounds=(lo, hi), method="bounded")
        return float(np.exp(res.x if res.fun <= -values[i] else grid[i]))


def _evidence_curve(Phi: np.ndarray, Yc: np.ndarray, G: np.ndarray, b: np.ndarray, yy: np.ndarray) -> EvidenceCurve:
    """The evidence curve from the smaller of the two Gram matrices.

    With fewer rows than features, ``Phi Phi^T = U S U^T`` has the nonzero eigenvalues
    of ``Phi^T Phi`` and the projections ``V^T Phi^T y = sqrt(S) U^T y``; the other
    ``D - n`` eigenvalues are zero with zero projections. An ``n x n`` eigh instead of
    ``D x D`` (a KJIT operator's first minibatch is often smaller than its features).
    """
    n, D = Phi.shape
    if n >= D:
        evals, evecs = np.linalg.eigh(G)
        return EvidenceCurve(np.maximum(evals, 0.0), evecs.T @ b, yy, n)
    evals, U = np.linalg.eigh(Phi @ Phi.T)
    evals = np.maximum(evals, 0.0)
    projected = np.sqrt(evals)[:, None] * (U.T @ Yc)
    pad = D - n
    return EvidenceCurve(
        np.concatenate([np.zeros(pad), evals]), np.vstack([np.zeros((pad, Yc.shape[1])), projected]), yy, n
    )


class BayesianLinearRegression:
    """Multi-output Bayesian linear regression with a shared Cholesky-held posterior.

    Parameters
    ----------
    regularization : float or None, default None
        ``lam``, the ratio of noise variance to prior weight variance
        (sigma_y^2 / sigma_0^2). ``None`` chooses it by maximising the log
        evidence on the data given to :meth:`fit`.
    center : bool, default True
        Subtract the mean of the outputs seen by :meth:`fit` (kept fixed during
        later :meth:`partial_fit` calls, so online and batch updates agree).
    regularization_rule : {"summed", "smallest"}, default "summed"
        How ``regularization=None`` is chosen. One ``lam`` serves every output, so
        every output gets the same signal-to-noise ratio ``sigma_0^2 / sigma_y^2 =
        1 / lam``. ``"summed"`` maximises the evidence summed over outputs; when the
        outputs' signal-to-noise ratios differ by orders of magnitude (a KJIT
        operator regressing a belief's log rate that moves by units beside a log
        shape that moves by hundredths, from noisy oracle answers), that compromise
        over-smooths the strong output and books its misfit as noise. ``"smallest"``
        takes the smallest of the per-output maximisers: every output gets at least
        the prior variance it needs; the weaker ones, under-regularised, partly fit
        their noise, so their errors grow to the order of that noise.

    Attributes
    ----------
    regularization_ : float
        The ``lam`` in use.
    noise_var_ : ndarray of shape (n_outputs,)
        Profiled noise variance per output.
    coef_ : ndarray of shape (n_features, n_outputs)
        Posterior mean weights.
    offset_ : ndarray of shape (n_outputs,)
    n_samples_seen_ : int
    """

    def __init__(self, regularization: float | None = None, *, center: bool = True,
                 regularization_rule: str = "summed") -> None:
        self.regularization = regularization
        self.center = center
        if regularization_rule not in ("summed", "smallest"):
            raise ValueError(f"regularization_rule must be 'summed' or 'smallest', got {regularization_rule!r}")
        self.regularization_rule = regularization_rule

    # ------------------------------------------------------------------ fitting
    def fit(self, Phi: np.ndarray, Y: np.ndarray) -> "BayesianLinearRegression":
        """Fit from scratch on features ``Phi`` (n, D) and targets ``Y`` (n, K) or (n,)."""
        Phi, Y = self._check(Phi, Y, first=True)
        self._ravel = self._ravel_output
        self.offset_ = Y.mean(axis=0) if self.center else np.zeros(Y.shape[1])
        Yc = Y - self.offset_
        G = Phi.T @ Phi
        b = Phi.T @ Yc
        yy = np.einsum("nk,nk->k", Yc, Yc)
        if self.regularization is None:
            curve = _evidence_curve(Phi, Yc, G, b, yy)
            lam = curve.best_lambda(self.regularization_rule)
        else:
            lam = float(self.regularization)
            if not lam > 0:
                raise ValueError(f"regularization must be positive, got {lam}")
        G[np.diag_indices_from(G)] += lam
        self.regularization_ = lam
        self.R_ = linalg.cholesky(G, lower=False, overwrite_a=True, check_finite=False)
        self._b = b
        self._yy = yy
        self.n_samples_seen_ = Phi.shape[0]
        self._refresh()
        return self

    def partial_fit(self, Phi: np.ndarray, Y: np.ndarray) -> "BayesianLinearRegression":
        """Add rows ``(Phi, Y)`` to the posterior with a rank-k Cholesky update.

        Equivalent to refitting on all data seen so far with the same ``lam``
        and offset; costs O(k D^2) rather than O(n D^2 + D^3).
        """
        if not hasattr(self, "R_"):
            return self.fit(Phi, Y)
        Phi, Y = self._check(Phi, Y, first=False)
        Yc = Y - self.offset_
        D = self.R_.shape[0]
        # tpqrt factors [R; Phi] = Q [R'; 0], so R'^T R' = R^T R + Phi^T Phi.
        nb = min(D, 32)
        for start in range(0, Phi.shape[0], 4096):  # bound tpqrt's workspace
            # tpqrt overwrites its B argument: always hand it a private copy, never the caller's rows.
            block = np.array(Phi[start : start + 4096], order="F", copy=True)
            out = lapack.dtpqrt(0, nb, self.R_, block, overwrite_a=1, overwrite_b=1)
            if out[-1] != 0:
                raise np.linalg.LinAlgError(f"LAPACK dtpqrt failed with info={out[-1]}")
            R = np.triu(out[0])
            # tpqrt may return negative diagonals; flip rows so R stays a Cholesky factor.
            sign = np.sign(np.diag(R))
            sign[sign == 0] = 1.0
            self.R_ = np.asfortranarray(R * sign[:, None])
        self._b = self._b + Phi.T @ Yc
        self._yy = self._yy + np.einsum("nk,nk->k", Yc, Yc)
        self.n_samples_seen_ += Phi.shape[0]
        self._refresh()
        return self

    def _refresh(self) -> None:
        """Recompute posterior mean weights and profiled noise from running statistics."""
        u = linalg.solve_triangular(self.R_, self._b, trans="T", lower=False, check_finite=False)
        self.coef_ = linalg.solve_triangular(self.R_, u, lower=False, check_finite=False)
        quad = np.einsum("dk,dk->k", u, u)  # b^T A^-1 b
        n = self.n_samples_seen_
        self.noise_var_ = np.maximum(self._yy - quad, 1e-12 * np.maximum(self._yy, 1e-300)) / n
        logdet = 2.0 * np.sum(np.log(np.abs(np.diag(self.R_))))
        D = self.R_.shape[0]
        self.log_evidence_ = -0.5 * n * (np.log(2 * np.pi * self.noise_var_) + 1.0) - 0.5 * (
            logdet - D * np.log(self.regularization_)
        )
        self._R32_stale = True  # R changed: the float32 copy is derived again when asked for

    def single_precision_factor(self) -> np.ndarray | None:
        """``R`` in float32 when its condition number keeps a float32 leverage accurate, else None.

        The leverage only scales the epistemic variance that is compared with an
        oracle threshold, so a relative error of a few per cent at worst is harmless,
        and float32 halves the cost of the triangular solve that dominates a batched
        prediction. LAPACK's ``trcon`` estimates cond(R) in O(D^2); the answer is kept
        until ``R`` changes, and only models asked for ``precision="auto"`` pay for it.
        """
        self._check_fitted()
        if getattr(self, "_R32_stale", True):
            rcond, info = lapack.dtrcon(self.R_, norm="1", uplo="U", diag="N")
            ok = info == 0 and rcond * _LEVERAGE_RTOL >= np.finfo(np.float32).eps
            self._R32 = np.asfortranarray(self.R_, dtype=np.float32) if ok else None
            self._R32_stale = False
        return self._R32

    # --------------------------------------------------------------- prediction
    def predict(
        self, Phi: np.ndarray, *, return_var: bool = False, include_noise: bool = True,
        overwrite_features: bool = False, variance_precision: str = "double",
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean (and variance) for features ``Phi`` (n, D).

        Parameters
        ----------
        Phi : ndarray of shape (n, D)
        return_var : bool
            Also return the predictive variance per output, shape (n, K).
        include_noise : bool
            Add the noise variance ``s_k`` to the epistemic variance
            ``s_k phi^T A^{-1} phi``. ``False`` gives the uncertainty of the mean
            function alone, which is what tells a KJIT operator it lacks data.
        overwrite_features : bool
            Let the variance computation overwrite ``Phi`` (C-contiguous float64) in
            place, saving a copy of the largest array of a batched prediction.
        variance_precision : {"double", "auto"}
            ``"auto"`` computes the leverage in single precision when the condition
            number of the Cholesky factor bounds its relative error by 5% (see
            :meth:`leverage`); the mean is always in double precision.
        """
        self._check_fitted()
        Phi = np.asarray(Phi, dtype=float)
        if Phi.ndim != 2 or Phi.shape[1] != self.R_.shape[0]:
            raise ValueError(f"expected features of shape (n, {self.R_.shape[0]}), got {Phi.shape}")
        mean = Phi @ self.coef_ + self.offset_
        if not return_var:
            return mean[:, 0] if self._ravel else mean
        lev = self.leverage(Phi, overwrite=overwrite_features, precision=variance_precision)
        var = lev[:, None] * self.noise_var_
        if include_noise:
            var = var + self.noise_var_
        if self._ravel:
            return mean[:, 0], var[:, 0]
        return mean, var

    def leverage(self, Phi: np.ndarray, overwrite: bool = False, precision: str = "double") -> np.ndarray:
        """``phi^T A^{-1} phi`` for every row, by one BLAS-3 triangular solve.

        Parameters
        ----------
        Phi : ndarray of shape (n, D)
        overwrite : bool
            Let the solve overwrite a C-contiguous float64 ``Phi`` (double precision only).
        precision : {"double", "auto"}
            ``"auto"`` solves in float32 (twice the speed) whenever the estimated
            condition number of ``R`` bounds the solve's relative error by
            ``cond(R) * eps_32 <= 0.05``, and in float64 otherwise.
        """
        self._check_fitted()
        if precision not in ("double", "auto"):
            raise ValueError(f"precision must be 'double' or 'auto', got {precision!r}")
        Phi = np.asarray(Phi, dtype=float)
        R32 = self.single_precision_factor() if precision == "auto" else None
        if R32 is not None:
            P32 = Phi.astype(np.float32)  # a private copy: strsm overwrites it
            # P32.T of a C-ordered array is Fortran-ordered: trsm reads it without a copy.
            V = blas.strsm(1.0, R32, P32.T, side=0, lower=0, trans_a=1, overwrite_b=1)
            return np.einsum("dn,dn->n", V, V, dtype=np.float64)
        overwrite = overwrite and Phi.flags.c_contiguous
        V = blas.dtrsm(1.0, self.R_, Phi.T, side=0, lower=0, trans_a=1, overwrite_b=int(overwrite))
        return np.einsum("dn,dn->n", V, V)

    # -------------------------------------------------------------- utilities
    def log_evidence(self) -> np.ndarray:
        """Log marginal likelihood per output at the profiled noise variance."""
        self._check_fitted()
        return self.log_evidence_.copy()

    def get_params(self, deep: bool = True) -> dict:
        return {"regularization": self.regularization, "center": self.center,
                "regularization_rule": self.regularization_rule}

    def set_params(self, **params) -> "BayesianLinearRegression":
        for key, value in params.items():
            if key not in ("regularization", "center", "regularization_rule"):
                raise ValueError(f"unknown parameter {key!r}")
            setattr(self, key, value)
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        """Arrays that fully describe a fitted model (for ``.npz`` files)."""
        self._check_fitted()
        return {
            "R": self.R_,
            "b": self._b,
            "yy": self._yy,
            "offset": self.offset_,
            "n": np.array(self.n_samples_seen_),
            "regularization": np.array(self.regularization_),
            "ravel": np.array(self._ravel),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray]) -> "BayesianLinearRegression":
        """Rebuild a fitted model from :meth:`state_dict` output."""
        self = cls(regularization=float(state["regularization"]))
        self.R_ = np.asfortranarray(state["R"], dtype=float)
        self._b = np.asarray(state["b"], dtype=float)
        self._yy = np.asarray(state["yy"], dtype=float)
        self.offset_ = np.asarray(state["offset"], dtype=float)
        self.n_samples_seen_ = int(state["n"])
        self.regularization_ = float(state["regularization"])
        self._ravel = bool(state["ravel"])
        D, K = self._b.shape
        if self.R_.shape != (D, D) or self._yy.shape != (K,) or self.offset_.shape != (K,):
            raise ValueError("inconsistent regression state shapes")
        self._refresh()
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "R_"):
            raise RuntimeError("BayesianLinearRegression is not fitted yet; call fit first")

    def _check(self, Phi: np.ndarray, Y: np.ndarray, *, first: bool) -> tuple[np.ndarray, np.ndarray]:
        Phi = np.asarray(Phi, dtype=float)
        Y = np.asarray(Y, dtype=float)
        if first:
            self._ravel_output = Y.ndim == 1
        if Y.ndim == 1:
            Y = Y[:, None]
        if Phi.ndim != 2 or Y.ndim != 2 or Phi.shape[0] != Y.shape[0]:
            raise ValueError(f"Phi (n, D) and Y (n, K) must have matching rows; got {Phi.shape}, {Y.shape}")
        if Phi.shape[0] == 0:
            raise ValueError("cannot fit on zero rows")
        if not first and (Phi.shape[1] != self.R_.shape[0] or Y.shape[1] != self._b.shape[1]):
            raise ValueError(
                f"expected Phi with {self.R_.shape[0]} columns and Y with {self._b.shape[1]}; "
                f"got {Phi.shape}, {Y.shape}"
            )
        if not (np.isfinite(Phi).all() and np.isfinite(Y).all()):
            bad = np.flatnonzero(~(np.isfinite(Phi).all(1) & np.isfinite(Y).all(1)))
            raise ValueError(f"non-finite features or targets in rows {bad[:5].tolist()}")
        return Phi, Y
