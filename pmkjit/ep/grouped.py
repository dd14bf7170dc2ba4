"""One site per group for a likelihood whose groups of instances each read their own scalars.

:mod:`pmkjit.ep.collapsed` gives one site to a likelihood whose every instance reads the
same two or three scalars. The same loss happens group by group where each group of
observations has its own parameters, the way users write per-group models:

    shape = pm.Gamma("shape", 2, 0.5, dims="g")
    rate = pm.Gamma("rate", 2, 1, dims="g")
    pm.Gamma("y", alpha=shape[g], beta=rate[g], observed=y)

Instance-by-instance sites drop the correlation each group's observations put between its
two parameters, and each instance sees none of the others' information: on that model
the sds came out 0.30-0.53 of NUTS's, on a per-group ``pm.BetaBinomial(alpha=a[g],
beta=b[g])`` 0.33-0.61, converged and unwarned (robustness round 29).

Here the instances are partitioned by the elements they read (or by a Gaussian coordinate
of their own, a Normal location ``mu[g]``), and each group is one site: its tilted law, the
group's cavity (EP's marginals of its elements less the group's sites on them) times the
product of its observations' densities, is a law of two or three scalars, integrated on a uniform grid in its own rotated frame, all groups at once
(:func:`grouped_grids`); its projection less the cavity is the group's site, shared
equally by its instances. Within a group this is the collapsed method exactly; across
groups it is EP with one factor per group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pmkjit.families import ExponentialFamily
from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot, ElementSlot, LinearSlot
from pmkjit.operators.oracle import project_beliefs

from .collapsed import BLOCK, _FACE_ROOM, _MIN_RESOLVED_NODES, _ROTATED_CHECK, _ROTATED_EDGE, _WIDEN, _ZOOM, OneSite

__all__ = ["GroupedLikelihood", "groupable"]

_NODES = {2: 41, 3: 21}  # nodes per axis: spacing 0.33 of the law's sds in 2-D, 0.65 in 3-D
_FIRST_HALF = 8.0  # the first grid's reach, in sds of EP's marginals
_HALF = 6.5  # the reach of a grid in the law's own frame, in its sds
_PASSES = 12
# zooming, pushing faces out, the boundary's allowance and the check against the grid of
# every other node are those of pmkjit.ep.collapsed.rotated_grid (_ZOOM, _WIDEN,
# _FACE_ROOM, _ROTATED_EDGE, _MIN_RESOLVED_NODES, _ROTATED_CHECK)
_MAX_EVALUATIONS = 2e7  # distinct instances x nodes of one pass (beyond, instance by instance)
_CHUNK = 4e6  # densities evaluated at once


def groupable(f: BlackBoxFactor) -> bool:
    """Whether likelihood ``f`` reads two or three scalar latents, each an element (or one
    projection of the Gaussian block) that is the same for all instances of a group and
    different between groups, with two groups at least and fewer groups than instances (see
    the module docstring)."""
    return _groups(f) is not None


def slot_reads(f: BlackBoxFactor) -> list[np.ndarray] | None:
    """What each instance of likelihood ``f`` reads through each latent slot, ``(N, 1)`` per
    slot: the element's index, or a label of its row of a Gaussian projection; None where
    ``f`` is not a likelihood with a density of two to four element or projection slots
    that no two slots read alike."""
    if (f.kind != "likelihood" or f.logp is None or f.density_source != "pymc" or f.observed is None
            or f.analytic is not None or f.mixture is not None or f.joint or f.from_prior or f.size < 3):
        return None
    latent = f.latent_inputs
    if not 2 <= len(latent) <= 4:
        return None
    slots = [f.inputs[i] for i in latent]
    idx = []  # per slot, what each instance reads: an element, or its row of a Gaussian projection
    for slot in slots:
        if isinstance(slot, ElementSlot):
            i = np.asarray(slot.index).reshape(slot.size, -1)
            if i.shape[1] != 1:
                return None
            idx.append(i)
        elif isinstance(slot, LinearSlot):
            # a group's own coordinate of the Gaussian block (a Normal location mu[g]): one
            # projection per group, read alike by its instances
            A = np.asarray(slot.A, dtype=float).reshape(slot.size, -1)
            if not np.all(np.any(A != 0, axis=1)):
                return None
            c = np.broadcast_to(np.asarray(slot.c, dtype=float), (slot.size,))
            idx.append(np.unique(np.column_stack([A, c]), axis=0, return_inverse=True)[1].reshape(-1, 1))
        else:
            return None
    # no element read by two slots (``ab[g, 0]`` and ``ab[g, 1]`` are two elements of one variable)
    read = [(s.variable, int(j)) for s, i in zip(slots, idx) if isinstance(s, ElementSlot) for j in np.unique(i)]
    if len(set(read)) < len(read):
        return None
    return idx


def distinct_rows(f: BlackBoxFactor, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """``(rows, count, y, data)``: one instance of each set of a group's instances alike in all
    they read (observed value and data), sorted by group so each group's are contiguous, how
    many each stands for, and its observed value and data (by input position)."""
    y = np.asarray(f.observed, dtype=float).reshape(f.size)
    data = {i: np.asarray(s.values, dtype=float).reshape(f.size)
            for i, s in enumerate(f.inputs) if isinstance(s, DataSlot)}
    table = np.stack([group.astype(float), y] + list(data.values()), axis=1)
    _, rows, counts = np.unique(table, axis=0, return_index=True, return_counts=True)
    order = np.argsort(group[rows], kind="stable")
    rows = rows[order]
    return rows, counts[order].astype(float), y[rows], {i: v[rows] for i, v in data.items()}


def _groups(f: BlackBoxFactor) -> tuple[np.ndarray, np.ndarray] | None:
    """``(group, first)``: each instance's group and each group's first instance, or None."""
    idx = slot_reads(f)
    if idx is None or len(idx) > 3:
        return None
    latent = f.latent_inputs
    keys = np.concatenate(idx, axis=1)
    _, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    n_groups = first.size
    # each element in one group only (nested, not crossed: a crossed element's site would
    # have to come from several groups' laws at once)
    if not 2 <= n_groups < f.size or any(np.unique(i).size != n_groups for i in idx):
        return None
    if _NODES[len(latent)] ** len(latent) * f.size > _MAX_EVALUATIONS:
        return None
    return group.reshape(-1), first


class GroupedLikelihood(OneSite):
    """The tilted moments of a likelihood group by group, one site per group.

    Parameters
    ----------
    factor : BlackBoxFactor
        A likelihood for which :func:`groupable` holds.
    per_instance : callable
        The factor's ordinary method, used for a sweep in which a group's cavity is improper
        or its law is not held by its grid.
    """

    def __init__(self, factor: BlackBoxFactor, per_instance):
        found = _groups(factor)
        if found is None:
            raise ValueError(f"{factor.name}: not a likelihood of per-group scalars ({factor.description})")
        super().__init__(factor, per_instance)
        f = factor
        self._group, self._first = found
        self.n_groups = self._first.size
        self._size = np.bincount(self._group, minlength=self.n_groups).astype(float)
        # instances of one group alike in all they read have one density, weighted by their count
        self._rows, self._count, self._y, self._data = distinct_rows(f, self._group)
        self._row_group = self._group[self._rows]
        self._latent = {i: k for k, i in enumerate(f.latent_inputs)}
        self._frames = None  # each group's frame at the end of the last sweep

    @property
    def _kind(self) -> str:
        return "one site per group"

    # ------------------------------------------------------------------ EP update
    def sites(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray],
              state=None) -> list[np.ndarray] | None:
        """New per-instance sites ``[(N, 2) per latent]`` from the posterior ``marginals`` of
        the latent inputs and the factor's current ``sites``; None where a group's cavity is
        improper or its law is not held by its grid."""
        return self._counted(self._sites(marginals, sites))

    def _sites(self, marginals, sites):
        found = self._law(marginals, sites)
        if found is None:
            return None
        self.n_integrals += 1
        cavities, (U, w, _, _) = found
        G, m = self.n_groups, len(cavities)
        stats = np.full((m, G, 3), np.nan)
        mean = np.einsum("gp,gpk->gk", w, U)
        for k, c in enumerate(cavities):
            T = type(c).sufficient_statistics_unconstrained(U[:, :, k])
            stats[k, :, :2] = np.einsum("gp,gpj->gj", w, T)
            stats[k, :, 2] = np.einsum("gp,gp->g", w, (U[:, :, k] - mean[:, k:k + 1]) ** 2)
        beliefs, accepted = project_beliefs([type(c) for c in cavities], stats, np.ones(G, bool))
        if not accepted.all():
            return None
        out = []
        for b, c in zip(beliefs, cavities):
            delta = np.asarray(b.natural, dtype=float) - np.asarray(c.natural, dtype=float)
            if not np.all(np.isfinite(delta)):
                return None
            out.append(delta[self._group] / self._size[self._group, None])
        return out

    def _cavities(self, marginals, sites) -> list[ExponentialFamily] | None:
        """Each group's cavity per latent (a batch of ``G``): the marginal of its element (or
        of its Gaussian coordinate) less the group's summed sites; None where one is improper."""
        out = []
        for m, site in zip(marginals, sites):
            site = np.asarray(site, dtype=float)
            summed = np.stack([np.bincount(self._group, weights=site[:, j], minlength=self.n_groups)
                               for j in range(site.shape[1])], axis=1)
            cav = type(m).from_natural(np.asarray(m.natural, dtype=float)[self._first] - summed)
            if not np.all(cav.is_proper()):
                return None
            out.append(cav)
        return out

    # ------------------------------------------------------------------ the grids
    def _law(self, marginals, sites) -> tuple | None:
        """``(cavities, grids)``: every group's cavity and its law on its grid
        (:func:`grouped_grids`), starting from the last sweep's frames where there are any,
        else from EP's marginals; None where a cavity is improper or a law is not held."""
        cavities = self._cavities(marginals, sites)
        if cavities is None:
            return None
        m = len(cavities)
        naturals = [np.asarray(c.natural, dtype=float) for c in cavities]
        families = [type(c) for c in cavities]

        def log_law(U):
            return self._log_law(families, naturals, U)

        found = None
        if self._frames is not None:
            centre, L, _, reach = self._frames
            found = grouped_grids(log_law, centre, L, _HALF, _NODES[m], reach)
        if found is None:
            mom = np.array([np.asarray(mg[self._first].unconstrained_moments(), dtype=float) for mg in marginals])
            centre, sd = mom[:, 0].T, np.sqrt(mom[:, 1].T)  # (G, m)
            L = sd[:, :, None] * np.eye(m)[None]
            found = grouped_grids(log_law, centre, L, _FIRST_HALF, _NODES[m])
        if found is None:
            return None
        self._frames = found[3]
        return cavities, found

    def _log_law(self, families, naturals, U: np.ndarray) -> np.ndarray:
        """The unnormalised log law of every group at its nodes ``U`` ``(G, P, m)``: each
        latent's cavity in its unconstrained coordinate plus the group's observations' summed
        log densities; ``-inf`` where it cannot be evaluated."""
        f = self.factor
        G, P, m = U.shape
        with np.errstate(all="ignore"):
            logw = np.zeros((G, P))
            for k, (fam, nat) in enumerate(zip(families, naturals)):
                T = fam.sufficient_statistics_unconstrained(U[:, :, k])
                logw += np.einsum("gpj,gj->gp", T, nat) + fam.log_abs_det_jacobian(U[:, :, k])
            X = np.stack([fam.from_unconstrained(U[:, :, k]) for k, fam in enumerate(families)], axis=-1)
            step = max(1, int(_CHUNK // P))
            for lo in range(0, self._rows.size, step):
                r = np.arange(lo, min(lo + step, self._rows.size))
                g = self._row_group[r]
                ins = []
                for i in range(len(f.inputs)):
                    if i in self._data:
                        ins.append(np.ascontiguousarray(np.broadcast_to(self._data[i][r, None], (r.size, P))))
                    elif i in self._latent:
                        ins.append(X[g, :, self._latent[i]])
                y = np.ascontiguousarray(np.broadcast_to(self._y[r, None], (r.size, P)))
                ll = np.asarray(f.logp(y, tuple(ins)), dtype=float) * self._count[r, None]
                # the rows are sorted by group: sum each group's run
                starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
                logw[g[starts]] += np.add.reduceat(ll, starts, axis=0)
        return np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)

    # ------------------------------------------------------------------ draws
    def element_places(self) -> list | None:
        """Where each latent's groups live, ``[place, ..., None]`` (no outputs; see
        :func:`pmkjit.ep.collapsed.draw_jointly`): ``(variable, indices (G,))`` for an element,
        ``(BLOCK, J (G,), a (G,), c (G,))`` for a Gaussian coordinate per group read as
        ``a theta_J + c``; None where a group's projection reads more than one coordinate."""
        f = self.factor
        places = []
        for i in f.latent_inputs:
            s = f.inputs[i]
            if isinstance(s, ElementSlot):
                places.append((s.variable, np.asarray(s.index).reshape(f.size, -1)[self._first, 0]))
                continue
            A = np.asarray(s.A, dtype=float).reshape(f.size, -1)[self._first]
            nonzero = A != 0
            if not np.all(nonzero.sum(axis=1) == 1):
                return None
            J = np.argmax(nonzero, axis=1)
            if np.unique(J).size < J.size:
                return None
            c = np.broadcast_to(np.asarray(s.c, dtype=float), (f.size,))[self._first]
            places.append((BLOCK, J, A[np.arange(J.size), J], c))
        return places + [None]

    def joint_draws(self, marginals, sites, n: int, rng: np.random.Generator, priors=None,
                    state=None) -> list | None:
        """``n`` joint draws of every group's latents from its law (``(n, G)`` per latent,
        then None for the outputs it has not), or None: a node picked by weight, jittered
        uniformly within its cell. ``priors`` is not used (each group's cavity has its
        elements' priors as EP's sites)."""
        found = self._law(marginals, sites)
        if found is None:
            return None
        cavities, (U, w, Z, (centre, L, half, _)) = found
        G, P, m = U.shape
        spacing = half * (Z[1, -1] - Z[0, -1])  # (G,): the unit grid's spacing times each reach
        out = np.empty((m, n, G))
        for g in range(G):  # per group: draws of one group's law (not a hot loop: G draws in all)
            pick = rng.choice(P, size=n, p=w[g])
            Zs = half[g] * Z[pick] + rng.uniform(-0.5, 0.5, size=(n, m)) * spacing[g]
            Us = centre[g] + Zs @ L[g].T
            for k, c in enumerate(cavities):
                out[k, :, g] = type(c).from_unconstrained(Us[:, k])
        return list(out) + [None]


def grouped_grids(log_law, centre: np.ndarray, L: np.ndarray, half, nodes: int,
                  reach: np.ndarray | None = None) -> tuple | None:
    """Each of ``G`` laws of ``m`` coordinates on a uniform grid of ``nodes`` per axis over
    +-``_HALF`` of its sds in its own (rotated) frame, all groups vectorised.

    ``log_law(U)`` gives the unnormalised log densities of every group at its nodes ``U``
    ``(G, P, m)``. The first grids span +-``half`` of the frames ``centre + L z``
    (``(G, m)``, ``(G, m, m)``); each group's next one is placed in the frame of its last
    one's mean and covariance until every group's two agree (means within 0.05 sds,
    variances within 10%) with at most ``_ROTATED_EDGE`` of its mass on the boundary, zooming in on a
    law that falls between a few nodes. Where a group's boundary holds more, the faces that
    hold it are pushed out for all groups at the same spacing, as
    :func:`pmkjit.ep.collapsed.rotated_grid` does for one law, up to ``_FACE_ROOM`` times the
    first grid's nodes (``reach``: the faces' extents to start from, in units of ``half``, as
    the last sweep left them). Returns ``(U, w, Z, (centre, L, half, reach))``: every group's nodes
    ``(G, P, m)`` and normalised weights ``(G, P)``, the unit grid ``Z`` ``(P, m)`` (a product
    of uniform axes, 1 = ``half``) and the frames (``half`` per group), checked against the
    grid of every other node; None where a law is not found, not held or not resolved.
    """
    G, m = centre.shape
    core = nodes // 2  # nodes from the centre to a face of the first grid
    centre, L = centre.astype(float).copy(), L.astype(float).copy()
    half = np.broadcast_to(np.asarray(half, dtype=float), (G,)).copy()
    # each axis's extent below and above the centre, in units of half
    reach = np.ones((m, 2)) if reach is None else np.asarray(reach, dtype=float).copy()
    for _ in range(_PASSES):
        counts = np.ceil(core * reach - 1e-9).astype(int)
        axes = [np.arange(-lo, hi + 1) / core for lo, hi in counts]
        Z = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, m)
        U = centre[:, None, :] + np.einsum("pj,gkj->gpk", Z, L) * half[:, None, None]
        logw = log_law(U)
        top = logw.max(axis=1)
        if not np.all(np.isfinite(top)):
            return None
        w = np.exp(logw - top[:, None])
        w /= w.sum(axis=1, keepdims=True)
        mean = np.einsum("gp,gpk->gk", w, U)
        D = U - mean[:, None, :]
        cov = np.einsum("gp,gpk,gpl->gkl", w, D, D)
        ok = (1.0 / np.sum(w**2, axis=1) >= _MIN_RESOLVED_NODES) & np.all(np.linalg.eigvalsh(cov)[:, :1] > 0, axis=1)
        L_next = np.broadcast_to(np.eye(m), cov.shape).copy()
        try:
            L_next[ok] = np.linalg.cholesky(cov[ok])
        except np.linalg.LinAlgError:
            return None
        shift = np.linalg.solve(L_next, (mean - centre)[..., None])[..., 0]
        ratio = np.linalg.svd(np.linalg.solve(L_next, L), compute_uv=False)
        stable = ok & (half == _HALF) & np.all(np.abs(shift) <= 0.05, axis=1) & np.all(
            np.abs(2.0 * np.log(ratio)) <= 0.1, axis=1)
        # each group's mass on each axis's lower and upper face
        faces = np.stack([np.stack([w[:, Z[:, k] <= a[0]].sum(axis=1), w[:, Z[:, k] >= a[-1]].sum(axis=1)], axis=1)
                          for k, a in enumerate(axes)], axis=1)  # (G, m, 2)
        edge = w[:, np.any((Z <= [a[0] for a in axes]) | (Z >= [a[-1] for a in axes]), axis=1)].sum(axis=1)
        if np.all(stable & (edge <= _ROTATED_EDGE)):
            return _checked(U, w, Z, 1.0 / core, (centre, L, half, reach))
        # the faces some settled group's law crosses beyond its share of the allowance
        heavy = np.any(stable[:, None, None] & (faces > _ROTATED_EDGE / (2 * m)), axis=0)
        reach = np.where(heavy, reach * _WIDEN, reach)
        if np.prod(np.ceil(core * reach - 1e-9).sum(axis=1) + 1) > _FACE_ROOM * nodes**m:
            return None
        # zoom in on a law that falls between a few nodes; place the others in their frames
        zoom = ~ok
        centre[zoom] = U[zoom, np.argmax(w[zoom], axis=1)]
        L[zoom] *= _ZOOM
        half[zoom] = _FIRST_HALF
        centre[ok], L[ok], half[ok] = mean[ok], L_next[ok], _HALF
    return None


def _checked(U: np.ndarray, w: np.ndarray, Z: np.ndarray, spacing: float, frames: tuple) -> tuple | None:
    """``(U, w, Z, frames)`` where every group's moments on the grid of every other node
    (``spacing`` apart in ``Z``) agree with the whole grid's to ``_ROTATED_CHECK``, else None."""
    coarse = np.all(np.round((Z - Z[0]) / spacing).astype(int) % 2 == 0, axis=1)
    moments = []
    for use in (np.ones(Z.shape[0], bool), coarse):
        v = w[:, use] / w[:, use].sum(axis=1, keepdims=True)
        mu = np.einsum("gp,gpk->gk", v, U[:, use])
        moments.append((mu, np.einsum("gp,gpk->gk", v, (U[:, use] - mu[:, None, :]) ** 2)))
    (mu, var), (mu_h, var_h) = moments
    if not (np.all(np.abs(mu - mu_h) <= _ROTATED_CHECK[0] * np.sqrt(var)) and np.all(np.abs(np.log(var_h / var)) <= _ROTATED_CHECK[1])):
        return None
    return U, w, Z, frames
