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

The same holds for a likelihood with covariates on two or three of its parameters (a
distributional regression: a zero-inflated Poisson's ``psi`` and ``mu``, a Normal's mean and
log scale, a Beta's mean and precision): given the observation, its predictors are
correlated, and rank-one sites left a ZIP's coefficients at sds 0.83-0.90 of NUTS's and a
Gamma(mu, sigma) regression's at 0.87-0.94 (robustness round 43). :func:`pmkjit.fit` gives
such a likelihood one joint site per observation (:func:`joinable`, :func:`join`) where no
one-site method for the whole likelihood applies.

The tilted moments come from a tensor Gauss-Hermite grid (scrambled Sobol points above
six inputs) in two passes, in the cavity's frame and then in the frame of the tilted
moments the first pass found, with the factor's log-density (the observed class's log
probability) at the nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
from scipy import linalg, stats

from pmkjit.families import Gaussian, PointMass
from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot, LinearSlot, pair_slots
from pmkjit.operators.grid import moments_agree, product_grid, well_conditioned

__all__ = ["JointQuadrature", "joint_update", "joinable", "join"]

# Gauss-Hermite nodes per dimension: a grid of a few thousand nodes at most. A class
# probability is bounded, so the tilted law is the cavity reweighted by a bounded factor,
# which a grid in its own frame resolves; a density (a distributional regression's) need not
# be bounded, and the second pass, in the frame of the first pass's moments, resolves it
# unless it is far sharper than the cavity, where the answer is refused (_MIN_RESOLVED).
_NODES = {1: 64, 2: 32, 3: 16, 4: 7, 5: 6, 6: 5}
_MAX_GRID_DIMS = max(_NODES)
_CHUNK = 2_000_000  # grid points x instances evaluated at once
_MIN_RESOLVED = 0.05  # least effective number of nodes, relative to the grid's own, of an answer
# nodes per axis of the coarser grid that checks an answer (with a fallback), whose moments
# must agree as the grid oracle's check requires (pmkjit.operators.grid.moments_agree)
_CHECK_NODES = {2: 20, 3: 10}
_MAX_FALLBACK = 10  # entries answered by the fallback oracle per call


# Most linear predictors of a likelihood given a joint site by :func:`join`: the tensor grid
# has 16^3 nodes at three, and a distributional regression rarely has more.
MAX_JOINED = 3


def joinable(f: BlackBoxFactor) -> bool:
    """Whether likelihood ``f`` reads two or three linear predictors that one joint site per
    instance should hold (a distributional regression: ``pm.ZeroInflatedPoisson(psi=invlogit(
    c0 + c1 x), mu=exp(a + b x))``, a Normal with a log-linear scale, a Beta with a
    regression on its precision).

    Rank-one sites per predictor drop the predictors' correlation within an observation:
    on the ZIP its coefficients' sds were 0.83-0.90 of NUTS's, on a Gamma(mu, sigma)
    regression 0.87-0.94 with a mean 0.13 sd off (robustness round 43). The predictors'
    rows must span as many directions as there are predictors in every instance, or the
    joint cavity is singular (``mu=eta, sigma=exp(eta)`` reads one predictor twice).
    """
    if (f.kind != "likelihood" or f.logp is None or f.observed is None or f.joint or f.analytic is not None
            or f.mixture is not None or f.linear_normal is not None or f.from_prior):
        return False
    slots = [f.inputs[i] for i in f.latent_inputs]
    if not 2 <= len(slots) <= MAX_JOINED or not all(isinstance(s, LinearSlot) for s in slots):
        return False
    A = [np.asarray(s.A, dtype=float) for s in slots]
    # each observation's Gram matrix of its predictors' rows, (B, m, m), without stacking
    # the (B, D) rows into one more copy
    gram = np.stack([np.stack([np.einsum("bd,bd->b", a, b) for b in A], axis=1) for a in A], axis=1)
    ev = np.linalg.eigvalsh(gram)
    return bool(np.all(ev[:, 0] > 1e-12 * np.maximum(ev[:, -1], np.finfo(float).tiny)))


def join(f: BlackBoxFactor) -> None:
    """Give likelihood ``f`` one joint Gaussian site per instance over its linear predictors."""
    f.pair_slots = pair_slots([f.inputs[i] for i in f.latent_inputs])
    f.description += f" (joint site over {len(f.latent_inputs)} linear predictors)"


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
    fallback : callable, optional
        An oracle of the factor (``fallback(messages) -> Answer``, as
        :class:`pmkjit.ep.methods.FactorOracle`) for the entries whose joint answer the
        grid cannot resolve: each predictor's tilted marginal under the cavity's marginals,
        kept as a diagonal site. Without it, those entries go unanswered.
    """

    kind = "joint quadrature"

    def __init__(self, factor: BlackBoxFactor, rng: np.random.Generator, n_samples: int = 4096,
                 fallback: Callable | None = None):
        self.factor = factor
        self.fallback = fallback
        self.rng = rng
        self.n_samples = int(n_samples)
        self.n_calls = 0
        self.n_fallback = 0
        self._qmc: dict[int, np.ndarray] = {}

    def _grid(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Standard-normal nodes ``(G, m)`` and log weights ``(G,)``, the same on every call."""
        if m <= _MAX_GRID_DIMS:
            return product_grid(_NODES[m], m)
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
                 precision: np.ndarray | None = None,
                 fresh: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tilted ``(mean, cov, ok)`` for instances ``idx`` with cavity ``N(mean, cov)`` (``(b, m)``, ``(b, m, m)``).

        ``precision``: the cavity's precision matrices, when the caller has them.
        ``fresh``: which entries have no site yet (those the fallback may answer; a
        refused entry that has one keeps it, rather than trading a joint site for a
        diagonal one and back from sweep to sweep).

        Two passes: the grid in the cavity's frame locates the tilted law, and a second
        grid in the frame of those moments computes them, the cavity's density entering
        the weights. A broad cavity against a sharp likelihood (an early sweep, or
        cutpoints whose order cuts the cavity) leaves only a few nodes of the first grid
        with weight, and its moments alone sent EP to a wrong fixed point (an ordered
        probit's cutpoints 20 sds off with 7 nodes a side). A frame wider than the first
        pass's moments puts the nodes where the integrand is not polynomial in them (sds
        1.4% low at 1.5 times, 7 nodes a side). An entry whose second pass still rests on
        a few nodes (effective number below ``_MIN_RESOLVED`` of the grid's own) is not
        answered. With a ``fallback`` oracle, an answer must also agree with a coarser grid
        in the same frame (:meth:`_agrees`), and the entries refused are answered by the
        fallback as rank-one sites (:meth:`_factorised`).
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
            resolved = ess >= _MIN_RESOLVED * ess_grid
            if self.fallback is not None:
                resolved[resolved] &= self._agrees(mu2[resolved], cov2[resolved], centre[resolved], L2[resolved],
                                                   idx[sl][resolved], (mean[sl][resolved], P[sl][resolved]))
            out_mean[sl], out_cov[sl] = mu2, cov2
            ok[sl] = resolved
        ok &= np.isfinite(out_mean).all(axis=1) & np.isfinite(out_cov).all(axis=(1, 2))
        ok[ok] &= well_conditioned(out_cov[ok])
        self.n_fallback += int((~ok).sum())
        if self.fallback is not None and not ok.all():
            bad = np.flatnonzero(~ok & (True if fresh is None else fresh))
            # The fallback's adaptive quadrature costs about as much per entry as the grid
            # does for a thousand. Refusals come from cavities broad against a sharp
            # likelihood (the priors, in the first sweep): at most _MAX_FALLBACK of them, spread
            # over the batch, are answered so, and their sites narrow the others' cavities
            # for the next sweep. The first sweep, from the priors, refuses nearly all: a
            # Normal with a log-linear scale, N = 5,000, took 346 s when all were answered so;
            # on N = 100-200, 50 a sweep made six of nine fits 1.3-3.5 times slower than 10 a
            # sweep (benchmarks/two_predictors_vs_nuts.py, the same answers).
            bad = bad[np.unique(np.linspace(0, bad.size - 1, min(bad.size, _MAX_FALLBACK)).round().astype(int))]
            out_mean[bad], out_cov[bad], ok[bad] = self._factorised(mean[bad], cov[bad], P[bad], idx[bad])
        return out_mean, out_cov, ok

    def _agrees(self, mu, cov, centre, L, idx, cavity):
        """Whether a coarser grid in the same frame gives the same tilted moments (per entry).

        A funnel passes the effective-number test: a Normal's observation with a latent
        log scale, under a broad cavity (the priors, in the first sweep), is a tilted law
        whose width in the mean shrinks as exp(log scale) down the scale's axis, and a
        fixed grid hits or misses its spikes at random. Its moments sent EP 1e6 sds away.
        """
        Zc, log_wc = product_grid(_CHECK_NODES[mu.shape[1]], mu.shape[1])
        mu3, cov3, _ = self._moments(centre, L, Zc, log_wc, idx, cavity)
        return moments_agree(mu, cov, mu3, cov3)

    def _factorised(self, mean, cov, precision, idx):
        """Tilted ``(mean, cov, ok)`` whose site is diagonal: each predictor's answer from the
        fallback oracle under the cavity's marginals, as rank-one sites get it.

        For entries the grid cannot resolve. The site of predictor ``k`` is its tilted
        marginal over its cavity marginal; added to the joint cavity it gives the law
        returned. The next sweep tries the joint grid again, in the cavity that update led
        to.
        """
        f = self.factor
        latent = f.latent_inputs
        var = np.diagonal(cov, axis1=1, axis2=2)
        messages = [PointMass(s.values[idx]) if isinstance(s, DataSlot) else
                    Gaussian(mean[:, latent.index(i)], var[:, latent.index(i)]) for i, s in enumerate(f.inputs)]
        answer = self.fallback(messages + [PointMass(f.observed[idx])])
        with np.errstate(all="ignore"):
            t_mean = np.stack([np.asarray(b.mean(), float) for b in answer.beliefs], axis=1)
            t_var = np.stack([np.asarray(b.var(), float) for b in answer.beliefs], axis=1)
            lam = 1.0 / t_var - 1.0 / var
            h = t_mean / t_var - mean / var
            P_t = precision + lam[:, :, None] * np.eye(mean.shape[1])
            h_t = np.einsum("bij,bj->bi", precision, mean) + h
        ok = np.asarray(answer.accepted, bool) & np.isfinite(P_t).all(axis=(1, 2)) & np.isfinite(h_t).all(axis=1)
        ok[ok] &= well_conditioned(P_t[ok])
        out_cov = np.full_like(cov, np.nan)
        out_cov[ok] = np.linalg.solve(P_t[ok], np.broadcast_to(np.eye(mean.shape[1]), P_t[ok].shape))
        out_mean = np.full_like(mean, np.nan)
        out_mean[ok] = np.einsum("bij,bj->bi", out_cov[ok], h_t[ok])
        return out_mean, out_cov, ok

    def _moments(self, centre, L, Z, log_w, idx, cavity):
        """Weighted mean, covariance and effective number of nodes on the grid ``centre + L Z``.

        ``cavity=None``: the grid is in the cavity's own frame (its density is in the
        Gauss-Hermite weights); else ``(mean, precision)`` of the cavity, whose density
        relative to the frame's enters each node's weight.

        Everything but the factor's density is computed in the grid's own coordinates
        ``Z``, shared by all instances, as matrix products of a few ``(c, m, m)`` terms
        with ``(G, m)`` or ``(G, m^2)`` node arrays; no ``(c, G, m)`` array is formed.
        """
        f = self.factor
        c, m = centre.shape
        ZZ = (Z[:, :, None] * Z[:, None, :]).reshape(Z.shape[0], m * m)
        # each latent input at the nodes, (c, G)
        x = [centre[:, k, None] + L[:, k, :] @ Z.T for k in range(m)]
        sel = idx[:, None]
        ins = []
        latent = f.latent_inputs
        for i, s in enumerate(f.inputs):
            ins.append(np.broadcast_to(s.values[sel], x[0].shape) if isinstance(s, DataSlot)
                       else x[latent.index(i)])
        y = np.broadcast_to(f.observed[sel], x[0].shape)
        with np.errstate(all="ignore"):
            lp = log_w + f.logp(y, tuple(ins))
            if cavity is not None:
                # (x - m)' P (x - m) with x - m = delta + L z, expanded in z
                delta, P = centre - cavity[0], cavity[1]
                PL = P @ L
                quad = (np.einsum("ci,cij,cj->c", delta, P, delta)[:, None]
                        + 2.0 * np.einsum("ci,cij->cj", delta, PL) @ Z.T
                        + (np.swapaxes(L, 1, 2) @ PL).reshape(c, m * m) @ ZZ.T)
                lp = lp - 0.5 * quad + 0.5 * np.sum(Z**2, axis=1)
            lp = np.where(np.isnan(lp), -np.inf, lp)
            r = np.exp(lp - lp.max(axis=1, keepdims=True))
            r /= r.sum(axis=1, keepdims=True)
            zbar = r @ Z
            # E[z z'] - zbar zbar' loses log10(|zbar|^2 / S) digits where the law is much
            # narrower than the frame away from its centre (the first pass only; the second
            # is in the law's own frame, zbar ~ 0 and S ~ I)
            S = (r @ ZZ).reshape(c, m, m) - zbar[:, :, None] * zbar[:, None, :]
            mu = centre + np.einsum("cij,cj->ci", L, zbar)
            cov = L @ S @ np.swapaxes(L, 1, 2)
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
    fresh = ~(Lam.any(axis=(1, 2)) | h.any(axis=1))
    t_mean, t_cov, good = method(m_cav, 0.5 * (C_cav + np.swapaxes(C_cav, 1, 2)), idx, precision=P_cav[idx],
                                 fresh=fresh[idx])
    info.unanswered += int((~good).sum())
    P_t = np.linalg.solve(t_cov[good], eye[idx[good]])
    Lam_new = P_t - P_cav[idx[good]]
    h_new = np.einsum("bij,bj->bi", P_t, t_mean[good]) - h_cav[idx[good]]
    return idx[good], slot_sites(Lam_new, h_new)
