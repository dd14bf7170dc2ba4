"""One site for a prior whose instances share their hyperparameters.

A hierarchical prior ``sigma[g] ~ HalfNormal(s)``, ``theta[i] ~ Gamma(alpha, beta)`` or
``w[k] ~ Laplace(0, lam)`` is a factor of ``G`` instances, each reading the same one or two
hyperparameters and writing its own output. EP gives each instance its own site on the
hyperparameters; each site is the projection of one instance's tilted law, and the
correlation between the hyperparameter and every output that the instances together carry
is lost in each. With a few groups the hyperparameter came out too narrow with nothing in
EP's output to show it (a LogNormal model with ``sigma[g] ~ HalfNormal(s_scale)`` over six
groups: ``s_scale``'s sd 0.75 of NUTS's, converged and unwarned).

Given the hyperparameters ``t``, the instances' outputs are independent, so the factor's
tilted law, its cavity times the whole prior, ``cav(t) prod_g cav_g(x_g) p(x_g | t)``, has
the exact marginal ``cav(t) prod_g Z_g(t)`` with ``Z_g(t) = int p(x | t) cav_g(x) dx``: a
grid over the hyperparameters (the rotated uniform grid of :mod:`pmkjit.ep.collapsed`, in
their unconstrained coordinates) with one 1-D integral per instance and node (a uniform
grid in the output's unconstrained coordinate). The hyperparameters' projection, divided by
their cavity, is one site shared out over the instances; each output's marginal, the
mixture over the nodes of its conditional laws, is projected for its own site. That is EP
with the whole prior as one factor: exact given the outputs' other messages, where the
instance-by-instance sites are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pmkjit.ep.collapsed import (
    _LAPLACE_NODES,
    _LAPLACE_RESOLVED,
    OneSite,
    _checked_moments,
    _exact_priors,
    _log_cavities,
    _marginal_frames,
    all_proper,
    rotated_grid,
)
from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian
from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot, ElementSlot, LinearSlot
from pmkjit.operators.oracle import project_beliefs

__all__ = ["CollapsedPrior", "collapsible_prior"]

_MAX_SHARED = 2  # hyperparameters on the grid
_FAMILIES = (Gaussian, Gamma, Beta)
# each output's grid: nodes over +- _INNER_HALF of its EP marginal's sds (unconstrained), a
# spacing of 0.13 of them; a conditional law narrower than the spacing, or with more
# than _INNER_EDGE of its (node-weighted) mass on the grid's two outer nodes each side, asks
# for a finer or a wider grid, at most _INNER_PASSES times
_INNER_NODES = 121
_INNER_HALF = 8.0
_INNER_EDGE = 1e-7
# least sd of a conditional law, in grid spacings, for the grid's answer to stand. The
# trapezoid rule's relative error on a Gaussian is about exp(-2 pi^2 (sd / h)^2), negligible
# at one spacing, but on a law with a kink it converges as h^2 only: a Laplace prior's
# exp(-|x| / b) erred by -8% to +16% (where the kink falls) at one spacing, about 1% at four
_INNER_SPACING = 4.0
_INNER_PASSES = 4
# a narrower law is integrated again on its own grid of _FINE_NODES over +- 10 of its sds (and
# two coarse spacings: a Laplace prior's exponential tails leave 2e-4 of the mass beyond 6),
# where the same criterion holds at about ten times the resolution
_FINE_NODES = 241
_FINE_HALF = 10.0
_FINE_EDGE = 1e-5
# narrower still, the prior is much narrower than the cavity (its spike as its scale nears 0),
# and the prior's own _SAMPLES draws, weighted by the nearly constant cavity, integrate it
_SAMPLES = 512
_WIDEN = 1.6
# instances x inner nodes x hyperparameter nodes of one grid (pytensor's densities, about 0.1 us
# each: 2 s a pass, a few passes a sweep); beyond, the instances are many enough that each
# one's site on the hyperparameters errs little
_MAX_EVALUATIONS = 2e7
_CHUNK = 4_000_000  # densities evaluated at once
# draws of the hyperparameters given the outputs' (CollapsedPrior.draws_given): nodes per axis
# of their grid, the least effective nodes of a draw's law on it, the most mass on its edge,
# and the most densities evaluated
_DRAW_REFINE = {1: 4, 2: 2}  # the joint draws' grid, nodes per axis over the moments' grid's
_GIVEN_NODES = {1: 241, 2: 61}
_GIVEN_FAILED = 0.01  # most share of draws whose law the grid does not resolve (they keep EP's)
_GIVEN_RESOLVED = 4.0
_GIVEN_EDGE = 1e-6
_MAX_GIVEN_EVALUATIONS = 3e8
_FLAT = 1e-6  # share of the marginal's natural parameters below which an output's cavity is flat
_WEIGHTED = 1e-6  # hyperparameter nodes of less weight (of the heaviest's) are left out of the inner grids' checks


@dataclass
class _OutputGrids:
    """Each output's grid in its unconstrained coordinate ``u`` ``(G, n)`` (spacing ``h``,
    ``(G,)``), its cavity's log density there with the Jacobian (``log_cav``), the output's
    values ``x_out`` and sufficient statistics ``T_out`` ``(G, n, 2)`` at the nodes, the
    cavity itself and which outputs' cavities are flat."""

    u: np.ndarray
    h: np.ndarray
    log_cav: np.ndarray
    x_out: np.ndarray
    T_out: np.ndarray
    cav_out: ExponentialFamily
    flat: np.ndarray


def collapsible_prior(f: BlackBoxFactor) -> bool:
    """Whether ``f`` is a prior whose every instance reads the same one or two latent
    hyperparameters (an element of an element variable, or one Gaussian projection with the
    same row for all) and writes its own output; per-instance data may ride along.

    Priors with a semi-analytic method (a Normal's latent scale) keep it; so do priors whose
    grid would cost more than ``_MAX_EVALUATIONS`` densities per pass.
    """
    if (f.kind != "prior" or f.logp is None or f.density_source != "pymc" or f.analytic is not None
            or f.mixture is not None or f.joint or f.size < 2 or f.output_family not in _FAMILIES):
        return False
    latent = f.latent_inputs
    if not 1 <= len(latent) <= _MAX_SHARED:
        return False
    for i in latent:
        s = f.inputs[i]
        if s.family not in _FAMILIES:
            return False
        if isinstance(s, ElementSlot):
            idx = np.asarray(s.index).reshape(s.size, -1)
            if not np.all(idx == idx[0]):
                return False
        elif isinstance(s, LinearSlot):
            A = np.asarray(s.A, dtype=float).reshape(s.size, -1)
            c = np.broadcast_to(np.asarray(s.c, dtype=float), (s.size,))
            if not (np.any(A) and np.all(A == A[0]) and np.all(c == c[0])):
                return False
        else:
            return False
    out = f.output
    if isinstance(out, ElementSlot):
        idx = np.asarray(out.index).reshape(out.size, -1)
        if np.unique(idx, axis=0).shape[0] != out.size:
            return False
    elif not isinstance(out, LinearSlot):
        return False
    nodes = _LAPLACE_NODES[len(latent)] ** len(latent)
    return f.size * _INNER_NODES * nodes <= _MAX_EVALUATIONS


class CollapsedPrior(OneSite):
    """The tilted moments of a whole hierarchical prior (see the module docstring).

    Parameters
    ----------
    factor : BlackBoxFactor
        A prior for which :func:`collapsible_prior` holds.
    per_instance : callable
        The factor's ordinary method (its oracle), used for a sweep in which a cavity is
        improper or the integral is refused.
    rng : numpy.random.Generator, optional
        Seeds the prior's forward draws (:meth:`_by_sampling`).
    graph : FactorGraph, optional
        The model's graph: where a hyperparameter's cavity is improper, its own prior's exact
        density stands in for that prior's site (:func:`~pmkjit.ep.collapsed._exact_priors`).

    Attributes
    ----------
    n_integrals : int
        Integrals of the whole prior computed.
    n_per_instance_sweeps : int
        Sweeps answered instance by instance instead (set by the engine).
    """

    def __init__(self, factor: BlackBoxFactor, per_instance, rng: np.random.Generator | None = None, graph=None):
        if not collapsible_prior(factor):
            raise ValueError(f"{factor.name}: not a prior of shared hyperparameters ({factor.description})")
        super().__init__(factor, per_instance)
        self._graph = graph
        self._frame = None  # the hyperparameters' grid frame in the last sweep, where the next starts
        # the seed of the prior's draws where a grid cannot resolve its conditional law
        self._seed = int((rng if rng is not None else np.random.default_rng(0)).integers(2**63 - 1))
        self._data = {i: np.asarray(s.values, dtype=float).reshape(factor.size)
                      for i, s in enumerate(factor.inputs) if isinstance(s, DataSlot)}

    @property
    def _kind(self) -> str:
        return "collapsed prior"

    def sites(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray],
              state=None) -> list[np.ndarray] | None:
        """New per-instance sites ``[(G, 2) per slot]`` (the hyperparameters', then the
        output's) from the posterior ``marginals`` of the factor's slots and its current
        ``sites``; None where a cavity is improper or the integral is refused."""
        found = self._cavities(marginals, sites)
        if found is None or found[2].all():
            # an output's cavity improper (a site of negative precision), which the instances'
            # own method skips too; or every one flat (the first sweep, before the factors after
            # this one have sites), which says nothing of the hyperparameters: no refusal
            return None
        priors = None
        if self._graph is not None and state is not None and not all_proper(found[0]):
            # an improper cavity (a HalfCauchy's Gamma site, lam^-1.03) can leave the law itself
            # improper at 0, where the prior's exact density is flat: the law with that density
            # in place of the site, as the joint draws have it
            priors = _exact_priors(self._graph, state, self.factor)
        out = self._sites(marginals, sites, *found, priors=priors)
        if out is None and priors is None and self._graph is not None and state is not None:
            # a hyper-scale's Gamma site (a HalfCauchy's, shape 0.31) has a left tail in log
            # space, e^(0.31 u), far heavier than its prior's own (e^u); where the outputs'
            # likelihood flattens as the scale goes to 0 (a Laplace prior's, beside coefficients
            # whose cavities hold 0) the law is a narrow peak on a long tail that no uniform
            # grid resolves (a Bayesian lasso on 10 coefficients: refused in every sweep,
            # robustness round 30). The prior's exact density then stands in for its site.
            priors = _exact_priors(self._graph, state, self.factor)
            if priors is not None:
                out = self._sites(marginals, sites, *found, priors=priors)
        return self._counted(out)

    def _cavities(self, marginals, sites) -> tuple[list[ExponentialFamily], ExponentialFamily, np.ndarray] | None:
        """The hyperparameters' collapsed cavities (their marginals less the factor's summed
        sites, batches of one), the outputs' own (a batch of ``G``) and which of those are flat
        (``(G,)``: below ``_FLAT`` of the marginal's natural parameters, an output nothing else
        reads yet or at all); None where an output's cavity is improper and not flat, or a
        cavity is not finite. A hyperparameter's cavity may be improper in its family (its
        prior's site: ``pm.Pareto``'s, ``pm.Uniform``'s on a scale), the law on the grid being
        proper."""
        shared = []
        for m, site in zip(marginals[:-1], sites[:-1]):
            natural = np.asarray(m.natural[:1], dtype=float) - np.asarray(site).sum(axis=0)
            if not np.all(np.isfinite(natural)):
                return None
            shared.append(type(m).from_natural(natural))
        m_out = marginals[-1]
        marginal = np.asarray(m_out.natural, dtype=float)
        natural = marginal - np.asarray(sites[-1], dtype=float)
        flat = np.all(np.abs(natural) <= _FLAT * np.abs(marginal), axis=1)
        cav_out = type(m_out).from_natural(natural)
        if not np.all(np.isfinite(natural)) or not np.all(cav_out.is_proper() | flat):
            return None
        return shared, cav_out, flat

    def _sites(self, marginals, sites, shared, cav_out, flat, priors=None) -> list[np.ndarray] | None:
        f = self.factor
        m_out = marginals[-1]
        found = self._law(shared, marginals[:-1], cav_out, m_out, priors=priors, flat=flat)
        if found is None:
            return None
        self.n_integrals += 1
        U, w, cov, inner = found["U"], found["w"], found["cov"], found["inner"]
        k = len(shared)
        stats = np.full((k, 1, 3), np.nan)
        for j, c in enumerate(shared):
            stats[j, 0, :2] = w @ type(c).sufficient_statistics_unconstrained(U[:, j])
            stats[j, 0, 2] = cov[j, j]
        beliefs, ok = project_beliefs([type(c) for c in shared], stats, np.ones(1, bool))
        if not ok[0]:
            return None
        new = []
        for b, c in zip(beliefs, shared):
            delta = (np.asarray(b.natural, dtype=float) - np.asarray(c.natural, dtype=float))[0]
            if not np.all(np.isfinite(delta)):
                return None
            new.append(np.broadcast_to(delta / f.size, (f.size, 2)).copy())
        # each output's marginal: the mixture over the nodes of its conditional laws (a flat
        # output whose grid does not hold its prior keeps its site)
        ET, mu, var = inner
        stats_out = np.full((1, f.size, 3), np.nan)
        stats_out[0, :, :2] = np.einsum("t,tik->ik", w, ET)
        centre = w @ mu
        stats_out[0, :, 2] = w @ (var + (mu - centre) ** 2)
        beliefs, ok = project_beliefs([type(m_out)], stats_out, ~found["unheld"])
        if not np.all(ok | found["unheld"]):
            return None
        delta = np.asarray(beliefs[0].natural, dtype=float) - np.asarray(cav_out.natural, dtype=float)
        delta[~ok] = np.asarray(sites[-1], dtype=float)[~ok]
        if not np.all(np.isfinite(delta)):
            return None
        return new + [delta]

    # ------------------------------------------------------------------ draws
    def element_places(self) -> list[tuple[str, np.ndarray] | None] | None:
        """Per slot (the hyperparameters', then the output), the element variable and the flat
        indices it holds, or None for an output that is a Gaussian projection; None where a
        hyperparameter is one (drawn with the Gaussian block, which draws here would leave
        incoherent)."""
        f = self.factor
        places = []
        for s in [f.inputs[i] for i in f.latent_inputs] + [f.output]:
            if not isinstance(s, ElementSlot):
                if s is not f.output:
                    return None
                places.append(None)
                continue
            idx = np.asarray(s.index).reshape(s.size, -1)
            if idx.shape[1] != 1:
                return None
            places.append((s.variable, idx[:1, 0] if s is not f.output else idx[:, 0]))
        return places

    def draws_given(self, outputs: np.ndarray, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray],
                    rng: np.random.Generator, priors: Sequence | None = None) -> list[np.ndarray] | None:
        """Draws of the hyperparameters (``(n,)`` each) from their law given each draw of the
        outputs ``(n, G)``, ``cav(t) prod_g p(x_g | t)``, or None.

        For outputs drawn elsewhere: a scale that the real latents are drawn given
        (:mod:`pmkjit.ep.conditional`). The pair
        is then drawn as the posterior factorises, ``p(x) p(t | x)``: the hyperparameter
        correlated with the outputs as the prior makes it, and its marginal not confined to
        its family's shape. Each draw's law is on a uniform grid over +-9 sds of the
        hyperparameters' EP marginals (``_GIVEN_NODES`` per axis), picked by weight and
        jittered within the cell. A draw whose law that grid does not resolve (fewer than
        ``_GIVEN_RESOLVED`` effective nodes, or more than ``_GIVEN_EDGE`` of its mass on the
        edge: a HalfCauchy hyper-scale given an empty group's scale drawn far out) is NaN, for
        the caller to keep its own; None where more than ``_GIVEN_FAILED`` of them are, or the
        grid would cost more than ``_MAX_GIVEN_EVALUATIONS`` densities.
        """
        f = self.factor
        found = self._cavities(marginals, sites)
        if found is None:
            return None
        shared = found[0]
        n, G = outputs.shape
        k = len(shared)
        m = _GIVEN_NODES[k]
        if n * m**k * G > _MAX_GIVEN_EVALUATIONS:
            return None
        centre, var = _marginal_frames(marginals[:-1], [0] * k)
        z1 = np.linspace(-9.0, 9.0, m)
        Z = np.stack(np.meshgrid(*([z1] * k), indexing="ij"), axis=-1).reshape(-1, k)
        U = centre + Z * np.sqrt(var)
        K = U.shape[0]
        with np.errstate(all="ignore"):
            base = _log_cavities(shared, list(U.T), priors)  # (K,)
            xs = [type(c).from_unconstrained(U[:, j]) for j, c in enumerate(shared)]
        logw = np.empty((n, K))
        step = max(1, _CHUNK // (K * G))
        for lo in range(0, n, step):
            d = slice(lo, min(n, lo + step))
            width = d.stop - d.start
            ins = self._inputs([np.tile(x, width)[:, None] for x in xs], lambda v: v[None, :], (width * K, G))
            y = np.ascontiguousarray(np.repeat(outputs[d], K, axis=0))
            with np.errstate(all="ignore"):
                lp = np.asarray(f.logp(y, tuple(ins)), dtype=float).reshape(width, K, G).sum(axis=2)
            logw[d] = base[None, :] + lp
        logw = np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)
        top = logw.max(axis=1)
        w = np.exp(logw - np.where(np.isfinite(top), top, 0.0)[:, None])
        w /= np.maximum(w.sum(axis=1, keepdims=True), 1e-300)
        edge = np.any(np.abs(Z) >= z1[-1] - 1e-9, axis=1)
        with np.errstate(divide="ignore"):
            failed = (~np.isfinite(top) | (1.0 / np.sum(w**2, axis=1) < _GIVEN_RESOLVED)
                      | (w[:, edge].sum(axis=1) > _GIVEN_EDGE))
        if failed.mean() > _GIVEN_FAILED:
            return None
        at = _inverse_cdfs(np.where(failed[:, None], 1.0, w), np.arange(n), rng)
        Us = U[at] + rng.uniform(-0.5, 0.5, size=(n, k)) * (z1[1] - z1[0]) * np.sqrt(var)
        Us[failed] = np.nan
        return [type(c).from_unconstrained(Us[:, j]) for j, c in enumerate(shared)]

    def joint_draws(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray], n: int,
                    rng: np.random.Generator, priors: Sequence | None = None, state=None) -> list[np.ndarray] | None:
        """``n`` joint draws of the hyperparameters (``(n,)`` each) and the outputs (``(n, G)``)
        from the collapsed law, or None.

        EP's marginals are that law's projections onto their families, but its draws of a
        hyperparameter are independent of the outputs' and its family's shape (a hyper-scale
        over a few groups: a Gamma of the exact law's mean and mean log has 0.9 of its sd).
        Each draw is a node of the hyperparameters' grid picked by weight and jittered within
        its cell, then every output from its conditional law at that node on its own grid.
        ``priors``: per hyperparameter, None or ``(site, log_density)``, its prior factor's
        exact density in place of that factor's site (see
        :meth:`~pmkjit.ep.collapsed.CollapsedLikelihood.joint_draws`).
        """
        found = self._cavities(marginals, sites)
        if found is None:
            return None
        shared, cav_out, flat = found
        law = self._law(shared, marginals[:-1], cav_out, marginals[-1], priors, flat, fine=True)
        if law is None:
            return None
        U, w, (_, L0), spacing = law["U"], law["w"], law["frame"], law["spacing"]
        k = U.shape[1]
        pick = rng.choice(w.size, size=n, p=w)
        Us = U[pick] + rng.uniform(-0.5 * spacing, 0.5 * spacing, size=(n, k)) @ L0.T
        used, where = np.unique(pick, return_inverse=True)
        grids = law["grids"]
        u, h = grids.u, grids.h
        with np.errstate(all="ignore"):
            xs = [type(c).from_unconstrained(U[used, j]) for j, c in enumerate(shared)]
            q, sampled = self._inner(xs, grids, keep=True)[-1]
        # inverse cdfs of every (node, instance)'s grid law, searched at once
        G = u.shape[0]
        rows = (where[:, None] * G + np.arange(G)[None, :]).ravel()  # (n G,)
        at = _inverse_cdfs(q.reshape(used.size * G, -1), rows, rng).reshape(n, G)
        g = np.arange(G)[None, :]
        u_draw = u[g, at] + rng.uniform(-0.5, 0.5, size=(n, G)) * h[None, :]
        if sampled is not None:
            # pairs whose law is narrower than the grid: one of the prior's weighted draws
            bad_t, bad_g, u_p, w_p = sampled
            row = np.full((used.size, G), -1)
            row[bad_t, bad_g] = np.arange(bad_t.size)
            r = row[where[:, None], g]  # (n, G)
            hit = r >= 0
            if hit.any():
                pick_p = _inverse_cdfs(w_p, r[hit], rng)
                u_draw[hit] = u_p[r[hit], pick_p]
        out = [type(c).from_unconstrained(Us[:, j]) for j, c in enumerate(shared)]
        return out + [type(cav_out).from_unconstrained(u_draw)]

    def _law(self, shared: list, shared_marginals: Sequence[ExponentialFamily], cav_out: ExponentialFamily,
             m_out: ExponentialFamily, priors: Sequence | None = None, flat: np.ndarray | None = None,
             fine: bool = False) -> dict | None:
        """The hyperparameters' law on a rotated grid and each output's conditional laws at its
        nodes, or None where no grid holds the law. Keys: ``U`` the nodes ``(T, k)``
        (unconstrained), ``Z``, ``spacing`` and ``frame`` as :func:`rotated_grid` gives them,
        ``w`` their normalised weights, ``mean`` and ``cov`` the law's moments, ``inner`` per
        node and instance the output's expected sufficient statistics ``(T, G, 2)`` and the
        mean and variance of its unconstrained coordinate ``(T, G)``, ``grids`` the outputs'
        grids, and ``unheld`` the flat outputs whose grids do not hold their laws. ``priors`` as for
        :func:`~pmkjit.ep.collapsed._log_cavities` (the draws' exact priors); ``flat`` the
        outputs whose cavities are flat, whose integrals are 1 (the prior is a density of its
        output) and whose conditional laws are the prior's. ``fine``: the nodes returned are a
        grid ``_DRAW_REFINE`` times finer per axis over the same range (for draws)."""
        f = self.factor
        k = len(shared)
        fam_out = type(m_out)
        flat = np.zeros(f.size, bool) if flat is None else flat
        centre_out, var_out = (np.asarray(a, dtype=float) for a in m_out.unconstrained_moments())
        sd_out = np.sqrt(var_out)
        if not (np.all(np.isfinite(centre_out)) and np.all(sd_out > 0) and np.all(np.isfinite(sd_out))):
            return None
        # the hyperparameters' first frame: their EP marginals (the cavity times this factor's sites)
        centre, var = _marginal_frames(shared_marginals, [0] * k)
        n_inner, half = _INNER_NODES, _INNER_HALF
        for _ in range(_INNER_PASSES):
            u = centre_out[:, None] + (half * sd_out)[:, None] * np.linspace(-1.0, 1.0, n_inner)[None, :]
            with np.errstate(all="ignore"):
                log_cav = cav_out.logpdf_unconstrained(u)  # (G, n), the Jacobian included
                log_cav[flat] = fam_out.log_abs_det_jacobian(u[flat])
                grids = _OutputGrids(u, 2.0 * half * sd_out / (n_inner - 1), log_cav, fam_out.from_unconstrained(u),
                                     fam_out.sufficient_statistics_unconstrained(u), cav_out, flat)
            last: dict = {}

            def log_law(U, grids=grids, last=last):
                with np.errstate(all="ignore"):
                    logw = _log_cavities(shared, list(U.T), priors)
                    xs = [type(c).from_unconstrained(U[:, j]) for j, c in enumerate(shared)]
                    inner = self._inner(xs, grids)
                    logw = logw + inner[0][:, ~flat].sum(axis=1)
                logw = np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)
                if not np.isfinite(logw.max()):
                    return None
                last.update(U=U, inner=inner)
                return logw

            nodes = _LAPLACE_NODES[k]
            found = None
            for frame in ([self._frame] if self._frame is not None else []) + [None]:
                found = rotated_grid(log_law, k, centre, var, nodes, f.size * n_inner, budget=4 * _MAX_EVALUATIONS,
                                     min_resolved=_LAPLACE_RESOLVED[k], frame=frame)
                if found is not None:
                    break
            if found is None:
                return None
            Z, w, spacing, (c0, L0) = found
            U = c0 + Z @ L0.T
            _, ET, mu, v, edge = last["inner"]
            heavy = w > _WEIGHTED * w.max()
            wide = (w[heavy] @ edge[heavy]) > _INNER_EDGE
            if not np.any(wide & ~flat):
                checked = _checked_moments(U, w, Z, spacing)
                if checked is None:
                    return None
                self._frame = (c0, L0)
                if fine:
                    # the draws' grid: the same frame and range, _DRAW_REFINE times as many nodes
                    # per axis (a hyper-scale's law in log space has a long exponential tail,
                    # so +-6.5 of its sds put cells of half a unit of log scale across its
                    # bulk, and jitter within them widened the draws by 5%)
                    spacing /= _DRAW_REFINE[k]
                    axes = [spacing * np.arange(round(Z[:, j].min() / spacing), round(Z[:, j].max() / spacing) + 1)
                            for j in range(k)]
                    Z = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, k)
                    U = c0 + Z @ L0.T
                    logw = log_law(U)
                    if logw is None:
                        return None
                    w = np.exp(logw - logw.max())
                    w /= w.sum()
                    _, ET, mu, v, _ = last["inner"]
                return {"U": U, "Z": Z, "spacing": spacing, "frame": (c0, L0), "w": w, "mean": checked[0],
                        "cov": checked[1], "inner": (ET, mu, v), "grids": grids, "unheld": flat & wide}
            half *= _WIDEN
            n_inner = int(np.ceil(n_inner * _WIDEN))
            if f.size * n_inner * nodes**k > 4 * _MAX_EVALUATIONS:
                return None
        return None

    def _inner(self, xs: list[np.ndarray], grids: _OutputGrids, keep: bool = False) -> tuple:
        """Per hyperparameter node (``xs``, ``(T,)`` each) and instance, the log of the output's
        integral ``Z_g(t)`` ``(T, G)``, its conditional law's expected sufficient statistics
        ``(T, G, 2)``, the mean and variance of its unconstrained coordinate ``(T, G)``, and the
        share of its mass on the grid's two outer nodes each side ``(T, G)``; with ``keep``, also
        its normalised weights on the grid ``(T, G, n)`` and the pairs answered otherwise
        (their nodes and instances ``(P,)`` and weighted points ``(P, m)``), or None.

        A conditional law narrower than ``_INNER_SPACING`` spacings is integrated again on its
        own finer grid (:meth:`_refined`); one narrower than that too (a Laplace prior's spike at
        0 as its scale nears 0) is the prior's, the cavity nearly constant across it, so the
        prior's own draws weighted by the cavity integrate it (:meth:`_by_sampling`)."""
        f = self.factor
        u, h, log_cav, x_out, T_out = grids.u, grids.h, grids.log_cav, grids.x_out, grids.T_out
        G, n = u.shape
        T = xs[0].shape[0]
        logZ, ET = np.empty((T, G)), np.empty((T, G, 2))
        mu, var, edge = np.empty((T, G)), np.empty((T, G)), np.empty((T, G))
        kept = np.empty((T, G, n)) if keep else None
        step = max(1, _CHUNK // (G * n))
        y = x_out.reshape(1, G * n)
        for lo in range(0, T, step):
            t = slice(lo, min(T, lo + step))
            width = t.stop - t.start
            ins = self._inputs([x[t, None] for x in xs], lambda d: np.repeat(d, n)[None, :], (width, G * n))
            lp = np.asarray(f.logp(np.ascontiguousarray(np.broadcast_to(y, (width, G * n))), tuple(ins)),
                            dtype=float).reshape(width, G, n)
            logZ[t], ET[t], mu[t], var[t], edge[t], q = _reduce(lp + log_cav[None], u[None], h[None, :], T_out[None])
            if keep:
                kept[t] = q
        bad_t, bad_g = np.nonzero(~(np.sqrt(var) >= _INNER_SPACING * h[None, :]) | ~np.isfinite(logZ))
        points = None
        if bad_t.size:
            sub = [x[bad_t] for x in xs]
            fine = self._refined(sub, bad_g, mu[bad_t, bad_g], np.sqrt(var[bad_t, bad_g]), grids)
            fine, ok = list(fine[:6]), fine[6]
            if not ok.all():
                mc = self._by_sampling([x[~ok] for x in sub], bad_g[~ok], grids)
                for k in range(4):
                    fine[k][~ok] = mc[k]
                fine[4], fine[5] = _padded(fine[4], mc[4], ok), _padded(fine[5], mc[5], ok)
            logZ[bad_t, bad_g], ET[bad_t, bad_g], mu[bad_t, bad_g], var[bad_t, bad_g] = fine[:4]
            edge[bad_t, bad_g] = 0.0
            points = (bad_t, bad_g, fine[4], fine[5])
        return (logZ, ET, mu, var, edge) + (((kept, points),) if keep else ())

    def _inputs(self, shared: list[np.ndarray], data, shape: tuple) -> list[np.ndarray]:
        """The factor's inputs in order, each broadcast to ``shape``: the hyperparameters from
        ``shared`` (arrays that broadcast), each data input through ``data`` (its values per
        instance to an array that broadcasts)."""
        ins, j = [], 0
        for i, s in enumerate(self.factor.inputs):
            a = data(self._data[i]) if isinstance(s, DataSlot) else shared[j]
            j += not isinstance(s, DataSlot)
            ins.append(np.ascontiguousarray(np.broadcast_to(a, shape)))
        return ins

    def _refined(self, xs: list[np.ndarray], g: np.ndarray, centre: np.ndarray, sd: np.ndarray,
                 grids: _OutputGrids) -> tuple:
        """:meth:`_inner`'s answers for ``P`` pairs of hyperparameters ``xs`` and instances ``g``
        on a grid of their own, ``_FINE_NODES`` over the coarse answer's mean ``centre`` +-
        ``_FINE_HALF`` of its sds ``sd`` and two coarse spacings: ``(log Z, E[T], mean, var, u, weights, ok)``,
        ``ok`` where that grid resolves the law (``_INNER_SPACING`` of its spacings, at most
        ``_FINE_EDGE`` on its edge)."""
        f = self.factor
        fam = type(grids.cav_out)
        P, m = g.size, _FINE_NODES
        out = [np.full(P, -np.inf), np.zeros((P, 2)), np.zeros(P), np.zeros(P), np.zeros((P, m)), np.zeros((P, m)),
               np.zeros(P, bool)]
        usable = np.flatnonzero(np.isfinite(centre) & np.isfinite(sd))
        step = max(1, _CHUNK // m)
        for lo in range(0, usable.size, step):
            c = usable[lo:lo + step]
            half = _FINE_HALF * np.maximum(sd[c], 0.0) + 2.0 * grids.h[g[c]]
            u = centre[c, None] + half[:, None] * np.linspace(-1.0, 1.0, m)[None, :]
            h = 2.0 * half / (m - 1)
            with np.errstate(all="ignore"):
                log_cav = np.where(grids.flat[g[c], None], fam.log_abs_det_jacobian(u),
                                   grids.cav_out[g[c]].logpdf_unconstrained(u))
                ins = self._inputs([x[c, None] for x in xs], lambda d: d[g[c], None], u.shape)
                lp = np.asarray(f.logp(np.ascontiguousarray(fam.from_unconstrained(u)), tuple(ins)), dtype=float)
                log_z, ET, mu, var, edge, q = _reduce(lp + log_cav, u, h, fam.sufficient_statistics_unconstrained(u))
            ok = np.isfinite(log_z) & (np.sqrt(var) >= _INNER_SPACING * h) & (edge <= _FINE_EDGE)
            for k, a in enumerate((log_z, ET, mu, var, u, q, ok)):
                out[k][c] = a
        return tuple(out)

    def _by_sampling(self, xs: list[np.ndarray], g: np.ndarray, grids: _OutputGrids) -> tuple:
        """:meth:`_inner`'s answers for ``P`` pairs of hyperparameters ``xs`` (``(P,)`` each) and
        instances ``g`` from ``_SAMPLES`` draws of each output from the prior given them,
        weighted by the output's cavity: ``(log Z, E[T], mean, var, u, weights)``, the last
        two ``(P, M)``. The generator is seeded afresh on every call, so the answers are a
        function of their inputs, as a quadrature's are."""
        f = self.factor
        fam = type(grids.cav_out)
        rng = np.random.default_rng(self._seed)
        P, M = g.size, _SAMPLES
        log_z, ET, mu, var = np.empty(P), np.empty((P, 2)), np.empty(P), np.empty(P)
        us, ws = np.empty((P, M)), np.empty((P, M))
        step = max(1, _CHUNK // M)
        for lo in range(0, P, step):
            c = slice(lo, min(P, lo + step))
            width = c.stop - c.start
            ins = self._inputs([x[c][None, :] for x in xs], lambda d: d[g[c]][None, :], (M, width))
            with np.errstate(all="ignore"):
                x = np.asarray(f.sampler(tuple(ins), rng), dtype=float).reshape(M, width)
                u = fam.to_unconstrained(x)
                log_c = np.where(grids.flat[g[c]][None, :], 0.0, grids.cav_out[g[c]].logpdf(x))
            ok = np.isfinite(u) & np.isfinite(log_c)
            u = np.where(ok, u, 0.0).T
            # the draws as nodes of weight 1 / M each: the mean of the cavity's density over them
            log_z[c], ET[c], mu[c], var[c], _, ws[c] = _reduce(
                np.where(ok, log_c, -np.inf).T, u, np.full(width, 1.0 / M), fam.sufficient_statistics_unconstrained(u))
            us[c] = u
        return log_z, ET, mu, var, us, ws


def _inverse_cdfs(weights: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index drawn from each of ``weights``' rows named in ``rows`` (with repeats), in
    proportion to the row: every row's cdf offset by its number, so one sorted array holds
    them all and one search answers every draw."""
    R, m = weights.shape
    cdf = np.cumsum(weights, axis=1)
    cdf = cdf / np.where(cdf[:, -1:] > 0, cdf[:, -1:], 1.0)
    flat = (np.minimum(cdf, 1.0) + np.arange(R)[:, None]).ravel()
    at = np.searchsorted(flat, rows + rng.uniform(size=rows.size)) - rows * m
    return np.clip(at, 0, m - 1)


def _reduce(lp: np.ndarray, u: np.ndarray, h: np.ndarray, T: np.ndarray) -> tuple:
    """A law's log density ``lp`` at uniformly spaced nodes ``u`` (last axis; spacing ``h`` per
    row) to its log integral, expected sufficient statistics ``T`` (``(..., n, 2)``), mean
    and variance of ``u``, share of mass on the two outer nodes each side, and normalised
    weights; a row without mass has log integral ``-inf``."""
    lp = np.where(np.isnan(lp) | (lp == np.inf), -np.inf, lp)
    top = lp.max(axis=-1)
    safe = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(lp - safe[..., None])
    total = p.sum(axis=-1)
    with np.errstate(divide="ignore"):
        log_z = np.where(total > 0, np.log(total) + safe + np.log(h), -np.inf)
    q = p / np.where(total > 0, total, 1.0)[..., None]
    ET = np.einsum("...n,...nk->...k", q, np.broadcast_to(T, q.shape + (2,)))
    mu = np.sum(q * u, axis=-1)
    var = np.sum(q * (u - mu[..., None]) ** 2, axis=-1)
    edge = q[..., :2].sum(axis=-1) + q[..., -2:].sum(axis=-1)
    return log_z, ET, mu, var, edge, q


def _padded(a: np.ndarray, b: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Rows of ``a`` where ``ok``, else the next row of ``b``, both padded with zeros to one width."""
    width = max(a.shape[1], b.shape[1])
    out = np.zeros((ok.size, width))
    out[ok, :a.shape[1]] = a[ok]
    out[~ok, :b.shape[1]] = b
    return out
