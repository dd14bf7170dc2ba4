"""Posterior draws of the real latents given each draw of the scales they are Normal under.

EP's approximation factorises: the joint Gaussian of the real latents ``theta`` and each
positive latent (a scale ``tau``) are independent in ``q``. Where ``theta`` is Normal
given ``tau`` (a hierarchical prior ``a ~ Normal(mu, tau)``, a likelihood
``y ~ Normal(X @ w, sigma)``), the semi-analytic factor's Gaussian site is the average
over ``q(tau)`` of what the factor says given ``tau``, so independent draws of ``a - mu``
and ``tau`` lose their strongest posterior dependence: the group effects shrink with the
scale (the funnel), and a non-centred ``z = (a - mu) / tau`` computed from such draws comes
out far wider than its posterior (sd ratios 1.5 to 3.3 against NUTS).

The draws are therefore made from

    q(theta, tau) ∝ q_cav(tau) * q_rest(theta) * prod N(y; A theta + c, sd(tau)^2),

EP's posterior with those factors' sites (on ``theta`` and on ``tau``) replaced by the
factors themselves; every other factor keeps its site. Given ``tau`` it is Gaussian
(``theta`` is drawn from it exactly), and ``tau``'s marginal is ``q_cav(tau)`` times the
Gaussian integral ``Z(tau)`` (with ``tau``'s own prior density in place of its site where
the prior has constant parameters), which importance weights on draws from a widened EP
marginal reach (Pareto-smoothed, then resampled; their Pareto k says whether the proposal
covered the target). This is the structure of ``p(theta, tau | y) = p(tau | y)
p(theta | tau, y)``, exact for a Normal hierarchy with Gaussian observations.
"""

from __future__ import annotations

from dataclasses import dataclass

import arviz as az
import numpy as np
from scipy import stats
from scipy.linalg import eigh, solve_triangular  # batched since SciPy 1.15

from pmkjit.ep.normal_scale import SEMI_ANALYTIC, noise_power
from pmkjit.graph.factor_graph import ElementSlot, FactorGraph

__all__ = ["ConditionalDraws", "conditional_draws"]

_OVERSAMPLE = 4  # proposals per kept draw: resampling n of 4n weighted draws repeats few of them
_TEMPER = 0.5  # proposals of the scales from about q ** 0.5: twice the variance (see _proposal)
_NEAR_ZERO = 0.2  # share of the proposals from the component that is heavy near 0 (see _proposal)
_HEAVY, _HEAVY_DOF, _HEAVY_WIDTH, _HEAVY_CLIP = 0.1, 3.0, 1.5, 8.0  # the defensive component (see _draw_proposal)
_MAX_WORK = 1e10  # flops of the draws' linear algebra: about 2 s on one core
_MAX_WORK_GIVEN = 2e10  # ... and of draws given EP's scale marginals, one Cholesky per draw (about 5 s)
_MAX_FLOATS = 2**25  # memory for the per-element (D, D) blocks
_CHUNK_FLOATS = 2**20  # one chunk of proposals' (D, D) precisions: 8 MB, so it stays in cache
_MAX_PARETO_K = 0.7  # beyond this the importance weights are unreliable (Vehtari et al. 2024)
_MAX_WEIGHT_RATIO = 10.0  # ... unless no weight exceeds 10 times their mean (see conditional_draws)
_MAX_COLUMNS = 16  # scale elements the weights can reweight jointly


@dataclass
class ConditionalDraws:
    """Draws of the Gaussian block given the scales, and the scale draws they go with.

    Attributes
    ----------
    theta : ndarray (n, D)
    scales : dict of str to ndarray (n, size)
        Draws of the positive latents the Gaussian block is Normal under (the others keep
        their draws from EP's marginals).
    pareto_k : float
        Pareto k of the importance weights.
    reweighted : bool
        Whether the scales were reweighted: ``pareto_k <= 0.7``, or no weight above 10 times
        their mean. Otherwise the scales are EP's marginals, and ``theta`` is drawn given them.
    """

    theta: np.ndarray
    scales: dict[str, np.ndarray]
    pareto_k: float
    reweighted: bool


def _columns(factors: list) -> dict:
    """Column per distinct (scale variable, element, link) read by the Normal factors."""
    keys: dict = {}
    for _, f in factors:
        scale = f.inputs[1]
        for e in np.unique(scale.index):
            keys.setdefault((scale.variable, int(e), f.analytic), len(keys))
    return keys


class _Conditional:
    """``q_rest(theta)`` and the Normal factors given their scales, as Gaussian blocks per scale element.

    With one scale element (one column) ``P_j = P_ref + (w_j - w_ref) G`` is diagonal in one
    basis, so each draw costs ``O(D^2)`` after one eigendecomposition; with several, each
    draw has its own Cholesky.
    """

    def __init__(self, graph: FactorGraph, state, factors: list, columns: dict):
        D, E = graph.n_theta, len(columns)
        L = state.chol
        self.P, self.h = L @ L.T, L @ (L.T @ state.mu)
        self.G, self.g = np.zeros((E, D, D)), np.zeros((E, D))
        self.counts, self.squares = np.zeros(E), np.zeros(E)
        self.columns = list(columns)
        self.site = {}  # per scale variable: the removed factors' sites on it, (size, 2)
        self.reads = {}  # per scale variable: which elements likelihoods / priors read, (size, 2)
        for fi, f in factors:
            slot, scale = f.inputs[0], f.inputs[1]
            n1, n2 = state.sites[fi][0][:, 0], state.sites[fi][0][:, 1]
            self.P -= slot.A.T @ (slot.A * (-2.0 * n2)[:, None])
            self.h -= slot.A.T @ (n1 + 2.0 * n2 * slot.c)
            site = self.site.setdefault(scale.variable, np.zeros_like(state.element_natural[scale.variable]))
            np.add.at(site, scale.index, state.sites[fi][1])
            reads = self.reads.setdefault(scale.variable, np.zeros((site.shape[0], 2), bool))
            reads[scale.index, int(f.from_prior)] = True
            # the factor given its scale: prod_b N(y_b; A_b theta + c_b, 1 / w_e) per column e
            residual = np.asarray(f.observed, float) - slot.c
            elements, rows = np.unique(scale.index, return_inverse=True)
            for i, element in enumerate(elements):  # the scale's distinct elements (groups), not data points
                col = columns[(scale.variable, int(element), f.analytic)]
                A, r = slot.A[rows == i], residual[rows == i]
                self.G[col] += A.T @ A
                self.g[col] += A.T @ r
                self.counts[col] += r.size
                self.squares[col] += r @ r
        # a scale's own prior with constant parameters (HalfNormal(2)) enters with its
        # density, not with the Gamma site EP gave it
        self.priors = []
        for fi, f in enumerate(graph.factors):
            # (a black-box prior of a real latent, a Laplace coefficient, has a LinearSlot output)
            if (f.kind == "prior" and f.logp is not None and not f.latent_inputs
                    and isinstance(f.output, ElementSlot) and f.output.variable in self.site):
                np.add.at(self.site[f.output.variable], f.output.index, state.sites[fi][-1])
                self.priors.append(f)
        self._eig = None

    def log_prior(self, scales: dict[str, np.ndarray]) -> np.ndarray:
        """``(M,)``: the log density of the scales' priors that replace their sites."""
        out = np.zeros(next(iter(scales.values())).shape[0])
        for f in self.priors:
            x = scales[f.output.variable][:, f.output.index]
            ins = tuple(np.broadcast_to(s.values, x.shape) for s in f.inputs)
            with np.errstate(all="ignore"):
                out += np.sum(f.logp(np.ascontiguousarray(x), ins), axis=1)
        return out

    def precisions(self, scales: dict[str, np.ndarray]) -> np.ndarray:
        """``(M, E)``: the precision ``w_e`` of each column at each draw of the scales."""
        cols = [scales[name][:, element] for name, element, _ in self.columns]
        s = np.stack(cols, axis=1)
        return s ** -np.array([noise_power(analytic) for _, _, analytic in self.columns])  # 1 / sd^2

    # ---------------------------------------------------------------- one column
    def _eigen(self, W: np.ndarray):
        """``P_ref = L L^T`` at the median precision, and ``L^-1 G L^-T = U diag(lam) U^T``."""
        if self._eig is None:
            w_ref = float(np.median(W[:, 0]))
            L = np.linalg.cholesky(self.P + w_ref * self.G[0])
            X = solve_triangular(L, self.G[0], lower=True, check_finite=False)
            S = solve_triangular(L, X.T, lower=True, check_finite=False)
            lam, U = eigh(0.5 * (S + S.T))
            lam = np.maximum(lam, 0.0)  # G is positive semi-definite: negative values are round-off
            a = U.T @ solve_triangular(L, self.h, lower=True, check_finite=False)
            b = U.T @ solve_triangular(L, self.g[0], lower=True, check_finite=False)
            self._eig = (L, w_ref, lam, U, a, b, 2.0 * np.sum(np.log(np.diag(L))))
        return self._eig

    def _diagonal(self, W: np.ndarray) -> tuple:
        L, w_ref, lam, U, a, b, log_det = self._eigen(W)
        w = W[:, :1]
        d = 1.0 + (w - w_ref) * lam
        if not np.all(d > 0.0):
            raise np.linalg.LinAlgError("a conditional precision is not positive definite")
        return L, U, w, d, a + w * b, log_det

    # ---------------------------------------------------------------- any number of columns
    def _cholesky(self, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cholesky factors of ``P_j`` and ``h_j`` for rows of precisions ``W``."""
        E, D = self.G.shape[0], self.P.shape[0]
        Pj = self.P + (W @ self.G.reshape(E, D * D)).reshape(-1, D, D)
        return np.linalg.cholesky(Pj), self.h + W @ self.g

    def evidence(self, W: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``log Z`` (up to a constant) at each row of ``W``, and what :meth:`sample` reuses.

        ``Z`` is the integral over ``theta`` of ``q_rest`` times the factors given the
        scales. Raises ``numpy.linalg.LinAlgError`` when a ``P_j`` is not positive definite.
        """
        M, D = W.shape[0], self.P.shape[0]
        norm = 0.5 * np.log(W) @ self.counts - 0.5 * W @ self.squares
        if self.G.shape[0] == 1:
            _, _, _, d, t, log_det = self._diagonal(W)
            return 0.5 * np.sum(t**2 / d, axis=1) - 0.5 * (log_det + np.sum(np.log(d), axis=1)) + norm, None
        log_z, v = np.empty(M), np.empty((M, D))
        chunk = max(1, _CHUNK_FLOATS // (D * D))
        for start in range(0, M, chunk):
            sl = slice(start, start + chunk)
            Lj, hj = self._cholesky(W[sl])
            v[sl] = solve_triangular(Lj, hj[..., None], lower=True, check_finite=False)[..., 0]
            log_det = 2.0 * np.sum(np.log(np.diagonal(Lj, axis1=-2, axis2=-1)), axis=-1)
            log_z[sl] = 0.5 * np.einsum("mi,mi->m", v[sl], v[sl]) - 0.5 * log_det + norm[sl]
        return log_z, v

    def sample(self, W: np.ndarray, v: np.ndarray | None, z: np.ndarray) -> np.ndarray:
        """``theta ~ N(P_j^-1 h_j, P_j^-1)`` for each row of ``W``, one Cholesky each.

        ``v`` is what :meth:`evidence` returned for the same rows, or ``None`` to compute it here.
        """
        if self.G.shape[0] == 1:
            # theta = L^-T U (t / d + z / sqrt(d)): covariance (L U diag(d) U^T L^T)^-1 = P_j^-1
            L, U, _, d, t, _ = self._diagonal(W)
            y = t / d + z / np.sqrt(d)
            return solve_triangular(L, U @ y.T, lower=True, trans="T", check_finite=False).T
        D = self.P.shape[0]
        theta = np.empty_like(z)
        chunk = max(1, _CHUNK_FLOATS // (D * D))
        for start in range(0, W.shape[0], chunk):
            sl = slice(start, start + chunk)
            Lj, hj = self._cholesky(W[sl])
            vj = v[sl] if v is not None else solve_triangular(Lj, hj[..., None], lower=True, check_finite=False)[..., 0]
            # L_j^-T (v_j + z_j): mean L_j^-T L_j^-1 h_j = P_j^-1 h_j, covariance P_j^-1
            theta[sl] = solve_triangular(Lj, (vj + z[sl])[..., None], lower=True, trans="T",
                                         check_finite=False)[..., 0]
        return theta


def _proposal(q: np.ndarray, site: np.ndarray, reads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gamma proposals for scales with EP marginal ``q``: a body and, near 0, a heavier part.

    The body is ``q ** _TEMPER``: about twice the variance, heavier than the target far out,
    where ``Z`` decays polynomially and the cavity ``q / site`` exponentially. Near 0 the
    target of a prior's scale (and of no likelihood's) is the cavity times ``Z``, which tends
    to a constant there (the effects collapse onto their location); a proposal lighter than
    the cavity there gave weights without a bound (``s ** -0.06`` for the scale of a
    logistic model's group effects: Pareto k 2.6 at a relative ESS of 0.8). Such elements
    get a second component, the body with the cavity's power of ``s``, drawn with
    probability ``_NEAR_ZERO``: as the only proposal it wasted most draws where the target
    is sharp (150 groups: Pareto k 1.3). A likelihood's ``Z`` vanishes fast as its scale
    goes to 0 and needs none.

    Returns
    -------
    body, near_zero : ndarray (size, 2)
        Natural parameters of the two components (``near_zero`` equals ``body`` where there
        is no second component).
    """
    cavity = q - site
    body = _TEMPER * q  # Gamma(b (k - 1) + 1, b r): proper for every proper q
    near_zero = body.copy()
    collapsible = reads[:, 1] & ~reads[:, 0] & (cavity[:, 0] > -1.0)
    near_zero[collapsible, 0] = np.minimum(body[collapsible, 0], cavity[collapsible, 0])
    return body, near_zero


def _draw_proposal(fam, body: np.ndarray, near_zero: np.ndarray, M: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``M`` draws of every element from its proposal, and their log densities.

    The two Gamma components of :func:`_proposal`, and with probability ``_HEAVY`` a
    defensive one: ``u = to_unconstrained(s)`` Student-t with ``_HEAVY_DOF`` degrees of
    freedom about the body's ``u`` moments, ``_HEAVY_WIDTH`` times wider. A scale's prior
    with a polynomial tail (``pm.InverseGamma`` on a variance, ``pm.HalfCauchy``) enters the
    target with its density, so the target's upper tail is polynomial, where a Gamma's is
    exponential: the weights had no bound (five groups under an InverseGamma(2, 1)
    variance: Pareto k above 0.7, the draws left at EP's marginals; robustness round 31).
    In ``log s`` a Student-t's tails are heavier than any power of ``s``; it is truncated at
    ``_HEAVY_CLIP`` widths (12 body sds), beyond which the target's mass is negligible.
    """
    first, second = fam.from_natural(body), fam.from_natural(near_zero)
    x = first.sample(rng, M).reshape(M, -1)
    mixed = np.any(near_zero != body, axis=1)
    swap = (rng.random(x.shape) < _NEAR_ZERO) & mixed
    x = np.where(swap, second.sample(rng, M).reshape(M, -1), x)
    centre, var = first.unconstrained_moments()
    width = _HEAVY_WIDTH * np.sqrt(var)
    # truncated at _HEAVY_CLIP widths (drawn by the inverse CDF, its density renormalised):
    # scales e^-37 times the body's, as an untruncated draw gave, made the conditional
    # precisions singular and cost the whole reweighting (the gallery's non-centred model)
    edge = stats.t.cdf(-_HEAVY_CLIP, _HEAVY_DOF)
    t = stats.t.ppf(edge + (1.0 - 2.0 * edge) * rng.random(x.shape), _HEAVY_DOF)
    x = np.where(rng.random(x.shape) < _HEAVY, fam.from_unconstrained(centre + width * t), x)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = np.logaddexp(np.log1p(-_NEAR_ZERO) + first.logpdf(x), np.log(_NEAR_ZERO) + second.logpdf(x))
        log_q = np.where(mixed, log_q, first.logpdf(x))
        u = fam.to_unconstrained(x)
        # (a Beta draw that rounds to 1 has u = inf: outside, no weight)
        inside = np.abs(u - centre) <= _HEAVY_CLIP * width
        log_heavy = np.where(inside, stats.t.logpdf(u, _HEAVY_DOF, loc=centre, scale=width) - np.log1p(-2.0 * edge)
                             - fam.log_abs_det_jacobian(u), -np.inf)
    return x, np.logaddexp(np.log1p(-_HEAVY) + log_q, np.log(_HEAVY) + log_heavy)


def conditional_draws(graph: FactorGraph, state, scales: dict[str, np.ndarray], n: int,
                      rng: np.random.Generator) -> ConditionalDraws | None:
    """Draws of the real latents given the scales they are Normal under, the scales reweighted.

    Parameters
    ----------
    graph : FactorGraph
    state : EPState
        The fitted EP state (``mu``, ``chol`` of the precision, ``sites``).
    scales : dict of str to ndarray (n, size)
        Draws of every positive latent from EP's marginals, flattened per draw.
    n : int
        Number of draws.
    rng : numpy.random.Generator

    Returns
    -------
    ConditionalDraws or None
        ``None`` (draw from EP's joint Gaussian) when no semi-analytic Normal factor has a
        latent scale; when they read more than 16 scale elements; when the linear algebra
        would take more than a few seconds (with one scale element, an eigendecomposition,
        ``10 D^3 + n D^2 > 1e10``: ``D > 1,000``; with several, a Cholesky per draw given
        EP's scale marginals, ``n D^3 > 2e10``: ``D > 215`` for 2 x 1,000 draws; the
        reweighting, a Cholesky per proposal, needs ``4 n D^3 <= 1e10``: ``D <= 107``), or
        the per-element blocks would not fit in memory; or when a conditional precision is
        not positive definite (a site of another factor with negative precision can leave
        one so).
    """
    factors = [(fi, f) for fi, f in enumerate(graph.factors) if f.analytic in SEMI_ANALYTIC]
    D, M = graph.n_theta, _OVERSAMPLE * n
    if not factors or D == 0:
        return None
    columns = _columns(factors)
    E = len(columns)
    if E > _MAX_COLUMNS:
        # a scale per group of many, or per observation (a Student-t as a scale mixture):
        # importance weights over that many dimensions degenerate (Pareto k 2.2 with 80
        # group scales, 27 with one per observation), so the work would be thrown away
        return None
    # one column: an eigendecomposition and O(D^2) per draw; else a Cholesky per proposal,
    # or, beyond that, one per draw given EP's marginals of the scales (no reweighting)
    blocks = sum(f.size for _, f in factors) * float(D) ** 2  # the blocks A^T A
    per_draw = float(D) ** 3 + E * float(D) ** 2
    work = 10.0 * D**3 + n * float(D) ** 2 if E == 1 else M * per_draw
    if E * float(D) ** 2 > _MAX_FLOATS:
        return None
    if work + blocks > _MAX_WORK:
        if E == 1 or n * per_draw + blocks > _MAX_WORK_GIVEN:
            return None
        cond = _Conditional(graph, state, factors, columns)
        kept = {name: scales[name] for name in cond.site}
        try:
            theta = cond.sample(cond.precisions(kept), None, rng.standard_normal((n, D)))
        except np.linalg.LinAlgError:
            return None
        return ConditionalDraws(theta, kept, float("nan"), False)
    cond = _Conditional(graph, state, factors, columns)
    # proposals: the scales from Gammas wider than EP's marginals, theta given them
    proposal, minus_log_proposal = {}, np.zeros(M)
    for name, site in cond.site.items():
        fam = graph.variables[name].family
        body, near_zero = _proposal(state.element_natural[name], site, cond.reads[name])
        proposal[name], lq = _draw_proposal(fam, body, near_zero, M, rng)
        minus_log_proposal -= lq.sum(axis=1)
    W = cond.precisions(proposal)
    # a scale drawn at 0 makes its log-weight -inf or NaN: no weight, below
    with np.errstate(divide="ignore", invalid="ignore"):
        try:
            log_z, v = cond.evidence(W)
        except np.linalg.LinAlgError:
            return None
        # target q_cav(scales) Z(scales) (priors with their densities) over the proposals; Gamma
        # densities are exp(natural . (log s, s)) up to constants
        log_w = log_z + cond.log_prior(proposal) + minus_log_proposal
        for name, site in cond.site.items():
            fam = graph.variables[name].family
            coef = state.element_natural[name] - site
            log_w = log_w + np.einsum("mek,ek->m", fam.sufficient_statistics(proposal[name]), coef)
    k, ratio = np.inf, np.inf
    finite = np.isfinite(log_w)
    if finite.mean() > 0.5:
        # a proposal where the target or the linear algebra is not finite (a scale drawn
        # at 0) gets no weight, not the whole sample
        log_w = np.where(finite, log_w, np.min(log_w[finite]) - 50.0)
        with np.errstate(over="ignore"):  # arviz's Pareto fit overflows on a long flat top: weights of 0
            smoothed, k = az.psislw(log_w)
        k = float(k)
        w = np.exp(log_w - log_w.max())
        ratio = float(w.max() / w.mean())
    # Pareto k misreads weights that are bounded but have a short stretched top (the
    # proposals nearest 0 of a prior's scale, 1.3-1.8 times the median weight): k 3.1 at a
    # relative ESS of 0.83. Weights none of which exceeds 10 times their mean are reliable
    # whatever k says (ESS >= M / 10).
    if k <= _MAX_PARETO_K or ratio <= _MAX_WEIGHT_RATIO:
        # systematic resampling of n from the M weighted proposals, in random order (by the
        # weights themselves where they are bounded, else by their Pareto-smoothed form)
        use = log_w if ratio <= _MAX_WEIGHT_RATIO else smoothed
        cdf = np.cumsum(np.exp(use - use.max()))
        u = (rng.random() + np.arange(n)) / n * cdf[-1]
        index = rng.permutation(np.minimum(np.searchsorted(cdf, u), M - 1))
        theta = cond.sample(W[index], None if v is None else v[index], rng.standard_normal((n, D)))
        return ConditionalDraws(theta, {k_: p[index] for k_, p in proposal.items()}, k, True)
    kept = {name: scales[name] for name in cond.site}
    try:
        theta = cond.sample(cond.precisions(kept), None, rng.standard_normal((n, D)))
    except np.linalg.LinAlgError:
        return None
    return ConditionalDraws(theta, kept, k, False)
