"""Parallel, damped expectation propagation on a :class:`~pmkjit.graph.FactorGraph`.

State: one site per (black-box factor instance, latent slot), held as natural
parameters ``(*, 2)`` of the slot's family (Gaussian sites on linear slots are
rank-one sites on the joint Gaussian). The posterior approximation is

* ``q(theta) = N(P^{-1} h, P^{-1})`` with ``P = P0 + sum A^T diag(-2 n2) A`` and
  ``h = h0 + sum A^T (n1 + 2 n2 c)`` over the Gaussian sites ``(n1, n2)`` on
  ``eta = A theta + c`` (``P0``, ``h0`` from the exact Gaussian factors);
* for every Beta or Gamma variable, the sum of its conjugate and black-box sites.

A sweep visits the black-box factors one after another; all instances of a factor
are updated at once (cavity, tilted beliefs, projection, damped site update), with a
guard that never lets an improper cavity or posterior through: an instance whose
cavity is improper is skipped, and an update that makes the posterior improper is
retried with half the damping, then dropped. Each is counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import linalg

from pmkjit.errors import UnsupportedModelError
from pmkjit.families import Gaussian, PointMass
from pmkjit.ep.joint import joint_update
from pmkjit.ep.normal_scale import noise_power
from pmkjit.graph.factor_graph import BlackBoxFactor, DataSlot, FactorGraph, LinearSlot

__all__ = ["EPState", "EPInfo", "init", "sweep", "combine", "posterior_moments"]

_MAX_HALVINGS = 4
_FLAT = 1e-8  # cavity / marginal precision below which a prior's output cavity counts as flat
_INIT_CLIP = 30.0  # |unconstrained value| of the forward samples that start a prior's site


@dataclass
class EPState:
    """Sites of every black-box factor and the posterior they imply."""

    sites: list[list[np.ndarray]]
    mu: np.ndarray
    chol: np.ndarray
    element_natural: dict[str, np.ndarray]


@dataclass
class EPInfo:
    """What one sweep did.

    Attributes
    ----------
    max_change : float
        Largest change of a posterior mean (in sds) or log sd over the sweep.
    change : ndarray
        The signed changes behind ``max_change``: every scalar latent's mean shift in
        its new sd, then the change of its log sd (NaN where undefined).
    skipped_improper_cavity, damping_halvings, rejected_updates, unanswered : int
        Guard events of the sweep.
    updated : int
        Factor instances whose sites the sweep moved.
    silent : list of str
        Factors none of whose instances with a proper cavity got an answer: their sites
        did not move because they could not, whatever the rest of the posterior did.
    seconds : dict
        Time in each part (cavity, tilted moments, site update).
    variance : dict of str to ndarray (size, n_outputs)
        Per factor answered by a KJIT operator: the epistemic predictive variance of
        each instance's message (NaN where no operator existed yet or the cavity was
        skipped).
    asked : dict of str to ndarray of bool (size,)
        Per factor answered by a KJIT operator: which instances went to the oracle.
    sweep : int
        1-based sweep number (set by :func:`pmkjit.fit`).
    damping : float
        Damping the sweep used.
    """

    max_change: float
    change: np.ndarray = field(default_factory=lambda: np.zeros(0))
    skipped_improper_cavity: int = 0
    damping_halvings: int = 0
    rejected_updates: int = 0
    unanswered: int = 0
    updated: int = 0
    silent: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    variance: dict[str, np.ndarray] = field(default_factory=dict)
    asked: dict[str, np.ndarray] = field(default_factory=dict)
    sweep: int = 0
    damping: float = 1.0


class _Prior:
    """Constant parts of the posterior: exact Gaussian factors and conjugate element sites."""

    def __init__(self, graph: FactorGraph):
        D = graph.n_theta
        self.P0 = np.zeros((D, D))
        self.h0 = np.zeros(D)
        for t in graph.gaussian_terms:
            Rw = t.R * t.precision[:, None]
            self.P0 += t.R.T @ Rw
            self.h0 += Rw.T @ (t.y - t.c)
        self.element = {v.name: np.zeros((v.size, 2)) for v in graph.element_variables}
        for s in graph.element_sites:
            np.add.at(self.element[s.variable], s.index, s.natural)


def init(graph: FactorGraph, rng: np.random.Generator, n_init: int = 4000) -> tuple[EPState, _Prior]:
    """Initial sites: zero for likelihood factors; prior factors moment matched by forward sampling.

    A latent whose only prior is a black-box factor (say ``s ~ HalfNormal``) would start
    with an improper posterior; its prior site is therefore initialised by projecting
    forward samples of the prior (parents drawn from their current approximations, in
    the model's topological order), as if its cavity were flat.
    """
    prior = _Prior(graph)
    sites = [[np.zeros((s.size, 2)) for s in f.slots] for f in graph.factors]
    state = _posterior(graph, prior, sites, jitter=True)
    for fi, f in enumerate(graph.factors):
        if f.from_prior:
            # a Normal prior with a latent scale: start the residual's site at N(0, (2 E[sd])^2)
            q = f.inputs[1].family.from_natural(state.element_natural[f.inputs[1].variable][f.inputs[1].index])
            sd = q.mean() ** (0.5 * noise_power(f.analytic))
            sites[fi][0] = Gaussian(np.zeros(f.size), 4.0 * sd**2).natural
            state = _posterior(graph, prior, sites, jitter=True)
            continue
        if f.kind != "prior":
            continue
        marg = _marginals(graph, prior, state, f, jitter=True)
        ins = []
        for s, m in zip(f.inputs, marg[: len(f.inputs)]):
            if isinstance(s, DataSlot):
                ins.append(np.broadcast_to(s.values, (n_init, s.size)))
            elif not np.all(m.is_proper()):
                # ab = pm.HalfFlat("ab") read by theta's Beta prior (Gelman's rat tumours) failed
                # in numpy's Gamma sampler with "scale < 0", naming nothing
                raise UnsupportedModelError(
                    f"{getattr(s, 'variable', s.label)}: its prior is improper (e.g. pm.HalfFlat or pm.Flat), and "
                    f"EP starts {f.name}'s prior by drawing from it; give it a proper prior (e.g. a pm.HalfNormal "
                    "or pm.Normal with a wide scale)"
                )
            else:
                ins.append(m.sample(rng, n_init))
        with np.errstate(all="ignore"):  # a vague prior's draws at 0 or inf: clipped below
            x = f.sampler(tuple(ins), rng)
        fam = f.output_family
        with np.errstate(all="ignore"):
            # forward samples of a diffuse prior (Beta(phi k, (1 - phi) k) with a small k)
            # round to the ends of the support (0 or 1, 0 or inf), where the sufficient
            # statistics are infinite: clip them inside, in unconstrained space
            u = np.clip(fam.to_unconstrained(np.asarray(x, dtype=float)), -_INIT_CLIP, _INIT_CLIP)
            stats = fam.sufficient_statistics_unconstrained(np.where(np.isnan(u), 0.0, u))
        if fam is Gaussian:
            # a broad start: 2 sds, from the median and the interquartile range (a normal's
            # 1.349 sds). The sample mean and variance of a heavy-tailed prior's draws (pm.Cauchy
            # coefficients of a logistic regression, robustness round 19) are ruled by a few
            # draws in the tails: they started EP at sds of tens to hundreds, the first sweep's
            # logistic beliefs at linear predictors near 400, and the KJIT operator that learned
            # from them left the coefficients 160 NUTS sd off, not converged in 50 sweeps
            lo, mid, hi = np.percentile(x, [25.0, 50.0, 75.0], axis=0)
            natural = Gaussian(mid, np.maximum((hi - lo) / 1.349, 1e-12) ** 2 * 4.0).natural
        else:
            natural = fam.project(stats.mean(0), f"initial prior of {f.name}").natural
            if f.logp is not None and not f.latent_inputs:
                # A prior with constant parameters: quadrature, with the Monte Carlo
                # projection as its frame, gives the exact projection, a start without the
                # Monte Carlo error (~1% of the mean). (A latent that nothing else reads,
                # whose site EP would never revisit, is not in the graph: it is drawn from
                # its prior, pmkjit.graph.predictive.)
                natural = _project_prior_by_quadrature(f, fam, natural)
        sites[fi][-1] = natural
        state = _posterior(graph, prior, sites, jitter=True)
    return _posterior(graph, prior, sites, jitter=False, strict=True), prior


def _project_prior_by_quadrature(f, fam, natural: np.ndarray) -> np.ndarray:
    """KL projection of a data-only prior factor's density, by quadrature on ``fam(natural)``.

    Returns ``natural`` unchanged where the quadrature is not finite or not proper.
    """
    frame = fam.from_natural(natural)
    u, w = frame.unconstrained_quadrature()  # (B, n)
    with np.errstate(all="ignore"):
        x = fam.from_unconstrained(u)
        ins = tuple(np.broadcast_to(s.values, (u.shape[1], s.size)) for s in f.inputs)
        log_p = f.logp(np.ascontiguousarray(x.T), ins).T + fam.log_abs_det_jacobian(u)
        log_r = log_p - frame.logpdf_unconstrained(u)
        log_r = np.where(w > 0, log_r, -np.inf)
        r = w * np.exp(log_r - np.max(log_r, axis=-1, keepdims=True))
        r = r / np.sum(r, axis=-1, keepdims=True)
        ess = np.einsum("bn,bnk->bk", r, fam.sufficient_statistics_unconstrained(u))
    ok = np.isfinite(ess).all(axis=-1)
    if not ok.any():
        return natural
    try:
        exact = fam.project(np.where(ok[:, None], ess, fam.from_natural(natural).expected_sufficient_statistics()),
                            f"initial prior of {f.name}").natural
    except ValueError:  # an improper projection (ImproperMessageError): keep the Monte Carlo one
        return natural
    good = ok & fam.from_natural(exact).is_proper()
    return np.where(good[:, None], exact, natural)


def _posterior(graph: FactorGraph, prior: _Prior, sites, *, jitter: bool, strict: bool = False) -> EPState:
    P = prior.P0.copy()
    h = prior.h0.copy()
    element = {k: v.copy() for k, v in prior.element.items()}
    for f, fs in zip(graph.factors, sites):
        for slot, site in zip(f.slots, fs):
            if isinstance(slot, LinearSlot):
                tau = -2.0 * site[:, 1]
                P += slot.A.T @ (slot.A * tau[:, None])
                h += slot.A.T @ (site[:, 0] + 2.0 * site[:, 1] * slot.c)
            else:
                np.add.at(element[slot.variable], slot.index, site)
    D = graph.n_theta
    if jitter and D:
        P = P + 1e-8 * np.eye(D) * max(1.0, np.abs(np.diag(P)).max(initial=1.0))
    try:
        L = np.linalg.cholesky(P) if D else np.zeros((0, 0))
    except np.linalg.LinAlgError:
        if strict:
            raise UnsupportedModelError(_improper_gaussian_message(graph, P)) from None
        return None
    mu = linalg.cho_solve((L, True), h) if D else np.zeros(0)
    if strict:
        for v in graph.element_variables:
            fam = v.family.from_natural(element[v.name])
            if not fam.is_proper().all():
                raise UnsupportedModelError(
                    f"{v.name}: its prior is improper ({v.family.name} natural parameters "
                    f"{element[v.name][~fam.is_proper()][0]}); give it a proper prior"
                )
    return EPState(sites, mu, L, element)


def _improper_gaussian_message(graph: FactorGraph, P: np.ndarray) -> str:
    weak = np.flatnonzero(np.diag(P) <= 0)
    names = sorted({v.name for v in graph.gaussian_variables for i in weak if v.offset <= i < v.offset + v.size})
    return (
        f"the prior of {', '.join(names) or 'the real-valued latents'} is improper (e.g. pm.Flat) and EP needs a "
        "proper starting point; give it a proper prior (e.g. a wide Normal)"
    )


def _marginals(graph: FactorGraph, prior: _Prior, state: EPState, f: BlackBoxFactor, jitter=False) -> list:
    """Current posterior marginals of a factor's slots (inputs, then a latent output)."""
    out = []
    slots = list(f.inputs) + ([f.output] if f.kind == "prior" else [])
    for s in slots:
        if isinstance(s, DataSlot):
            out.append(None)
        elif isinstance(s, LinearSlot):
            m = s.A @ state.mu + s.c
            Z = linalg.solve_triangular(state.chol, s.A.T, lower=True, check_finite=False)
            v = np.einsum("ij,ij->j", Z, Z)
            out.append(Gaussian(m, np.maximum(v, 1e-300)))
        else:
            out.append(s.family.from_natural(state.element_natural[s.variable][s.index]))
    return out


def posterior_moments(graph: FactorGraph, state: EPState) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Posterior mean and standard deviation of every latent (shaped like the variable)."""
    out = {}
    if graph.n_theta:
        Linv = linalg.solve_triangular(state.chol, np.eye(graph.n_theta), lower=True)
        sd = np.sqrt(np.einsum("ij,ij->j", Linv, Linv))
    for v in graph.variables.values():
        if v.in_gaussian_block:
            sl = slice(v.offset, v.offset + v.size)
            out[v.name] = (state.mu[sl].reshape(v.shape), sd[sl].reshape(v.shape))
        else:
            q = v.family.from_natural(state.element_natural[v.name])
            out[v.name] = (q.mean().reshape(v.shape), np.sqrt(q.var()).reshape(v.shape))
    return out


def sweep(graph: FactorGraph, prior: _Prior, state: EPState, methods: list[Callable], *,
          damping: float) -> tuple[EPState, EPInfo]:
    """One parallel EP sweep over every black-box factor.

    Parameters
    ----------
    graph, prior, state
        From :func:`init` or the previous sweep.
    methods : list of callables
        One per factor: ``method(messages) -> Answer`` (beliefs of the factor's targets).
    damping : float in (0, 1]
        Weight of the new site in the (natural-parameter) update.

    Returns
    -------
    (state, info)
    """
    info = EPInfo(max_change=0.0, damping=damping)
    before = _summary(graph, state)
    sites = [list(s) for s in state.sites]
    for fi, (f, method) in enumerate(zip(graph.factors, methods)):
        unanswered, skipped = info.unanswered, info.skipped_improper_cavity
        sites, state = _update_factor(graph, prior, sites, state, fi, method, damping, info)
        attempted = f.size - (info.skipped_improper_cavity - skipped)
        if attempted > 0 and info.unanswered - unanswered == attempted:
            info.silent.append(f.name)
        elif attempted == 0 and f.size > 0 and f.kind == "likelihood" and not f.from_prior:
            # every cavity improper: the observations sent EP nothing, which is no fixed
            # point (a Normal likelihood whose scale slot had the wrong family "converged"
            # in one sweep with its prior as the posterior; a latent's own prior may be
            # skipped so legitimately, a likelihood's cavity has the priors in it)
            info.silent.append(f.name)
    state.sites = sites
    info.change = _change(before, _summary(graph, state))
    info.max_change = float(np.nanmax(np.abs(info.change))) if info.change.size else 0.0
    return state, info


def _update_factor(graph: FactorGraph, prior: _Prior, sites: list[list[np.ndarray]], state: EPState, fi: int,
                   method: Callable, damping: float, info: EPInfo) -> tuple[list[list[np.ndarray]], EPState]:
    """Cavities, tilted moments and damped site update of factor ``fi`` (one step of a sweep)."""
    f = graph.factors[fi]
    t0 = time.perf_counter()
    if f.joint and not getattr(method, "collapsed", False):
        use, new = joint_update(f, state, sites[fi], method, info)
        info.seconds["tilted"] = info.seconds.get("tilted", 0.0) + time.perf_counter() - t0
        return _damped_update(graph, prior, sites, state, fi, use, new, damping, info)
    marg = _marginals(graph, prior, state, f)
    if getattr(method, "collapsed", False):
        # one site for the whole likelihood (pmkjit.ep.collapsed); instance by instance
        # in a sweep where its cavity is improper or its integral refused
        new = method.sites([marg[i] for i in f.targets], sites[fi], state) if method.active else None
        info.seconds["tilted"] = info.seconds.get("tilted", 0.0) + time.perf_counter() - t0
        if new is not None:
            return _damped_update(graph, prior, sites, state, fi, np.arange(f.size), new, damping, info)
        one_site, method = method, method.per_instance
    else:
        one_site = None
    cav, ok = [], np.ones(f.size, bool)
    for k, (slot, m) in enumerate(zip(f.slots, [marg[i] for i in f.targets])):
        natural = m.natural - sites[fi][k]
        if (f.kind == "prior" or f.from_prior) and isinstance(slot, LinearSlot):
            natural = _flat_up_to_round_off(natural, m.natural)
        c = type(m).from_natural(natural)
        cav.append(c)
        ok &= c.is_proper()
    info.skipped_improper_cavity += int((~ok).sum())
    idx = np.flatnonzero(ok)
    if one_site is not None and idx.size:
        one_site.n_per_instance_sweeps += 1
    info.seconds["cavity"] = info.seconds.get("cavity", 0.0) + time.perf_counter() - t0
    if idx.size == 0:
        return sites, state
    messages = _messages(f, cav, idx)
    t1 = time.perf_counter()
    answer = method(messages)
    info.seconds["tilted"] = info.seconds.get("tilted", 0.0) + time.perf_counter() - t1
    t1 = time.perf_counter()
    if answer.variance is not None:
        var = np.full((f.size, answer.variance.shape[1]), np.nan)
        var[idx] = answer.variance
        asked = np.zeros(f.size, bool)
        asked[idx] = answer.asked
        info.variance[f.name], info.asked[f.name] = var, asked
    good = np.asarray(answer.accepted, bool).copy()
    new = []
    for k, b in enumerate(answer.beliefs):
        delta = b.natural - cav[k].natural[idx]
        good &= np.isfinite(delta).all(axis=1)
        new.append(delta)
    # a one-site factor's joint site (pmkjit.ep.collapsed) answered instance by instance: its
    # pair slots' share of it goes, as these rank-one sites do not carry one
    new += [np.zeros((idx.size, 2)) for _ in f.pair_slots]
    info.unanswered += int((~good).sum())
    sites, state = _damped_update(graph, prior, sites, state, fi, idx[good], [n[good] for n in new], damping,
                                  info)
    info.seconds["update"] = info.seconds.get("update", 0.0) + time.perf_counter() - t1
    return sites, state


def combine(graph: FactorGraph, prior: _Prior, states: Sequence[EPState], weights: np.ndarray) -> EPState | None:
    """The posterior of the sites ``sum_i weights[i] * states[i].sites``, or None if improper.

    The weights sum to 1 (an affine combination: an extrapolation of the sweeps' sites).
    """
    sites = [[sum(w * s.sites[fi][k] for w, s in zip(weights, states)) for k in range(len(fs))]
             for fi, fs in enumerate(states[-1].sites)]
    state = _posterior(graph, prior, sites, jitter=False)
    return state if state is not None and _proper_elements(graph, state) else None


def _flat_up_to_round_off(cavity: np.ndarray, marginal: np.ndarray) -> np.ndarray:
    """Gaussian cavities that are flat up to round-off, made proper and nearly flat.

    When a prior-like factor is the only factor on its output (the level of a group
    effect ``u`` that no observation reads while other levels are read; a latent that
    nothing reads at all is not in the graph, :mod:`pmkjit.graph.predictive`) its site
    carries all of the output's precision, so the cavity is exactly flat and its computed
    precision is round-off of either sign. The factor is a normalised density of its output, so the tilted law has
    a limit as the cavity flattens (the output's predictive; no message to the parents),
    and a cavity with ``_FLAT`` times the marginal's precision reaches it to that relative
    accuracy. Skipping the entries instead, as for any improper cavity, left them at a
    stale site whenever the round-off came out negative.
    """
    out = cavity.copy()
    flat = np.abs(cavity[:, 1]) <= _FLAT * np.abs(marginal[:, 1])
    out[flat] = _FLAT * marginal[flat]
    return out


def _damped_update(graph: FactorGraph, prior: _Prior, sites: list, state: EPState, fi: int, use: np.ndarray,
                   new: list[np.ndarray], damping: float, info: EPInfo) -> tuple[list, EPState]:
    """Move factor ``fi``'s sites at entries ``use`` towards ``new`` (one array per slot).

    The step is halved until the posterior is proper (its Gaussian block positive
    definite, every element message proper); after ``_MAX_HALVINGS`` halvings the
    update is rejected.
    """
    if use.size == 0:
        return sites, state
    step = damping
    for _ in range(_MAX_HALVINGS + 1):
        trial = [list(s) for s in sites]
        for k, target in enumerate(new):
            old = sites[fi][k]
            upd = old.copy()
            upd[use] = old[use] + step * (target - old[use])
            trial[fi][k] = upd
        candidate = _posterior(graph, prior, trial, jitter=False)
        if candidate is not None and _proper_elements(graph, candidate):
            info.updated += int(use.size)
            return trial, candidate
        info.damping_halvings += 1
        step *= 0.5
    info.rejected_updates += int(use.size)
    return sites, state


def _messages(f: BlackBoxFactor, cav: list, idx: np.ndarray) -> tuple:
    """Incoming messages in the operator convention ``(*inputs, output)`` for entries ``idx``."""
    targets = dict(zip(f.targets, cav))
    msgs = []
    for i, s in enumerate(f.inputs):
        msgs.append(PointMass(s.values[idx]) if isinstance(s, DataSlot) else targets[i][idx])
    if f.kind == "likelihood":
        msgs.append(PointMass(f.observed[idx]))
    elif f.kind == "prior":
        msgs.append(targets[len(f.inputs)][idx])
    else:
        msgs.append(f.output_family.from_natural(f.output_natural[idx]))
    return tuple(msgs)


def _proper_elements(graph: FactorGraph, state: EPState) -> bool:
    for v in graph.element_variables:
        if not v.family.from_natural(state.element_natural[v.name]).is_proper().all():
            return False
    return True


def _summary(graph: FactorGraph, state: EPState) -> tuple[np.ndarray, np.ndarray]:
    """Posterior means and sds of every scalar latent (the convergence criterion's coordinates)."""
    mom = posterior_moments(graph, state)
    if not mom:
        return np.zeros(0), np.ones(0)
    return (np.concatenate([m.ravel() for m, _ in mom.values()]),
            np.concatenate([s.ravel() for _, s in mom.values()]))


def _change(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Signed change of every posterior marginal: mean shift in new sds, then change of log sd."""
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = (b[0] - a[0]) / b[1]
        scale = np.log(b[1]) - np.log(a[1])
    return np.concatenate([shift, scale])
