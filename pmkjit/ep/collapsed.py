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
``prod_n psi(y_n | theta, x_n)``, a law of two to five scalars; its moments are exact
integrals, by adaptive quadrature in 2-D (:class:`~pmkjit.operators.QuadratureOracle`) and
a Gauss-Hermite grid in 3-D (:class:`~pmkjit.operators.GridOracle`) and a uniform grid in
the law's own rotated frame in 4-D and 5-D (:func:`rotated_grid`: a growth or dose-response
curve's correlated level, rate, midpoint and noise), in the latents' unconstrained coordinates. Its projection onto each latent's family, divided by the
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
from numpy.polynomial.hermite_e import hermegauss
from scipy import linalg

from pmkjit.families import Beta, ExponentialFamily, Gamma, Gaussian
from pmkjit.ep.joint import joint_site, slot_sites
from pmkjit.graph.factor_graph import (FEW_INSTANCES, MAX_PREDICTOR_RANK, BlackBoxFactor, DataSlot, ElementSlot,
                                      LinearSlot, pair_slots)
from pmkjit.operators.grid import GridOracle
from pmkjit.operators.oracle import project_beliefs
from pmkjit.operators.quadrature import QuadratureOracle

__all__ = ["CollapsedLikelihood", "collapsible", "integrates_gaussian_inputs", "order_constraints",
           "pair_shared_scalars"]

_MAX_LATENTS = 3  # adaptive quadrature up to two, the grid for three
_MAX_REGRESSION_DIMS = MAX_PREDICTOR_RANK  # a regression's predictor (two or three coordinates) and its elements, on the rotated grid
_MAX_ROTATED_ELEMENTS = 5  # shared scalars on the rotated grid (a dose-response curve's four and its noise)
_CHUNK = 2_000_000  # nodes x instances evaluated at once
# observations of a likelihood whose density joins another law's draws (_joint_priors): each
# costs one density per node of that law's grid
_MAX_JOINT_INSTANCES = 500
_GRID_PASSES = 8  # frames the grid may move through before its last pass (the first sweep's cavity is the prior)
# nodes per axis of the two-latent fallback grid, (coarse, fine): a first grid finds the
# law's mode and extent, the second integrates
_WIDE_PASSES = ((61, 61), (121, 161))
_WIDE_HELD = 1e-14  # share of the mass below which the first grid's outer nodes are left out of the second
_WIDE_SDS = 14.0  # its coarse range: the cavity's mean +- this many of its sds (unconstrained)
_WIDE_EDGE = 1e-6  # most mass it may leave on its edge
_WIDE_RTOL = 5e-3  # agreement with every other node's grid, in tilted sds (the full grid errs about a quarter of that)
_MAX_REFUSED = 2  # sweeps in a row without a collapsed answer before the factor stays instance by instance
_ROTATED_PASSES = 10  # grids placed before the law's own frame is found, or none is
_MIN_RESOLVED_NODES = 20.0  # effective nodes below which a grid zooms in on its heaviest node
_ZOOM = 0.3  # its shrinking of the frame per pass
# most difference of the grid of every other node from the rotated grid's answer: means in
# sds, log variances. The trapezoid rule on a uniform grid converges exponentially for a
# smooth law inside its range (error ~ exp(-c / h**2)), so halving the spacing takes an error
# e to about e**4: 0.1 sds and 20% on the coarse grid mean about 1e-4 and 2e-3 on the fine
# one (a Gamma regression's law in four coordinates: 2% of variance at 1.6 sds of spacing;
# a Student-t regression's with a latent nu: 0.06 sds of mean). A law with kinks (a Laplace
# likelihood's at every observation) converges as h**2 only: 0.1 sds become 0.025. The
# wide grid's non-uniform trapezoid converges as h**2 too and keeps _WIDE_RTOL.
_ROTATED_CHECK = (0.1, 0.2)
_MAX_REGRESSION_EVALUATIONS = 1e8  # instances x least nodes of a regression's collapsed law
# most mass on the rotated grid's edge: beyond 6.5 sds it moves a variance by about that times
# 6.5**2, and it is invisible in thousands of draws (a Student-t regression's latent nu left
# 1.7e-6 there, its Gamma(2, 0.1) prior's long tail)
_ROTATED_EDGE = 1e-5
# four or five element coordinates: a dose-response curve's law left 1e-6 to 1e-5 on most of
# the cube's ten faces once its one long tail was held, and widening them all cost more than
# the budget; a two-component mixture's law (a weight through invlogit, ordered means, one
# scale) has a component that explains no data, its mean free under its prior, 4e-6 on
# each of three faces at 17 sds. 5e-5 on the edge moves a variance by about 2e-3.
_ROTATED_EDGE_ELEMENTS = 5e-5
_WIDEN = 1.6  # growth of a grid's range (at the same spacing) around a law with mass on its edge
# nodes per axis of the rotated grid of a regression's site, by coordinates: (at most, at least)
# (spacing 0.5 of the law's sds at 27, 0.72 at 19; the grid of every other node, which checks
# the answer, needs a spacing of at most about 1.6 sds)
_SITE_NODES = {1: (201, 101), 2: (61, 41), 3: (27, 21), 4: (19, 17), 5: (15, 13)}
_MAX_SITE_EVALUATIONS = 2e7  # distinct instances x nodes of one pass of it (a refused law costs up to 10 of them)
_FACE_ROOM = 4.0  # growth of that pass's grid allowed along the faces a long tail crosses
_DRAW_NODES = {1: 2001, 2: 201, 3: 45, 4: 21, 5: 15}  # nodes per axis of the grids joint draws are made on
_MIN_DRAW_NODES = {1: 401, 2: 61, 3: 25, 4: 15, 5: 11}  # fewer per axis, where many distinct instances make a grid costly: no joint draws
_MAX_DRAW_EVALUATIONS = 1e8  # distinct instances x nodes of the grids of one law
# the name of the Gaussian block's coordinates among joint draws' places (a tuple: no PyMC
# variable's name, as "theta" is the pumps' rates' and was taken for the block's)
BLOCK = ("gaussian block",)
# A regression of more coordinates than the rotated grid takes (three or more predictors, or
# many observations) is integrated by nested Laplace instead (:meth:`_laplace_grid`): its one
# or two element latents on a rotated grid, the predictor's coefficients given them by a
# Gaussian at their conditional mode.
_MAX_LAPLACE_RANK = 12  # coordinates of the predictor (its site's split has k (k + 1) / 2 entries)
_MAX_LAPLACE_ELEMENTS = 2
# nodes per axis of the elements' grid (spacings 0.33 and 0.54 of the law's sds over +-6.5,
# where the trapezoid rule's error on a Gaussian is below 1e-15), and the effective nodes
# below which it zooms in (a Gaussian law has 11 and 43)
_LAPLACE_NODES = {1: 41, 2: 25}
_LAPLACE_RESOLVED = {1: 8.0, 2: 20.0}
_LAPLACE_BUDGET = {1: 400, 2: 4000}  # most nodes it may widen to
_NEWTON_STEPS = 50
_NEWTON_TOL = 1e-10  # Newton decrement (log density) at which a conditional mode is found
# the decrement below which a search that can no longer ascend (the central differences'
# round-off: their gradient carries about 1e-8 of each instance's log density) is at the
# mode: 1e-3 of a conditional sd from it
_STALLED_TOL = 1e-6
_LEAST_CURVATURE = 1e-3  # least eigenvalue a Newton step's Hessian is shifted to where it is not positive
_FD_STEP = 1e-4  # relative step of the central differences of each instance's log density
_MAX_CUBATURE_EVALUATIONS = 5e7  # distinct instances x nodes x points of the correction's cubature


def collapsible(f: BlackBoxFactor) -> bool:
    """Whether every instance of likelihood ``f`` reads the same two to five scalar latents (four
    or five on the rotated grid, where affordable), or more where a Normal's Gaussian ones
    integrate out (:func:`integrates_gaussian_inputs`).

    Element slots must name one element for all instances; linear slots must be multiples
    of one projection of the Gaussian block, with any offsets (``s_n * b + d_n``: data
    times a latent coefficient plus constants, :func:`_scales`), or, beside element
    latents, one regression's linear predictor ``a + b * x_n`` whose rows span two
    coordinates of the block (:func:`_basis`). Data inputs may differ per instance.
    Factors with a semi-analytic, mixture or joint method keep it.
    """
    return _layout(f) is not None


def on_rotated_elements(f: BlackBoxFactor) -> bool:
    """Whether likelihood ``f`` is collapsible as a law of four or five element scalars on the
    rotated grid (:meth:`CollapsedLikelihood._beliefs_on_rotated_grid`)."""
    layout = _layout(f)
    return layout is not None and layout[1] is None and layout[2] is None and sum(
        1 if b is None else b[0].size for b in layout[0]) >= 4


def integrates_gaussian_inputs(f: BlackBoxFactor) -> bool:
    """Whether likelihood ``f`` is collapsible with its Gaussian inputs integrated out in closed
    form (:class:`pmkjit.ep.collapsed_linear.CollapsedLinearNormal`): a Normal likelihood of
    four or more shared scalars whose mean is affine in the Gaussian ones given one to three
    others (:mod:`pmkjit.graph.linear_normal`)."""
    layout = _layout(f)
    return layout is not None and layout[2] == "gaussian inputs"


def _layout(f: BlackBoxFactor) -> tuple[list, int | None, str | None] | None:
    """Per latent input of ``f``, None (an element) or the basis ``(R, C, d)`` of a linear
    slot; the position of the one regression slot (rank two or more) if any, and how its law
    is integrated (``"grid"``, the rotated grid, or ``"laplace"``, nested Laplace), or
    ``"gaussian inputs"`` for a Normal's scalars of which the Gaussian ones integrate out in
    closed form; None where ``f`` is not collapsible."""
    if (f.kind != "likelihood" or f.logp is None or f.density_source != "pymc" or f.observed is None
            or f.analytic is not None or f.mixture is not None or f.joint or f.from_prior):
        return None
    latent = f.latent_inputs
    # One latent has no correlation to lose, but its instance-by-instance sites still
    # project each observation's tilted law alone: on one scale read by 40 observations
    # (pm.HalfNormal("y", s, observed=y)) EP's sd was 0.96 of the exact one. Collapsed, a
    # shared scalar's site is the exact projection, at the cost of one 1-D quadrature over
    # all instances. A regression's predictor alone (two or more coordinates: the README's
    # logistic regression) keeps its operator; one coordinate (b * x_n + d_n) is a scalar too.
    # A small one is one site: its instances are answered directly anyway, and few
    # observations leave a law far from Gaussian, whose exact draws a Gaussian's miss (the
    # bioassay's four doses: the dose-response curve's sds near 0 and 1, 2.2-2.7 times NUTS's)
    if not latent:
        return None
    alone = len(latent) == 1 and isinstance(f.inputs[latent[0]], LinearSlot) and _scales(f.inputs[latent[0]]) is None
    if alone and f.size >= FEW_INSTANCES:
        return None
    bases, block = [], None
    for k, i in enumerate(latent):
        s = f.inputs[i]
        if isinstance(s, ElementSlot):
            idx = np.asarray(s.index).reshape(s.size, -1)
            if not np.all(idx == idx[0]):
                return None
            bases.append(None)
        elif isinstance(s, LinearSlot):
            basis = _basis(s, _MAX_LAPLACE_RANK)
            if basis is None:
                return None
            if basis[0].size > 1:
                if block is not None:
                    return None
                block = k
            bases.append(basis)
        else:
            return None
    dims = sum(1 if b is None else b[0].size for b in bases)
    gridded = all(f.inputs[i].family in (Gaussian, Gamma, Beta) for i in latent)  # families the grids take
    if block is None:
        if dims <= _MAX_LATENTS and (dims < 3 or gridded):
            return bases, None, None
        # four or five scalars none of which is Gaussian and affine in the mean (a growth
        # curve's positive level, rate and noise beside its midpoint): the rotated grid, where affordable
        if (dims <= _MAX_ROTATED_ELEMENTS and not _integrable(f) and gridded
                and _SITE_NODES[dims][1] ** dims * f.size <= _MAX_REGRESSION_EVALUATIONS):
            return bases, None, None
        # more scalars than the grid takes, where the Gaussian ones integrate out in closed
        # form given the others (pmkjit.ep.collapsed_linear)
        return (bases, None, "gaussian inputs") if _integrable(f) else None
    # a group's effect (each instance reads one coordinate of the slot: A[g] * exp(-k * t)) or
    # a regression's predictor whose site the instances' sites can hold (a + b * x + f, an
    # HSGP beside a trend) beside shared scalars, the Gaussian ones integrated out in closed form
    C = bases[block][1]
    if latent[block] in (f.linear_normal.linear if f.linear_normal is not None else ()) and \
            (np.all(np.count_nonzero(C, axis=1) == 1) or _split(C) is not None) and _integrable(f):
        return bases, block, "gaussian inputs"
    if not gridded:
        return None
    # the regression's coefficients beside elements only (another linear slot's
    # coordinates would be correlated with them a priori), and its site must be
    # expressible as the instances' sites on their own predictors (:func:`_split`)
    if any(b is not None for k, b in enumerate(bases) if k != block):
        return None
    if _split(bases[block][1]) is None:
        return None
    # the rotated grid where it is affordable: beyond, each pass would cost more than the
    # whole instance-by-instance sweep it replaces (N = 10,800 with three coordinates,
    # 1,190 with four); nested Laplace for more coordinates or instances
    if dims <= _MAX_REGRESSION_DIMS and _SITE_NODES[dims][1] ** dims * f.size <= _MAX_REGRESSION_EVALUATIONS:
        return bases, block, "grid"
    if alone:
        return None  # nested Laplace would approximate the very law that was to be exact
    if dims - bases[block][0].size <= _MAX_LAPLACE_ELEMENTS:
        return bases, block, "laplace"
    return None


def order_constraints(f: BlackBoxFactor, graph) -> list[tuple[int, float, float, int, float, float]] | None:
    """The order among the latent inputs of ``f`` that read entries of one ordered vector of
    ``graph`` (``transform=ordered``, a mixture's means): ``(k, a, c, l, b, e)`` for inputs
    ``k`` and ``l`` whose reference instances read ``x_k = a mu_i + c`` and ``x_l = b mu_j +
    e`` with ``i < j``, so the law is zero where ``(x_k - c) / a >= (x_l - e) / b``; None
    where two inputs read one such vector otherwise (a sum of its entries, or an entry
    beside other coordinates), which the law's coordinates cannot express, or where the law
    with its order is one the rotated grid does not hold (five coordinates): the factor then
    stays instance by instance.

    The order is a factor of its own (:mod:`pmkjit.ep.truncation`), so without it the
    likelihood's law is symmetric in a mixture's means, with two modes: a rotated grid around
    one of them was refused in every sweep, and instance by instance EP left a two-component
    mixture's sds at 0.45-0.55 of NUTS's, unwarned (robustness round 40). Its indicator
    within the law is exact: the product with the order factor is the same posterior."""
    latent = f.latent_inputs
    found = []
    for name in graph.ordered:
        v = graph.variables.get(name)
        if v is None or not v.in_gaussian_block:
            continue
        entries = slice(v.offset, v.offset + v.size)
        reads = []
        for k, i in enumerate(latent):
            s = f.inputs[i]
            if not isinstance(s, LinearSlot):
                continue
            A = np.asarray(s.A, dtype=float).reshape(s.size, -1)
            if not np.any(A[:, entries]):
                continue
            scales = _scales(s)
            if scales is None:
                reads.append(None)
                continue
            r = scales[0]
            row = A[r]
            (nonzero,) = np.nonzero(row)
            inside = nonzero[(nonzero >= entries.start) & (nonzero < entries.stop)]
            c = float(np.broadcast_to(np.asarray(s.c, dtype=float), (s.size,))[r])
            reads.append((k, int(inside[0]) - entries.start, float(row[inside[0]]), c)
                         if nonzero.size == 1 else None)
        if len(reads) < 2:
            continue
        if any(read is None for read in reads):
            return None
        found += [(k, a, c, l, b, e) for (k, i, a, c) in reads for (l, j, b, e) in reads if i < j]
    # Five coordinates with an order: a two-component mixture with a scale per component has
    # a law its 13 nodes per axis do not resolve (the grid of every other node's variances
    # 25-30% below the grid's, in every sweep), so each sweep's refused grids cost 62 s where
    # the instances' own sites, as accurate there, take 11 s (robustness round 41)
    if found and on_rotated_elements(f) and len(latent) == _MAX_ROTATED_ELEMENTS:
        return None
    return found


def _integrable(f: BlackBoxFactor) -> bool:
    """Whether a Normal likelihood's Gaussian inputs integrate out in closed form with the rest
    (one to four scalars) on the rotated grid at an affordable cost (one evaluation of the
    mean and sd, and one of the mean per Gaussian input, per node and instance)."""
    spec = f.linear_normal
    r = 0 if spec is None else len(spec.rest)
    return spec is not None and r <= _MAX_REGRESSION_DIMS and (
        _SITE_NODES[r][1] ** r * f.size * (len(spec.linear) + 1) <= _MAX_REGRESSION_EVALUATIONS)


def _basis(slot: LinearSlot, max_rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(R, C, d)`` with ``eta_n = C_n . eta_R + d_n`` for every instance ``n`` of a linear slot:
    ``R`` the reference instances whose rows span the slot's rows (at most ``max_rank``, picked
    by a pivoted QR for conditioning), ``C`` ``(N, k)`` and ``d`` ``(N,)``; else None."""
    A = np.asarray(slot.A, dtype=float).reshape(slot.size, -1)
    if not np.any(A):
        return None
    _, T, piv = linalg.qr(A.T, mode="economic", pivoting=True)
    diag = np.abs(np.diag(T))
    k = int(np.sum(diag > 1e-10 * diag[0]))
    if k > max_rank:
        return None
    R = np.asarray(piv[:k])
    C = np.linalg.lstsq(A[R].T, A.T, rcond=None)[0].T
    if np.abs(A - C @ A[R]).max() > 1e-10 * np.abs(A).max():
        return None
    c = np.broadcast_to(np.asarray(slot.c, dtype=float), (slot.size,))
    return R, C, c - C @ c[R]


def _scales(slot: LinearSlot) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(r, s, d)`` with ``eta_n = s_n * eta_r + d_n`` for every instance ``n`` of a linear
    slot whose rows are multiples of one row ``r`` (``b * x_n`` with data ``x``), else None."""
    found = _basis(slot, 1)
    return None if found is None else (int(found[0][0]), found[1][:, 0], found[2])


def _split(C: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(features, G)``: a site of natural parameters ``(h, Q)`` on the reference predictors
    ``eta_R`` (``h . e + e^T Q e``) is written as every instance's site on its own predictor
    ``eta_n = C_n . e + d_n``, of quadratic coefficient ``q_n = phi_n . m`` with
    ``sum_n q_n C_n C_n^T = Q`` (``G m = vech(Q)``); None where that system is singular (fewer
    distinct predictor directions than ``Q`` has entries: a two-group design).

    ``phi_n`` is the quadratic form ``C_n^T M C_n / |C_n|^2`` (its mean over directions,
    ``trace(M) / k``, for an instance that reads a constant, ``C_n = 0``, whose site adds
    nothing), so for one coordinate every instance gets the same precision.
    """
    k = C.shape[1]
    iu = np.triu_indices(k)
    outer = C[:, iu[0]] * C[:, iu[1]]  # the entries of C_n C_n^T on and above the diagonal
    norm = np.einsum("nk,nk->n", C, C)
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where((norm > 0)[:, None], outer * np.where(iu[0] == iu[1], 1.0, 2.0) / norm[:, None],
                       np.where(iu[0] == iu[1], 1.0 / k, 0.0))
    G = outer.T @ phi
    if not np.linalg.cond(G) < 1e10:
        return None
    return phi, G


def _on_reference(site: np.ndarray, C: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The instances' Gaussian sites ``(N, 2)`` (natural parameters on each ``eta_n = C_n . e +
    d_n``) summed and written on the reference predictors ``e``: ``(g, Q)``, ``g . e + e^T Q e``."""
    return C.T @ (site[:, 0] + 2.0 * site[:, 1] * d), np.einsum("n,ni,nj->ij", site[:, 1], C, C)


def _to_instances(g: np.ndarray, Q: np.ndarray, C: np.ndarray, d: np.ndarray, split: tuple) -> np.ndarray:
    """A site ``(g, Q)`` on the reference predictors as the instances' sites ``(N, 2)`` whose
    :func:`_on_reference` it is: quadratic coefficients from :func:`_split`, linear ones
    ``C_n . g'`` with ``sum_n C_n C_n^T g' = g``, less the offsets' share."""
    phi, G = split
    q = phi @ np.linalg.solve(G, Q[np.triu_indices(C.shape[1])])
    return np.stack([C @ np.linalg.solve(C.T @ C, g) - 2.0 * q * d, q], axis=1)


def pair_shared_scalars(f: BlackBoxFactor, method: "CollapsedLikelihood") -> None:
    """Give likelihood ``f`` a pair slot per two of the inputs ``method.pair_inputs`` (which
    read a scalar in common: ``a`` and ``b - a``), where their joint site lives; the method
    then writes one joint site on them (:meth:`CollapsedLikelihood._joint_sites`)."""
    f.pair_slots = pair_slots([f.inputs[f.latent_inputs[k]] for k in method.pair_inputs])


class OneSite:
    """What EP's engine asks of a method that answers a whole factor with one site: it tries
    :meth:`sites` while :attr:`active`, and otherwise (or where that returns None) asks
    ``per_instance``, the factor's ordinary method, and counts the sweep in
    ``n_per_instance_sweeps``. Subclasses define ``sites`` (counting its refusals in
    ``_refused``, by :meth:`_counted`, and its answers in ``n_integrals``) and ``_kind``, the
    method's name."""

    collapsed = True

    def __init__(self, factor: BlackBoxFactor, per_instance):
        self.factor = factor
        self.per_instance = per_instance
        self.n_integrals = 0
        self.n_per_instance_sweeps = 0
        self._refused = 0  # consecutive sweeps without a collapsed answer

    @property
    def kind(self) -> str:
        if self.n_per_instance_sweeps:
            n = self.n_per_instance_sweeps
            return f"{self._kind} ({n} sweep{'s' if n != 1 else ''} instance by instance)"
        return self._kind

    @property
    def ended_refused(self) -> bool:
        """Whether the last sweep fell back to the instances' own sites (the law was not held)."""
        return self._refused > 0

    @property
    def active(self) -> bool:
        """Whether to try the collapsed integral this sweep: not after ``_MAX_REFUSED``
        sweeps in a row without one (a law that neither quadrature nor the wide grid
        contains is answered instance by instance instead of failing every sweep)."""
        return self._refused < _MAX_REFUSED

    @property
    def current(self) -> bool:
        """Whether the factor's sites are the collapsed law's: its last sweep was answered by
        the integral (else the posterior diagnostics and draws treat it as any factor)."""
        return self.n_integrals > 0 and self._refused == 0

    @property
    def n_calls(self) -> int:
        return self.n_integrals + getattr(self.per_instance, "n_calls", 0)

    @property
    def n_fallback(self) -> int:
        return getattr(self.per_instance, "n_fallback", 0)

    def __call__(self, messages):
        """Instance-by-instance answers (what EP asks of a factor it does not collapse)."""
        return self.per_instance(messages)

    def _counted(self, out: list[np.ndarray] | None) -> list[np.ndarray] | None:
        """``out``, a sweep's new sites or None where the law was refused, counted in ``_refused``."""
        self._refused = 0 if out is not None else self._refused + 1
        return out


class CollapsedLikelihood(OneSite):
    """The tilted moments of a whole likelihood of shared scalars (see the module docstring).

    Parameters
    ----------
    factor : BlackBoxFactor
        A likelihood for which :func:`collapsible` holds.
    per_instance : callable
        The factor's ordinary method (its oracle), used for a sweep in which the collapsed
        cavity is improper or the integral is refused.
    order : sequence of tuple, optional
        :func:`order_constraints` of ``factor``: the law is zero where two inputs reading one
        ordered vector's entries are out of order.

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

    _integrates_gaussian_inputs = False

    def __init__(self, factor: BlackBoxFactor, per_instance,
                 order: Sequence[tuple[int, float, float, int, float, float]] = ()):
        layout = _layout(factor)
        if layout is None:
            raise ValueError(f"{factor.name}: not a likelihood of shared scalars ({factor.description})")
        super().__init__(factor, per_instance)
        # the order among inputs reading one ordered vector (order_constraints), part of the law
        self._order = list(order)
        self._quadrature_refused = False
        # whether the last rotated grid held the law but its every other node disagreed
        self._unresolved = False
        # a regression's last rotated grid frame (centre, L) and reach, its predictor rows in
        # eta_R (see _frame_now): the next sweep's grid, and the draws', start from it
        self._frame: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        f = factor
        # per latent input, for linear slots: the reference instance r and every instance's
        # input as s_n * eta_r + d_n (data times a latent coefficient, plus constants); a
        # regression's predictor a + b * x_n instead has reference instances R and
        # eta_n = C_n . eta_R + d_n, its k coordinates of the law jointly Gaussian a priori
        bases, self._block, self._integrator = layout
        if (self._integrator == "gaussian inputs") != self._integrates_gaussian_inputs:
            raise ValueError(f"{factor.name}: integrate it with "
                             + ("CollapsedLinearNormal" if self._integrates_gaussian_inputs is False
                                else "CollapsedLikelihood"))
        self._linear = [None if b is None or b[0].size > 1 else (int(b[0][0]), b[1][:, 0], b[2]) for b in bases]
        self._basis = None if self._block is None else bases[self._block]
        # latent inputs (positions) whose Gaussian coordinates share one joint site, or None,
        # and their reference predictors' rows and offsets (e = rows . theta + offsets)
        self.pair_inputs = self._shared_coordinates() if self._integrator is None and not self._order else None
        self._pair_rows = None if self.pair_inputs is None else self._reference_rows(self.pair_inputs)
        self._dims = [1 if b is None else b[0].size for b in bases]  # coordinates of each latent input
        # per linear latent input: how a site on its reference predictors is shared out
        self._splits = {k: _split(b[1]) for k, b in enumerate(bases) if b is not None}
        y = np.asarray(f.observed, dtype=float).reshape(f.size)
        data = {i: np.asarray(s.values, dtype=float).reshape(f.size)
                for i, s in enumerate(f.inputs) if isinstance(s, DataSlot)}
        # instances alike in everything they read (repeated counts, shared covariate values)
        # have one density: evaluate each distinct one once, weighted by its count
        columns = [y] + list(data.values()) + [a for lin in self._linear if lin is not None for a in lin[1:]]
        if self._basis is not None:
            columns += list(self._basis[1].T) + [self._basis[2]]
        _, first, counts = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_counts=True)
        self._rows = first
        # what one node of a grid costs, in elementwise densities (a multivariate density's
        # one instance costs as many as its observation or largest parameter has entries)
        self._cost = first.size * factor.evaluation_cost
        self._count = counts.astype(float)
        self._y = y[first]
        self._data = {i: v[first] for i, v in data.items()}

    @property
    def _kind(self) -> str:
        if self.pair_inputs and self.factor.pair_slots:
            return "collapsed grid, one joint site on its Gaussian scalars"
        return ("collapsed Laplace" if self._integrator == "laplace"
                else "collapsed quadrature" if sum(self._dims) <= 2 else "collapsed grid")

    def _reference_rows(self, inputs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The rows ``(k, D)`` and offsets ``(k,)`` of the linear latent inputs ``inputs``
        (positions) at their reference instances: ``eta_r = rows . theta + offsets``."""
        f = self.factor
        slots = [f.inputs[f.latent_inputs[k]] for k in inputs]
        refs = [self._linear[k][0] for k in inputs]
        rows = np.stack([np.asarray(s.A, dtype=float).reshape(s.size, -1)[r] for s, r in zip(slots, refs)])
        offsets = np.array([np.broadcast_to(np.asarray(s.c, dtype=float), (s.size,))[r] for s, r in zip(slots, refs)])
        return rows, offsets

    def _shared_coordinates(self) -> list[int] | None:
        """The latent inputs that are scalar projections of the Gaussian block (``b - a``
        beside ``a``) where two of them read a coordinate in common, else None.

        Each such input's own site is the projection of the law onto it alone, and EP's
        posterior of a coordinate two inputs read is then assembled from sites that leave out
        the law's correlation between them: ``a + (b - a) * x**p`` had ``b``'s sd 9.9 times
        NUTS's (robustness round 44). Such inputs get one joint Gaussian site (a pair slot per
        two of them, :attr:`~pmkjit.graph.BlackBoxFactor.pair_slots`), from the law's joint
        moments under their joint cavity, once :func:`pair_shared_scalars` has given the
        factor those pair slots. Inputs that read disjoint coordinates keep their own sites,
        whose draws come from the law itself (:func:`draw_jointly`).
        """
        linear = [k for k, lin in enumerate(self._linear) if lin is not None]
        if len(linear) < 2 or len(linear) > _MAX_ROTATED_ELEMENTS:
            return None
        rows, _ = self._reference_rows(linear)
        reads = rows != 0
        shared = any(np.any(reads[i] & reads[j]) for i in range(len(linear)) for j in range(i))
        # each instance's share of the site is written on its own predictors (their scales
        # s_n must not vanish), and the reference rows must be independent: two inputs reading
        # one coordinate at different scales (b and 2 b) are one predictor read twice
        if (not shared or np.linalg.matrix_rank(rows) < len(linear)
                or any(np.any(self._linear[k][1] == 0) for k in linear)):
            return None
        return linear

    # ------------------------------------------------------------------ EP update
    def sites(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray],
              state=None) -> list[np.ndarray] | None:
        """New per-instance sites ``[(N, 2) per latent]`` from the posterior ``marginals`` of
        the latent inputs (batches of ``N``) and the factor's current ``sites``; None where
        the collapsed cavity is improper or the integral is refused. ``state`` (the EP
        state) gives a regression's coefficients their joint posterior."""
        if self.pair_inputs and self.factor.pair_slots:
            return self._counted(self._joint_sites(marginals, sites, state))
        return self._counted(self._sites(marginals, sites) if self._block is None
                             else self._regression_sites(marginals, sites, state))

    def _joint_law(self, marginals, sites, state, priors=None) -> tuple | None:
        """The collapsed law where inputs ``pair_inputs`` share one joint Gaussian site, under
        the joint cavity of those inputs' reference predictors ``e`` (EP's joint marginal of
        ``e`` less the factor's joint site on it, which keeps their correlation through the
        priors: ``a`` and ``b - a`` of independent ``a`` and ``b``) and the elements' own
        cavities (``priors`` as for :meth:`joint_draws`): ``(cavities, ref, P_cav, h_cav,
        log_law, scales, offsets)``, the Gaussian inputs' cavities being the joint one's
        marginals (where the grids start); None where a cavity is improper."""
        f = self.factor
        J = self.pair_inputs
        n_latent = len(f.latent_inputs)
        found = self._cavities(marginals, sites[:n_latent], improper=True)
        if found is None:
            return None
        cavities, ref = found
        # EP's joint marginal of e and the factor's joint site on it (eta_n = s_n e + d_n)
        rows, offsets = self._pair_rows
        mu = rows @ state.mu + offsets
        Z = linalg.solve_triangular(state.chol, rows.T, lower=True, check_finite=False)
        sc = np.stack([self._linear[k][1] for k in J], axis=1)
        d = np.stack([self._linear[k][2] for k in J], axis=1)
        Lam_n, h_n = joint_site([sites[k] for k in J] + list(sites[n_latent:]), len(J))
        Lam = np.einsum("ni,nij,nj->ij", sc, Lam_n, sc)
        h = np.einsum("ni,ni->i", sc, h_n - np.einsum("nij,nj->ni", Lam_n, d))
        P = linalg.solve(Z.T @ Z, np.eye(len(J)), assume_a="pos")
        P_cav, h_cav = P - Lam, P @ mu - h
        try:
            C_cav = linalg.cho_solve((linalg.cholesky(P_cav, lower=True), True), np.eye(len(J)))
        except linalg.LinAlgError:
            return None
        m_cav = C_cav @ h_cav
        if not all_proper([c for k, c in enumerate(cavities) if k not in J]):
            return None
        # the grid's frames use each coordinate's own cavity: the joint cavity's marginals
        for i, k in enumerate(J):
            cavities[k] = Gaussian(m_cav[i:i + 1], C_cav[i, i:i + 1])
        others = [k for k in range(n_latent) if k not in J]
        own = None if priors is None else [priors[k] for k in others]

        def law(U):
            with np.errstate(all="ignore"):
                E = U[:, J] - m_cav
                logw = -0.5 * np.einsum("gi,ij,gj->g", E, P_cav, E)
                if others:
                    logw = logw + _log_cavities([cavities[k] for k in others], [U[:, k] for k in others], own)
                xs = [type(c).from_unconstrained(U[:, k]) for k, c in enumerate(cavities)]
                logw = logw + self._log_likelihood(xs)
            logw = np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)
            return logw if np.isfinite(logw.max()) else None

        return cavities, ref, P_cav, h_cav, law, sc, d

    def _joint_sites(self, marginals, sites, state) -> list[np.ndarray] | None:
        """New sites where inputs ``pair_inputs`` share one joint Gaussian site: the law's
        joint moments on the rotated grid (:meth:`_joint_law`), its Gaussian projection on
        ``e`` less their joint cavity; the elements' sites as in :meth:`_sites`. Returns the
        sites of the latent inputs, then of the pair slots; None where the joint cavity is
        not positive definite or the grid does not hold the law."""
        found = self._joint_law(marginals, sites, state)
        if found is None:
            return None
        cavities, ref, P_cav, h_cav, law, sc, d = found
        f, J = self.factor, self.pair_inputs
        self.n_integrals += 1
        # (from the law's mode under the joint cavity's marginals before the priors' frame, far
        # wider than the law: there the power curve's first sweep was refused)
        moments = self._moments_from_starts(cavities, marginals, ref, log_law=law)
        if moments is None:
            return None
        mean, cov, stats, self._frame = moments
        beliefs, accepted = project_beliefs([type(c) for c in cavities], stats, np.ones(1, bool))
        if not bool(np.asarray(accepted)[0]):
            return None
        out = self._instance_sites(beliefs, cavities)
        if out is None:
            return None
        # the joint site on e, shared out over the instances as for a linear input's own
        # site (1/N each), on each instance's predictors: Lam_n = D^-1 Lam D^-1 / N
        try:
            P_t = linalg.solve(cov[np.ix_(J, J)], np.eye(len(J)), assume_a="pos")
        except (linalg.LinAlgError, ValueError):
            return None
        Lam_new, h_new = P_t - P_cav, P_t @ mean[J] - h_cav
        if not (np.all(np.isfinite(Lam_new)) and np.all(np.isfinite(h_new))):
            return None
        Lam_i = Lam_new[None] / (sc[:, :, None] * sc[:, None, :]) / f.size
        h_i = h_new[None] / sc / f.size + np.einsum("nij,nj->ni", Lam_i, d)
        joint = slot_sites(Lam_i, h_i)
        for i, k in enumerate(J):
            out[k] = joint[i]
        return out + joint[len(J):]

    def _sites(self, marginals, sites):
        found = self._cavities(marginals, sites, improper=True)
        if found is None:
            return None
        cavities, ref = found
        if not all_proper(cavities):
            return self._sites_of_improper_cavity(cavities, marginals, ref)
        self.n_integrals += 1
        if len(cavities) == 3:
            oracle = GridOracle(lambda xs, _rows: self._log_likelihood(xs), [type(c) for c in cavities],
                                max_passes=_GRID_PASSES)

            def on_grid(frame):
                centre, var = frame
                result = oracle(tuple(cavities), frame=(centre[None, :], np.sqrt(var)[None, :]))
                return result.beliefs if bool(np.asarray(result.accepted)[0]) else None

            # the first frame: EP's marginals, near the tilted law once the factor has sites;
            # else the law's mode and curvature
            beliefs = on_grid(_marginal_frames(marginals, ref))
            if beliefs is None:
                laplace = self._laplace_frame(cavities, marginals, ref)
                beliefs = None if laplace is None else on_grid(laplace)
            if beliefs is None:
                # a law curved away from every axis-aligned frame (a + (b - a) * x**p: p against
                # b - a) in the frame of its own moments, as four or five scalars are
                beliefs = self._beliefs_on_rotated_grid(cavities, marginals, ref)
        elif len(cavities) >= 4:
            beliefs = self._beliefs_on_rotated_grid(cavities, marginals, ref)
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
        return None if beliefs is None else self._instance_sites(beliefs, cavities)

    def _beliefs_on_rotated_grid(self, cavities, marginals, ref) -> list | None:
        """Projected beliefs of a collapsed law of four or five scalars (or three that the
        axis-aligned Gauss-Hermite grid refused) on :meth:`_moments_on_rotated_grid`, or None.

        Not the three-latent law's axis-aligned grid: a growth curve's level, rate and midpoint
        are strongly correlated, so most of an axis-aligned grid's nodes fall where the law has
        no mass. The grid starts in the last one's frame (the coordinates do not move with the
        cavity, unlike a regression's), else at the law's mode, else at EP's marginals."""
        found = self._moments_from_starts(cavities, marginals, ref, edge=_edge_allowance(len(cavities)))
        if found is None:
            return None
        self._frame = tuple(np.array(a, dtype=float) for a in found[3])
        beliefs, accepted = project_beliefs([type(c) for c in cavities], found[2], np.ones(1, bool))
        return beliefs if bool(np.asarray(accepted)[0]) else None

    def _moments_from_starts(self, cavities, marginals, ref, edge: float = _ROTATED_EDGE,
                             log_law=None) -> tuple | None:
        """:meth:`_moments_on_rotated_grid` (refined where it must be) started in the last
        sweep's frame, else at the law's mode (:meth:`_mode_frame`), else at EP's marginals;
        None where none holds the law."""
        start = _marginal_frames(marginals, ref)
        found, self._unresolved = None, False
        if self._frame is not None:
            found = self._moments_on_rotated_grid(cavities, *start, frame=self._frame, edge=edge, log_law=log_law,
                                                  refine=True)
        # a grid that held the law but whose every other node disagreed would disagree from
        # any start (the law is one): a mixture's whose mass lies against its order's cut was
        # tried from two more starts in each of two sweeps, 29 grids for nothing
        if found is None and not self._unresolved:
            mode = self._mode_frame(cavities, *start)
            if mode is not None:
                found = self._moments_on_rotated_grid(cavities, *mode, edge=edge, log_law=log_law, refine=True)
        if found is None and not self._unresolved:
            found = self._moments_on_rotated_grid(cavities, *start, edge=edge, log_law=log_law, refine=True)
        return found

    def _instance_sites(self, beliefs, cavities) -> list[np.ndarray] | None:
        """The collapsed site (the tilted law's projections ``beliefs`` less the ``cavities``)
        as every instance's share, ``[(N, 2) per latent]``; None where it is not finite."""
        f = self.factor
        out = []
        for k, (b, cav) in enumerate(zip(beliefs, cavities)):
            delta = (np.asarray(b.natural, dtype=float) - np.asarray(cav.natural, dtype=float))[0]
            if not np.all(np.isfinite(delta)):
                return None
            if self._linear[k] is None:
                out.append(np.broadcast_to(delta / f.size, (f.size, 2)).copy())
                continue
            # shares of the site in eta_r proportional to s_n^2, each written on its eta_n
            _, sc, d = self._linear[k]
            out.append(_to_instances(delta[:1], delta[1:].reshape(1, 1), sc[:, None], d, self._splits[k]))
        return out

    def _laplace_frame(self, cavities, marginals, ref) -> tuple[np.ndarray, np.ndarray] | None:
        """The collapsed law's mode and the diagonal of its inverse curvature there, in the
        latents' unconstrained coordinates, searched from EP's marginals: a frame for the grid
        where EP's marginals are too far from the law for its passes to find it. In the first
        sweep they are the priors: sixty bivariate Student-t rows put the law of a location
        pair and ``nu`` 35 prior sds inside a Normal(0, 5) prior, the grid oracle refused it
        in eight passes, and EP stayed at the prior, 9 sds off (robustness round 32)."""
        return self._mode_frame(cavities, *_marginal_frames(marginals, ref))

    def _mode_frame(self, cavities, start, var, to_inputs=None) -> tuple[np.ndarray, np.ndarray] | None:
        """The collapsed law's mode and the diagonal of its inverse curvature there, searched
        by BFGS from ``start`` in units of ``sqrt(var)`` (``to_inputs`` as for
        :meth:`_log_law_at`); None where the search fails."""
        from scipy import optimize

        scale = np.sqrt(var)

        def objective(z):
            law = self._log_law_at(cavities, [np.atleast_1d(u) for u in start + scale * z], to_inputs=to_inputs)
            return 1e300 if law is None else -float(law[0])

        with np.errstate(all="ignore"):
            found = optimize.minimize(objective, np.zeros(len(cavities)), method="BFGS")
        if not (np.all(np.isfinite(found.x)) and found.fun < 1e300):
            return None
        hess_inv = np.atleast_2d(found.hess_inv)
        spread = np.diag(hess_inv) * scale**2
        if not np.all(np.isfinite(spread) & (spread > 0)):
            return None
        return start + scale * found.x, spread

    def _sites_of_improper_cavity(self, cavities, marginals, ref):
        """:meth:`_sites` where a cavity is improper in its family, on the rotated grid.

        A prior factor's site is a local fit of its density, which need not be a proper
        law: a ``pm.LogNormal(1, 1)`` concentration read by one ``pm.DirichletMultinomial``
        factor of thirty rows had a Gamma site of shape -0.24 at the posterior, so this
        factor's cavity, that site alone, was improper in every sweep, EP skipped the factor
        and did not converge (robustness round 32). The cavity times the whole likelihood is
        still a proper law; the rotated grid integrates it with the cavity's unnormalised
        density, in EP's marginals' frame."""
        found = self._moments_on_rotated_grid(cavities, *_marginal_frames(marginals, ref), refine=True)
        if found is None:
            return None
        self.n_integrals += 1
        beliefs, accepted = project_beliefs([type(c) for c in cavities], found[2], np.ones(1, bool))
        return self._instance_sites(beliefs, cavities) if bool(np.asarray(accepted)[0]) else None

    def _regression_law(self, marginals, sites, state) -> tuple | None:
        """The collapsed law of a regression's coefficients and its elements, in coordinates in
        which its cavity is a product: the regression's ``k`` reference predictors ``eta_R``,
        jointly Gaussian under EP, whitened by their cavity (``eta_R = m + W z``, ``z``
        standard normal a priori), and each element's own unconstrained coordinate.

        Returns ``(cavities, centre, var, to_inputs, cavity)``, one cavity and one frame (EP's
        marginal: mean and variance) per coordinate, ``to_inputs`` mapping coordinates to the
        likelihood's (``z`` to ``eta_R``), and ``cavity = (m, W, K, h)``: its precision
        ``K K^T`` (``W = K^-T``) and shift ``h``; None where a cavity is improper."""
        found = self._cavities(marginals, sites)
        if found is None or state is None:
            return None
        elements, ref = found
        R, C, d = self._basis
        k = R.size
        f = self.factor
        slot = f.inputs[f.latent_inputs[self._block]]
        A_R = np.asarray(slot.A, dtype=float).reshape(f.size, -1)[R]
        c_R = np.broadcast_to(np.asarray(slot.c, dtype=float), (f.size,))[R]
        # EP's joint marginal of eta_R, and its cavity: less every instance's site, each a
        # Gaussian in eta_n = C_n . eta_R + d_n
        mean_q = A_R @ state.mu + c_R
        Z = linalg.solve_triangular(state.chol, A_R.T, lower=True, check_finite=False)
        cov_q = Z.T @ Z
        site = np.asarray(sites[self._block], dtype=float)
        try:
            P_q = linalg.cho_solve(linalg.cho_factor(cov_q, lower=True), np.eye(k))
            g, Q = _on_reference(site, C, d)
            P, h = P_q + 2.0 * Q, P_q @ mean_q - g  # (Q is minus half the sites' precision)
            K = np.linalg.cholesky(P)
        except np.linalg.LinAlgError:
            return None
        W = linalg.solve_triangular(K, np.eye(k), lower=True, check_finite=False).T  # W W^T = P^-1
        m = linalg.cho_solve((K, True), h)
        centre_z = K.T @ (mean_q - m)
        var_z = np.diag(K.T @ cov_q @ K)
        own = [q for q, c in zip(marginals, elements) if c is not None]
        e_centre, e_var = _marginal_frames(own, [0] * len(own))
        cavities, centre, var, j = [], [], [], 0
        for c in elements:
            if c is None:
                cavities += [Gaussian(np.zeros(1), np.ones(1))] * k
                centre += list(centre_z)
                var += list(var_z)
            else:
                cavities.append(c)
                centre.append(e_centre[j])
                var.append(e_var[j])
                j += 1
        b = self._block

        def to_inputs(xs):
            xs = list(xs)
            z = np.stack([np.asarray(x, dtype=float) for x in xs[b:b + k]])
            eta = m.reshape((k,) + (1,) * (z.ndim - 1)) + np.tensordot(W, z, axes=1)
            return xs[:b] + list(eta) + xs[b + k:]

        return cavities, np.array(centre), np.array(var), to_inputs, (m, W, K, h)

    def _frame_now(self, m: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The last regression grid's frame and reach in this cavity's coordinates, or None.

        A converging EP leaves the collapsed law where it was, so a grid placed in the last
        frame is accepted in one pass, where a grid from EP's marginals took three to six (a
        zero-inflated negative binomial regression's four coordinates: 94 s of fit became 57 s). The frame is kept with its predictor rows in ``eta_R`` (:meth:`_keep_frame`),
        as the whitening ``eta_R = m + W z``, ``W = K^-T``, moves with the cavity."""
        if self._frame is None:
            return None
        centre, L, reach = (a.copy() for a in self._frame)
        b, k = self._block, K.shape[0]
        centre[b:b + k] = K.T @ (centre[b:b + k] - m)
        L[b:b + k] = K.T @ L[b:b + k]
        return centre, L, reach

    def _keep_frame(self, frame, m: np.ndarray, W: np.ndarray) -> None:
        """Keep a regression grid's ``frame`` ``(centre, L, reach)``, its predictor rows in ``eta_R``."""
        centre, L, reach = (np.array(a, dtype=float) for a in frame)
        b, k = self._block, W.shape[0]
        centre[b:b + k] = m + W @ centre[b:b + k]
        L[b:b + k] = W @ L[b:b + k]
        self._frame = (centre, L, reach)

    def _regression_sites(self, marginals, sites, state):
        """:meth:`sites` for a regression's predictor beside element latents: the law of the
        ``k`` reference predictors and the elements on a rotated uniform grid
        (:meth:`_moments_on_rotated_grid`), whose covariance of the predictors gives their
        joint site, split over the instances.

        Not the Gauss-Hermite grid of the other three-latent laws: the law of a truncated
        regression's coefficients and scale is skewed enough that its variances on 12, 16, 24
        and 32 nodes per axis differed by 11%, 7% and 4%, where the trapezoid rule on a
        uniform grid converges exponentially for a smooth law inside its range."""
        f = self.factor
        law = self._regression_law(marginals, sites, state)
        if law is None:
            return None
        cavities, centre, var, to_inputs, (m, W, K, h) = law
        self.n_integrals += 1
        b, k = self._block, self._basis[0].size
        found = None
        if self._integrator == "grid":
            frame = self._frame_now(m, K)
            if frame is not None:
                found = self._moments_on_rotated_grid(cavities, centre, var, to_inputs=to_inputs, frame=frame)
            else:
                # the first grid: from the law's mode and curvature, not from EP's marginals (the
                # priors, in the first sweep), which took three passes more to reach the law
                mode = self._mode_frame(cavities, centre, var, to_inputs)
                if mode is not None:
                    found = self._moments_on_rotated_grid(cavities, *mode, to_inputs=to_inputs)
            if found is None:  # the law moved away from the last frame, or left the mode's
                found = self._moments_on_rotated_grid(cavities, centre, var, to_inputs=to_inputs)
            if found is not None:
                self._keep_frame(found[3], m, W)
            if found is None and len(cavities) - k <= _MAX_LAPLACE_ELEMENTS:
                # no affordable grid holds the law (a truncated regression's: a ridge out to the
                # priors' scale as the intercept falls and the scale grows); nested Laplace
                # needs a grid over the elements only, which can widen much further, so it
                # takes over for this and the later sweeps
                found = self._moments_by_laplace(cavities, centre, var, m, W)
                if found is not None:
                    self._integrator = "laplace"
        else:
            found = self._moments_by_laplace(cavities, centre, var, m, W)
        if found is None:
            return None
        mean_z, cov_z, stats, _ = found
        beliefs, accepted = project_beliefs([type(c) for c in cavities], stats, np.ones(1, bool))
        if not accepted[0]:
            return None
        # the tilted law of eta_R: mean m + W E[z], covariance W Cov[z] W^T; its precision and
        # shift less the cavity's are the site
        mean_z, cov_z = mean_z[b:b + k], cov_z[b:b + k, b:b + k]
        try:
            P_t = K @ linalg.cho_solve(linalg.cho_factor(cov_z, lower=True), K.T)  # (W Cov[z] W^T)^-1
        except np.linalg.LinAlgError:
            return None
        h_t = P_t @ (m + W @ mean_z)
        Q, g = -0.5 * (P_t - K @ K.T), h_t - h  # natural parameters: g . e + e^T Q e
        if not (np.isfinite(Q).all() and np.isfinite(g).all()):
            return None
        _, C, d = self._basis
        out = []
        for j, (bel, cav) in enumerate(zip(beliefs, cavities)):
            if b <= j < b + k:
                if j == b:
                    out.append(_to_instances(g, Q, C, d, self._splits[b]))
                continue
            delta = (np.asarray(bel.natural, dtype=float) - np.asarray(cav.natural, dtype=float))[0]
            if not np.all(np.isfinite(delta)):
                return None
            out.append(np.broadcast_to(delta / f.size, (f.size, 2)).copy())
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
        if sum((a + b) ** 2 for a, b in _WIDE_PASSES) * self._cost > _MAX_DRAW_EVALUATIONS:
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

    def _log_law_at(self, cavities, us: Sequence[np.ndarray], priors=None, to_inputs=None) -> np.ndarray | None:
        """Log density (unnormalised) of the collapsed law at points ``us`` (one unconstrained
        coordinate array per latent; ``to_inputs`` maps a regression's whitened coordinates
        to its predictors); ``-inf`` where it cannot be evaluated, None if nowhere."""
        with np.errstate(all="ignore"):
            logw = _log_cavities(cavities, us, priors)
            xs = [type(c).from_unconstrained(u) for c, u in zip(cavities, us)]
            logw = logw + self._log_likelihood(xs if to_inputs is None else to_inputs(xs))
        logw = np.where(np.isnan(logw) | (logw == np.inf), -np.inf, logw)
        return logw if np.isfinite(logw.max()) else None

    def _cavities(self, marginals, sites, improper: bool = False) -> tuple[list[ExponentialFamily], list[int]] | None:
        """The collapsed cavity of each latent (its marginal less the factor's summed sites, a
        batch of one) and the reference instance of each; None where one is improper, unless
        ``improper`` (for the rotated grid, whose law is the cavity's unnormalised density)."""
        cavities, ref = [], []
        for k, (m, site) in enumerate(zip(marginals, sites)):
            if k == self._block:
                cavities.append(None)  # jointly with its other coordinates: _regression_law
                ref.append(None)
                continue
            site = np.asarray(site, dtype=float)
            r = 0
            if self._linear[k] is not None:
                # instance n's Gaussian site on eta_n = s_n eta_r + d_n, written in eta_r
                r, sc, d = self._linear[k]
                g, Q = _on_reference(site, sc[:, None], d)
                site = np.array([[g[0], Q[0, 0]]])
            cav = type(m).from_natural(np.asarray(m.natural[r:r + 1], dtype=float) - site.sum(axis=0))
            if not (improper and np.all(np.isfinite(cav.natural))) and not np.all(cav.is_proper()):
                return None
            cavities.append(cav)
            ref.append(r)
        return cavities, ref

    # ------------------------------------------------------------------ draws
    def joint_draws(self, marginals: Sequence[ExponentialFamily], sites: Sequence[np.ndarray], n: int,
                    rng: np.random.Generator, priors: Sequence | None = None, state=None) -> list[np.ndarray] | None:
        """``n`` joint draws of the latents (each as instance ``r``'s input, ``(n,)`` per latent;
        a regression's predictor as its ``k`` reference instances', ``(n, k)``) from the
        collapsed law, cavity times the whole likelihood, or None.

        EP's marginals of the latents are that law's projections, but its posterior draws are
        independent; these keep the correlation the likelihood puts between them. A grid
        over 6.5 of the law's sds each way in its own (rotated) frame, found from a first grid
        in the frame of EP's marginals (:meth:`_rotated_grid`); each draw is a node picked by
        weight, jittered uniformly within its cell. Where no such grid contains the law (more
        than ``_ROTATED_EDGE`` of its mass on an edge: a long flat side), two latents are drawn
        from the non-uniform grid of :meth:`_on_wide_grid` instead. None where a cavity is improper,
        no grid contains the law, or a grid would cost more than
        ``_MAX_DRAW_EVALUATIONS`` density evaluations. Where Gaussian inputs share one joint
        site (``pair_inputs``), the law is :meth:`_joint_law`'s, under their joint cavity.

        ``priors``: per latent, None or ``(site, log_density)``, a prior factor of the latent
        whose EP site (natural parameters) is replaced in the cavity by its exact density
        (of the latent's value): the tail of a flat likelihood is the prior's, which the
        site's family may not have (a Gamma site of a HalfNormal scale: draws of a truncated
        Normal's scale with 1.2-1.26 times the exact sd).
        """
        if self._block is not None:
            law = self._regression_law(marginals, sites, state)
            if law is None:
                return None
            cavities, centre, var, to_inputs, _ = law
            b, k = self._block, self._basis[0].size
            if priors is not None:  # per latent input: the predictor's k coordinates have none
                priors = list(priors[:b]) + [None] * k + list(priors[b + 1:])
            if self._integrator == "laplace":
                draws = self._draws_by_laplace(cavities, centre, var, law[4][:2], n, rng, priors)
            else:
                frame = self._frame_now(law[4][0], law[4][2])
                draws = self._draws_on_rotated_grid(cavities, centre, var, n, rng, priors, to_inputs, frame)
                if draws is None and frame is not None:
                    draws = self._draws_on_rotated_grid(cavities, centre, var, n, rng, priors, to_inputs)
            if draws is None:
                return None
            draws = to_inputs(draws)
            return draws[:b] + [np.stack(draws[b:b + k], axis=1)] + draws[b + k:]
        if self.pair_inputs and self.factor.pair_slots:
            # under the joint site's law (its inputs' joint cavity), from the last sweep's grid
            law = self._joint_law(marginals, sites, state, priors)
            if law is None:
                return None
            cavities, ref, law = law[0], law[1], law[4]
            start, draws = _marginal_frames(marginals, ref), None
            if self._frame is not None:
                draws = self._draws_on_rotated_grid(cavities, *start, n, rng, frame=self._frame, log_law=law)
            return draws if draws is not None else self._draws_on_rotated_grid(cavities, *start, n, rng, log_law=law)
        # the rotated grid reads a cavity's unnormalised density, so an improper one serves
        # (a LogNormal prior's site: see _sites_of_improper_cavity); the wide grid spans the
        # cavities' own ranges and needs them proper
        found = self._cavities(marginals, sites, improper=True)
        if found is None:
            return None
        cavities, ref = found
        m = len(cavities)
        start, edge = _marginal_frames(marginals, ref), _edge_allowance(m)
        draws = None
        if self._frame is not None:  # four or five scalars: from the last sweep's grid
            draws = self._draws_on_rotated_grid(cavities, *start, n, rng, priors, frame=self._frame, edge=edge)
        if draws is None:
            draws = self._draws_on_rotated_grid(cavities, *start, n, rng, priors, edge=edge)
        if draws is None and m == 2 and all_proper(cavities):
            draws = self._draws_on_wide_grid(cavities, marginals, ref, n, rng, priors)
        return draws

    def _draws_on_rotated_grid(self, cavities, centre, var, n, rng, priors=None, to_inputs=None, frame=None,
                               edge: float = _ROTATED_EDGE, log_law=None) -> list[np.ndarray] | None:
        """Joint draws on a uniform grid in the law's own frame (see :meth:`joint_draws`;
        ``frame`` as for :func:`rotated_grid`; ``log_law`` replaces the collapsed law's density)."""
        m = len(cavities)
        # a few passes of nodes**m nodes, each costing one density per distinct instance
        nodes = min(_DRAW_NODES[m], int((_MAX_DRAW_EVALUATIONS / (2 * self._cost)) ** (1.0 / m)))
        if nodes < _MIN_DRAW_NODES[m]:
            return None
        found = self._rotated_grid(cavities, centre, var, nodes, priors, to_inputs, frame=frame, edge=edge,
                                   log_law=log_law)
        if found is None:
            return None
        Z, w, spacing, (centre, L) = found
        pick = rng.choice(w.size, size=n, p=w)
        Zs = Z[pick] + rng.uniform(-0.5 * spacing, 0.5 * spacing, size=(n, m))
        Zs = _without_jitter_variance(Zs, Z, w, spacing)
        Us = centre + Zs @ L.T
        # a jitter past the edge of the law's support (pm.Uniform(0, theta): theta below the
        # largest observation) falls back to its node: 0.35% of the draws were impossible
        law = self._log_law_at(cavities, list(Us.T), priors, to_inputs) if log_law is None else log_law(Us)
        if law is not None:
            outside = ~np.isfinite(law)
            Us[outside] = centre + Z[pick[outside]] @ L.T
        return [type(c).from_unconstrained(Us[:, k]) for k, c in enumerate(cavities)]

    def _rotated_grid(self, cavities, centre, var, nodes, priors=None, to_inputs=None,
                      budget: float = _MAX_DRAW_EVALUATIONS, log_law=None,
                      min_resolved: float = _MIN_RESOLVED_NODES, frame=None, edge: float = _ROTATED_EDGE) -> tuple | None:
        """The collapsed law on a uniform grid of ``nodes`` per axis over +-6.5 of its sds in
        its own (rotated) frame: ``(Z, w, spacing, (centre, L))``, the nodes ``centre + L z``
        and their normalised weights; None where no frame contains it.

        The first grid spans +-8 sds of EP's marginals; each next one is placed in the frame
        of the last one's mean and covariance, until two agree (means within 0.05 sds,
        variances within 10%) with at most ``_ROTATED_EDGE`` of the mass on the edge, widening
        it at the same spacing while ``budget`` density evaluations allow. A law that falls
        between a few nodes (the first sweep, whose frame is the prior's, for a likelihood of
        many observations) is zoomed in on, ``_ZOOM``-fold per pass, while it has fewer than
        ``min_resolved`` effective nodes. ``log_law`` (nodes ``(G, m)`` to log densities, or
        None) replaces the collapsed law's density.
        """

        def law(U):
            return self._log_law_at(cavities, list(U.T), priors, to_inputs)

        return rotated_grid(law if log_law is None else log_law, len(cavities), centre, var, nodes,
                            self._cost, budget, min_resolved, frame, edge)

    def _moments_on_rotated_grid(self, cavities, centre, var, priors=None, to_inputs=None,
                                 frame=None, edge: float = _ROTATED_EDGE, log_law=None,
                                 refine: bool = False) -> tuple | None:
        """``(mean, cov, stats, frame)`` of the collapsed law's coordinates on :meth:`_rotated_grid`,
        with each coordinate's expected sufficient statistics ``stats`` ``(m, 1, 3)`` as
        :func:`~pmkjit.operators.oracle.project_beliefs` takes them and the grid's ``frame``
        ``(centre, L)``; None where the grid does not contain the law or every other node's grid
        disagrees (``_ROTATED_CHECK``). ``frame``: where the grid starts, as for :func:`rotated_grid`;
        ``log_law`` (nodes ``(G, m)`` to log densities) replaces the collapsed law's density.
        ``refine``: a law the grid holds but whose every other node disagrees is integrated
        once more on a finer grid (where nothing else would answer it: a regression's law has
        nested Laplace, which answered a truncated regression as well, in 16 s, not 40)."""
        m = len(cavities)
        # fewer nodes where many distinct instances make each costly, but not so few that the
        # grid of every other node cannot check the answer
        most, least = _SITE_NODES[m]
        nodes = max(least, min(most, int((_MAX_SITE_EVALUATIONS / self._cost) ** (1.0 / m))))
        found = self._rotated_grid(cavities, centre, var, nodes, priors, to_inputs,
                                   _FACE_ROOM * max(_MAX_SITE_EVALUATIONS, nodes**m * self._cost), frame=frame,
                                   edge=edge, log_law=log_law)
        if found is None:
            return None
        Z, w, spacing, (centre, L) = found
        U = centre + Z @ L.T
        checked = _checked_moments(U, w, Z, spacing)
        fine = min(2 * nodes - 1, int((_FACE_ROOM * _MAX_SITE_EVALUATIONS / self._cost) ** (1.0 / m)))
        if checked is None and refine and fine >= nodes + 4:
            # a curved law (a + (b - a) * x**p: p trades off against b - a) that the grid held
            # but its every other node did not resolve: once more in the frame found, at up to
            # half the spacing as the budget of a widened grid allows (four scalars of 100
            # observations: 29 nodes a side, not 19; refused, the sweep went instance by
            # instance, and EP did not converge in 50 sweeps, sds 0.08 of NUTS's)
            found = self._rotated_grid(cavities, centre, var, fine, priors, to_inputs,
                                       _FACE_ROOM * _MAX_SITE_EVALUATIONS,
                                       frame=(centre, L, grid_reach(Z, spacing, nodes)), edge=edge, log_law=log_law)
            if found is not None:
                nodes, (Z, w, spacing, (centre, L)) = fine, found
                U = centre + Z @ L.T
                checked = _checked_moments(U, w, Z, spacing)
        if checked is None:
            self._unresolved = True
            return None
        mean, cov = checked
        stats = np.full((m, 1, 3), np.nan)
        for k, c in enumerate(cavities):
            stats[k, 0, :2] = w @ type(c).sufficient_statistics_unconstrained(U[:, k])
            stats[k, 0, 2] = cov[k, k]
        return mean, cov, stats, (centre, L, grid_reach(Z, spacing, nodes))

    # ------------------------------------------------------------------ nested Laplace
    def _moments_by_laplace(self, cavities, centre, var, m, W, priors=None) -> tuple | None:
        """:meth:`_moments_on_rotated_grid` for a regression's law by nested Laplace
        (:meth:`_laplace_grid`): the elements' moments on their grid, the whitened
        coefficients' as the mixture over its nodes of their conditional Gaussians (no frame:
        ``None``)."""
        found = self._laplace_grid(cavities, centre, var, m, W, priors)
        if found is None:
            return None
        U, Z, spacing, w, z, S, own, _ = found
        b, k = self._block, self._basis[0].size
        order = own + list(range(b, b + k))
        found = _checked_moments(np.concatenate([U, z], axis=1), w, Z, spacing, S)
        if found is None:
            return None
        mean, cov = found
        dims = len(cavities)
        mean_all, cov_all = np.empty(dims), np.empty((dims, dims))
        mean_all[order] = mean
        cov_all[np.ix_(order, order)] = cov
        stats = np.full((dims, 1, 3), np.nan)
        for j, c in zip(own, (cavities[j] for j in own)):
            stats[j, 0, :2] = w @ type(c).sufficient_statistics_unconstrained(U[:, own.index(j)])
        for j in range(dims):
            stats[j, 0, 2] = cov_all[j, j]
            if b <= j < b + k:
                stats[j, 0, :2] = mean_all[j], cov_all[j, j] + mean_all[j] ** 2
        return mean_all, cov_all, stats, None

    def _draws_by_laplace(self, cavities, centre, var, whitening, n, rng, priors=None) -> list[np.ndarray] | None:
        """Joint draws of a regression's law by nested Laplace: a node of the elements' grid
        picked by weight and jittered within its cell, the coefficients from their
        conditional Gaussian there (see :meth:`joint_draws`)."""
        found = self._laplace_grid(cavities, centre, var, *whitening, priors)
        if found is None:
            return None
        U, _, spacing, w, z, S, own, L0 = found
        pick = rng.choice(w.size, size=n, p=w)
        Us = U[pick] + rng.uniform(-0.5 * spacing, 0.5 * spacing, size=(n, len(own))) @ L0.T
        used, where = np.unique(pick, return_inverse=True)
        chol = np.linalg.cholesky(S[used])[where]
        zs = z[pick] + (chol @ rng.standard_normal((n, z.shape[1], 1)))[..., 0]
        b, k = self._block, z.shape[1]
        out, e = [], 0
        for j, c in enumerate(cavities):
            if b <= j < b + k:
                out.append(zs[:, j - b])
            else:
                out.append(type(c).from_unconstrained(Us[:, e]))
                e += 1
        return out

    def _laplace_grid(self, cavities, centre, var, m, W, priors=None) -> tuple | None:
        """A regression's collapsed law by nested Laplace: ``(U, Z, spacing, w, z, S, own, L)``.

        The element latents (positions ``own`` among the coordinates) on a rotated uniform grid
        (:meth:`_rotated_grid`: nodes ``U``, ``Z`` in its frame ``U = c + Z L^T``, normalised
        weights ``w``); at
        each node, the whitened coefficients' conditional law, cavity times likelihood, by the
        Gaussian at its mode ``z`` with covariance ``S`` (the inverse Hessian), and the node's
        weight the elements' cavity times that Gaussian's mass (Laplace's approximation of the
        integral over the coefficients). The conditional law of many coefficients given a scale
        is a GLM's posterior, near Gaussian once each coefficient has a few observations' worth
        of information, while its dependence on the scale, the correlation the grid exists for,
        is kept in full. None where no grid contains the law, or a node of weight conditional
        modes were not found for.
        """
        b, k = self._block, self._basis[0].size
        own = [j for j in range(len(cavities)) if not b <= j < b + k]
        elems = [cavities[j] for j in own]
        elem_priors = None if priors is None else [priors[j] for j in own]
        _, C, d = self._basis
        B = C[self._rows] @ W  # eta_n = a_n + B_n . z, the distinct instances' predictors
        a = C[self._rows] @ m + d[self._rows]
        # each grid's Newton searches start where the last grid's modes, as a weighted linear
        # function of the elements, put them
        last: dict = {"start": (np.zeros(len(own)), np.zeros((len(own) + 1, k)))}

        def log_law(U):
            centre_u, coef = last["start"]
            start = np.column_stack([np.ones(U.shape[0]), U - centre_u]) @ coef
            with np.errstate(all="ignore"):
                xs = [type(c).from_unconstrained(U[:, i]) for i, c in enumerate(elems)]
                z, L, obj, found = self._conditional_modes(B, a, xs, start)
                logw = (_log_cavities(elems, list(U.T), elem_priors) + obj
                        - np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1))
            logw = np.where(np.isfinite(logw), logw, -np.inf)
            if not np.isfinite(logw.max()):
                return None
            w = np.exp(logw - logw.max())
            # a node of weight whose mode was not found (the search stalled): no answer
            if w[~found].sum() > 1e-9 * w.sum():
                return None
            w /= w.sum()
            centre_u = w @ U
            design = np.column_stack([np.ones(U.shape[0]), U - centre_u]) * np.sqrt(w)[:, None]
            coef = np.linalg.lstsq(design, np.nan_to_num(z) * np.sqrt(w)[:, None], rcond=None)[0]
            last.update(U=U, z=z, L=L, start=(centre_u, coef))
            return logw

        nodes = _LAPLACE_NODES[len(own)]
        found = self._rotated_grid(elems, centre[own], var[own], nodes,
                                   budget=_LAPLACE_BUDGET[len(own)] * self._cost, log_law=log_law,
                                   min_resolved=_LAPLACE_RESOLVED[len(own)])
        if found is None:
            return None
        Z, w, spacing, (c0, L0) = found
        U = c0 + Z @ L0.T
        z, L = last["z"], last["L"]  # the last grid evaluated is the one returned
        keep = w > 0
        S = np.zeros((w.size, k, k))
        Linv = np.linalg.solve(L[keep], np.broadcast_to(np.eye(k), (int(keep.sum()), k, k)))
        S[keep] = np.swapaxes(Linv, 1, 2) @ Linv  # H^-1 = L^-T L^-1
        z = np.where(keep[:, None], z, 0.0)
        corrected = self._corrected(B, a, [type(c).from_unconstrained(U[keep, i]) for i, c in enumerate(elems)],
                                    z[keep], Linv)
        if corrected is not None:
            log_ratio, z[keep], S[keep] = corrected
            w = w.copy()
            w[keep] *= np.exp(log_ratio - log_ratio.max())
            w /= w.sum()
        return U, Z, spacing, w, z, S, own, L0

    def _corrected(self, B, a, xs, z, Linv) -> tuple | None:
        """Each node's conditional law beyond Laplace: ``(log_ratio, mean, cov)``, the moments
        of the exact conditional law (cavity times likelihood) of the coefficients at ``G`` nodes,
        and the log of its mass over Laplace's, by a cubature of the standard normal
        (:func:`_cubature`) in the frame of each node's Laplace Gaussian ``N(z, Linv^T Linv)``:
        ``E[g] = E_xi[g(z + Linv^T xi) r(xi)] / E_xi[r]``, ``r`` the ratio of the exact law to
        the Gaussian. Laplace puts the mean at the mode, off by the law's skewness: a Gamma
        regression's intercept by 0.15 of its sd at N = 60. None where every rule would cost
        more than ``_MAX_CUBATURE_EVALUATIONS`` density evaluations, or negative weights leave a
        mass or a covariance that is not positive (Laplace's moments stay).
        """
        G, k = z.shape
        rule = _cubature(k, _MAX_CUBATURE_EVALUATIONS / (G * self._cost))
        if rule is None:
            return None
        xi, omega = rule
        P = z[:, None, :] + xi[None] @ Linv  # (G, J, k): z + Linv^T xi, each point a row
        J = xi.shape[0]
        with np.errstate(all="ignore"):
            eta = a[None, None, :] + P @ B.T  # (G, J, N)
            els = [np.repeat(np.asarray(x, dtype=float), J) for x in xs]
            ll = self._log_terms(eta.reshape(G * J, -1), els).reshape(G, J, -1) @ self._count
            log_r = ll - 0.5 * np.einsum("gjk,gjk->gj", P, P) + 0.5 * np.einsum("jk,jk->j", xi, xi)
            log_r -= log_r[:, :1]  # the centre, xi = 0 (Laplace's own density there)
            r = np.exp(log_r)
            mass = r @ omega
            if not (np.all(np.isfinite(r)) and np.all(mass > 0)):
                return None
            v = r * omega / mass[:, None]
            m_xi = np.einsum("gj,jk->gk", v, xi)
            C_xi = np.einsum("gj,jk,jl->gkl", v, xi, xi) - m_xi[:, :, None] * m_xi[:, None, :]
            if not np.all(np.linalg.eigvalsh(C_xi)[:, 0] > 0):
                return None
        LinvT = np.swapaxes(Linv, 1, 2)
        mean = z + (LinvT @ m_xi[..., None])[..., 0]
        cov = LinvT @ C_xi @ Linv
        return np.log(mass), mean, cov

    def _conditional_modes(self, B, a, xs, z0) -> tuple:
        """Modes of ``-|z|^2 / 2 + sum_n count_n log psi(y_n | a_n + B_n . z, xs)`` at ``G`` nodes
        of the elements ``xs`` (each ``(G,)``), by damped Newton from ``z0`` ``(G, k)``:
        ``(z, L, obj, found)``, the Hessian's Cholesky factor ``L`` (``(G, k, k)``, the
        identity where not positive definite), the objective at the mode and where the mode
        was found.

        The instances' first and second derivatives in their own predictor are central
        differences (the Hessian in ``z`` is ``I - B^T diag(count l'') B``). Where that is not
        positive definite (some ``l'' > 0``: a Student-t's outliers, a Gamma's with its sd
        latent away from the mode) a step uses it shifted by a multiple of the identity, so
        it ascends; where it is, Newton's own step, which converges quadratically.
        """
        G, k = z0.shape
        z = z0.astype(float).copy()
        obj, g1, g2 = self._instance_terms(B, a, xs, z, np.arange(G))
        # a start the likelihood rules out (the last grid's modes extrapolated to a node of a
        # wider one) starts again from the cavity's mean, z = 0, instead of being dropped
        retry = np.flatnonzero(~np.isfinite(obj))
        if retry.size:
            z[retry] = 0.0
            obj[retry], g1[retry], g2[retry] = self._instance_terms(B, a, xs, z[retry], retry)
        found = np.zeros(G, bool)
        todo = np.flatnonzero(np.isfinite(obj))
        eye = np.eye(k)
        for _ in range(_NEWTON_STEPS):
            if todo.size == 0:
                break
            grad = g1[todo] @ B - z[todo]
            H = eye - np.matmul(B.T[None] * g2[todo][:, None, :], B)
            low = np.linalg.eigvalsh(H)[:, 0]
            # not concave here: the Hessian shifted to be just positive definite (only
            # there: a shift where it already is, as at a Student-t's mode with outliers,
            # made Newton linear and left searches unfinished after 50 steps)
            H += np.maximum(_LEAST_CURVATURE - low, 0.0)[:, None, None] * eye
            step = np.linalg.solve(H, grad[..., None])[..., 0]
            decrement = np.einsum("gi,gi->g", grad, step)
            done = decrement <= _NEWTON_TOL
            found[todo[done]] = True
            todo, step = todo[~done], step[~done]
            t = np.ones(todo.size)
            pending = np.arange(todo.size)
            for _ in range(30):  # halve each step until the objective does not fall
                if pending.size == 0:
                    break
                idx = todo[pending]
                z_new = z[idx] + t[pending, None] * step[pending]
                o, d1, d2 = self._instance_terms(B, a, xs, z_new, idx)
                up = o >= obj[idx] - 1e-12 * np.abs(obj[idx])
                acc = idx[up]
                z[acc], obj[acc], g1[acc], g2[acc] = z_new[up], o[up], d1[up], d2[up]
                t[pending[~up]] *= 0.5
                pending = pending[~up]
            # a step that never ascended: the search has stalled, at the mode to within the
            # round-off of the differences if its decrement is small, else somewhere else
            found[todo[pending[decrement[~done][pending] <= _STALLED_TOL]]] = True
            todo = np.setdiff1d(todo, todo[pending])
        H = eye - np.matmul(B.T[None] * np.where(np.isfinite(g2), g2, 0.0)[:, None, :], B)
        pd = np.linalg.eigvalsh(H)[:, 0] > 1e-10
        found &= pd
        L = np.broadcast_to(eye, (G, k, k)).copy()
        L[pd] = np.linalg.cholesky(H[pd])
        return z, L, obj, found

    def _instance_terms(self, B, a, xs, z, nodes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """At coefficients ``z`` ``(G', k)`` of nodes ``nodes``: the objective of
        :meth:`_conditional_modes` and the count-weighted first and second derivatives
        ``(G', N)`` of the distinct instances' log densities in their predictors."""
        eta = a[None, :] + z @ B.T
        h = _FD_STEP * (1.0 + np.abs(eta))
        els = [np.asarray(x, dtype=float)[nodes] for x in xs]
        with np.errstate(all="ignore"):
            l0 = self._log_terms(eta, els)
            lp = self._log_terms(eta + h, els)
            lm = self._log_terms(eta - h, els)
            obj = l0 @ self._count - 0.5 * np.einsum("gi,gi->g", z, z)
            d1 = (lp - lm) / (2.0 * h) * self._count
            d2 = (lp - 2.0 * l0 + lm) / h**2 * self._count
        obj = np.where(np.isnan(obj), -np.inf, obj)
        return obj, d1, d2

    def _log_terms(self, eta: np.ndarray, els: Sequence[np.ndarray]) -> np.ndarray:
        """Each distinct instance's log density ``(G, N)`` at its regression predictor ``eta``
        ``(G, N)`` and the elements' values ``els`` (each ``(G,)``), in chunks of nodes."""
        f = self.factor
        G, n = eta.shape
        out = np.empty((G, n))
        step = max(1, _CHUNK // max(n, 1))
        for lo in range(0, G, step):
            g = slice(lo, min(G, lo + step))
            width = g.stop - g.start
            ins, k, j = [], 0, 0
            for i in range(len(f.inputs)):
                if i in self._data:
                    ins.append(np.ascontiguousarray(np.broadcast_to(self._data[i], (width, n))))
                    continue
                if k == self._block:
                    ins.append(eta[g])
                else:
                    ins.append(np.ascontiguousarray(np.broadcast_to(els[j][g, None], (width, n))))
                    j += 1
                k += 1
            y = np.ascontiguousarray(np.broadcast_to(self._y, (width, n)))
            out[g] = np.asarray(f.logp(y, tuple(ins)), dtype=float).reshape(width, n)
        return out

    def _log_likelihood(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        """``sum_n log psi(y_n | x, data_n)`` at nodes ``xs`` (arrays of one shape), in chunks of instances."""
        f = self.factor
        shape = np.shape(xs[0])
        G = int(np.prod(shape, dtype=int))
        flat = [np.asarray(x, dtype=float).reshape(G) for x in xs]
        total = np.full(G, -np.inf)
        # nodes out of an order in the law have none: a quarter to a third of a mixture's grid
        # nodes, not evaluated
        keep = np.ones(G, bool)
        with np.errstate(invalid="ignore"):
            for k, a, c, l, b, e in self._order:
                keep &= (flat[k] - c) / a < (flat[l] - e) / b
        if not keep.all():
            flat = [x[keep] for x in flat]
        H = flat[0].size
        if H == 0:
            return total.reshape(shape)
        found = np.zeros(H)
        for n in self._chunks(H):
            y = np.ascontiguousarray(np.broadcast_to(self._y[n], (H, n.stop - n.start)))
            found += np.asarray(f.logp(y, tuple(self._inputs(flat, n))), dtype=float) @ self._count[n]
        total[keep] = found
        return total.reshape(shape)

    def _chunks(self, G: int) -> list[slice]:
        """Slices of the distinct instances, each evaluated at ``G`` nodes at once."""
        step = max(1, _CHUNK // max(G, 1))
        return [slice(lo, min(self._rows.size, lo + step)) for lo in range(0, self._rows.size, step)]

    def _inputs(self, flat: Sequence[np.ndarray], n: slice) -> list[np.ndarray]:
        """Every input of the distinct instances ``n`` at the nodes ``flat`` (one ``(G,)`` array
        per coordinate of the law), ``(G, width)`` each."""
        f = self.factor
        G = flat[0].size
        rows = self._rows[n]
        width = n.stop - n.start
        ins, k, j = [], 0, 0  # latent input k reads coordinates j, ..., j + dims[k] - 1
        for i in range(len(f.inputs)):
            if i in self._data:
                ins.append(np.ascontiguousarray(np.broadcast_to(self._data[i][n], (G, width))))
                continue
            x = flat[j][:, None]
            if k == self._block:
                _, C, d = self._basis
                ins.append(sum(C[None, rows, r] * flat[j + r][:, None] for r in range(C.shape[1])) + d[None, rows])
            elif self._linear[k] is None:
                ins.append(np.ascontiguousarray(np.broadcast_to(x, (G, width))))
            else:
                _, sc, d = self._linear[k]
                ins.append(sc[None, rows] * x + d[None, rows])
            j += self._dims[k]
            k += 1
        return ins


def draw_jointly(graph, state, methods: dict[int, OneSite], elements: dict[str, np.ndarray],
                 theta: np.ndarray | None, rng: np.random.Generator, *, fixed: frozenset[str] = frozenset()) -> set[int]:
    """Replace EP's independent draws of each collapsed factor's latents by joint ones.

    ``elements`` (``(n, size)`` per element variable) and ``theta`` (``(n, D)``) are EP's
    draws, changed in place; ``methods`` maps factor indices to their collapsed methods.
    A factor's latents are drawn jointly from its collapsed law
    (:meth:`CollapsedLikelihood.joint_draws`) where that leaves the rest of the draws
    coherent: each latent is an element of an element variable, or a coordinate of the
    Gaussian block that EP's posterior leaves uncorrelated with every other; none is in
    ``fixed`` (variables drawn given others, :mod:`pmkjit.ep.conditional`) or read by
    another collapsed factor drawn so; Gaussian inputs that share one joint site (``a`` and
    ``b - a``) are drawn together and solved for the scalars they read
    (:func:`_draw_joint_site`). A hierarchical prior's
    (:class:`~pmkjit.ep.hierarchy.CollapsedPrior`) element hyperparameters are drawn with its
    outputs from its law, given the outputs' draws where those are in ``fixed``, or from the
    law's marginal beside Gaussian outputs. Returns the indices of the factors drawn jointly.
    """
    from pmkjit.ep.engine import _marginals

    done: set[int] = set()
    taken: set[tuple[str, int]] = set()
    n = len(next(iter(elements.values()))) if elements else (0 if theta is None else theta.shape[0])
    # likelihoods first: a hierarchical prior over elements a likelihood draws jointly (per-group
    # shapes under a hyper-rate) then draws its hyperparameters given them; the other way
    # round the likelihood found its elements taken and left its pairs independent (the
    # shape-rate correlations -0.11 to 0.05 where NUTS has 0.89-0.95)
    # ... and among likelihoods those of more latents first: one of a single latent has no
    # correlation to keep, and drawn first it took a latent that a likelihood of two shares
    # (an observation with x = 0 of pm.Gamma(alpha=k, beta=k / exp(b * x)) reads k alone)
    # ... save a one-instance factor (a pm.Potential of a and b) that a law of the same scalars
    # takes in (_joint_priors): drawn first, it took a and b from its own law, uncorrelated
    # in the cavity, and left the draws of the law that correlates them EP's (the rat tumours'
    # a and b: 0.05 where NUTS has 0.86; a Gamma likelihood's shape and rate: 0.10, not 0.82)
    from pmkjit.ep.hierarchy import CollapsedPrior

    def takes_joint(fi: int, method) -> bool:
        # the law's coordinates are the factor's latent inputs, in order (not a regression's
        # whitened predictor, nor a joint site's pair)
        return isinstance(method, CollapsedPrior) or (
            type(method) is CollapsedLikelihood and method._block is None
            and not (method.pair_inputs and graph.factors[fi].pair_slots))

    absorbed = {gi for fi, method in methods.items() if takes_joint(fi, method)
                for gi in _joint_priors(graph, state, graph.factors[fi])[0]}
    for fi, method in sorted(methods.items(), key=lambda item: (item[0] in absorbed,
                                                                graph.factors[item[0]].kind != "likelihood",
                                                                -len(graph.factors[item[0]].latent_inputs))):
        f = graph.factors[fi]
        marg = _marginals(graph, None, state, f)
        marginals = [marg[i] for i in f.targets]
        if hasattr(method, "element_places"):
            # a hierarchical prior (pmkjit.ep.hierarchy): its element hyperparameters with its
            # outputs from its law, or given the outputs' draws where those are made elsewhere
            # (a scale the real latents are drawn given, pmkjit.ep.conditional, or a likelihood
            # drawn above); a per-group likelihood (pmkjit.ep.grouped): its groups' elements
            found = method.element_places()
            if found is None:
                continue
            hyper, out = list(found[:-1]), found[-1]

            def drawable(p) -> bool:
                # a per-group likelihood's Gaussian coordinates (BLOCK, J, a, c: x = a theta_J + c)
                # are drawn so only where EP's posterior leaves each uncorrelated with every other
                # coordinate (replacing them then keeps the rest of the joint Gaussian)
                return (p is not None and ("theta" if p[0] == BLOCK else p[0]) not in fixed
                        and not (p[0] == BLOCK and (theta is None or not _alone(state, p[1])))
                        and not {(p[0], int(j)) for j in p[1]} & taken)

            if getattr(method, "draws_separately", False):
                # shared scalars beside groups (pmkjit.ep.nested) are drawn from the law's
                # marginal where the groups' coordinates cannot be replaced
                hyper = [p if drawable(p) else None for p in hyper]
                if all(p is None for p in hyper):
                    continue
            elif not all(drawable(p) for p in hyper):
                continue
            keys = [(p[0], int(j)) for p in hyper if p is not None for j in p[1]]
            priors = _exact_priors(graph, state, f, joint=takes_joint(fi, method))
            if out is not None and out[0] not in fixed and not {(out[0], int(j)) for j in out[1]} & taken:
                draws = method.joint_draws(marginals, state.sites[fi], n, rng, priors)
                if draws is None:
                    continue
                keys += [(out[0], int(j)) for j in out[1]]
            else:
                # Not given a Gaussian output's draws: EP's Gaussian marginal of a coefficient
                # under a Laplace prior lacks the prior's spike at 0 where the data are weak, and
                # the scale drawn given it came out 0.26 sd high and 0.74 as wide as the exact
                # law. The hyperparameters are then drawn from the law's marginal, independent of
                # the outputs as EP's draws are, but not confined to their family's shape.
                draws = None
                if out is not None:
                    x = np.asarray(elements[out[0]][:, out[1]], dtype=float)
                    draws = method.draws_given(x, marginals, state.sites[fi], rng, priors)
                if draws is None:
                    draws = method.joint_draws(marginals, state.sites[fi], n, rng, priors)
                    if draws is None:
                        continue
                    draws = draws[:-1]
            for place, x in zip(hyper + [out], draws):
                if place is None:
                    continue
                name, idx = place[:2]
                x = np.asarray(x, dtype=float).reshape(n, idx.size)
                if name == BLOCK:
                    a, c = place[2:]
                    x = (x - c) / a
                    theta[:, idx] = np.where(np.isfinite(x), x, theta[:, idx])
                    continue
                keep = np.isfinite(x)  # a draw the grid could not resolve keeps EP's
                elements[name][:, idx] = np.where(keep, x, elements[name][:, idx])
            taken |= set(keys)
            done.add(fi)
            done.update(getattr(priors, "factors", ()))  # a potential in the law was drawn with it
            continue
        if getattr(method, "pair_inputs", None) and f.pair_slots:
            # a joint site on inputs that read scalars in common (a and b - a): drawn together
            if _draw_joint_site(graph, fi, method, state, marginals, elements, theta, rng, n, fixed, taken):
                done.add(fi)
            continue
        places = []
        for k, i in enumerate(f.latent_inputs):
            s = f.inputs[i]
            if isinstance(s, ElementSlot):
                if s.variable in fixed:
                    break
                places.append((s.variable, np.asarray(s.index).reshape(s.size, -1)[0, :1], np.ones((1, 1)),
                               np.zeros(1)))
                continue
            # the reference predictors eta_R = A_R theta + c_R, one per coordinate of theta they
            # read (b, or a regression's a and b), are drawn; theta_J = A_R[:, J]^-1 (eta_R - c_R)
            R = method._basis[0] if k == method._block else np.array([method._linear[k][0]])
            A_R = np.asarray(s.A, dtype=float).reshape(s.size, -1)[R]
            J = np.flatnonzero(np.any(A_R != 0.0, axis=0))
            if J.size != R.size or theta is None or "theta" in fixed:
                break
            B = A_R[:, J]
            if not np.linalg.cond(B) < 1e12:
                break
            c = np.broadcast_to(np.asarray(s.c, dtype=float), (s.size,))[R]
            places.append((BLOCK, J, B, c))
        else:
            # the law's Gaussian coordinates are replaced together: correlated with the rest,
            # replacing them would break the joint Gaussian; among themselves only within one
            # input's coordinates (a regression's a and b) or between two inputs whose order is
            # part of the law (a mixture's ordered means, correlated through their order factor)
            J = [j for name, idx, _, _ in places if name == BLOCK for j in idx]
            ordered = {frozenset((k, l)) for k, _, _, l, _, _ in getattr(method, "_order", ())}
            if J and not (_alone(state, np.array(J), among=False) and all(
                    frozenset((p, q)) in ordered or _uncorrelated(state, places[p][1], places[q][1])
                    for p in range(len(places)) for q in range(p) if places[p][0] == places[q][0] == BLOCK)):
                continue
            keys = [(name, int(j)) for name, idx, _, _ in places for j in idx]
            if len(set(keys)) < len(keys) or set(keys) & taken:
                continue
            priors = _exact_priors(graph, state, f, joint=takes_joint(fi, method))
            draws = method.joint_draws(marginals, state.sites[fi], n, rng, priors, state)
            if draws is None:
                continue
            for (name, idx, B, c), x in zip(places, draws):
                x = np.asarray(x, dtype=float).reshape(n, -1)
                if name == BLOCK:
                    theta[:, idx] = np.linalg.solve(B, (x - c).T).T
                else:
                    elements[name][:, idx[0]] = x[:, 0]
            taken |= set(keys)
            done.add(fi)
            done.update(getattr(priors, "factors", ()))
    return done


def _draw_joint_site(graph, fi: int, method: CollapsedLikelihood, state, marginals, elements: dict,
                     theta: np.ndarray | None, rng: np.random.Generator, n: int, fixed: frozenset[str],
                     taken: set) -> bool:
    """:func:`draw_jointly` for a likelihood whose Gaussian inputs share one joint site
    (``method.pair_inputs``): their reference predictors ``e = B theta_J + c`` read the block's
    coordinates ``J``, as many as there are inputs (``a`` and ``b - a`` read ``a`` and ``b``),
    so a joint draw of ``e`` and the elements from the law gives ``theta_J = B^-1 (e - c)``.
    Where ``B`` is not square and well conditioned, ``J`` is correlated with the block's other
    coordinates, or a latent is drawn elsewhere, the draws stay EP's (False)."""
    f = graph.factors[fi]
    if theta is None or "theta" in fixed:
        return False
    places = []  # per latent input: (variable, element) of an element, None for a linear one
    for i in f.latent_inputs:
        s = f.inputs[i]
        if isinstance(s, ElementSlot):
            if s.variable in fixed:
                return False
            places.append((s.variable, int(np.asarray(s.index).reshape(s.size, -1)[0, 0])))
        else:
            places.append(None)
    A, offsets = method._pair_rows  # every linear input is one of pair_inputs
    J = np.flatnonzero(np.any(A != 0.0, axis=0))
    B = A[:, J]
    if B.shape[0] != B.shape[1] or not np.linalg.cond(B) < 1e12 or not _alone(state, J, among=False):
        return False
    keys = [(BLOCK, int(j)) for j in J] + [p for p in places if p is not None]
    if set(keys) & taken:
        return False
    draws = method.joint_draws(marginals, state.sites[fi], n, rng, _exact_priors(graph, state, f), state)
    if draws is None:
        return False
    E = np.stack([np.asarray(x, dtype=float).reshape(n) for x, p in zip(draws, places) if p is None], axis=1)
    theta[:, J] = np.linalg.solve(B, (E - offsets).T).T
    for x, p in zip(draws, places):
        if p is not None:
            x = np.asarray(x, dtype=float).reshape(n)
            elements[p[0]][:, p[1]] = np.where(np.isfinite(x), x, elements[p[0]][:, p[1]])
    taken |= set(keys)
    return True


def _alone(state, J: np.ndarray, *, among: bool = True) -> bool:
    """Whether EP's joint Gaussian leaves the coordinates ``J`` of the block uncorrelated with
    every coordinate outside ``J`` and, if ``among``, with each other (their posterior
    covariances, by the Cholesky factor of the precision).

    One law's own coordinates (a regression's a and b) may be correlated among themselves, as
    they are drawn together (``among=False``); a per-group likelihood's groups are drawn
    independently, so their coordinates may not.
    """
    J = np.asarray(J, dtype=int)
    cols = np.abs(linalg.cho_solve((state.chol, True), np.eye(state.chol.shape[0])[:, J]))
    own = cols[J, np.arange(J.size)]
    if among:
        cols[J, np.arange(J.size)] = 0.0
    else:
        cols[J] = 0.0
    return bool(np.all(cols.max(axis=0) <= 1e-9 * np.sqrt(own * own.max())))


def _uncorrelated(state, J: np.ndarray, K: np.ndarray) -> bool:
    """Whether EP's joint Gaussian leaves the block's coordinates ``J`` uncorrelated with ``K``
    (as :func:`_alone`, relative to their variances)."""
    cols = linalg.cho_solve((state.chol, True), np.eye(state.chol.shape[0])[:, np.concatenate([J, K])])
    var = np.diag(cols[np.concatenate([J, K])])
    cross = np.abs(cols[K][:, :len(J)])
    return bool(np.all(cross <= 1e-9 * np.sqrt(var[:len(J)] * var.max())))


def rotated_grid(log_law, m: int, centre: np.ndarray, var: np.ndarray, nodes: int, cost: float,
                 budget: float = _MAX_DRAW_EVALUATIONS, min_resolved: float = _MIN_RESOLVED_NODES,
                 frame: tuple[np.ndarray, np.ndarray] | None = None, edge: float = _ROTATED_EDGE) -> tuple | None:
    """A law of ``m`` coordinates (``log_law``: nodes ``(G, m)`` to unnormalised log densities,
    or None where it can be evaluated nowhere) on a uniform grid of ``nodes`` per axis over
    +-6.5 of its sds in its own (rotated) frame, found from a first grid over +-8 sds of
    ``centre`` and ``var`` (see :meth:`CollapsedLikelihood._rotated_grid`), or over +-6.5 of
    ``frame`` ``(centre, L)`` where given (the law's frame in the last sweep, which a
    converging EP leaves in place: one pass instead of four or five; a third element, the
    last grid's ``reach`` (:func:`grid_reach`), starts it with the faces widened as they
    were there, a second pass otherwise); ``cost`` evaluations
    per node count against ``budget``. Returns ``(Z, w, spacing, (centre, L))`` or None.

    Where more than ``edge`` of the mass lies on the grid's boundary, only the faces
    that hold it are pushed out (``_WIDEN`` times their reach, at the same spacing), so the
    product grid (``Z`` a product of uniform axes, not a cube) is longer on the side of a
    long tail and no longer elsewhere: a zero-inflated count's mixing weight has an
    exponential tail towards no inflation, 1e-3 of its mass beyond 6.5 sds, and a cube wide
    enough for it cost 4.5 times the grid in four coordinates.
    """
    L, half = np.diag(np.sqrt(var)), 8.0
    reach = np.ones((m, 2))  # each axis's extent below and above the centre, in units of half
    if frame is not None:
        (centre, L), half = frame[:2], 6.5
        if len(frame) > 2:
            reach = np.array(frame[2], dtype=float)
    for _ in range(_ROTATED_PASSES):
        core = (nodes - 1) // 2 + (nodes - 1) % 2  # nodes from the centre to either edge of the cube
        spacing = half / core
        counts = np.ceil(core * reach - 1e-9).astype(int)
        axes = [spacing * np.arange(-lo, hi + 1) for lo, hi in counts]
        Z = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, m)
        U = centre + Z @ L.T
        logw = log_law(U)
        if logw is None:
            return None
        w = np.exp(logw - logw.max())
        w /= w.sum()
        mean = w @ U
        D = U - mean
        try:
            if not 1.0 / np.sum(w**2) >= min_resolved:
                raise np.linalg.LinAlgError
            L_next = np.linalg.cholesky((D * w[:, None]).T @ D)
        except np.linalg.LinAlgError:
            centre, L, half, reach = U[np.argmax(w)], _ZOOM * L, 8.0, np.ones((m, 2))
            continue
        shift = linalg.solve_triangular(L_next, mean - centre, lower=True)
        ratio = np.linalg.svd(linalg.solve_triangular(L_next, L, lower=True), compute_uv=False)
        stable = half == 6.5 and np.all(np.abs(shift) <= 0.05) and np.all(np.abs(2.0 * np.log(ratio)) <= 0.1)
        if stable:
            # the mass on each axis's lower and upper face
            faces = np.array([[w[Z[:, k] <= a[0] + 1e-9 * spacing].sum(), w[Z[:, k] >= a[-1] - 1e-9 * spacing].sum()]
                              for k, a in enumerate(axes)])
            edge_mass = w[np.any(np.isclose(Z, [a[0] for a in axes]) | np.isclose(Z, [a[-1] for a in axes]), axis=1)].sum()
            if edge_mass <= edge:
                return Z, w, spacing, (centre, L)
            # the faces beyond their share of the allowance (one at least, as they hold it all)
            reach = np.where(faces > edge / (2 * m), reach * _WIDEN, reach)
            if np.prod(np.ceil(core * reach - 1e-9).sum(axis=1) + 1) * cost > budget:
                return None
        centre, L, half = mean, L_next, 6.5
    return None


def _edge_allowance(m: int) -> float:
    """The mass a collapsed law of ``m`` element scalars may leave on its rotated grid's edge."""
    return _ROTATED_EDGE_ELEMENTS if m >= 4 else _ROTATED_EDGE


def _without_jitter_variance(Zs: np.ndarray, Z: np.ndarray, w: np.ndarray, spacing: float) -> np.ndarray:
    """Draws ``Zs`` (nodes of a grid ``Z`` of weights ``w`` picked and jittered uniformly within
    their cell) mapped affinely back to the grid's mean and covariance.

    The jitter adds ``spacing**2 / 12`` to the variance along every axis: on the 15 nodes per
    axis of a five-coordinate grid (0.93 sds apart) 8,000 draws' sds came out 1-4% wider than
    the exact posterior's, 1-2% on a four-coordinate one. The map
    ``T = L_S L_(S + c I)^-1`` takes the covariance ``S + c I`` of the jittered nodes to ``S``."""
    mean = w @ Z
    D = Z - mean
    S = (D * w[:, None]).T @ D
    try:
        L_S = np.linalg.cholesky(S)
        L_J = np.linalg.cholesky(S + np.eye(S.shape[0]) * spacing**2 / 12.0)
    except np.linalg.LinAlgError:
        return Zs
    return mean + (L_S @ linalg.solve_triangular(L_J, (Zs - mean).T, lower=True)).T


def grid_reach(Z: np.ndarray, spacing: float, nodes: int) -> np.ndarray:
    """The extent ``(m, 2)`` of :func:`rotated_grid`'s grid ``Z`` below and above its centre on
    each axis, in units of the half-width of its cube of ``nodes`` per axis."""
    core = (nodes - 1) // 2 + (nodes - 1) % 2
    return np.stack([-Z.min(axis=0), Z.max(axis=0)], axis=1) / (spacing * core)


def _checked_moments(X: np.ndarray, w: np.ndarray, Z: np.ndarray, spacing: float,
                     S: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and covariance of a rotated grid's nodes ``X`` ``(G, d)`` of normalised weights
    ``w`` (``Z`` the nodes in the grid's frame, ``spacing`` apart), with each node's own
    covariance ``S`` ``(G, k, k)`` of the last ``k`` coordinates added where given (nested
    Laplace's conditional Gaussians); None where the grid of every other node disagrees by
    more than ``_ROTATED_CHECK``."""
    coarse = np.all(np.round((Z - Z[0]) / spacing).astype(int) % 2 == 0, axis=1)

    def moments(use):
        v = w[use] / w[use].sum()
        mean = v @ X[use]
        D = X[use] - mean
        cov = (D * v[:, None]).T @ D
        if S is not None:
            k = S.shape[1]
            cov[-k:, -k:] += np.tensordot(v, S[use], axes=1)
        return mean, cov

    mean, cov = moments(np.ones(w.size, bool))
    mean_h, cov_h = moments(coarse)
    sd = np.sqrt(np.diag(cov))
    if not (np.all(np.abs(mean - mean_h) <= _ROTATED_CHECK[0] * sd)
            and np.all(np.abs(np.log(np.diag(cov_h) / sd**2)) <= _ROTATED_CHECK[1])):
        return None
    return mean, cov


def _cubature(k: int, most: float) -> tuple[np.ndarray, np.ndarray] | None:
    """A cubature rule for the standard normal in ``k`` dimensions of at most ``most`` points
    ``(J, k)``, the centre first, and weights ``(J,)``; None if none is that small.

    The product of 5-point Gauss-Hermite rules (degree 9 in each coordinate) where affordable,
    else Stroud's fully symmetric rule of degree 5 (``2 k^2 + 1`` points: the centre,
    ``+-sqrt(k + 2) e_i`` and ``sqrt((k + 2) / 2) (+-e_i +- e_j)``; the axis points' weights
    are negative beyond four dimensions). A Laplace Gaussian's correction to the mean needs
    degree 5 (the law's skewness against its fourth moments); to the covariance, degree 8 (the
    skewness squared): for a Gamma regression's coefficients at N = 60 the degree-5 rule left
    their sds 1.5-2% narrow, the product rule matched the exact grid to 0.2%.
    """
    if 5.0**k <= most:
        t, w = hermegauss(5)
        P = np.stack(np.meshgrid(*([t] * k), indexing="ij"), axis=-1).reshape(-1, k)
        W = np.prod(np.stack(np.meshgrid(*([w / w.sum()] * k), indexing="ij"), axis=-1).reshape(-1, k), axis=1)
        first = (5**k - 1) // 2  # the centre, (0, ..., 0)
        order = np.r_[first, np.arange(first), np.arange(first + 1, 5**k)]
        return P[order], W[order]
    if 2 * k * k + 1 > most:
        return None
    pts, wts = [np.zeros((1, k))], [np.array([2.0 / (k + 2)])]
    axis = np.sqrt(k + 2.0) * np.eye(k)
    pts += [axis, -axis]
    wts += [np.full(2 * k, (4.0 - k) / (2.0 * (k + 2) ** 2))]
    i, j = np.triu_indices(k, 1)
    if i.size:
        r = np.sqrt((k + 2) / 2.0)
        for si, sj in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
            p = np.zeros((i.size, k))
            p[np.arange(i.size), i] = si * r
            p[np.arange(i.size), j] = sj * r
            pts.append(p)
        wts.append(np.full(4 * i.size, 1.0 / (k + 2) ** 2))
    return np.concatenate(pts), np.concatenate(wts)


def all_proper(laws: Sequence[ExponentialFamily]) -> bool:
    """Whether every entry of every law is a proper law of its family."""
    return all(np.all(law.is_proper()) for law in laws)


def _marginal_frames(marginals, ref) -> tuple[np.ndarray, np.ndarray]:
    """EP's marginal of each latent (at its reference instance) as mean and variance of its
    unconstrained coordinate: where the collapsed law's grids are first placed."""
    mom = np.array([np.asarray(m[r:r + 1].unconstrained_moments(), dtype=float)[:, 0]
                    for m, r in zip(marginals, ref)]).reshape(-1, 2)  # (none: a predictor alone)
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
    """``sum_k log cavity_k(u_k)`` in unconstrained coordinates, up to a constant, a prior site
    replaced by the prior's exact density where ``priors[k]`` is ``(site, log_density)``:
    ``cavity(u) / exp(site . T(x)) * prior(x)``, the Jacobian staying the cavity's.

    Unnormalised (``eta . T(x(u)) + log |dx/du|``), so a cavity that is improper in its
    family serves where the law it is part of is proper: a hierarchical prior's hyperparameter
    whose own prior a Gamma cannot hold (``pm.Pareto``'s ``x**-2.5``)."""
    total = 0.0
    for k, (c, u) in enumerate(zip(cavities, us)):
        fam = type(c)
        term = (fam.sufficient_statistics_unconstrained(u) @ np.asarray(c.natural, dtype=float)[0]
                + fam.log_abs_det_jacobian(u))
        if priors is not None and priors[k] is not None:
            site, log_density = priors[k]
            term = term - fam.sufficient_statistics_unconstrained(u) @ site + log_density(fam.from_unconstrained(u))
        total = total + term
    for positions, sites, log_density in getattr(priors, "joint", ()):
        xs = []
        for k, site in zip(positions, sites):
            fam = type(cavities[k])
            total = total - fam.sufficient_statistics_unconstrained(us[k]) @ site
            xs.append(fam.from_unconstrained(us[k]))
        total = total + log_density(xs)
    return total


class ExactPriors(list):
    """:func:`_exact_priors`'s answer: per latent input, ``(site, log_density)`` or None; and
    ``joint``, per one-instance factor of several of those latents (a hyperprior written as
    ``pm.Potential("p(a, b)", -2.5 * log(a + b))``), ``(positions, sites, log_density)``:
    the latents it reads (positions among the inputs), its site on each, and its exact log
    density of their values (a list of ``(G,)`` arrays), which stands in for those sites;
    ``factors``, those factors' indices into the graph's factors (drawn with the law)."""

    def __init__(self, per_latent: Sequence, joint: Sequence = (), factors: Sequence[int] = ()):
        super().__init__(per_latent)
        self.joint = tuple(joint)
        self.factors = tuple(factors)


def _exact_priors(graph, state, f: BlackBoxFactor, joint: bool = False) -> ExactPriors | None:
    """Per latent input of ``f``: ``(site, log_density)`` of the black-box prior factor of that
    element with constant parameters (:meth:`CollapsedLikelihood.joint_draws`), or None.

    ``joint``: also the one-instance likelihoods (a ``pm.Potential``) that read nothing but
    elements among ``f``'s latent inputs (:func:`_joint_priors`), in ``ExactPriors.joint``."""
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
    found, terms = _joint_priors(graph, state, f) if joint else ((), ())
    return ExactPriors(out, terms, found) if terms or any(p is not None for p in out) else None


def _element_of(s) -> tuple[str, int] | None:
    """``(variable, element)`` of a slot whose every instance reads that one element, or None."""
    if not isinstance(s, ElementSlot):
        return None
    index = np.asarray(s.index).reshape(s.size, -1)[:, 0]
    return (s.variable, int(index[0])) if np.all(index == index[0]) else None


def _joint_priors(graph, state, f: BlackBoxFactor) -> tuple[list[int], list[tuple]]:
    """The black-box likelihoods other than ``f`` whose latent inputs are all elements that
    ``f``'s latent inputs read, in every instance the same (the rat tumours' hyperprior
    ``pm.Potential("p(a, b)", -2.5 * log(a + b))`` beside ``theta ~ Beta(a, b)``; a second
    likelihood of a Gamma's shape and rate): their indices into ``graph.factors``, and per
    factor ``(positions, sites, log_density)`` as :class:`ExactPriors` holds them, the sites
    summed over its instances and the density over its observations.

    Such a factor's site on each latent is a separate Gamma or Gaussian, so a law that takes
    it from the cavity drops the correlation it puts between them (the rat tumours' ``a`` and
    ``b``: 0.05 in the draws where NUTS has 0.86; beside a second Gamma likelihood written as
    ``pm.Potential("lik", pm.logp(pm.Gamma.dist(a, b), y2).sum())``, sds 0.72 of the exact
    law's); its exact density keeps it. At most ``_MAX_JOINT_INSTANCES`` observations."""
    places = {}
    for k, i in enumerate(f.latent_inputs):
        e = _element_of(f.inputs[i])
        if e is not None:
            places.setdefault(e, k)
    found, terms = [], []
    for gi, g in enumerate(graph.factors):
        # one observed value per instance, weighed by the model's own density (not a
        # simulator's kernel, nor a multivariate observation, whose logp reads more)
        if (g is f or g.kind != "likelihood" or g.size > _MAX_JOINT_INSTANCES or g.logp is None
                or g.analytic is not None or g.density_source != "pymc" or not g.latent_inputs
                or np.size(g.observed) != g.size):
            continue
        reads = [_element_of(g.inputs[i]) for i in g.latent_inputs]
        if any(e not in places for e in reads):
            continue
        data = {i: np.asarray(s.values, dtype=float).reshape(-1) for i, s in enumerate(g.inputs)
                if isinstance(s, DataSlot)}
        if any(v.size != g.size for v in data.values()):
            continue
        positions = [places[e] for e in reads]
        sites = [np.asarray(state.sites[gi][j], dtype=float).reshape(g.size, -1).sum(axis=0)
                 for j in range(len(reads))]
        y = np.asarray(g.observed, dtype=float).reshape(1, g.size)

        def log_density(xs, _g=g, _data=data, _y=y):
            G, size = np.shape(xs[0])[0], _y.shape[1]
            out = np.empty(G)
            step = max(1, _CHUNK // size)
            for lo in range(0, G, step):
                rows = slice(lo, min(G, lo + step))
                width = rows.stop - rows.start
                it = iter(xs)
                ins = tuple(np.broadcast_to(_data[i], (width, size)) if i in _data
                            else np.broadcast_to(np.asarray(next(it), dtype=float)[rows, None], (width, size))
                            for i in range(len(_g.inputs)))
                with np.errstate(all="ignore"):
                    lp = np.asarray(_g.logp(np.broadcast_to(_y, (width, size)), ins), dtype=float)
                out[rows] = lp.reshape(width, size).sum(axis=1)
            return np.where(np.isnan(out), -np.inf, out)

        found.append(gi)
        terms.append((positions, sites, log_density))
    return found, terms
