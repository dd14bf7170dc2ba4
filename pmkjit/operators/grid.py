"""Deterministic tilted moments for factors of three to six latent variables.

Adaptive trapezoid quadrature (:class:`~pmkjit.operators.QuadratureOracle`) stops at two
latent variables; beyond them pmkjit used importance sampling, whose Monte Carlo noise
enters every site and keeps EP from meeting its tolerance when many instances read the
same few latents (a Student-t likelihood with a latent ``nu``: 116 s; a two-component
Normal mixture with a latent weight: not converged in 50 sweeps). Here the tilted law

    q_b(x) ∝ psi_b(x) prod_v m_{v,b}(x_v)

of ``m`` latent variables is integrated on a tensor Gauss-Hermite grid in unconstrained
coordinates ``u_v`` (identity, log or logit), in two passes as the joint quadrature of
categorical likelihoods does (:mod:`pmkjit.ep.joint`): first in the frame of the incoming
messages (each moment-matched by a Gaussian in ``u``), then in the frame of the tilted
mean and covariance that pass found, rotated by its Cholesky factor, so that correlated
and shifted tilted laws are resolved by the whole grid. The exact incoming densities
enter the node weights, so the frame only decides where the nodes are. The same nodes on
every call: the answers are deterministic functions of the messages, and EP converges
as it does with quadrature. An entry whose second pass rests on few nodes (effective
number below ``min_resolved`` of the grid's own) is refused, as the other oracles refuse
what they cannot resolve, and so is one whose tilted mean and covariance on a coarser
grid in the same frame differ by more than 0.05 tilted sds or 10% in variance: a law
the grid does not resolve (a broad incoming message against a mixture likelihood, the
tilted law a sum of narrow bumps between the nodes) passed the first test with
accurate-looking weights and moments 0.7 sds off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pmkjit.families import ExponentialFamily, Gaussian
from pmkjit.operators.oracle import OracleResult, project_beliefs

__all__ = ["GridOracle", "GRID_NODES", "moments_agree", "product_grid", "well_conditioned"]

# Gauss-Hermite nodes per axis: 4,096, 10,000, 7,776 and 15,625 nodes in all.
GRID_NODES = {3: 16, 4: 10, 5: 6, 6: 5}
# The coarser grid each answer is checked against, in the same frame.
_CHECK_NODES = {3: 12, 4: 7, 5: 4, 6: 3}
# One or two variables (adaptive quadrature's domain for a density alone) take the grid
# where its answers must carry expectations of more than the variables' own statistics
# (``extras``: a conditionally Gaussian likelihood's integrated-out inputs), as many nodes
# as three: with 32 per axis a measurement-error regression's law of (x, s) was 0.04 sd
# off in the mean (importance sampling with 4e6 draws), within what the check allows;
# with 64, 0.003
_LOW_NODES = {1: 128, 2: 64}
_LOW_CHECK_NODES = {1: 96, 2: 48}
_CHECK_MEAN = 0.05  # largest difference of a tilted mean between the grids, in tilted sds
_CHECK_LOG_VAR = 0.1  # largest difference of a tilted log variance between the grids
_CHUNK = 2_000_000  # grid nodes x entries evaluated at once
_MIN_RESOLVED = 0.05
_ZOOM = 0.3  # least shrinking of a frame's sds per pass around a law the nodes do not resolve


class GridOracle:
    """Projected tilted beliefs of ``m`` latent variables (3 to 6) on a Gauss-Hermite grid.

    Parameters
    ----------
    log_factor : callable
        ``log_factor(xs, rows) -> log psi``: ``xs`` a list of ``m`` arrays of shape
        ``(b, G)`` (the latent variables at the nodes, in their own support), ``rows``
        the indices ``(b,)`` of the entries into the batch being answered (to pick
        per-entry data); returns ``(b, G)``.
    families : sequence of family classes
        Message family of each latent variable (Gaussian, Gamma or Beta).
    min_resolved : float, default 0.05
        Least effective number of nodes of an accepted answer, relative to the grid's.
        An answer must also agree with a coarser grid's in the same frame (tilted means
        within 0.05 tilted sds, variances within 10%).
    max_passes : int, default 2
        Grids computed before the checked one: each after the first is placed in the frame
        of the previous one's tilted moments, until two frames agree (means within 0.05
        sds, variances within 10%). Two suffice when the tilted law is within a few
        message sds of the first frame; a whole likelihood against its prior
        (:mod:`pmkjit.ep.collapsed`) is a law tens of times narrower, which the first
        grid only brackets.
    extras : bool, default False
        ``log_factor`` returns ``(log psi, g)`` with ``g`` of shape ``(b, G, k)``, whose
        expectations under the tilted law the answer carries (:attr:`extra_means` after
        each call, ``(B, k)``, NaN where refused). One and two variables are taken then
        too (128 and 64 nodes per axis).
    """

    kind = "grid"

    def __init__(self, log_factor: Callable, families: Sequence[type[ExponentialFamily]], *,
                 min_resolved: float = _MIN_RESOLVED, max_passes: int = 2, extras: bool = False):
        if max_passes < 2:
            raise ValueError(f"max_passes must be at least 2, got {max_passes}")
        self.max_passes = int(max_passes)
        self.log_factor = log_factor
        self.families = tuple(families)
        self.extras = bool(extras)
        self.extra_means: np.ndarray | None = None
        m = len(self.families)
        nodes, check = (({**_LOW_NODES, **GRID_NODES}, {**_LOW_CHECK_NODES, **_CHECK_NODES}) if extras
                        else (GRID_NODES, _CHECK_NODES))
        if m not in nodes:
            raise ValueError(f"the grid oracle takes {min(nodes)} to {max(nodes)} latent variables, got {m}")
        self._Z, self._log_w = product_grid(nodes[m], m)
        self._check = product_grid(check[m], m)
        self._ess_grid = 1.0 / np.sum(np.exp(2 * self._log_w))
        self.min_resolved = float(min_resolved)
        self.n_calls = 0

    def __call__(self, messages: Sequence[ExponentialFamily], frame: tuple | None = None) -> OracleResult:
        """Tilted beliefs of every latent variable for a batch of message tuples ``(B,)`` each.

        ``frame``: ``(centre, sd)``, arrays ``(B, m)`` in the unconstrained coordinates, where
        the first grid goes; by default each message's own mean and sd there.
        """
        messages = tuple(messages)
        m = len(self.families)
        B = len(messages[0])
        self.n_calls += B
        stats = np.full((m, B, 3), np.nan)
        extra = None
        ess = np.zeros(B)
        if frame is None:
            # the messages' own Gaussian frames in u (exact moments of u)
            mom = [msg.unconstrained_moments() for msg in messages]
            centre = np.stack([np.asarray(mu, float) for mu, _ in mom], axis=1)
            sd = np.sqrt(np.stack([np.asarray(v, float) for _, v in mom], axis=1))
        else:
            centre, sd = (np.asarray(a, dtype=float).reshape(B, m) for a in frame)
        rows_per_chunk = max(1, _CHUNK // self._Z.shape[0])
        for lo in range(0, B, rows_per_chunk):
            rows = np.arange(lo, min(B, lo + rows_per_chunk))
            L2 = sd[rows][:, :, None] * np.eye(m)
            centre2 = centre[rows]
            for _ in range(self.max_passes - 1):
                centre2, L2, moved = self._reframe(messages, rows, centre2, L2)
                if not moved.any():
                    break
            mu2, cov2, s2, e2, g = self._pass(messages, rows, centre2, L2)
            if g is not None:
                extra = np.full((B, g.shape[1]), np.nan) if extra is None else extra
                extra[rows] = g
            mu3, cov3, *_ = self._pass(messages, rows, centre2, L2, self._check)
            agree = moments_agree(mu2, cov2, mu3, cov3)
            stats[:, rows] = s2
            ess[rows] = np.where(agree, e2, 0.0)
        accepted = (ess >= self.min_resolved * self._ess_grid) & np.isfinite(stats[..., :2]).all(axis=(0, 2))
        beliefs, accepted = project_beliefs(self.families, stats, accepted)
        if self.extras:
            self.extra_means = np.where(accepted[:, None], extra, np.nan)
        return OracleResult(beliefs, ess, accepted)

    def _reframe(self, messages, rows, centre, L):
        """One grid in frame ``(centre, L)``; the frame of its tilted moments (where they are
        usable), and which entries' frames moved by more than the answers' check allows."""
        mu1, cov1, _, e1, _ = self._pass(messages, rows, centre, L)
        old = L @ np.swapaxes(L, 1, 2)
        if self.max_passes > 2:
            # a law narrower than the node spacing sits on a node or two: their covariance
            # is no frame, so zoom in on them, at most _ZOOM-fold per pass (the default two
            # passes keep the first pass's moments as they are)
            few = np.isfinite(mu1).all(axis=1) & (e1 < self.min_resolved * self._ess_grid)
            var = np.maximum(np.diagonal(np.nan_to_num(cov1), axis1=1, axis2=2),
                             _ZOOM**2 * np.diagonal(old, axis1=1, axis2=2))
            cov1 = np.where(few[:, None, None], var[:, :, None] * np.eye(old.shape[1]), cov1)
        good = np.isfinite(mu1).all(axis=1) & np.isfinite(cov1).all(axis=(1, 2))
        good[good] &= well_conditioned(cov1[good])
        cov = np.where(good[:, None, None], cov1, old)
        new_centre = np.where(good[:, None], mu1, centre)
        moved = ~moments_agree(new_centre, cov, centre, old)
        return new_centre, np.linalg.cholesky(cov), moved & good

    def _pass(self, messages, rows, centre, L, grid=None):
        """Tilted mean and covariance in ``u``, statistics ``(m, b, 3)``, effective nodes ``(b,)``
        and, with ``extras``, the expectations ``(b, k)`` of what ``log_factor`` returned beside
        ``log psi`` (else None)."""
        Z, log_w = (self._Z, self._log_w) if grid is None else grid
        m = len(self.families)
        # nodes as (b, m, G), by one matrix product (b m, m) @ (m, G) for the whole batch
        # (NumPy's broadcast (b, m, m) @ (m, G) took up to 20 times longer): each latent's
        # (b, G) slice is contiguous in the nodes, as the elementwise work below wants
        b = centre.shape[0]
        U = centre[:, :, None] + (L.reshape(b * m, m) @ Z.T).reshape(b, m, -1)
        # log N(U; centre, L L^T) up to the constant, which cancels on normalising
        log_frame = -0.5 * np.sum(Z**2, axis=1) - np.log(np.abs(np.diagonal(L, axis1=1, axis2=2))).sum(axis=1)[:, None]
        xs, log_msgs = [], 0.0
        with np.errstate(all="ignore"):
            for v, fam in enumerate(self.families):
                u = U[:, v]
                xs.append(fam.from_unconstrained(u))
                log_msgs = log_msgs + messages[v][rows].logpdf_unconstrained(u)
            value = self.log_factor(xs, rows)
            log_psi, g = value if self.extras else (value, None)
            lp = log_w + log_psi + log_msgs - log_frame
            lp = np.where(np.isnan(lp), -np.inf, lp)
            top = lp.max(axis=1, keepdims=True)
            r = np.exp(lp - np.where(np.isfinite(top), top, 0.0))
            r = r / r.sum(axis=1, keepdims=True)
            mu = np.einsum("bg,big->bi", r, U)
            d = U - mu[:, :, None]
            cov = (d * r[:, None, :]) @ np.swapaxes(d, 1, 2)
            out = np.full((m, rows.size, 3), np.nan)
            for v, fam in enumerate(self.families):
                if issubclass(fam, Gaussian):
                    # E[u] and E[u^2] are the mean and covariance just computed
                    out[v, :, 0], out[v, :, 2] = mu[:, v], cov[:, v, v]
                    out[v, :, 1] = cov[:, v, v] + mu[:, v] ** 2
                    continue
                T = fam.sufficient_statistics_unconstrained(U[:, v])
                T = np.where(r[..., None] > 0, T, 0.0)
                out[v, :, :2] = np.einsum("bg,bgk->bk", r, T)
            ess = 1.0 / np.sum(r**2, axis=1)
            if g is not None:
                g = np.einsum("bg,bgk->bk", r, np.where(r[..., None] > 0, g, 0.0))
        return mu, cov, out, np.where(np.isfinite(ess), ess, 0.0), g


def moments_agree(mean: np.ndarray, cov: np.ndarray, other_mean: np.ndarray, other_cov: np.ndarray) -> np.ndarray:
    """Per entry ``(b,)``: whether ``(other_mean, other_cov)`` is within ``_CHECK_MEAN`` sds of
    ``cov`` of ``mean`` on every axis, and its variances within ``_CHECK_LOG_VAR`` of
    ``cov``'s in log (two grids' answers, or a frame against the one before it)."""
    with np.errstate(all="ignore"):
        var = np.diagonal(cov, axis1=1, axis2=2)
        return np.all(np.abs(other_mean - mean) <= _CHECK_MEAN * np.sqrt(var), axis=1) & np.all(
            np.abs(np.log(np.diagonal(other_cov, axis1=1, axis2=2) / var)) <= _CHECK_LOG_VAR, axis=1)


def product_grid(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal tensor Gauss-Hermite nodes ``(n**m, m)`` and their log weights."""
    z, w = np.polynomial.hermite_e.hermegauss(n)
    Z = np.stack(np.meshgrid(*([z] * m), indexing="ij"), axis=-1).reshape(-1, m)
    W = np.prod(np.stack(np.meshgrid(*([w] * m), indexing="ij"), axis=-1).reshape(-1, m), axis=1)
    return Z, np.log(W / W.sum())


def well_conditioned(cov: np.ndarray) -> np.ndarray:
    """Per matrix ``(b, m, m)``: positive definite with room for a Cholesky factorisation.

    A covariance from a few weighted nodes can have an eigenvalue positive by round-off
    only, which passed ``> 0`` and then failed the Cholesky of the second pass.
    """
    ev = np.linalg.eigvalsh(cov)
    return ev[:, 0] > 1e-10 * np.maximum(ev[:, -1], np.finfo(float).tiny)
