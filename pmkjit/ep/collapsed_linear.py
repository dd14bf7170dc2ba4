"""One site for a Normal likelihood of shared scalars whose Gaussian ones integrate out.

:class:`~pmkjit.ep.collapsed.CollapsedLikelihood` gives a likelihood whose every instance
reads the same few scalars one site, integrating their law on a grid of up to three
coordinates. A curve fitted by least squares often reads more: ``y ~ Normal(c + A *
exp(-k * t), s)`` reads four, ``y ~ Normal(mu + A * sin(w * t + phi), s)`` five. Instance by
instance, EP crawled on the first and stopped 0.7 posterior sd off (robustness round 33),
and gave the second's ``w`` half of NUTS's sd. But the mean is affine in the Gaussian
scalars ``z`` (``c``, ``A``; :mod:`pmkjit.graph.linear_normal`) given the others ``theta``
(``k``, ``s``), so with ``mu_n = mu0_n(theta) + g_n(theta) . (z - m)`` around the cavity mean
``m`` of ``z`` (their joint cavity ``N(m, V)``: EP's joint marginal of them less this
factor's sites), the whole likelihood integrates over ``z`` in closed form:

    log integral prod_n N(y_n; mu_n, sigma_n^2) N(z; m, V) dz
        = -1/2 [sum_n log(2 pi sigma_n^2) + log det V + log det P + r' D^-1 r - b' P^-1 b],
    P = V^-1 + G' D^-1 G,  b = G' D^-1 r,  r = y - mu0,  D = diag(sigma^2),
    z | theta ~ N(m + P^-1 b, P^-1)

(the Woodbury identity: ``k x k`` systems, ``k`` the number of Gaussian coordinates). What
is left is the law of ``theta`` alone, one to four coordinates, integrated on the rotated
grid of :func:`~pmkjit.ep.collapsed.rotated_grid`; the moments of ``z`` are those of its
conditional Gaussians averaged over the same nodes, as nested Laplace averages a
regression's coefficients. ``mu0`` and ``G`` come from the likelihood's own mean and its
compiled gradient at ``m`` (or, where the mean has no symbolic gradient, from its mean at
``m + sqrt(V_jj) e_j``): exact for an affine mean. Each Gaussian coordinate's site is its
tilted marginal less its cavity's marginal (EP's sites are one per coordinate). Joint
draws are exact the same way: ``theta`` from the grid, then ``z`` from its conditional
Gaussian.

A group's effect read by each observation as its own group's (``A[g] * exp(-k * t)``, one
linear slot whose rows each pick one coordinate) is one coordinate per group: an
observation's slope is in its group's coordinate alone, and each group's site is shared over
its observations.
Its draws are EP's (the rest of the draws could not be kept coherent with a group's). A
regression's predictor among the Gaussian inputs (``a + b * t + f(t)``: a trend beside an
HSGP) has its reference predictors as coordinates, and one joint site on them (the tilted
law's joint marginal less the cavity's), shared out to the instances as
:func:`~pmkjit.ep.collapsed._to_instances` does; its draws are the law's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import linalg

from pmkjit.ep.collapsed import (
    _DRAW_NODES,
    _FACE_ROOM,
    _MAX_DRAW_EVALUATIONS,
    _MAX_SITE_EVALUATIONS,
    _MIN_DRAW_NODES,
    _SITE_NODES,
    CollapsedLikelihood,
    _checked_moments,
    _log_cavities,
    _marginal_frames,
    _on_reference,
    _to_instances,
    rotated_grid,
)
from pmkjit.families import ExponentialFamily, Gaussian
from pmkjit.graph.factor_graph import BlackBoxFactor
from pmkjit.operators.oracle import project_beliefs

__all__ = ["CollapsedLinearNormal"]

_CORRELATED_CAVITY = 0.2  # largest correlation of the Gaussian scalars' joint cavity that goes unmentioned
_CORRELATED_LAW = 0.5  # ... and of their tilted law


class CollapsedLinearNormal(CollapsedLikelihood):
    """The tilted moments of a whole Normal likelihood of shared scalars, its Gaussian
    scalars integrated out in closed form (see the module docstring).

    Parameters
    ----------
    factor : BlackBoxFactor
        A likelihood for which :func:`~pmkjit.ep.collapsed.integrates_gaussian_inputs` holds.
    per_instance : callable
        The factor's ordinary method, for a sweep in which the collapsed cavity is improper
        or the integral refused.
    """

    _integrates_gaussian_inputs = True

    def __init__(self, factor: BlackBoxFactor, per_instance):
        super().__init__(factor, per_instance)
        spec = factor.linear_normal
        place = {i: k for k, i in enumerate(factor.latent_inputs)}
        self._gaussian = [place[i] for i in spec.linear]  # latent positions integrated in closed form
        self._rest = [place[i] for i in spec.rest]  # latent positions on the grid (one coordinate each)
        self._params = spec.params
        # [mu, sigma, slope per Gaussian input] in one evaluation, in the order of spec.linear
        # (self._gaussian's), or None: a step per Gaussian input instead
        self._gradients = spec.gradients
        # the coordinates of the law each latent position reads: one, or a group effect's one
        # per group (its reference instances'), each instance reading its group's
        first = np.cumsum([0] + self._dims[:-1])
        self._coordinates = {k: list(range(first[k], first[k] + self._dims[k])) for k in range(len(self._dims))}
        self._z = [c for k in self._gaussian for c in self._coordinates[k]]  # the Gaussian coordinates, in order
        # a group's effect (each instance reads one coordinate: a site per group) or a
        # regression's predictor (a + b * x: one joint site on its reference predictors)
        self._groups = self._block is not None and bool(np.all(np.count_nonzero(self._basis[1], axis=1) == 1))
        self._member = np.argmax(self._basis[1] != 0, axis=1) if self._groups else None
        block = [] if self._block is None else [c for c in self._z if c in self._coordinates[self._block]]
        self._block_z = [self._z.index(c) for c in block]  # the block's places among the Gaussian coordinates
        # one evaluation of the mean and sd, and one of the mean per Gaussian scalar (the
        # gradient's one evaluation computes as many outputs)
        self._node_cost = self._cost * (len(self._gaussian) + 1)
        # the largest correlation of two Gaussian scalars in their joint cavity and in their
        # tilted law, at the last integral (:attr:`drops_correlation`)
        self.cavity_correlation = 0.0
        self.tilted_correlation = 0.0

    @property
    def _kind(self) -> str:
        return "collapsed grid, Gaussian inputs in closed form"

    # ------------------------------------------------------------------ EP update
    def sites(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray],
              state=None) -> list[np.ndarray] | None:
        """New per-instance sites ``[(N, 2) per latent]`` (see :meth:`CollapsedLikelihood.sites`);
        ``state``, the EP state, gives the Gaussian scalars their joint cavity."""
        return self._counted(self._sites_in(marginals, sites, state))

    def _all_cavities(self, marginals, sites, state) -> tuple | None:
        """``(cavities, ref, (m, V))``: each latent's own cavity and reference instance, and the
        Gaussian coordinates' joint cavity; None where one is improper."""
        found = self._cavities(marginals, sites)
        cavity = None if found is None else self._gaussian_cavity(found[0], sites, state)
        return None if cavity is None else (*found, cavity)

    def _sites_in(self, marginals, sites, state):
        found = self._all_cavities(marginals, sites, state)
        if found is None:
            return None
        cavities, ref, cavity = found
        law = self._law(cavities, cavity, marginals, ref, _SITE_NODES[len(self._rest)], _MAX_SITE_EVALUATIONS)
        if law is None:
            return None
        rest, X, w, Z, spacing, _, shift, cond = law
        checked = _checked_moments(np.concatenate([X, shift], axis=1), w, Z, spacing, cond)
        if checked is None:
            return None
        mean, cov = checked
        r = len(self._rest)
        stats = np.full((r, 1, 3), np.nan)
        for j, k in enumerate(self._rest):
            stats[j, 0, :2] = w @ type(cavities[k]).sufficient_statistics_unconstrained(X[:, j])
            stats[j, 0, 2] = cov[j, j]
        beliefs, accepted = project_beliefs([type(c) for c in rest], stats, np.ones(1, bool))
        if not bool(np.asarray(accepted)[0]):
            return None
        m, V = cavity
        # (a regression's reference predictors are correlated a priori, and their joint site
        # carries it: only pairs with another coordinate count)
        self.cavity_correlation = _largest_correlation(V, self._block_z)
        self.tilted_correlation = _largest_correlation(cov[r:, r:], self._block_z)
        # each Gaussian coordinate's site: its tilted marginal less its joint cavity's marginal
        with np.errstate(all="ignore"):
            z_sites = (np.asarray(Gaussian(m + mean[r:], np.diag(cov)[r:]).natural, dtype=float)
                       - np.asarray(Gaussian(m, np.diag(V)).natural, dtype=float))
        out, j = [], 0
        for k, cav in enumerate(cavities):
            if k in self._rest:
                b = beliefs[self._rest.index(k)]
                delta = (np.asarray(b.natural, dtype=float) - np.asarray(cav.natural, dtype=float))[0]
            else:
                delta = z_sites[j:j + self._dims[k]]
                j += self._dims[k]
            if not np.all(np.isfinite(delta)):
                return None
            if k == self._block and self._groups:
                out.append(self._group_sites(delta))
            elif k == self._block:
                site = self._predictor_site(m, V, m + mean[r:], cov[r:, r:])
                if site is None:
                    return None
                out.append(site)
            elif self._linear[k] is None:
                out.append(np.broadcast_to(delta / self.factor.size, (self.factor.size, 2)).copy())
            else:
                # shares of the site in eta_r proportional to s_n^2, each written on its eta_n
                _, sc, d = self._linear[k]
                delta = delta.reshape(-1)
                out.append(_to_instances(delta[:1], delta[1:].reshape(1, 1), sc[:, None], d, self._splits[k]))
        self.n_integrals += 1
        return out

    def _group_sites(self, delta: np.ndarray) -> np.ndarray:
        """A site per group, ``delta`` ``(groups, 2)`` (natural parameters on each group's
        reference predictor), as the instances' sites ``(N, 2)`` on their own predictors
        ``eta_n = C_n eta_R[j] + d_n``: each group's shares in proportion to ``C_n^2``."""
        _, C, d = self._basis
        n = np.arange(C.shape[0])
        scale = C[n, self._member]
        total = np.bincount(self._member, weights=scale**2, minlength=C.shape[1])
        q = delta[self._member, 1] / total[self._member]
        return np.stack([scale * delta[self._member, 0] / total[self._member] - 2.0 * q * d, q], axis=1)

    def _predictor_site(self, m, V, mean, cov) -> np.ndarray | None:
        """The regression predictor's joint site on its reference predictors (the tilted law's
        joint marginal of them less the cavity's, natural parameters ``g . e + e^T Q e``), as
        the instances' sites on their own predictors (:func:`~pmkjit.ep.collapsed._to_instances`);
        ``(m, V)`` the Gaussian coordinates' joint cavity, ``(mean, cov)`` their tilted law."""
        b = np.asarray(self._block_z)
        try:
            P_t = linalg.cho_solve(linalg.cho_factor(cov[np.ix_(b, b)], lower=True), np.eye(b.size))
            P_c = linalg.cho_solve(linalg.cho_factor(V[np.ix_(b, b)], lower=True), np.eye(b.size))
        except np.linalg.LinAlgError:
            return None
        Q, g = -0.5 * (P_t - P_c), P_t @ mean[b] - P_c @ m[b]
        _, C, d = self._basis
        out = _to_instances(g, Q, C, d, self._splits[self._block])
        return out if np.all(np.isfinite(out)) else None

    @property
    def drops_correlation(self) -> bool:
        """Whether another factor correlates the Gaussian scalars and this likelihood does too,
        strongly: one site per scalar cannot carry the likelihood's correlation, and EP's
        marginals are no longer its law's projections (a decay with a trend, ``a + b exp(-k t)
        + c t``, whose entry at t = 0 reads ``a + b`` alone: 0.14 NUTS sd off, ``a``'s sd 0.77
        of NUTS's; robustness round 34)."""
        return self.cavity_correlation > _CORRELATED_CAVITY and self.tilted_correlation > _CORRELATED_LAW

    def _gaussian_cavity(self, cavities, sites, state) -> tuple[np.ndarray, np.ndarray] | None:
        """Mean ``(k,)`` and covariance ``(k, k)`` of the Gaussian scalars' joint cavity (each at
        its reference instance): EP's joint marginal of them less this factor's sites on them.
        Another factor may correlate them (a curve's entry at t = 0 reads ``a + b`` alone, a
        factor of its own): with each scalar's own cavity alone, a decay with a trend, ``a + b
        exp(-k t) + c t``, stopped 0.32 NUTS sd off with ``a``'s sd 0.43 of NUTS's (robustness
        round 34). Without ``state``, the scalars' own cavities; None where the cavity is improper."""
        if state is None:
            if self._block is not None:
                return None
            m = np.array([float(np.asarray(cavities[k].mean())[0]) for k in self._gaussian])
            v = np.array([float(np.asarray(cavities[k].var())[0]) for k in self._gaussian])
            return m, np.diag(v)
        f = self.factor
        rows, offsets, g, Q = [], [], [], []
        for k in self._gaussian:
            slot = f.inputs[f.latent_inputs[k]]
            if k == self._block:
                R, C, d = self._basis
            else:
                r, sc, d = self._linear[k]
                R, C = np.array([r]), sc[:, None]
            rows.append(np.asarray(slot.A, dtype=float).reshape(f.size, -1)[R])
            offsets.append(np.broadcast_to(np.asarray(slot.c, dtype=float), (f.size,))[R])
            gk, Qk = _on_reference(np.asarray(sites[k], dtype=float), C, d)
            g.append(gk)
            Q.append(Qk)
        A = np.concatenate(rows)
        mean_q = A @ state.mu + np.concatenate(offsets)
        Z = linalg.solve_triangular(state.chol, A.T, lower=True, check_finite=False)
        try:
            P_q = linalg.cho_solve(linalg.cho_factor(Z.T @ Z, lower=True), np.eye(A.shape[0]))
            P = P_q + 2.0 * linalg.block_diag(*Q)  # (Q is minus half the sites' precision)
            L = np.linalg.cholesky(P)
        except np.linalg.LinAlgError:
            return None
        V = linalg.cho_solve((L, True), np.eye(A.shape[0]))
        m = V @ (P_q @ mean_q - np.concatenate(g))
        return (m, V) if np.all(np.isfinite(m)) and np.all(np.isfinite(V)) else None

    def _law(self, cavities, cavity, marginals, ref, nodes: tuple[int, int], evaluations: float,
             priors: Sequence | None = None) -> tuple | None:
        """The law of the other scalars on the rotated grid, ``(rest, X, w, Z, spacing, frame,
        shift, cond)``: their cavities, the nodes ``X = centre + Z L'`` ``(G, r)`` in
        unconstrained coordinates and their weights ``w``, the nodes ``Z`` in the grid's
        ``frame`` ``(centre, L)``, ``spacing`` apart, and at each node the
        Gaussian scalars' conditional shift from their cavity mean ``(G, k)`` and conditional
        covariance ``(G, k, k)``; None where no grid contains it. ``priors``: per other scalar,
        None or an exact prior density in place of its site (:meth:`joint_draws`)."""
        rest = [cavities[k] for k in self._rest]
        m, V = cavity
        r = len(rest)
        last: dict = {}  # the last grid's nodes and their conditional Gaussians

        def log_law(U):
            with np.errstate(all="ignore"):
                us = list(U.T)
                log_psi, last["shift"], last["cond"] = self._integrated(
                    [type(c).from_unconstrained(u) for c, u in zip(rest, us)], m, V)
                total = _log_cavities(rest, us, priors) + log_psi
            last["U"] = U
            total = np.where(np.isnan(total) | (total == np.inf), -np.inf, total)
            return total if np.isfinite(total.max()) else None

        most, least = nodes
        n = max(least, min(most, int((evaluations / self._node_cost) ** (1.0 / r))))
        centre, var = _marginal_frames([marginals[k] for k in self._rest], [ref[k] for k in self._rest])
        found = rotated_grid(log_law, r, centre, var, n, self._node_cost,
                             _FACE_ROOM * max(evaluations, n**r * self._node_cost))
        if found is None:
            return None
        Z, w, spacing, (c, L) = found
        X = c + Z @ L.T
        if np.array_equal(last["U"], X):  # the grid returned is the one last evaluated
            shift, cond = last["shift"], last["cond"]
        else:
            with np.errstate(all="ignore"):
                _, shift, cond = self._integrated(
                    [type(cav).from_unconstrained(X[:, j]) for j, cav in enumerate(rest)], m, V)
        used = w > 0
        if not (np.all(np.isfinite(shift[used])) and np.all(np.isfinite(cond[used]))):
            return None
        shift, cond = np.where(used[:, None], shift, 0.0), np.where(used[:, None, None], cond, 0.0)
        return rest, X, w, Z, spacing, (c, L), shift, cond

    def _integrated(self, xs: Sequence[np.ndarray], m: np.ndarray, V: np.ndarray) -> tuple:
        """At nodes ``xs`` (the other scalars' values, ``(G,)`` each): the likelihood's log
        integral over the Gaussian scalars ``(G,)`` (their cavity ``N(m, V)`` included), and
        their conditional shift from ``m`` ``(G, k)`` and covariance ``(G, k, k)``."""
        G, k = xs[0].size, m.size
        sd = np.sqrt(np.diag(V))
        V_inv = linalg.cho_solve(linalg.cho_factor(V, lower=True), np.eye(k))
        log_det_v = np.linalg.slogdet(V)[1]
        A = np.zeros((G, k, k))  # G' D^-1 G
        b = np.zeros((G, k))  # G' D^-1 r
        q = np.zeros(G)  # r' D^-1 r + sum log(2 pi sigma^2)
        flat = [None] * (len(xs) + k)  # the law's coordinates
        for j, pos in enumerate(self._rest):
            flat[self._coordinates[pos][0]] = np.asarray(xs[j], dtype=float).ravel()
        for j, c in enumerate(self._z):
            flat[c] = np.full(G, m[j])
        for n in self._chunks(G):
            mu0, sigma, g = self._slopes(flat, n, sd, k)
            c = self._count[n]
            prec = c / sigma**2
            r = self._y[n][None, :] - mu0
            weighted = g * prec[..., None]
            A += np.matmul(weighted.transpose(0, 2, 1), g)  # batched BLAS, not einsum's loop
            b += np.einsum("gnj,gn->gj", weighted, r)
            q += (prec * r**2 + c * np.log(2 * np.pi * sigma**2)).sum(axis=1)
        ok = np.isfinite(q) & np.isfinite(A).all(axis=(1, 2)) & np.isfinite(b).all(axis=1)
        P = np.where(ok[:, None, None], A, 0.0) + V_inv
        L = np.linalg.cholesky(P)
        shift = np.linalg.solve(P, np.where(ok[:, None], b, 0.0)[..., None])[..., 0]
        eye = np.broadcast_to(np.eye(k), P.shape)
        cond = np.linalg.solve(P, eye)
        log_det_p = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        log_psi = -0.5 * (q + log_det_v + log_det_p - np.einsum("gj,gj->g", b, shift))
        return np.where(ok, log_psi, -np.inf), shift, cond

    def _slopes(self, flat: list, n: slice, sd: np.ndarray, k: int) -> tuple:
        """The mean, the sd and the mean's slope in each Gaussian coordinate, ``(G, width)``,
        ``(G, width)`` and ``(G, width, k)``, of the distinct instances ``n`` at the nodes
        ``flat`` (one ``(G,)`` array per coordinate of the law)."""
        G, width = flat[0].size, n.stop - n.start
        rows = self._rows[n]
        g = np.zeros((G, width, k))
        ins = self._inputs(flat, n)
        if self._gradients is not None:
            # one evaluation: the gradient in each input, times the input's slope in its
            # coordinates (the linear slot's data, or the block's basis row C_n)
            shape = ins[0].shape
            mu0, sigma, *grads = self._gradients(*[np.ascontiguousarray(a).ravel() for a in ins])
            mu0, sigma = (np.broadcast_to(np.asarray(a, dtype=float), (G * width,)).reshape(shape) for a in (mu0, sigma))
            j = 0
            for pos, grad in zip(self._gaussian, grads):
                grad = np.broadcast_to(np.asarray(grad, dtype=float), (G * width,)).reshape(shape)
                if pos == self._block:  # input C_n . e + d_n of the block's coordinates e
                    C = self._basis[1][rows]
                    g[..., j:j + C.shape[1]] = grad[..., None] * C[None]
                elif self._linear[pos] is None:
                    g[..., j] = grad
                else:
                    g[..., j] = grad * self._linear[pos][1][None, rows]
                j += len(self._coordinates[pos])
            return mu0, sigma, g
        mu0, sigma = self._parameters(ins)
        j = 0
        for pos in self._gaussian:
            # the mean's slope in each coordinate, from one step of its cavity sd (exact:
            # affine); a group effect's coordinates all at once, as each instance reads one
            coordinates = self._coordinates[pos]
            for step in ([coordinates] if pos != self._block or self._groups else [[c] for c in coordinates]):
                moved = list(flat)
                for c in step:
                    moved[c] = flat[c] + sd[j + coordinates.index(c)]
                change = self._parameters(self._inputs(moved, n))[0] - mu0
                if pos == self._block and self._groups:
                    own = j + self._member[rows]
                    g[:, np.arange(width), own] = change / sd[own]
                else:
                    i = j + coordinates.index(step[0])
                    g[..., i] = change / sd[i]
            j += len(coordinates)
        return mu0, sigma, g

    def _parameters(self, ins: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The Normal's mean and sd ``(G, width)`` at the instances' inputs ``ins``."""
        shape = ins[0].shape
        out = self._params(*[np.ascontiguousarray(a).ravel() for a in ins])
        return tuple(np.broadcast_to(np.asarray(a, dtype=float), (int(np.prod(shape)),)).reshape(shape)
                     for a in out)

    # ------------------------------------------------------------------ draws
    def joint_draws(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray], n: int,
                    rng: np.random.Generator, priors: Sequence | None = None, state=None) -> list[np.ndarray] | None:
        """``n`` joint draws of the latents (each as instance ``r``'s input, ``(n,)`` per latent;
        ``(n, k)`` for a regression's ``k`` reference predictors) from the collapsed law: the
        other scalars from its grid (a node picked by weight and jittered within its cell), the
        Gaussian ones from their conditional Gaussian there.
        ``priors``: per latent, None or ``(site, log_density)``, an exact prior density in place
        of its site (:meth:`CollapsedLikelihood.joint_draws`), used for the other scalars (the
        Gaussian ones keep their Gaussian cavity); None where a cavity is improper or no grid
        contains the law."""
        if self._groups:
            return None  # a group effect's coordinates: EP's draws (warned as independent)
        found = self._all_cavities(marginals, sites, state)
        if found is None:
            return None
        cavities, ref, cavity = found
        r = len(self._rest)
        most = _DRAW_NODES[r]
        least = _MIN_DRAW_NODES[r]
        if least**r * self._node_cost > _MAX_DRAW_EVALUATIONS:
            return None
        law = self._law(cavities, cavity, marginals, ref, (most, least), _MAX_DRAW_EVALUATIONS / 2,
                        None if priors is None else [priors[k] for k in self._rest])
        if law is None:
            return None
        rest, X, w, Z, spacing, (c, L), _, _ = law
        pick = rng.choice(w.size, size=n, p=w)
        Us = c + (Z[pick] + rng.uniform(-0.5 * spacing, 0.5 * spacing, size=(n, r))) @ L.T
        m, V = cavity
        with np.errstate(all="ignore"):
            xs = [type(c).from_unconstrained(Us[:, j]) for j, c in enumerate(rest)]
            log_psi, shift, cond = self._integrated(xs, m, V)
        bad = ~np.isfinite(log_psi)
        if bad.any():  # a jitter past the law's support falls back to its node
            Us[bad] = X[pick[bad]]
            xs = [type(c).from_unconstrained(Us[:, j]) for j, c in enumerate(rest)]
            _, shift, cond = self._integrated(xs, m, V)
        z = m + shift + np.einsum("njl,nl->nj", np.linalg.cholesky(cond), rng.standard_normal((n, m.size)))
        out: list = [None] * len(cavities)
        for j, k in enumerate(self._rest):
            out[k] = xs[j]
        j = 0
        for k in self._gaussian:  # one coordinate each, or a regression's reference predictors
            d = self._dims[k]
            out[k] = z[:, j] if d == 1 else z[:, j:j + d]
            j += d
        return out


def _largest_correlation(cov: np.ndarray, together: Sequence[int] = ()) -> float:
    """The largest absolute correlation between two coordinates of covariance ``cov``, but
    for pairs both in ``together``."""
    if cov.shape[0] < 2:
        return 0.0
    sd = np.sqrt(np.diag(cov))
    corr = cov / np.outer(sd, sd)
    pairs = ~np.eye(cov.shape[0], dtype=bool)
    inside = np.zeros(cov.shape[0], dtype=bool)
    inside[list(together)] = True
    pairs &= ~np.outer(inside, inside)
    return float(np.max(np.abs(corr[pairs]), initial=0.0))
