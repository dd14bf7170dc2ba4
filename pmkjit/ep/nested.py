"""One site for a likelihood whose groups read their own scalar beside shared ones.

:mod:`pmkjit.ep.collapsed` gives one site to a likelihood whose every instance reads the
same few scalars, and :mod:`pmkjit.ep.grouped` one site per group where each group reads its
own. Users often write the two together: group effects beside a dispersion, a shape or a
scale that every group shares,

    alpha = pm.Gamma("alpha", 2, 0.2)
    pm.NegativeBinomial("y", mu=pm.math.exp(mu0 + tau * z[g]), alpha=alpha, observed=y)

Neither of those takes it, so its sites were instance by instance, and ``alpha``'s sd came
out 0.74 of NUTS's (robustness round 36). One site per group does no better (0.75,
measured): each group's law alone is too wide in ``alpha`` for its Gamma projection, and six
such sites compound the loss.

Given the shared scalars ``s`` the groups are independent, so the whole likelihood's tilted
law (the factor's cavity, EP's marginals less this factor's sites, times every
observation's density) is

    p(s, u_1..u_G) ~ c(s) prod_g c_g(u_g) prod_{n in g} psi(y_n | s, u_g),

and its marginal in ``s`` is ``c(s) prod_g Z_g(s)`` with ``Z_g(s)`` a one-dimensional
integral over the group's own scalar ``u_g``. Here ``s`` (one or two scalars) is integrated
on the rotated grid of :func:`~pmkjit.ep.grouped.grouped_grids`, and at each of its nodes
every group's ``u_g`` on a uniform grid of its own in its unconstrained coordinate, all
groups and nodes at once; each group's moments are its conditional moments averaged over
the nodes of ``s``. Their projections less the cavities are one site on each shared scalar
(each instance carries ``1/N`` of it) and one per group (shared over its instances): the
exact tilted law's, not EP's with one factor per group. Joint draws are the law's too: ``s``
from its grid, then each group's scalar given it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import logsumexp

from pmkjit.families import ExponentialFamily
from pmkjit.graph.factor_graph import BlackBoxFactor, ElementSlot, LinearSlot
from pmkjit.operators.oracle import project_beliefs

from .collapsed import _ROTATED_CHECK, _ROTATED_EDGE, BLOCK, OneSite
from .grouped import _CHUNK, _FIRST_HALF, _HALF, distinct_rows, grouped_grids, slot_reads

__all__ = ["NestedLikelihood", "nestable"]

_SHARED_NODES = {1: 101, 2: 25}  # nodes per axis of the shared scalars' grid (0.13 and 0.54 of their sds;
# in 1-D the law must cover 20 effective nodes, _MIN_RESOLVED_NODES: 61 gave 17)
_GROUP_NODES = 61  # nodes of a group's grid: 0.27 of its tilted sd apart over +-_GROUP_HALF
_MAX_GROUP_NODES = 241  # refined (halving the spacing) up to this many, where a group's law is narrower
_GROUP_HALF = 8.0  # a group's grid's reach, in sds of its tilted law (or of EP's marginal, at first)
_PLACINGS = 8  # grids placed in a sweep before the groups' laws are held, or none is (a first
# sweep's cavities are the priors: 100 groups of 20 counts took 6 to settle from them)
_MAX_EVALUATIONS = 4e7  # densities of one pass (distinct rows x nodes of s x nodes of a group)


def nestable(f: BlackBoxFactor) -> bool:
    """Whether likelihood ``f`` reads one or two scalars shared by all its instances and one
    that is each group's own (an element, or a Gaussian projection, per group), with two
    groups at least and fewer groups than instances (see the module docstring)."""
    return _layout(f) is not None


def _layout(f: BlackBoxFactor) -> tuple[np.ndarray, np.ndarray, list[int], int] | None:
    """``(group, first, shared, own)``: each instance's group, each group's first instance,
    the positions (among the latent inputs) of the shared scalars and of the group's own."""
    reads = slot_reads(f)
    if reads is None or not 2 <= len(reads) <= 3:
        return None
    shared = [k for k, i in enumerate(reads) if np.unique(i).size == 1]
    own = [k for k, i in enumerate(reads) if np.unique(i).size > 1]
    if len(own) != 1 or not 1 <= len(shared) <= 2:
        return None
    _, first, group = np.unique(reads[own[0]][:, 0], return_index=True, return_inverse=True)
    if not 2 <= first.size < f.size:
        return None
    rows = distinct_rows(f, group.reshape(-1))[0].size
    if rows * _SHARED_NODES[len(shared)] ** len(shared) * _GROUP_NODES > _MAX_EVALUATIONS:
        return None
    return group.reshape(-1), first, shared, own[0]


_MAX_OVERLAP_GROUPS = 200  # groups for which the pairs that share a coordinate are tracked


def _shared_coordinates(f: BlackBoxFactor, first: np.ndarray, own: int) -> np.ndarray | None:
    """``(G, G)`` pairs of distinct groups whose own scalars are projections reading a common
    coordinate of the Gaussian block (``mu0`` and ``mu0 + d``), or None where there are none
    (an element per group, or a group's own coordinate) or too many groups to track."""
    slot = f.inputs[f.latent_inputs[own]]
    if not isinstance(slot, LinearSlot) or first.size > _MAX_OVERLAP_GROUPS:
        return None
    nz = (np.asarray(slot.A, dtype=float).reshape(f.size, -1)[first] != 0).astype(float)
    pairs = (nz @ nz.T) > 0
    np.fill_diagonal(pairs, False)
    return pairs if pairs.any() else None


class NestedLikelihood(OneSite):
    """The tilted moments of a likelihood of shared scalars and one scalar per group, one site.

    Parameters
    ----------
    factor : BlackBoxFactor
        A likelihood for which :func:`nestable` holds.
    per_instance : callable
        The factor's ordinary method, used for a sweep in which the law is not held by its
        grids.
    """

    # its shared scalars are drawn from the law's marginal where the groups' coordinates cannot
    # be replaced (EP's joint Gaussian correlates them with others): Gamma's tail is not the law's
    draws_separately = True

    def __init__(self, factor: BlackBoxFactor, per_instance):
        found = _layout(factor)
        if found is None:
            raise ValueError(f"{factor.name}: not a likelihood of shared and per-group scalars ({factor.description})")
        super().__init__(factor, per_instance)
        self._group, self._first, self._shared, self._own = found
        self.n_groups = self._first.size
        self._size = np.bincount(self._group, minlength=self.n_groups).astype(float)
        self._rows, self._count, self._y, self._data = distinct_rows(factor, self._group)
        self._row_group = self._group[self._rows]
        self._input = {i: k for k, i in enumerate(factor.latent_inputs)}
        self._frames = None  # the shared scalars' frame at the end of the last sweep
        self._inner = None  # each group's grid (centre, sd, nodes) at the end of the last sweep
        self._overlap = _shared_coordinates(factor, self._first, self._own)
        # the largest (in size) correlation, under the last law held, of two groups' own
        # projections that read a common coordinate (mu0 and mu0 + d of a two-condition
        # design): their sites are the groups' own, so EP leaves it out (see
        # :func:`pmkjit.diagnostics.posterior.warn_nested_groups_correlated`)
        self.group_correlation = 0.0

    @property
    def _kind(self) -> str:
        return "one site, groups nested in shared scalars"

    # ------------------------------------------------------------------ EP update
    def sites(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray],
              state=None) -> list[np.ndarray] | None:
        """New per-instance sites ``[(N, 2) per latent]`` from the posterior ``marginals`` of
        the latent inputs and the factor's current ``sites``; None where the law is not held
        by its grids."""
        return self._counted(self._sites(marginals, sites))

    def _sites(self, marginals, sites):
        found = self._law(marginals, sites)
        if found is None:
            return None
        self.n_integrals += 1
        cavities, law = found
        N = self.factor.size
        out = [None] * len(cavities)
        for k, c in zip(self._shared + [self._own], self._moments(cavities, law)):
            beliefs, accepted = project_beliefs([type(cavities[k])], c[None], np.ones(c.shape[0], bool))
            if not accepted.all():
                return None
            delta = np.asarray(beliefs[0].natural, dtype=float) - np.asarray(cavities[k].natural, dtype=float)
            if not np.all(np.isfinite(delta)):
                return None
            if k == self._own:
                out[k] = delta[self._group] / self._size[self._group, None]
            else:
                out[k] = np.broadcast_to(delta / N, (N, delta.shape[-1])).copy()
        return out

    def _moments(self, cavities, law) -> list[np.ndarray]:
        """Each shared scalar's ``(1, 3)`` statistics and the groups' ``(G, 3)`` (``E[T]``
        and the variance in the unconstrained coordinate), in the order shared, own."""
        U, w, V, W, _ = law
        out = []
        for j, k in enumerate(self._shared):
            out.append(_stats(type(cavities[k]), U[0, :, j][None], w))
        out.append(_stats(type(cavities[self._own]), V, W))
        return out

    def _cavities(self, marginals, sites) -> list[ExponentialFamily]:
        """The cavity per latent: a batch of one for a shared scalar (its marginal less all
        the factor's sites on it), of ``G`` for the groups' own.

        A cavity may be improper: under a hierarchical prior (``a ~ Normal(mu_a, sigma_a)``,
        whose own EP sites may have negative precision) a group's marginal precision was
        below its site's (47.65 against 48.03 on a Gamma GLM of 20 observations a group),
        and refusing it left the whole likelihood instance by instance. The tilted law, the
        cavity times the group's observations' densities, is proper all the same where the
        data hold it; the grids check that (a law with mass on their edges is refused)."""
        out = []
        for k, (m, site) in enumerate(zip(marginals, sites)):
            site = np.asarray(site, dtype=float)
            nat = np.asarray(m.natural, dtype=float)
            if k == self._own:
                summed = np.stack([np.bincount(self._group, weights=site[:, j], minlength=self.n_groups)
                                   for j in range(site.shape[1])], axis=1)
                cav = type(m).from_natural(nat[self._first] - summed)
            else:
                cav = type(m).from_natural(nat[:1] - site.sum(axis=0))
            out.append(cav)
        return out

    # ------------------------------------------------------------------ the grids
    def _law(self, marginals, sites) -> tuple | None:
        """``(cavities, (U, w, V, W))``: the shared scalars' nodes ``U`` ``(1, P, S)`` and
        weights ``w`` ``(1, P)``, each group's nodes ``V`` ``(G, K)`` and marginal weights
        ``W`` ``(G, K)``; None where a cavity is not finite or the law is not held."""
        cavities = self._cavities(marginals, sites)
        if not all(np.all(np.isfinite(np.asarray(c.natural, dtype=float))) for c in cavities):
            return None
        S = len(self._shared)
        if self._inner is not None:
            centre, sd, K = self._inner
        else:
            mom = np.asarray(marginals[self._own][self._first].unconstrained_moments(), dtype=float)
            centre, sd, K = mom[0], np.sqrt(mom[1]), _GROUP_NODES
        frames = self._frames
        for _ in range(_PLACINGS):
            z = np.linspace(-_GROUP_HALF, _GROUP_HALF, K)
            V = centre[:, None] + sd[:, None] * z  # (G, K)
            cache = {}

            def log_law(U, V=V, cache=cache):
                return self._log_law(cavities, V, U, cache)

            found = None
            if frames is not None:
                c0, L0, _, reach = frames
                found = grouped_grids(log_law, c0, L0, _HALF, _SHARED_NODES[S], reach)
            if found is None:
                mom = np.array([np.asarray(marginals[k][:1].unconstrained_moments(), dtype=float)
                                for k in self._shared])  # (S, 2, 1)
                c0, sd0 = mom[:, 0].T, np.sqrt(mom[:, 1].T)
                found = grouped_grids(log_law, c0, sd0[:, :, None] * np.eye(S)[None], _FIRST_HALF, _SHARED_NODES[S])
            if found is None:
                return None
            U, w, Z, frames = found
            inner = cache["inner"]  # (G, P, K): each group's log law at every node of s
            q = np.exp(inner - inner.max(axis=2, keepdims=True))
            q /= q.sum(axis=2, keepdims=True)
            W = np.einsum("p,gpk->gk", w[0], q)
            mean = np.einsum("gk,gk->g", W, V)
            var = np.einsum("gk,gk->g", W, (V - mean[:, None]) ** 2)
            if not np.all(var > 0):
                return None
            moved = np.any(np.abs(mean - centre) > 0.5 * sd) or np.any(np.abs(np.log(np.sqrt(var) / sd)) > np.log(2.0))
            edge = W[:, 0] + W[:, -1]
            if moved or np.any(edge > _ROTATED_EDGE):
                # place the groups' grids on their laws (a first sweep's marginal is the prior's)
                centre, sd = mean, np.sqrt(var)
                continue
            if not _held(inner, w[0], V, U[0], cache["log_z"]):
                if K >= _MAX_GROUP_NODES:
                    return None
                K = 2 * K - 1  # halve the spacing: a group's law given s is narrower than its marginal
                continue
            self._frames, self._inner = frames, (mean, np.sqrt(var), K)
            if self._overlap is not None:
                # groups are independent given s: their covariance is that of their
                # conditional means over the nodes of s
                given = np.einsum("gpk,gk->gp", q, V) - mean[:, None]
                cov = np.einsum("p,gp,hp->gh", w[0], given, given)
                corr = cov / np.sqrt(np.outer(var, var))
                pairs = corr[self._overlap]
                self.group_correlation = float(pairs[np.argmax(np.abs(pairs))])  # signed: its sign says which way
            return cavities, (U, w, V, W, Z)
        return None

    def _log_law(self, cavities, V: np.ndarray, U: np.ndarray, cache: dict) -> np.ndarray:
        """The unnormalised log law ``(1, P)`` of the shared scalars at their nodes ``U``
        ``(1, P, S)``: their cavity plus each group's log integral over its nodes ``V``
        ``(G, K)``; ``cache`` keeps each group's log law given s (``inner``, ``(G, P, K)``)."""
        f = self.factor
        G, K = V.shape
        P = U.shape[1]
        own = cavities[self._own]
        fam_own = type(own)
        with np.errstate(all="ignore"):
            logw = np.zeros(P)
            xs = {}
            for j, k in enumerate(self._shared):
                fam = type(cavities[k])
                T = fam.sufficient_statistics_unconstrained(U[0, :, j])
                logw += T @ np.asarray(cavities[k].natural, dtype=float)[0] + fam.log_abs_det_jacobian(U[0, :, j])
                xs[k] = fam.from_unconstrained(U[0, :, j])
            T = fam_own.sufficient_statistics_unconstrained(V)
            log_c = np.einsum("gkj,gj->gk", T, np.asarray(own.natural, dtype=float)) + fam_own.log_abs_det_jacobian(V)
            x_own = fam_own.from_unconstrained(V)
            inner = np.zeros((G, P, K))
            step = max(1, int(_CHUNK // (P * K)))
            y_all = self._y
            for lo in range(0, self._rows.size, step):
                r = np.arange(lo, min(lo + step, self._rows.size))
                g = self._row_group[r]
                shape = (r.size, P, K)
                ins = []
                for i in range(len(f.inputs)):
                    if i in self._data:
                        ins.append(np.broadcast_to(self._data[i][r, None, None], shape))
                    elif i in self._input:
                        k = self._input[i]
                        v = x_own[g][:, None, :] if k == self._own else xs[k][None, :, None]
                        ins.append(np.broadcast_to(v, shape))
                ins = [np.ascontiguousarray(a).reshape(r.size, P * K) for a in ins]
                y = np.ascontiguousarray(np.broadcast_to(y_all[r, None], (r.size, P * K)))
                ll = (np.asarray(f.logp(y, tuple(ins)), dtype=float) * self._count[r, None]).reshape(shape)
                starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
                inner[g[starts]] += np.add.reduceat(ll, starts, axis=0)
            inner = np.where(np.isnan(inner) | (inner == np.inf), -np.inf, inner + log_c[:, None, :])
            log_z = logsumexp(inner, axis=2)  # (G, P); a group's spacing is the same at every node
            cache["inner"], cache["log_z"] = inner, log_z
            logw = logw + log_z.sum(axis=0)
        return np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)[None]

    # ------------------------------------------------------------------ draws
    def element_places(self) -> list | None:
        """Where each latent lives, ``[place, ..., None]`` (see
        :meth:`pmkjit.ep.grouped.GroupedLikelihood.element_places`): a shared scalar's one
        element or coordinate, the groups' own; None in place of a projection that reads more
        than one coordinate, or a coordinate two groups read."""
        f = self.factor
        places = []
        for k, i in enumerate(f.latent_inputs):
            s = f.inputs[i]
            first = self._first if k == self._own else self._first[:1]
            if isinstance(s, ElementSlot):
                places.append((s.variable, np.asarray(s.index).reshape(f.size, -1)[first, 0]))
                continue
            A = np.asarray(s.A, dtype=float).reshape(f.size, -1)[first]
            nonzero = A != 0
            J = np.argmax(nonzero, axis=1)
            if not np.all(nonzero.sum(axis=1) == 1) or np.unique(J).size < J.size:
                places.append(None)  # not one coordinate each: EP's draws are kept
                continue
            c = np.broadcast_to(np.asarray(s.c, dtype=float), (f.size,))[first]
            places.append((BLOCK, J, A[np.arange(J.size), J], c))
        return places + [None]

    def joint_draws(self, marginals, sites, n: int, rng: np.random.Generator, priors=None,
                    state=None) -> list | None:
        """``n`` joint draws from the law (``(n, 1)`` per shared scalar, ``(n, G)`` for the
        groups', then None for the outputs it has not), or None: a node of ``s`` picked by
        weight and jittered within its cell, then each group's node picked by its weight given
        that node of ``s`` and jittered within its own cell. ``priors`` is not used."""
        found = self._law(marginals, sites)
        if found is None:
            return None
        cavities, (U, w, V, _, Z) = found
        _, L0, half, _ = self._frames
        S = len(self._shared)
        P, G, K = U.shape[1], V.shape[0], V.shape[1]
        pick = rng.choice(P, size=n, p=w[0])
        spacing = half[0] * (Z[1, -1] - Z[0, -1])  # the unit grid's spacing (every axis's) times the reach
        Us = U[0, pick] + (rng.uniform(-0.5, 0.5, size=(n, S)) * spacing) @ L0[0].T
        # each group's conditional law at the picked nodes of s (a log law recomputed there)
        cache = {}
        self._log_law(cavities, V, U[:, np.unique(pick)], cache)
        rows = np.searchsorted(np.unique(pick), pick)
        inner = cache["inner"][:, rows]  # (G, n, K)
        q = np.exp(inner - inner.max(axis=2, keepdims=True))
        cum = np.cumsum(q / q.sum(axis=2, keepdims=True), axis=2)
        k = np.minimum((cum < rng.uniform(size=(G, n, 1))).sum(axis=2), K - 1)  # (G, n)
        step = V[:, 1] - V[:, 0]
        u = np.take_along_axis(V, k, axis=1) + rng.uniform(-0.5, 0.5, size=(G, n)) * step[:, None]
        out = [None] * (S + 1)
        for j, kk in enumerate(self._shared):
            out[kk] = type(cavities[kk]).from_unconstrained(Us[:, j])[:, None]
        out[self._own] = type(cavities[self._own]).from_unconstrained(u).T
        return out + [None]


def _stats(family: type, V: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``(B, 3)``: ``E[T]`` and the unconstrained variance of ``B`` laws at nodes ``V`` with
    normalised weights ``W`` (both ``(B, K)``)."""
    T = family.sufficient_statistics_unconstrained(V)
    mean = np.einsum("bk,bk->b", W, V)
    out = np.empty((V.shape[0], 3))
    out[:, :2] = np.einsum("bk,bkj->bj", W, T)
    out[:, 2] = np.einsum("bk,bk->b", W, (V - mean[:, None]) ** 2)
    return out


def _held(inner: np.ndarray, w: np.ndarray, V: np.ndarray, U: np.ndarray, log_z: np.ndarray) -> bool:
    """Whether the groups' grids resolve their laws: the shared scalars' moments (nodes
    ``U`` ``(P, S)``, weights ``w``) and each group's agree, to ``_ROTATED_CHECK``, with those
    from every other node of the groups' grids ``V`` (the trapezoid rule converges fast on a
    smooth law, so a halved grid that agrees means the full one is far closer)."""
    coarse = inner[:, :, ::2]
    with np.errstate(all="ignore"):
        shift = np.sum(logsumexp(coarse, axis=2) - log_z, axis=0)
        wc = w * np.exp(shift - np.max(shift))
    if not np.all(np.isfinite(wc)) or wc.sum() <= 0:
        return False
    wc /= wc.sum()
    moments = []
    for law, nodes, weights in ((inner, V, w), (coarse, V[:, ::2], wc)):
        q = np.exp(law - law.max(axis=2, keepdims=True))
        q /= q.sum(axis=2, keepdims=True)
        Wg = np.einsum("p,gpk->gk", weights, q)
        mu = np.concatenate([np.einsum("gk,gk->g", Wg, nodes), weights @ U])
        var = np.concatenate([np.einsum("gk,gk->g", Wg, (nodes - mu[:nodes.shape[0], None]) ** 2),
                              weights @ (U - mu[nodes.shape[0]:]) ** 2])
        moments.append((mu, var))
    (mu, var), (mu_c, var_c) = moments
    return bool(np.all(np.abs(mu - mu_c) <= _ROTATED_CHECK[0] * np.sqrt(var))
                and np.all(np.abs(np.log(var_c / var)) <= _ROTATED_CHECK[1]))
