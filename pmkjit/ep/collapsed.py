"""One site for a likelihood whose every instance reads the same few scalars.

EP gives each instance of a factor its own site and each latent its own message. Where
all ``N`` instances of a likelihood read the same two or three scalar latents (both
parameters of ``pm.NegativeBinomial(n=n, p=p)``, ``pm.Gamma(alpha, beta)``,
``pm.LogNormal(mu=log(A) + b * x, sigma=s)`` with data ``x``), the instances' tilted laws
are each a cavity times one observation's likelihood, and the correlation the
observations together put between the latents is lost twice over: once in each
instance's factorised projection, and again because no instance sees the others'
information. The posterior marginals then come out about as narrow as the conditionals
(robustness rounds 16-19: NegativeBinomial(n, p) 0.32 of NUTS's sds, BetaBinomial(a, b)
0.46, Rice 0.45-0.56, Kumaraswamy 0.58, the LogNormal above 0.46), converged and without a
sign in EP's own output.

Treated as one factor, the likelihood's tilted law is the factor's cavity (EP's marginal
of each latent less the sum of the factor's sites on it) times the whole likelihood,
``prod_n psi(y_n | theta, x_n)``, a law of two or three scalars; its moments are exact
integrals, by adaptive quadrature in 2-D (:class:`~pmkjit.operators.QuadratureOracle`) and
a Gauss-Hermite grid in 3-D (:class:`~pmkjit.operators.GridOracle`), in the latents'
unconstrained coordinates. Its projection onto each latent's family, divided by the
cavity, is the factor's site; each instance carries ``1/N`` of it, so the posterior is
assembled as for any factor. When this likelihood and the latents' priors make the whole
model, EP's marginals are then the exact marginals' projections; in larger models it is
EP with a coarser, strictly less approximate factorisation. The correlation itself is
still not in EP's factorised posterior (see :func:`pmkjit.diagnostics.posterior.warn_correlated_pairs`).

The integrals cost one evaluation of every instance's density per node, about what
``N`` separate two-dimensional quadratures cost, and EP converges in the few sweeps the
priors need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian
from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot, ElementSlot, LinearSlot
from pmkjit.operators.grid import GridOracle
from pmkjit.operators.oracle import project_beliefs
from pmkjit.operators.quadrature import QuadratureOracle

__all__ = ["CollapsedLikelihood", "collapsible"]

_MAX_LATENTS = 3  # adaptive quadrature up to two, the grid for three
_CHUNK = 2_000_000  # nodes x instances evaluated at once
_GRID_PASSES = 8  # frames the grid may move through before its last pass (the first sweep's cavity is the prior)
# nodes per axis of the two-latent fallback grid, (coarse, fine): a first grid finds the
# law's mode and extent, the second integrates
_WIDE_PASSES = ((61, 61), (121, 161))
_WIDE_HELD = 1e-14  # share of the mass below which the first grid's outer nodes are left out of the second
_WIDE_SDS = 14.0  # its coarse range: the cavity's mean +- this many of its sds (unconstrained)
_WIDE_EDGE = 1e-6  # most mass it may leave on its edge
_WIDE_RTOL = 5e-3  # agreement with every other node's grid, in tilted sds (the full grid errs about a quarter of that)
_MAX_REFUSED = 2  # sweeps in a row without a collapsed answer before the factor stays instance by instance
_DRAW_NODES = {2: 201, 3: 45}  # nodes per axis of the grids joint draws are made on
_MIN_DRAW_NODES = {2: 61, 3: 25}  # fewer per axis, where many distinct instances make a grid costly: no joint draws
_MAX_DRAW_EVALUATIONS = 1e8  # distinct instances x nodes of the grids of one law


def collapsible(f: BlackBoxFactor) -> bool:
    """Whether every instance of likelihood ``f`` reads the same two or three scalar latents.

    Element slots must name one element for all instances; linear slots must be multiples
    of one projection of the Gaussian block, with any offsets (``s_n * b + d_n``: data
    times a latent coefficient plus constants, :func:`_scales`). Data inputs may differ per
    instance. Factors
    with a semi-analytic, mixture or joint method keep it.
    """
    if (f.kind != "likelihood" or f.logp is None or f.density_source != "pymc" or f.observed is None
            or f.analytic is not None or f.mixture is not None or f.joint or f.from_prior or f.size < 2):
        return False
    latent = f.latent_inputs
    # one latent has no correlation to lose; its instance-by-instance sites stay
    if not 2 <= len(latent) <= _MAX_LATENTS:
        return False
    for i in latent:
        s = f.inputs[i]
        if isinstance(s, ElementSlot):
            idx = np.asarray(s.index).reshape(s.size, -1)
            if not np.all(idx == idx[0]):
                return False
        elif isinstance(s, LinearSlot):
            if _scales(s) is None:
                return False
        else:
            return False
    if len(latent) == 3 and not all(f.inputs[i].family in (Gaussian, Gamma, Beta) for i in latent):
        return False
    return True


def _scales(slot: LinearSlot) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(r, s, d)`` with ``eta_n = s_n * eta_r + d_n`` for every instance ``n`` of a linear
    slot whose rows are multiples of one row ``r`` (``b * x_n`` with data ``x``), else None."""
    A = np.asarray(slot.A, dtype=float).reshape(slot.size, -1)
    norms = np.einsum("ij,ij->i", A, A)
    r = int(np.argmax(norms))
    if not norms[r] > 0:
        return None
    s = A @ A[r] / norms[r]
    if np.abs(A - s[:, None] * A[r]).max() > 1e-12 * np.sqrt(norms[r]):
        return None
    c = np.broadcast_to(np.asarray(slot.c, dtype=float), (slot.size,))
    return r, s, c - s * c[r]


class CollapsedLikelihood:
    """The tilted moments of a whole likelihood of shared scalars (see the module docstring).

    Parameters
    ----------
    factor : BlackBoxFactor
        A likelihood for which :func:`collapsible` holds.
    per_instance : callable
        The factor's ordinary method (its oracle), used for a sweep in which the collapsed
        cavity is improper or the integral is refused.

    Attributes
    ----------
    n_integrals : int
        Integrals of the whole likelihood computed.
    n_per_instance_sweeps : int
        Sweeps answered instance by instance instead (set by the engine).
    n_calls, n_fallback : int
        Oracle answers in all (the integrals and the per-instance answers), and entries the
        per-instance oracle handed to importance sampling.
    """

    collapsed = True

    def __init__(self, factor: BlackBoxFactor, per_instance):
        if not collapsible(factor):
            raise ValueError(f"{factor.name}: not a likelihood of shared scalars ({factor.description})")
        self.factor = factor
        self.per_instance = per_instance
        self.n_integrals = 0
        self.n_per_instance_sweeps = 0
        self._refused = 0  # consecutive sweeps without a collapsed answer
        self._quadrature_refused = False
        f = factor
        # per latent input, for linear slots: the reference instance r and every instance's
        # input as s_n * eta_r + d_n (data times a latent coefficient, plus constants)
        self._linear = [_scales(f.inputs[i]) if isinstance(f.inputs[i], LinearSlot) else None
                        for i in f.latent_inputs]
        y = np.asarray(f.observed, dtype=float).reshape(f.size)
        data = {i: np.asarray(s.values, dtype=float).reshape(f.size)
                for i, s in enumerate(f.inputs) if isinstance(s, DataSlot)}
        # instances alike in everything they read (repeated counts, shared covariate values)
        # have one density: evaluate each distinct one once, weighted by its count
        columns = [y] + list(data.values()) + [a for lin in self._linear if lin is not None for a in lin[1:]]
        _, first, counts = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_counts=True)
        self._rows = first
        self._count = counts.astype(float)
        self._y = y[first]
        self._data = {i: v[first] for i, v in data.items()}

    @property
    def kind(self) -> str:
        kind = "collapsed quadrature" if len(self.factor.latent_inputs) <= 2 else "collapsed grid"
        if self.n_per_instance_sweeps:
            kind += f" ({self.n_per_instance_sweeps} sweeps instance by instance)"
        return kind

    @property
    def active(self) -> bool:
        """Whether to try the collapsed integral this sweep: not after ``_MAX_REFUSED``
        sweeps in a row without one (a law that neither quadrature nor the wide grid
        contains is answered instance by instance instead of failing every sweep)."""
        return self._refused < _MAX_REFUSED

    @property
    def n_calls(self) -> int:
        return self.n_integrals + getattr(self.per_instance, "n_calls", 0)

    @property
    def n_fallback(self) -> int:
        return getattr(self.per_instance, "n_fallback", 0)

    def __call__(self, messages):
        """Instance-by-instance answers (what EP asks of a factor it does not collapse)."""
        return self.per_instance(messages)

    # ------------------------------------------------------------------ EP update
    def sites(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """New per-instance sites ``[(N, 2) per latent]`` from the posterior ``marginals`` of
        the latent inputs (batches of ``N``) and the factor's current ``sites``; None where
        the collapsed cavity is improper or the integral is refused."""
        out = self._sites(marginals, sites)
        self._refused = 0 if out is not None else self._refused + 1
        return out

    def _sites(self, marginals, sites):
        f = self.factor
        found = self._cavities(marginals, sites)
        if found is None:
            return None
        cavities, ref = found
        self.n_integrals += 1
        if len(cavities) == 3:
            oracle = GridOracle(lambda xs, _rows: self._log_likelihood(xs), [type(c) for c in cavities],
                                max_passes=_GRID_PASSES)
            # the first frame: EP's marginals, near the tilted law once the factor has sites
            centre, var = _marginal_frames(marginals, ref)
            result = oracle(tuple(cavities), frame=(centre[None, :], np.sqrt(var)[None, :]))
            beliefs = result.beliefs if bool(np.asarray(result.accepted)[0]) else None
        else:
            # Adaptive quadrature, or for a law with a long flat side (Rice's nu towards 0
            # where the data leave it free, a truncated Normal's scale where its bounds hug
            # the data), which quadrature cannot contain at the peak's resolution, a product
            # grid fine around the peak and coarse over the cavity's range. Once quadrature
            # has refused, the wide grid goes first: a refusal costs its widest windows.
            quadrature = QuadratureOracle(lambda _y, xs: self._log_likelihood(xs), [type(c) for c in cavities],
                                          kind="density", observed=np.zeros(1))

            def by_quadrature():
                result = quadrature(tuple(cavities))
                if bool(np.asarray(result.accepted)[0]):
                    return result.beliefs
                self._quadrature_refused = True
                return None

            def by_wide_grid():
                return self._on_wide_grid(cavities, marginals, ref)

            order = (by_wide_grid, by_quadrature) if self._quadrature_refused else (by_quadrature, by_wide_grid)
            beliefs = order[0]() or order[1]()
        if beliefs is None:
            return None
        out = []
        for k, (b, cav) in enumerate(zip(beliefs, cavities)):
            delta = (np.asarray(b.natural, dtype=float) - np.asarray(cav.natural, dtype=float))[0]
            if not np.all(np.isfinite(delta)):
                return None
            if self._linear[k] is None:
                out.append(np.broadcast_to(delta / f.size, (f.size, 2)).copy())
                continue
            # shares of the site in eta_r proportional to s_n^2, each written on its eta_n (an
            # instance with s_n = 0 reads a constant and gets a site that adds nothing)
            _, sc, d = self._linear[k]
            S = np.sum(sc**2)
            out.append(np.stack([(delta[0] * sc - 2.0 * delta[1] * d) / S, np.full(f.size, delta[1] / S)], axis=1))
        return out

    def _on_wide_grid(self, cavities, marginals, ref) -> tuple | None:
        """Projected beliefs of a two-latent collapsed law on a non-uniform product grid, or None.

        Each axis (the latent's unconstrained coordinate) has coarse nodes over the cavity's
        mean +- ``_WIDE_SDS`` of its sds, and fine ones over EP's marginal mean +- 10 of its
        sds; trapezoid weights on the union (``_WIDE_PASSES`` gives the counts). A second,
        denser grid puts its fine nodes over +- 10 local sds around the first grid's mode
        (from the curvature there), where the peak is, whether EP's marginal is narrower
        (instance-by-instance sweeps) or wider than it. Refused where more than
        ``_WIDE_EDGE`` of the mass lies on the grid's edge, or where the grid of every other
        node on each axis gives tilted means or variances that differ by more than
        ``_WIDE_RTOL`` of the tilted sds (the peak is not resolved).
        """
        found = self._checked_wide_grid(cavities, marginals, ref)
        if found is None:
            return None
        _, _, stats = found
        beliefs, accepted = project_beliefs([type(c) for c in cavities], stats, np.ones(1, bool))
        return beliefs if accepted[0] else None

    def _checked_wide_grid(self, cavities, marginals, ref, priors=None) -> tuple | None:
        """``(axes, weights, statistics)`` of :meth:`_wide_grid` where it contains and resolves the law."""
        found = self._wide_grid(cavities, marginals, ref, priors)
        if found is None:
            return None
        axes, logw = found
        dens = np.exp(logw - logw.max())

        def moments(sub0, sub1):
            u0, u1 = axes[0][sub0], axes[1][sub1]
            w = dens[np.ix_(sub0, sub1)] * np.outer(_trapezoid(u0), _trapezoid(u1))
            w = w / w.sum()
            stats = np.full((2, 1, 3), np.nan)
            for k, (u, marginal) in enumerate(((u0, w.sum(axis=1)), (u1, w.sum(axis=0)))):
                stats[k, 0, :2] = marginal @ type(cavities[k]).sufficient_statistics_unconstrained(u)
                stats[k, 0, 2] = marginal @ (u - marginal @ u) ** 2  # central variance in u (= x if Gaussian)
            return w, stats

        w, stats = moments(*(np.arange(a.size) for a in axes))
        if not w[[0, -1], :].sum() + w[:, [0, -1]].sum() <= _WIDE_EDGE:
            return None
        # every other node of each axis, both ends kept: the same range, half the resolution
        half = [np.union1d(np.arange(0, a.size, 2), [a.size - 1]) for a in axes]
        w_h, stats_h = moments(*half)
        means = [w.sum(axis=1 - k) @ axes[k] for k in range(2)]
        means_h = [w_h.sum(axis=1 - k) @ axes[k][half[k]] for k in range(2)]
        if not (np.all(np.abs(np.subtract(means, means_h)) <= _WIDE_RTOL * np.sqrt(stats[:, 0, 2]))
                and np.all(np.abs(np.log(stats_h[:, 0, 2] / stats[:, 0, 2])) <= 2 * _WIDE_RTOL)):
            return None
        return axes, w, stats

    def _draws_on_wide_grid(self, cavities, marginals, ref, n, rng, priors=None) -> list[np.ndarray] | None:
        """Two-latent joint draws: a cell of :meth:`_wide_grid` picked by its mass, a point in it
        uniformly (cells run halfway to the neighbouring nodes); None where that grid does not
        contain or resolve the law (:meth:`_checked_wide_grid`)."""
        found = self._checked_wide_grid(cavities, marginals, ref, priors)
        if found is None:
            return None
        axes, w, _ = found
        pick = np.unravel_index(rng.choice(w.size, size=n, p=w.ravel()), w.shape)
        out = []
        for k, (u, c) in enumerate(zip(axes, cavities)):
            mid = np.concatenate([[u[0]], 0.5 * (u[1:] + u[:-1]), [u[-1]]])  # cell edges
            i = pick[k]
            out.append(type(c).from_unconstrained(rng.uniform(mid[i], mid[i + 1])))
        return out

    def _wide_grid(self, cavities, marginals, ref, priors=None) -> tuple[list[np.ndarray], np.ndarray] | None:
        """The axes of :meth:`_on_wide_grid`'s second grid and the law's log density on it;
        None where the two grids would cost more than ``_MAX_DRAW_EVALUATIONS`` evaluations."""
        if sum((a + b) ** 2 for a, b in _WIDE_PASSES) * self._rows.size > _MAX_DRAW_EVALUATIONS:
            return None
        ranges, fine = [], []
        for c, qm, qv in zip(cavities, *_marginal_frames(marginals, ref)):
            cm, cv = (float(np.asarray(a)[0]) for a in c.unconstrained_moments())
            if not (np.isfinite([cm, cv, qm, qv]).all() and cv > 0 and qv > 0):
                return None
            ranges.append((cm - _WIDE_SDS * np.sqrt(cv), cm + _WIDE_SDS * np.sqrt(cv)))
            fine.append((qm, np.sqrt(qv)))
        for n_coarse, n_fine in _WIDE_PASSES:
            axes = [np.union1d(np.linspace(lo, hi, n_coarse), np.linspace(m - 10.0 * sd, m + 10.0 * sd, n_fine))
                    for (lo, hi), (m, sd) in zip(ranges, fine)]
            logw = self._log_law(cavities, axes, priors)
            if logw is None:
                return None
            mode = np.unravel_index(np.argmax(logw), logw.shape)
            fine = [(axes[k][mode[k]], _local_sd(axes[k], np.take(logw, mode[1 - k], axis=1 - k), mode[k])
                     or fine[k][1]) for k in range(2)]
            # the next grid's coarse nodes span only where the law has mass (from the
            # cavity's +- _WIDE_SDS sds, mostly empty, down to the law's own extent), one node beyond
            w = np.exp(logw - logw.max()) * np.outer(_trapezoid(axes[0]), _trapezoid(axes[1]))
            for k in range(2):
                held = np.flatnonzero(w.sum(axis=1 - k) > _WIDE_HELD * w.sum())
                ranges[k] = (axes[k][max(held[0] - 1, 0)], axes[k][min(held[-1] + 1, axes[k].size - 1)])
        return axes, logw

    def _log_law(self, cavities, axes, priors=None) -> np.ndarray | None:
        """Log density (unnormalised) of the collapsed law on the product of ``axes`` (unconstrained)."""
        U = np.meshgrid(*axes, indexing="ij")
        logw = self._log_law_at(cavities, [u.ravel() for u in U], priors)
        return None if logw is None else logw.reshape(U[0].shape)

    def _log_law_at(self, cavities, us: Sequence[np.ndarray], priors=None) -> np.ndarray | None:
        """Log density (unnormalised) of the collapsed law at points ``us`` (one unconstrained
        coordinate array per latent); ``-inf`` where it cannot be evaluated, None if nowhere."""
        with np.errstate(all="ignore"):
            logw = _log_cavities(cavities, us, priors)
            logw = logw + self._log_likelihood([type(c).from_unconstrained(u) for c, u in zip(cavities, us)])
        logw = np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)
        return logw if np.isfinite(logw.max()) else None

    def _cavities(self, marginals, sites) -> tuple[list[ExponentialFamily], list[int]] | None:
        """The collapsed cavity of each latent (its marginal less the factor's summed sites, a
        batch of one) and the reference instance of each; None where one is improper."""
        cavities, ref = [], []
        for k, (m, site) in enumerate(zip(marginals, sites)):
            site = np.asarray(site, dtype=float)
            r = 0
            if self._linear[k] is not None:
                # instance n's Gaussian site on eta_n = s_n eta_r + d_n, written in eta_r
                r, sc, d = self._linear[k]
                site = np.stack([sc * (site[:, 0] + 2.0 * site[:, 1] * d), site[:, 1] * sc**2], axis=1)
            cav = type(m).from_natural(np.asarray(m.natural[r:r + 1], dtype=float) - site.sum(axis=0))
            if not np.all(cav.is_proper()):
                return None
            cavities.append(cav)
            ref.append(r)
        return cavities, ref

    # ------------------------------------------------------------------ draws
    def joint_draws(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray], n: int,
                    rng: np.random.Generator, priors: Sequence | None = None) -> list[np.ndarray] | None:
        """``n`` joint draws of the latents (each as instance ``r``'s input, ``(n,)`` per latent)
        from the collapsed law, cavity times the whole likelihood, or None.

        EP's marginals of the latents are that law's projections, but its posterior draws are
        independent; these keep the correlation the likelihood puts between them. A grid
        over 6.5 of the law's sds each way in its own (rotated) frame, found by a first grid
        in the frame of EP's marginals; each draw is a node picked by weight, jittered
        uniformly within its cell. Where the law is not contained in either grid (more than
        1e-6 of its mass on an edge: a long flat side), two latents are drawn from the
        non-uniform grid of :meth:`_on_wide_grid` instead. None where a cavity is improper,
        no grid contains the law, or a grid would cost more than
        ``_MAX_DRAW_EVALUATIONS`` density evaluations.

        ``priors``: per latent, None or ``(site, log_density)``, a prior factor of the latent
        whose EP site (natural parameters) is replaced in the cavity by its exact density
        (of the latent's value): the tail of a flat likelihood is the prior's, which the
        site's family may not have (a Gamma site of a HalfNormal scale: draws of a truncated
        Normal's scale with 1.2-1.26 times the exact sd).
        """
        found = self._cavities(marginals, sites)
        if found is None:
            return None
        cavities, ref = found
        m = len(cavities)
        draws = self._draws_on_rotated_grid(cavities, marginals, ref, n, rng, priors)
        if draws is None and m == 2:
            draws = self._draws_on_wide_grid(cavities, marginals, ref, n, rng, priors)
        return draws

    def _draws_on_rotated_grid(self, cavities, marginals, ref, n, rng, priors=None) -> list[np.ndarray] | None:
        """Joint draws on a uniform grid in the law's own frame (see :meth:`joint_draws`)."""
        m = len(cavities)
        # two passes of nodes**m nodes, each costing one density per distinct instance
        nodes = min(_DRAW_NODES[m], int((_MAX_DRAW_EVALUATIONS / (2 * self._rows.size)) ** (1.0 / m)))
        if nodes < _MIN_DRAW_NODES[m]:
            return None
        nodes += 1 - nodes % 2  # odd: a node at the frame's centre
        centre, var = _marginal_frames(marginals, ref)
        L = np.diag(np.sqrt(var))
        for half in (8.0, 6.5):  # EP's frame, then the law's own
            z1 = np.linspace(-half, half, nodes)
            Z = np.stack(np.meshgrid(*([z1] * m), indexing="ij"), axis=-1).reshape(-1, m)
            U = centre + Z @ L.T
            logw = self._log_law_at(cavities, list(U.T), priors)
            if logw is None:
                return None
            w = np.exp(logw - logw.max())
            w /= w.sum()
            on_edge = np.any(np.abs(Z) >= half - 1e-9, axis=1)
            if w[on_edge].sum() > 1e-6:
                return None
            mean = w @ U
            D = U - mean
            cov = (D * w[:, None]).T @ D
            try:
                L_next = np.linalg.cholesky(cov)
            except np.linalg.LinAlgError:
                return None
            if half == 8.0:
                centre, L = mean, L_next
        pick = rng.choice(w.size, size=n, p=w)
        spacing = z1[1] - z1[0]
        Zs = Z[pick] + rng.uniform(-0.5 * spacing, 0.5 * spacing, size=(n, m))
        Us = centre + Zs @ L.T
        return [type(c).from_unconstrained(Us[:, k]) for k, c in enumerate(cavities)]

    def _log_likelihood(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        """``sum_n log psi(y_n | x, data_n)`` at nodes ``xs`` (arrays of one shape), in chunks of instances."""
        f = self.factor
        shape = np.shape(xs[0])
        G = int(np.prod(shape, dtype=int))
        flat = [np.asarray(x, dtype=float).reshape(G) for x in xs]
        total = np.zeros(G)
        step = max(1, _CHUNK // max(G, 1))
        n_distinct = self._rows.size
        for lo in range(0, n_distinct, step):
            n = slice(lo, min(n_distinct, lo + step))
            rows = self._rows[n]
            width = n.stop - n.start
            ins, j = [], 0
            for i in range(len(f.inputs)):
                if i in self._data:
                    ins.append(np.ascontiguousarray(np.broadcast_to(self._data[i][n], (G, width))))
                    continue
                x = flat[j][:, None]
                if self._linear[j] is None:
                    ins.append(np.ascontiguousarray(np.broadcast_to(x, (G, width))))
                else:
                    _, sc, d = self._linear[j]
                    ins.append(sc[None, rows] * x + d[None, rows])
                j += 1
            y = np.ascontiguousarray(np.broadcast_to(self._y[n], (G, width)))
            total += np.asarray(f.logp(y, tuple(ins)), dtype=float) @ self._count[n]
        return total.reshape(shape)


def draw_jointly(graph, state, methods: dict[int, CollapsedLikelihood], elements: dict[str, np.ndarray],
                 theta: np.ndarray | None, rng: np.random.Generator, *, fixed: frozenset[str] = frozenset()) -> set[int]:
    """Replace EP's independent draws of each collapsed factor's latents by joint ones.

    ``elements`` (``(n, size)`` per element variable) and ``theta`` (``(n, D)``) are EP's
    draws, changed in place; ``methods`` maps factor indices to their collapsed methods.
    A factor's latents are drawn jointly from its collapsed law
    (:meth:`CollapsedLikelihood.joint_draws`) where that leaves the rest of the draws
    coherent: each latent is an element of an element variable, or a coordinate of the
    Gaussian block that EP's posterior leaves uncorrelated with every other; none is in
    ``fixed`` (variables drawn given others, :mod:`pmkjit.ep.conditional`) or read by
    another collapsed factor drawn so. Returns the indices of the factors drawn jointly.
    """
    from scipy.linalg import cho_solve

    from pmkjit.ep.engine import _marginals

    done: set[int] = set()
    taken: set[tuple[str, int]] = set()
    n = len(next(iter(elements.values()))) if elements else (0 if theta is None else theta.shape[0])
    for fi, method in methods.items():
        f = graph.factors[fi]
        marg = _marginals(graph, None, state, f)
        marginals = [marg[i] for i in f.targets]
        places = []
        for k, i in enumerate(f.latent_inputs):
            s = f.inputs[i]
            if isinstance(s, ElementSlot):
                if s.variable in fixed:
                    break
                places.append((s.variable, int(np.asarray(s.index).reshape(s.size, -1)[0, 0]), 1.0, 0.0))
                continue
            r = method._linear[k][0]
            row = np.asarray(s.A, dtype=float).reshape(s.size, -1)[r]
            (j,) = np.flatnonzero(row)[:1] if np.count_nonzero(row) == 1 else (None,)
            if j is None or theta is None or "theta" in fixed:
                break
            e = np.zeros(row.size)
            e[j] = 1.0
            col = cho_solve((state.chol, True), e)
            others = np.delete(np.abs(col), j)
            if others.size and others.max() > 1e-9 * np.sqrt(col[j] * np.max(np.abs(col))):
                break  # coupled to other coordinates: replacing it would break the joint Gaussian
            c = float(np.broadcast_to(np.asarray(s.c, dtype=float), (s.size,))[r])
            places.append(("theta", int(j), float(row[j]), c))
        else:
            keys = {(p[0], p[1]) for p in places}
            if len(keys) < len(places) or keys & taken:
                continue
            draws = method.joint_draws(marginals, state.sites[fi], n, rng, _exact_priors(graph, state, f))
            if draws is None:
                continue
            for (name, j, a, c), x in zip(places, draws):
                if name == "theta":
                    theta[:, j] = (x - c) / a
                else:
                    elements[name][:, j] = x
            taken |= keys
            done.add(fi)
    return done


def _marginal_frames(marginals, ref) -> tuple[np.ndarray, np.ndarray]:
    """EP's marginal of each latent (at its reference instance) as mean and variance of its
    unconstrained coordinate: where the collapsed law's grids are first placed."""
    mom = np.array([np.asarray(m[r:r + 1].unconstrained_moments(), dtype=float)[:, 0]
                    for m, r in zip(marginals, ref)])
    return mom[:, 0], mom[:, 1]


def _trapezoid(u: np.ndarray) -> np.ndarray:
    """Trapezoid weights of sorted, possibly unevenly spaced nodes ``u``."""
    h = np.diff(u)
    w = np.zeros(u.size)
    w[:-1] += 0.5 * h
    w[1:] += 0.5 * h
    return w


def _local_sd(u: np.ndarray, logw: np.ndarray, i: int) -> float | None:
    """``1 / sqrt(-d2 logw / du2)`` at node ``i`` of unevenly spaced ``u`` (three-point), or None."""
    if not 0 < i < u.size - 1:
        return None
    h0, h1 = u[i] - u[i - 1], u[i + 1] - u[i]
    d2 = 2.0 * (h0 * logw[i + 1] - (h0 + h1) * logw[i] + h1 * logw[i - 1]) / (h0 * h1 * (h0 + h1))
    return float(1.0 / np.sqrt(-d2)) if np.isfinite(d2) and d2 < 0 else None


def _log_cavities(cavities, us: Sequence[np.ndarray], priors=None) -> np.ndarray:
    """``sum_k log cavity_k(u_k)`` in unconstrained coordinates, a prior site replaced by the
    prior's exact density where ``priors[k]`` is ``(site, log_density)``:
    ``cavity(u) / exp(site . T(x)) * prior(x)``, the Jacobian staying the cavity's."""
    total = 0.0
    for k, (c, u) in enumerate(zip(cavities, us)):
        term = c.logpdf_unconstrained(u[None, :])[0]
        if priors is not None and priors[k] is not None:
            site, log_density = priors[k]
            fam = type(c)
            term = term - fam.sufficient_statistics_unconstrained(u) @ site + log_density(fam.from_unconstrained(u))
        total = total + term
    return total


def _exact_priors(graph, state, f: BlackBoxFactor) -> list | None:
    """Per latent input of ``f``: ``(site, log_density)`` of the black-box prior factor of that
    element with constant parameters (:meth:`CollapsedLikelihood.joint_draws`), or None."""
    out = []
    for i in f.latent_inputs:
        s = f.inputs[i]
        found = None
        if isinstance(s, ElementSlot):
            element = int(np.asarray(s.index).reshape(s.size, -1)[0, 0])
            for gi, g in enumerate(graph.factors):
                if (g.kind != "prior" or g.latent_inputs or g.logp is None or not isinstance(g.output, ElementSlot)
                        or g.output.variable != s.variable):
                    continue
                hits = np.flatnonzero(np.asarray(g.output.index).reshape(g.size, -1)[:, 0] == element)
                if hits.size != 1:
                    continue
                j = int(hits[0])
                values = [np.asarray(d.values, dtype=float).reshape(g.size)[j] for d in g.inputs]

                def log_density(x, _g=g, _v=values):
                    x = np.asarray(x, dtype=float).reshape(-1, 1)
                    ins = tuple(np.full_like(x, v) for v in _v)
                    return np.asarray(_g.logp(x, ins), dtype=float).reshape(-1)

                found = (np.asarray(state.sites[gi][0][j], dtype=float), log_density)
                break
        out.append(found)
    return out if any(p is not None for p in out) else None
