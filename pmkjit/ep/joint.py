"""Joint Gaussian sites for factors whose linear inputs must not be factorised.

A categorical likelihood with a softmax over ``m`` linear predictors (multinomial
logistic regression) couples its predictors: given an observed class, they move
together. EP's usual rank-one site per predictor drops that coupling, and the
posterior then misses the correlations between the classes' coefficients (robustness
check, 3 classes with intercepts only: sds 0.76 of NUTS's; 4 classes with covariates:
means 0.27 NUTS sd off, sds 0.76-0.84 of NUTS's). Such a factor gets one ``m``-variate
Gaussian site per instance instead, stored without changing how the posterior is
assembled: a symmetric ``m x m`` precision ``Lam`` equals

    sum_i (Lam_ii - sum_{j != i} Lam_ij) e_i e_i^T + sum_{i < j} Lam_ij (e_i + e_j)(e_i + e_j)^T,

so the site lives on the inputs' own slots and on one slot ``eta_i + eta_j`` per pair
(:attr:`pmkjit.graph.BlackBoxFactor.pair_slots`), each an ordinary rank-one site.
The tilted moments come from a tensor Gauss-Hermite grid (scrambled Sobol points above
six inputs) in two passes, in the cavity's frame and then in the frame of the tilted
moments the first pass found, with the factor's log-density (the observed class's log
probability) at the nodes.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import linalg, stats

from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot
from pmkjit.operators.grid import well_conditioned

__all__ = ["JointQuadrature", "joint_update"]

# Gauss-Hermite nodes per dimension: a grid of a few thousand nodes at most. The
# likelihood is bounded and continuous (a class probability), so the tilted law is the
# cavity reweighted by a bounded factor, which a grid in its own frame resolves.
_NODES = {1: 64, 2: 32, 3: 16, 4: 7, 5: 6, 6: 5}
_MAX_GRID_DIMS = max(_NODES)
_CHUNK = 2_000_000  # grid points x instances evaluated at once
_MIN_RESOLVED = 0.05  # least effective number of nodes, relative to the grid's own, of an answer


def _pairs(m: int) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(m), 2))


def joint_site(sites: list[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(Lam, h)``, shapes ``(B, m, m)`` and ``(B, m)``, from the slot sites (inputs, then pairs)."""
    B = sites[0].shape[0]
    Lam = np.zeros((B, m, m))
    h = np.zeros((B, m))
    for i in range(m):
        Lam[:, i, i] = -2.0 * sites[i][:, 1]
        h[:, i] = sites[i][:, 0]
    for p, (i, j) in enumerate(_pairs(m)):
        tau = -2.0 * sites[m + p][:, 1]
        Lam[:, i, i] += tau
        Lam[:, j, j] += tau
        Lam[:, i, j] += tau
        Lam[:, j, i] += tau
        h[:, i] += sites[m + p][:, 0]
        h[:, j] += sites[m + p][:, 0]
    return Lam, h


def slot_sites(Lam: np.ndarray, h: np.ndarray) -> list[np.ndarray]:
    """The slot sites ``(n1, n2)`` (inputs, then pairs) that make up the joint site ``(Lam, h)``."""
    m = h.shape[1]
    out = []
    off = Lam.sum(axis=2) - np.diagonal(Lam, axis1=1, axis2=2)  # sum_{j != i} Lam_ij
    for i in range(m):
        out.append(np.stack([h[:, i], -0.5 * (Lam[:, i, i] - off[:, i])], axis=1))
    for i, j in _pairs(m):
        out.append(np.stack([np.zeros(h.shape[0]), -0.5 * Lam[:, i, j]], axis=1))
    return out


class JointQuadrature:
    """Tilted mean and covariance of a factor's latent inputs under a joint Gaussian cavity.

    Parameters
    ----------
    factor : BlackBoxFactor
        A likelihood whose latent inputs are linear slots and which has a log-density.
    rng : numpy.random.Generator
        Used only above six latent inputs, where the product grid gives way to
        ``n_samples`` scrambled Sobol points (rounded up to a power of 2), scrambled once.
    n_samples : int
        Quasi-Monte Carlo points in that case.
    """

    kind = "joint quadrature"

    def __init__(self, factor: BlackBoxFactor, rng: np.random.Generator, n_samples: int = 4096):
        self.factor = factor
        self.rng = rng
        self.n_samples = int(n_samples)
        self.n_calls = 0
        self.n_fallback = 0
        self._qmc: dict[int, np.ndarray] = {}

    def _grid(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Standard-normal nodes ``(G, m)`` and log weights ``(G,)``, the same on every call."""
        if m <= _MAX_GRID_DIMS:
            z, w = np.polynomial.hermite_e.hermegauss(_NODES[m])
            Z = np.stack(np.meshgrid(*([z] * m), indexing="ij"), axis=-1).reshape(-1, m)
            W = np.prod(np.stack(np.meshgrid(*([w] * m), indexing="ij"), axis=-1).reshape(-1, m), axis=1)
            return Z, np.log(W / W.sum())
        if m not in self._qmc:
            # A product grid has too many nodes here: scrambled Sobol points mapped to normals,
            # drawn once, so every sweep integrates with the same nodes. Fresh Monte Carlo
            # draws per call kept EP from converging (8 classes, N = 300: 50 sweeps, 167 s,
            # sds up to 2.1 times NUTS's).
            n = 2 ** int(np.ceil(np.log2(self.n_samples)))
            u = stats.qmc.Sobol(d=m, scramble=True, seed=self.rng).random(n)
            Z = stats.norm.ppf(u)
            # Whitened to a sample mean of exactly 0 and covariance exactly I. Else the
            # points' own covariance error (about 2e-3 here) is a systematic error of every
            # instance's tilted covariance in its cavity's frame, so each site's precision
            # is off by that fraction of the *cavity's* precision, the same way for every
            # observation: it adds up over N (8 classes, N = 5,000: site precisions 1.6
            # times off for a flat likelihood, EP 15 NUTS sds off, not converged).
            Z = Z - Z.mean(axis=0)
            C = Z.T @ Z / Z.shape[0]
            self._qmc[m] = linalg.solve_triangular(np.linalg.cholesky(C), Z.T, lower=True).T
        Z = self._qmc[m]
        return Z, np.full(Z.shape[0], -np.log(Z.shape[0]))

    def __call__(self, mean: np.ndarray, cov: np.ndarray, idx: np.ndarray,
                 precision: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tilted ``(mean, cov, ok)`` for instances ``idx`` with cavity ``N(mean, cov)`` (``(b, m)``, ``(b, m, m)``).

        ``precision``: the cavity's precision matrices, when the caller has them.

        Two passes: the grid in the cavity's frame locates the tilted law, and a second
        grid in the frame of those moments computes them, the cavity's density entering
        the weights. A broad cavity against a sharp likelihood (an early sweep, or
        cutpoints whose order cuts the cavity) leaves only a few nodes of the first grid
        with weight, and its moments alone sent EP to a wrong fixed point (an ordered
        probit's cutpoints 20 sds off with 7 nodes a side). A frame wider than the first
        pass's moments puts the nodes where the integrand is not polynomial in them (sds
        1.4% low at 1.5 times, 7 nodes a side). An entry whose second pass still rests on
        a few nodes (effective number below ``_MIN_RESOLVED`` of the grid's own) is not
        answered.
        """
        b, m = mean.shape
        self.n_calls += b
        Z, log_w = self._grid(m)
        ess_grid = 1.0 / np.sum(np.exp(2 * log_w))
        P = np.linalg.solve(cov, np.broadcast_to(np.eye(m), cov.shape)) if precision is None else precision
        out_mean, out_cov = np.empty((b, m)), np.empty((b, m, m))
        ok = np.zeros(b, bool)
        rows = max(1, _CHUNK // Z.shape[0])
        for lo in range(0, b, rows):
            sl = slice(lo, min(b, lo + rows))
            L = np.linalg.cholesky(cov[sl])
            mu1, cov1, _ = self._moments(mean[sl], L, Z, log_w, idx[sl], None)
            good = np.isfinite(mu1).all(axis=1) & np.isfinite(cov1).all(axis=(1, 2))
            good[good] &= well_conditioned(cov1[good])
            frame = np.where(good[:, None, None], cov1, cov[sl])
            centre = np.where(good[:, None], mu1, mean[sl])
            L2 = np.linalg.cholesky(frame)
            mu2, cov2, ess = self._moments(centre, L2, Z, log_w, idx[sl], (mean[sl], P[sl]))
            out_mean[sl], out_cov[sl] = mu2, cov2
            ok[sl] = ess >= _MIN_RESOLVED * ess_grid
        ok &= np.isfinite(out_mean).all(axis=1) & np.isfinite(out_cov).all(axis=(1, 2))
        ok[ok] &= well_conditioned(out_cov[ok])
        self.n_fallback += int((~ok).sum())
        return out_mean, out_cov, ok

    def _moments(self, centre, L, Z, log_w, idx, cavity):
        """Weighted mean, covariance and effective number of nodes on the grid ``centre + L Z``.

        ``cavity=None``: the grid is in the cavity's own frame (its density is in the
        Gauss-Hermite weights); else ``(mean, precision)`` of the cavity, whose density
        relative to the frame's enters each node's weight.
        """
        f = self.factor
        x = centre[:, None, :] + Z @ np.swapaxes(L, 1, 2)  # (c, G, m)
        sel = idx[:, None]
        ins = []
        latent = f.latent_inputs
        for i, s in enumerate(f.inputs):
            ins.append(np.broadcast_to(s.values[sel], x.shape[:2]) if isinstance(s, DataSlot)
                       else x[..., latent.index(i)])
        y = np.broadcast_to(f.observed[sel], x.shape[:2])
        with np.errstate(all="ignore"):
            lp = log_w + f.logp(y, tuple(ins))
            if cavity is not None:
                d = x - cavity[0][:, None, :]
                lp = lp - 0.5 * np.einsum("bgi,bij,bgj->bg", d, cavity[1], d) + 0.5 * np.sum(Z**2, axis=1)
            lp = np.where(np.isnan(lp), -np.inf, lp)
            r = np.exp(lp - lp.max(axis=1, keepdims=True))
            r /= r.sum(axis=1, keepdims=True)
            mu = np.einsum("bg,bgi->bi", r, x)
            d = x - mu[:, None, :]
            cov = np.swapaxes(d * r[..., None], 1, 2) @ d  # batched BLAS, not einsum's loops
            ess = 1.0 / np.sum(r**2, axis=1)
        return mu, cov, ess


def joint_update(f: BlackBoxFactor, state, sites: list[np.ndarray], method: JointQuadrature,
                 info) -> tuple[np.ndarray, list[np.ndarray]]:
    """New slot sites of a joint factor: ``(entries updated, [(len, 2) per slot])``.

    The joint cavity is the joint marginal of the inputs less the joint site; instances
    whose cavity is not positive definite are skipped (``info.skipped_improper_cavity``),
    as EP skips an improper one-dimensional cavity, and those whose tilted moments are
    not finite are left unanswered (``info.unanswered``).
    """
    slots = [f.inputs[i] for i in f.latent_inputs]
    m = len(slots)
    mu = np.stack([s.A @ state.mu + s.c for s in slots], axis=1)  # (B, m)
    Z = np.stack([linalg.solve_triangular(state.chol, s.A.T, lower=True, check_finite=False) for s in slots])
    C = np.einsum("jdb,kdb->bjk", Z, Z)  # joint marginal covariance, (B, m, m)
    Lam, h = joint_site(sites, m)
    eye = np.broadcast_to(np.eye(m), C.shape)
    # natural parameters need the precision matrices themselves, not a solve against them
    P = np.linalg.solve(C, eye)
    P_cav = P - Lam
    h_cav = np.einsum("bij,bj->bi", P, mu) - h
    ok = np.linalg.eigvalsh(P_cav).min(axis=1) > 0
    info.skipped_improper_cavity += int((~ok).sum())
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return idx, []
    C_cav = np.linalg.solve(P_cav[idx], eye[idx])
    m_cav = np.einsum("bij,bj->bi", C_cav, h_cav[idx])
    t_mean, t_cov, good = method(m_cav, 0.5 * (C_cav + np.swapaxes(C_cav, 1, 2)), idx, precision=P_cav[idx])
    info.unanswered += int((~good).sum())
    P_t = np.linalg.solve(t_cov[good], eye[idx[good]])
    Lam_new = P_t - P_cav[idx[good]]
    h_new = np.einsum("bij,bj->bi", P_t, t_mean[good]) - h_cav[idx[good]]
    return idx[good], slot_sites(Lam_new, h_new)
