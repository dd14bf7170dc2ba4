"""Quadrature oracle for factors with one or two latent variables (the gold standard).

The tilted distribution ``q_b(x) ∝ ψ(x_out | x_in) ∏_v m_{v,b}(x_v)`` is integrated in the
unconstrained coordinates ``u`` of its latent variables (identity, logit or log), where
it is smooth, unbounded in support and usually close to Gaussian. Three stages, each
vectorised over the batch of message tuples (and restricted to the entries that still
need work):

1. **Locate.** A coarse uniform grid of ±12 standard deviations of the incoming
   messages. When the best node lies on the grid's edge, the tilted law is elsewhere
   (a narrow output message can pull it dozens of input standard deviations away), so
   the grid moves to that node and widens fourfold; this walk reaches any distance in
   logarithmically many steps.
2. **Zoom.** Once the peak is inside the grid, the grid is re-centred and re-shaped on
   the running estimate of the tilted mean and covariance (rotated by its Cholesky
   factor in 2-D) until that estimate agrees with the grid's own scale to a factor 2.
3. **Integrate.** A trapezoid grid of ±12 estimated standard deviations gives the
   expected sufficient statistics, entry by entry made trustworthy:

   * a side of the window on which the integrand, or its product with a sufficient
     statistic, has not decayed to ``e^-46`` of the total is pushed out (exponential
     tails, e.g. of a Gamma in log space);
   * in 1-D, a scan over ±40 standard deviations of both the incoming message and the
     tilted law looks for contributions away from the window (a second mode of weight
     1e-9 far away moves a Beta belief through its tiny ``E[log x]``) and widens the
     window over them;
   * the statistics are recomputed on every other node: since the trapezoid rule
     converges geometrically, the difference bounds the error, and the node count is
     doubled until it is below 1e-11 of each statistic's scale.

The trapezoid rule on a smooth integrand that has decayed to negligible values at both
ends of the window converges geometrically in the node spacing, which is why it is
used rather than Gauss–Hermite on the recentred law: it does not assume a Gaussian
shape, so skewed tilted laws, exponential tails and far-apart modes cost nothing
extra, and it comes with the every-other-node error estimate. For the logistic factor
over the whole range ``mu in [-20, 20]``, ``sigma^2 in [1e-3, 1e3]``,
``alpha, beta in [0.5, 500]`` the projected parameters agree with QUADPACK (and, where
QUADPACK fails, with brute force) to ~1e-11 relative.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pmkjit.families import ExponentialFamily, Gaussian
from pmkjit.links import unconstrained_output
from pmkjit.operators.oracle import OracleResult, check_messages, project_beliefs

__all__ = ["QuadratureOracle"]

_WINDOW = 12.0  # half-width of every grid, in standard deviations of the current estimate
_LOCATE_NODES = {1: 201, 2: 41}  # nodes per axis while locating and zooming
_DEFAULT_NODES = {1: 401, 2: 81}  # nodes per axis of the final grid
_WALK_GROWTH = 4.0  # widening of the grid per step while walking towards the tilted peak
_MAX_STEPS = 40  # locate + zoom iterations (walking ~100 sds takes ~4, zooming 1e-6 ~ 8)
_EDGE_LOG_WEIGHT = -46.0  # a window edge must be below e^-46 ~ 1e-20 of the peak
_MAX_EXTENSIONS = 6  # doublings of one side of the final window (up to 64 x 12 sds)
_MAX_GROWTH = {1: 16.0, 2: 2.0}  # widened windows get at most this many times more nodes per axis
_MAX_SPACING = 0.5  # coarsest final node spacing, in estimated tilted sds (trapezoid error ~e^-79 for a Gaussian)
_SCAN_SDS = 40.0  # 1-D scan for far contributions: ±40 sds of the incoming message and of the tilted law
_SCAN_NODES = 2001
_SCAN_LOG_SHARE = -40.0  # scan nodes adding more than e^-40 of an integral are important
_MAX_REFINE = {1: 6, 2: 2}  # doublings of the node count when the half-grid check fails
_RTOL = {1: 1e-10, 2: 1e-7}  # target |trapezoid - every-other-node trapezoid| / scale; the
# trapezoid's own error is then far smaller (geometric convergence: ~ the square of it)
_RTOL_FINAL = 1e-7  # accept an unconverged entry only if it is at least this close
# ... or, once the refinements are spent, this close: a kink in the integrand (a Laplace
# likelihood's |y - mu|, an asymmetric Laplace's quantile loss) makes the trapezoid converge
# only as h^2, so it stops near 1e-5 of a statistic and was refused; importance sampling
# then answered about half of a Laplace regression's entries (N = 80) with its Monte Carlo
# noise, and EP did not converge in 50 sweeps (110 s). An answer within 1e-4 is still more
# accurate than 1e5 importance samples and, being deterministic, lets EP converge.
_RTOL_KINK = 1e-4
_MAX_POINTS = 2_000_000  # grid points x batch entries held at once (per coordinate array)


class QuadratureOracle:
    """Projected tilted beliefs by adaptive trapezoidal quadrature in unconstrained space.

    Parameters
    ----------
    function : callable
        ``kind="deterministic"``: the factor is ``delta(x_out - function(x_in))`` for one
        latent input (e.g. ``scipy.special.expit``); vectorised over arrays.
        ``kind="density"``: ``function(x_out, inputs) -> log psi(x_out | inputs)``, where
        ``inputs`` is a tuple of arrays, vectorised, for at most two latent variables in
        all (the inputs and, unless ``observed`` is given, the output). ``-inf`` means zero
        density; NaN and ``+inf`` mean "cannot evaluate here" (see Notes).
    families : sequence of family classes
        Families of the variables ``(*inputs, output)``; without the output when it is
        observed.
    kind : {"deterministic", "density"}
    unconstrained_function : callable, optional
        Deterministic kind: ``u_out = unconstrained_function(x_in)``, the output in its
        family's unconstrained coordinates (for the logistic factor and a Beta output,
        ``z -> z``). It lets the output's density and sufficient statistics be computed
        without round-off where ``function`` saturates (``expit(40) == 1.0``).
    n_nodes : int, optional
        Nodes per axis of the first final grid (default 401 in 1-D, 81 in 2-D); entries
        whose integrals have not converged get more.
    observed : array_like (B,), optional
        Observed output values (density kind); the beliefs are then the inputs' only.
    covariates : array_like (B, k), optional
        Per-entry constants (a covariate, an exposure, a trial count): ``function`` then
        takes them as its last argument (``function(x_in, c)`` or ``function(x_out,
        inputs, c)``), an array ``(..., k)`` broadcast against the nodes.

    Attributes
    ----------
    n_calls : int
        Number of message tuples answered so far.
    n_coarse : int
        Of those, answers accepted at the coarser tolerance (1e-4 of a statistic): the
        integrand has a kink, and the trapezoid rule converges only algebraically there.

    Notes
    -----
    An entry is refused (``accepted=False``, NaN beliefs) rather than answered wrongly
    when the tilted law cannot be located or resolved, when the factor cannot be
    evaluated (non-finite ``function`` output, or an output that saturates to the edge of
    its support) at a node next to non-negligible mass, when the every-other-node
    error estimate stays above 1e-7 of a statistic while refinements remain and above
    1e-4 once they are spent (a kink in the integrand), or when a projection fails.
    ``OracleResult.ess`` reports the number of nodes of the final grid.

    The tilted law is assumed unimodal in 2-D (no scan there).

    Without ``unconstrained_function``, a deterministic ``function`` that saturates
    costs digits: ``logit(expit(19))`` keeps only ~8. ``scipy.special.expit`` with a
    Beta output and ``numpy.exp`` with a Gamma output are recognised and get the exact
    ``x_in -> x_in``, and :func:`pmkjit.links.half_erfc` (``pm.math.invprobit``) its
    stable logit (see :mod:`pmkjit.links`).
    """

    def __init__(self, function: Callable, families: Sequence[type[ExponentialFamily]], *,
                 kind: str = "deterministic", unconstrained_function: Callable | None = None,
                 n_nodes: int | None = None, observed=None, covariates=None):
        if kind not in ("deterministic", "density"):
            raise ValueError(f"kind must be 'deterministic' or 'density', got {kind!r}")
        self.function = function
        self.families = tuple(families)
        if unconstrained_function is None and kind == "deterministic" and len(self.families) == 2 \
                and covariates is None:
            # recognised links (expit, exp, invprobit) give the output's unconstrained
            # coordinate exactly where the link rounds to the edge of the support
            unconstrained_function = unconstrained_output(function, self.families[1].support)
        self.unconstrained_function = unconstrained_function
        self.kind = kind
        self.observed = None if observed is None else np.asarray(observed, dtype=float)
        self.covariates = None if covariates is None else np.asarray(covariates, dtype=float)
        if self.covariates is not None and self.covariates.ndim != 2:
            raise ValueError("covariates are a (B, k) array of per-entry constants")
        if self.covariates is not None and unconstrained_function is not None:
            raise ValueError("unconstrained_function takes no covariates; give function(x_in, covariates)")
        if kind == "deterministic":
            if observed is not None:
                raise ValueError("a deterministic factor has no observed output; use kind='density'")
            if len(self.families) != 2:
                raise ValueError("a deterministic factor takes one input and one output family")
            self._latent = [0]
        else:
            self._latent = list(range(len(self.families)))
        if not 1 <= len(self._latent) <= 2:
            raise ValueError(f"quadrature handles 1 or 2 latent variables, got {len(self._latent)}")
        d = len(self._latent)
        self.n_nodes = int(n_nodes) if n_nodes is not None else _DEFAULT_NODES[d]
        if self.n_nodes < 3:
            raise ValueError(f"n_nodes must be at least 3, got {self.n_nodes}")
        self.n_calls = 0
        self.n_coarse = 0

    # ------------------------------------------------------------------ public
    def __call__(self, messages: Sequence[ExponentialFamily]) -> OracleResult:
        """Project the tilted distributions of a batch of message tuples.

        Parameters
        ----------
        messages : sequence of family batches
            One batch of shape ``(B,)`` per variable, in the order of ``families``.

        Returns
        -------
        OracleResult
            ``beliefs`` one batch per variable (NaN where not accepted), ``ess`` the
            number of final nodes per entry, ``accepted``.
        """
        messages = check_messages(messages, self.families)
        B = len(messages[0])
        if self.observed is not None and self.observed.shape != (B,):
            raise ValueError(f"observed has shape {self.observed.shape}, expected ({B},) like the messages")
        if self.covariates is not None and self.covariates.shape[0] != B:
            raise ValueError(f"covariates have {self.covariates.shape[0]} rows, expected {B} like the messages")
        d = len(self._latent)
        # per variable: E T (2 columns) and, for Gaussians, the central variance (third)
        stats = np.full((len(self.families), B, 3), np.nan)
        accepted = np.zeros(B, dtype=bool)
        n_final = np.zeros(B)
        # chunks of the batch bound the memory of the (chunk, nodes, d) grids
        chunk = max(1, _MAX_POINTS // max(self.n_nodes**d, _SCAN_NODES if d == 1 else 0))
        log_target = self._log_target(messages)
        for start in range(0, B, chunk):
            idx = np.arange(start, min(B, start + chunk))
            stats[:, idx], accepted[idx], n_final[idx] = self._integrate(messages, log_target, idx)
        beliefs, accepted = project_beliefs(self.families, stats, accepted)
        self.n_calls += B
        return OracleResult(beliefs, n_final, accepted)

    # ---------------------------------------------------------------- stages
    def _integrate(self, messages, log_target, idx):
        """Expected sufficient statistics ``(n_vars, b, 2)``, success ``(b,)`` and node counts."""
        latent = [messages[i][idx] for i in self._latent]
        moments = [m.unconstrained_moments() for m in latent]
        prior_mean = np.stack([mv[0] for mv in moments], axis=-1)  # (b, d)
        prior_sd = np.sqrt(np.stack([mv[1] for mv in moments], axis=-1))
        centre = prior_mean.copy()
        L = prior_sd[:, :, None] * np.eye(len(latent))  # (b, d, d) Cholesky factor of the grid
        located = self._locate(log_target, idx, centre, L)
        return self._final(log_target, idx, centre, L, located, prior_mean, prior_sd)

    def _locate(self, log_target, idx, centre, L):
        """Walk and zoom ``centre``, ``L`` (in place) onto the tilted law; returns success ``(b,)``."""
        d = centre.shape[1]
        n = _LOCATE_NODES[d]
        z = _grid(np.full((1, d), -_WINDOW), np.full((1, d), _WINDOW), n)[0]  # (G, d)
        h = 2 * _WINDOW / (n - 1)
        located = np.zeros(idx.size, dtype=bool)
        todo = np.arange(idx.size)
        for _ in range(_MAX_STEPS):
            if todo.size == 0:
                break
            U = centre[todo, None, :] + z @ np.swapaxes(L[todo], 1, 2)
            lt, _bad = log_target(U, idx[todo])
            alive = np.isfinite(lt).any(axis=1)  # an all-zero grid gives no direction: refuse
            best = np.argmax(lt, axis=1)
            on_edge = np.any(np.abs(z[best]) > _WINDOW - 0.5 * h, axis=1) & alive
            # walk: the peak is beyond the edge, so move there and look wider
            walk = todo[on_edge]
            centre[walk] = U[on_edge, best[on_edge]]
            L[walk] *= _WALK_GROWTH
            inner = alive & ~on_edge
            sub = todo[inner]
            if sub.size:
                m_new, c_new = _moments(U[inner], lt[inner])
                Ls = L[sub]
                # tilted covariance in the current grid's coordinates: resolution and coverage
                Cz = np.linalg.solve(Ls, np.linalg.solve(Ls, c_new).swapaxes(-1, -2))
                ev = np.linalg.eigvalsh(0.5 * (Cz + Cz.swapaxes(-1, -2)))
                # the grid already matched the tilted law to within a factor 2 in scale (at
                # least ~4 nodes per sd in 1-D, ~1.7 in 2-D, and ±6 sds): rough, but the
                # final grid is a fresh ±12 sds of the new estimate
                ok = (ev[:, 0] >= 0.25) & (ev[:, -1] <= 4.0)
                # the floor (half a node spacing) keeps L non-singular when one node holds all the mass
                floor = (0.5 * h) ** 2 * (Ls @ Ls.swapaxes(-1, -2))
                centre[sub] = m_new
                L[sub] = np.linalg.cholesky(c_new + floor)
                located[sub[ok]] = True
                inner[np.flatnonzero(inner)[ok]] = False  # done
            todo = todo[on_edge | inner]
        return located

    def _final(self, log_target, idx, centre, L, located, prior_mean, prior_sd):
        """Trapezoid integration on ±12 estimated sds, widened and refined until it has converged.

        Every entry starts with the window ``[lo, hi]`` = ±12 in the coordinates
        ``z = L^{-1}(u - centre)``. Then, entry by entry:

        * a side whose edge still carries weight is doubled;
        * the statistics on the grid are compared with those on every other node (the
          trapezoid rule converges geometrically, so the difference bounds the error);
          too large a difference doubles the nodes: a statistic can have features far
          narrower than the tilted law (``E[log x]`` of a Beta belief near 1 comes from
          a thin region in the tail);
        * in 1-D a wide scan looks for contributions outside the window (a second mode,
          or the region that makes a tiny statistic) and widens the window over them.
        """
        b, d = centre.shape
        n_vars = len(self.families)
        stats = np.full((n_vars, b, 3), np.nan)
        done = np.zeros(b, dtype=bool)
        fine = np.zeros(b, dtype=bool)
        n_final = np.zeros(b)
        lo = np.full((b, d), -_WINDOW)
        hi = np.full((b, d), _WINDOW)
        refine = np.zeros(b, dtype=int)
        n_ext = np.zeros(b, dtype=int)
        scanned = np.zeros(b, dtype=bool)
        done[~located] = True
        for _ in range(_MAX_EXTENSIONS + _MAX_REFINE[d] + 4):
            todo = np.flatnonzero(~done)
            if todo.size == 0:
                break
            width = hi[todo] - lo[todo]  # (t, d)
            # keep the node spacing of the ±12 window as it widens (up to a cap), then refine;
            # per axis, so that a tail widening one axis does not multiply the other's nodes
            base = np.ceil((self.n_nodes - 1) / 2 * np.minimum(width / (2 * _WINDOW), _MAX_GROWTH[d])).astype(int)
            n_entry = 2 * base * 2 ** refine[todo, None] + 1  # odd: every other node is a grid too
            shapes, which = np.unique(n_entry, axis=0, return_inverse=True)
            for j, ns in enumerate(shapes):
                grp = todo[which.ravel() == j]
                ns = tuple(int(v) for v in ns)
                per = max(1, _MAX_POINTS // int(np.prod(ns)))
                for s in range(0, grp.size, per):
                    sub = grp[s : s + per]
                    self._final_step(log_target, idx, sub, ns, centre, L, lo, hi, refine, n_ext, scanned,
                                     prior_mean, prior_sd, stats, done, fine, n_final)
        fine &= done & np.isfinite(stats[..., :2]).all(axis=(0, 2))
        return stats, fine, n_final

    def _final_step(self, log_target, idx, sub, ns, centre, L, lo, hi, refine, n_ext, scanned,
                    prior_mean, prior_sd, stats, done, fine, n_final):
        """One trapezoid evaluation of entries ``sub`` on ``ns[j]`` nodes along axis ``j``; updates the state in place."""
        d = centre.shape[1]
        k = sub.size
        width = hi[sub] - lo[sub]  # (k, d)
        z = _grid(lo[sub], hi[sub], ns)  # (k, G, d)
        U = centre[sub, None, :] + z @ np.swapaxes(L[sub], 1, 2)
        lt, bad = log_target(U, idx[sub])
        peak = np.max(lt, axis=1, keepdims=True)
        alive = np.isfinite(peak[:, 0])
        with np.errstate(invalid="ignore", under="ignore"):
            rel = np.where(alive[:, None], lt - peak, -np.inf)  # log weight relative to the peak
            w = np.exp(rel)
        grid_shape = (k,) + ns
        heavy = rel.reshape(grid_shape) > _EDGE_LOG_WEIGHT
        # unevaluable nodes next to real mass make the answer unreliable
        near_bad = _dilate(bad.reshape(grid_shape))
        spacing_ok = np.all(width / (np.asarray(ns) - 1) <= _MAX_SPACING, axis=1)
        reliable = alive & spacing_ok & ~np.any((near_bad & heavy).reshape(k, -1), axis=1)
        push_lo = np.stack([np.take(heavy, 0, axis=1 + j).reshape(k, -1).any(1) for j in range(d)], 1)
        push_hi = np.stack([np.take(heavy, -1, axis=1 + j).reshape(k, -1).any(1) for j in range(d)], 1)
        pushed = (push_lo | push_hi).any(axis=1)

        refuse = ~reliable | (pushed & (n_ext[sub] >= _MAX_EXTENSIONS))
        widen = reliable & pushed & ~refuse
        grow = sub[widen]
        lo[grow] = np.where(push_lo[widen], 2 * lo[grow], lo[grow])
        hi[grow] = np.where(push_hi[widen], 2 * hi[grow], hi[grow])
        n_ext[grow] += 1
        done[sub[refuse]] = True

        ready = reliable & ~pushed
        if not ready.any():
            return
        r = np.flatnonzero(ready)
        sel = sub[r]
        w = w[r]
        half = (slice(None),) + (slice(None, None, 2),) * d  # every other node along each axis
        w_half = w.reshape((r.size,) + ns)[half].reshape(r.size, -1)
        mass, mass_half = np.sum(w, axis=1), np.sum(w_half, axis=1)
        T_all = [np.where(w[..., None] > 0, T, 0.0) for T in self._statistics(U[r], idx[sel])]  # zero weight: maybe off the support
        mean = np.stack([_weighted_sum(w, T) for T in T_all]) / mass[:, None]  # (n_vars, r, 2)
        mean_half = np.stack([
            _weighted_sum(w_half, T.reshape((r.size,) + ns + (2,))[half].reshape(r.size, -1, 2))
            for T in T_all]) / mass_half[:, None]
        # Scale of each statistic: |E T| + E|T - E T| / 1000. The mean absolute deviation is
        # at most 2 |E T| for a statistic of one sign (Beta's log x, far below 0 or tiny), so
        # those are held to relative accuracy -- a Beta projection needs it -- while a mean
        # that is zero by symmetry is measured on its spread. (The sd would not do: it can
        # exceed a tiny E[log x] by dozens of orders of magnitude.)
        mad = np.stack([_weighted_sum(w, np.abs(T - m[:, None, :])) for T, m in zip(T_all, mean)])
        scale = np.abs(mean) + 1e-3 * mad / mass[:, None]  # (n_vars, r, 2)

        # 1. The window must also hold the statistics' mass: w |T| at an edge, relative to
        # the scale, must be negligible too (T can grow fast where the weight is small).
        # Only the edge nodes are read, so only they are computed (a 2-D grid's 4n of n^2 nodes:
        # the whole grid's shares took a quarter of a 2-D integral's time).
        edge = _edge_nodes(ns)
        # a statistic with no spread and a zero mean (scale 0) at an edge of no weight is 0/0:
        # NaN, which is not heavy (robustness round 46: a pm.Potential("jeffreys", -log(tau))
        # printed "invalid value encountered in divide" seven times)
        with np.errstate(divide="ignore", under="ignore", invalid="ignore"):
            share = np.zeros((r.size, w.shape[1]))
            share[:, edge] = np.max(np.stack([
                w[:, edge, None] * np.abs(T[:, edge]) / (mass[:, None, None] * scale[v][:, None, :])
                for v, T in enumerate(T_all)]), axis=(0, 3))  # (r, G), zero inside the edges
        heavy_T = share.reshape((r.size,) + ns) > np.exp(_EDGE_LOG_WEIGHT)
        t_lo = np.stack([np.take(heavy_T, 0, axis=1 + j).reshape(r.size, -1).any(1) for j in range(d)], 1)
        t_hi = np.stack([np.take(heavy_T, -1, axis=1 + j).reshape(r.size, -1).any(1) for j in range(d)], 1)
        t_push = (t_lo | t_hi).any(axis=1) & (n_ext[sel] < _MAX_EXTENSIONS)
        g = sel[t_push]
        lo[g] = np.where(t_lo[t_push], 2 * lo[g], lo[g])
        hi[g] = np.where(t_hi[t_push], 2 * hi[g], hi[g])
        n_ext[g] += 1
        pending = t_push.copy()

        # 2. In 1-D, once per entry: a scan for contributions away from the window.
        if d == 1:
            check = ~pending & ~scanned[sel]
            if check.any():
                c = np.flatnonzero(check)
                scanned[sel[c]] = True
                h_u = width[r[c], 0] / (ns[0] - 1) * L[sel[c], 0, 0]
                log_norm = peak[r[c], 0] + np.log(mass[c] * h_u)  # log of the window's integral
                status, new_lo, new_hi = self._scan_1d(log_target, idx, sel[c], centre, L, lo, hi, prior_mean,
                                                       prior_sd, log_norm, scale[:, c])
                more = c[status > 0]
                lo[sel[more], 0] = np.minimum(lo[sel[more], 0], new_lo[status > 0])
                hi[sel[more], 0] = np.maximum(hi[sel[more], 0], new_hi[status > 0])
                pending[more] = True
                lost = sel[c[status < 0]]  # important contributions reach the edge of the scan
                done[lost] = True
                pending[c[status < 0]] = True

        # 3. Convergence: the trapezoid on every other node must agree.
        err = np.abs(mean - mean_half)
        converged = np.all(err <= _RTOL[d] * scale, axis=(0, 2))
        acceptable = np.all(err <= _RTOL_FINAL * scale, axis=(0, 2))
        again = ~pending & ~converged & (refine[sel] < _MAX_REFINE[d])
        refine[sel[again]] += 1
        settle = ~pending & ~again
        fin = sel[settle]
        stats[:, fin, :2] = mean[:, settle]
        for v, fam in enumerate(self.families):
            if issubclass(fam, Gaussian):
                x = T_all[v][settle, :, 0]
                stats[v, fin, 2] = np.einsum("bg,bg->b", w[settle], (x - mean[v, settle, 0][:, None]) ** 2) / mass[settle]
        coarse = ~acceptable & np.all(err <= _RTOL_KINK * scale, axis=(0, 2))
        fine[fin] = (acceptable | coarse)[settle]
        self.n_coarse += int(coarse[settle].sum())
        n_final[fin] = w.shape[1]
        done[fin] = True

    def _scan_1d(self, log_target, idx, sel, centre, L, lo, hi, prior_mean, prior_sd, log_norm, scale):
        """Look for non-negligible contributions outside the final 1-D windows of entries ``sel``.

        The scan covers ±40 sds of both the incoming message and the tilted estimate,
        with 2001 nodes. A node is important if it would add more than e^-40 of the
        window's integral to the normaliser, or of the scale ``|E T| + E|T - E T|/1000`` to some
        expected statistic: a far second mode of weight 1e-9 changes a Beta projection
        through ``E[log x]`` while being invisible in the mass.

        Returns
        -------
        status : ndarray of int (s,)
            0: nothing outside; 1: widen to ``[new_lo, new_hi]`` (grid coordinates);
            -1: important contributions reach the edge of the scan (refuse).
        new_lo, new_hi : ndarray (s,)
        """
        c, ell = centre[sel, 0], L[sel, 0, 0]
        a = np.minimum(prior_mean[sel, 0] - _SCAN_SDS * prior_sd[sel, 0], c - _SCAN_SDS * ell)
        bnd = np.maximum(prior_mean[sel, 0] + _SCAN_SDS * prior_sd[sel, 0], c + _SCAN_SDS * ell)
        t = np.linspace(0.0, 1.0, _SCAN_NODES)
        u = a[:, None] + (bnd - a)[:, None] * t  # (s, N)
        h_s = (bnd - a) / (_SCAN_NODES - 1)
        lt, _bad = log_target(u[..., None], idx[sel])
        inside = (u >= (c + ell * lo[sel, 0])[:, None]) & (u <= (c + ell * hi[sel, 0])[:, None])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            base = lt + np.log(h_s)[:, None] - log_norm[:, None]  # log share of the window's integral
            important = base > _SCAN_LOG_SHARE
            for v, T in enumerate(self._statistics(u[..., None], idx[sel])):
                contrib = base[..., None] + np.log(np.abs(T)) - np.log(scale[v][:, None, :])
                important |= np.any(np.where(np.isnan(contrib), -np.inf, contrib) > _SCAN_LOG_SHARE, axis=-1)
        important &= ~inside
        status = np.zeros(sel.size, dtype=int)
        any_imp = important.any(axis=1)
        first = np.argmax(important, axis=1)
        last = _SCAN_NODES - 1 - np.argmax(important[:, ::-1], axis=1)
        status[any_imp] = 1
        status[any_imp & ((first == 0) | (last == _SCAN_NODES - 1))] = -1
        pad = 4 * h_s  # a few scan nodes beyond the outermost important one
        rows = np.arange(sel.size)
        new_lo = (u[rows, first] - pad - c) / ell
        new_hi = (u[rows, last] + pad - c) / ell
        return status, new_lo, new_hi

    # --------------------------------------------------------------- helpers
    def _statistics(self, U: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
        """Sufficient statistics ``(b, G, 2)`` of every variable at unconstrained nodes ``U``
        of the batch entries ``rows``."""
        out = []
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            for j, i in enumerate(self._latent):
                out.append(self.families[i].sufficient_statistics_unconstrained(U[..., j]))
            if self.kind == "deterministic":
                out.append(self.families[1].sufficient_statistics_unconstrained(
                    self._output_unconstrained(U[..., 0], rows)))
        return out

    def _output_unconstrained(self, u_in: np.ndarray, rows: np.ndarray) -> np.ndarray:
        x_in = self.families[0].from_unconstrained(u_in)
        if self.unconstrained_function is not None:
            return np.asarray(self.unconstrained_function(x_in), dtype=float)
        extra = () if self.covariates is None else (self._covariates_at(rows, u_in.shape),)
        return self.families[1].to_unconstrained(np.asarray(self.function(x_in, *extra), dtype=float))

    def _covariates_at(self, rows: np.ndarray, shape: tuple) -> np.ndarray:
        """The entries' covariates broadcast against their nodes: ``shape + (k,)``."""
        return np.broadcast_to(self.covariates[rows, None, :], shape + self.covariates.shape[1:])

    def _log_target(self, messages):
        """``log_target(U, idx) -> (log density (b, G), unevaluable mask (b, G))`` of the tilted law in ``u``."""
        fams = [self.families[i] for i in self._latent]
        latent = [messages[i] for i in self._latent]

        def log_target(U: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            total = np.zeros(U.shape[:2])
            bad = np.zeros(U.shape[:2], dtype=bool)
            xs = []
            with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
                for j, (fam, m) in enumerate(zip(fams, latent)):
                    u = U[..., j]
                    total = total + m[idx].logpdf_unconstrained(u)  # density of u: Jacobian included
                    xs.append(fam.from_unconstrained(u))
                if self.kind == "deterministic":
                    u_out = self._output_unconstrained(U[..., 0], idx)
                    bad |= ~np.isfinite(u_out)  # the output saturated at the edge of its support
                    factor = messages[1][idx][:, None].logpdf_at_unconstrained(u_out)
                else:
                    # per-entry constants ride along like the observations: (b, G, k)
                    extra = () if self.covariates is None else (self._covariates_at(idx, xs[0].shape),)
                    if self.observed is not None:
                        obs = np.broadcast_to(self.observed[idx, None], xs[0].shape)
                        factor = np.asarray(self.function(obs, tuple(xs), *extra), dtype=float)
                    else:
                        factor = np.asarray(self.function(xs[-1], tuple(xs[:-1]), *extra), dtype=float)
                bad |= np.isnan(factor) | (factor == np.inf)
                total = total + factor
            bad |= np.isnan(total) | (total == np.inf)
            return np.where(bad, -np.inf, total), bad

        return log_target



def _weighted_sum(w: np.ndarray, T: np.ndarray) -> np.ndarray:
    """``sum_g w[b, g] T[b, g, :]``: a batched matrix product (3-4x faster than einsum here)."""
    return np.matmul(w[:, None, :], T)[:, 0, :]

def _grid(lo: np.ndarray, hi: np.ndarray, n: int | tuple[int, ...]) -> np.ndarray:
    """Tensor grids ``(b, prod(n), d)`` with ``n[j]`` uniform nodes along axis ``j`` on ``[lo, hi]`` (each ``(b, d)``).

    An int ``n`` means ``n`` nodes on every axis.
    """
    b, d = lo.shape
    ns = (int(n),) * d if np.ndim(n) == 0 else tuple(int(v) for v in n)
    axes = [lo[:, j, None] + (hi - lo)[:, j, None] * np.linspace(0.0, 1.0, ns[j]) for j in range(d)]  # (b, n_j)
    if d == 1:
        return axes[0][:, :, None]
    a0 = np.broadcast_to(axes[0][:, :, None], (b,) + ns)
    a1 = np.broadcast_to(axes[1][:, None, :], (b,) + ns)
    return np.stack([a0, a1], axis=-1).reshape(b, ns[0] * ns[1], 2)


def _edge_nodes(ns: tuple[int, ...]) -> np.ndarray:
    """Flat indices of the nodes on the edges of a tensor grid of ``ns[j]`` nodes along axis ``j``."""
    inner = np.zeros(ns, dtype=bool)
    inner[(slice(1, -1),) * len(ns)] = True
    return np.flatnonzero(~inner.ravel())


def _dilate(mask: np.ndarray) -> np.ndarray:
    """``mask`` (b, n[, n]) grown by one node along every grid axis."""
    out = mask.copy()
    for ax in range(1, mask.ndim):
        lead = [slice(None)] * mask.ndim
        trail = [slice(None)] * mask.ndim
        lead[ax], trail[ax] = slice(1, None), slice(None, -1)
        out[tuple(lead)] |= mask[tuple(trail)]
        out[tuple(trail)] |= mask[tuple(lead)]
    return out


def _moments(U: np.ndarray, logw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted mean ``(b, d)`` and covariance ``(b, d, d)`` of points ``U`` (b, G, d)."""
    with np.errstate(invalid="ignore", under="ignore"):
        lw = logw - np.max(logw, axis=1, keepdims=True)
        w = np.exp(lw)
    w /= np.sum(w, axis=1, keepdims=True)
    mean = _weighted_sum(w, U)
    D = U - mean[:, None, :]
    return mean, np.einsum("bg,bgi,bgj->bij", w, D, D)
