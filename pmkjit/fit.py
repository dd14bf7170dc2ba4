"""``pmkjit.fit``: expectation propagation on a PyMC model, returned as ArviZ InferenceData."""

from __future__ import annotations

import contextlib
import re
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

from pmkjit import __version__  # defined before pmkjit imports this module
from pmkjit._parallel import single_threaded_blas
from pmkjit._random import RandomState, as_generator
from pmkjit.ep import engine, schedule
from pmkjit.ep.methods import FactorOracle, KJITMethod, concatenate_answers, grid_possible, quadrature_possible
from pmkjit.ep.collapsed import (CollapsedLikelihood, collapsible, integrates_gaussian_inputs, order_constraints,
                                 pair_shared_scalars)
from pmkjit.ep.collapsed_linear import CollapsedLinearNormal
from pmkjit.ep.hierarchy import CollapsedPrior, collapsible_prior
from pmkjit.ep.grouped import GroupedLikelihood, groupable
from pmkjit.ep.nested import NestedLikelihood, nestable
from pmkjit.ep.joint import JointQuadrature, join, joinable
from pmkjit.ep.linear_normal import LinearNormalMethod
from pmkjit.ep.mixture import NormalMixtureMethod
from pmkjit.ep.normal_scale import NormalScaleMethod
from pmkjit.ep.truncation import PositiveMethod
from pmkjit.ep.engine import EPInfo
from pmkjit.ep.store import OperatorStore
from pmkjit.errors import UnsupportedModelError
from pmkjit.operators import KJITOperator
from pmkjit.graph import build_factor_graph
from pmkjit.graph.factor_graph import FEW_INSTANCES
from pmkjit.graph.sharing import shares_a_latent
from pmkjit.diagnostics.model import (
    warn_bounded_beside_linear, warn_latent_conditions, warn_latent_degrees_of_freedom, warn_latent_skewness,
    warn_non_centred, warn_scales_traded_through_latents,
)
from pmkjit.diagnostics.posterior import (
    warn_correlated_hyperparameters, warn_correlated_pairs, warn_impossible_observations,
    warn_nested_groups_correlated, warn_one_site_dropped_correlation, warn_one_site_refused,
    warn_overlapping_components, warn_unconditional_centred_draws,
)
from pmkjit.inference_data import NoOracle, as_original, assemble_inference_data, ep_group, ep_posterior
from pmkjit.graph.centre import centre_non_centred
from pmkjit.graph.interval import UNIT_PREFIX, rescale_uniform_intervals, signed_latents
from pmkjit.graph.potential import potentials_as_observations
from pmkjit.graph.simplex import STICK_PREFIX, stick_break_dirichlet
from pmkjit.graph.observed import default_initial_values, observed_as_data

__all__ = ["fit", "ep_posterior", "EPNotConvergedWarning"]

_METHODS = ("kjit", "oracle", "quadrature")
_ORACLES = ("auto", "quadrature", "importance")
_THREADED_BLAS_DIM = 1000  # larger joint Gaussians factorise faster on all cores


class EPNotConvergedWarning(UserWarning):
    """EP stopped at ``max_sweeps`` before the posterior stopped changing."""


def fit(
    *,
    model: pm.Model | None = None,
    draws: int = 1000,
    chains: int = 2,
    random_seed: RandomState = None,
    progressbar: bool = True,
    method: str = "kjit",
    oracle: str = "auto",
    operators: str | Path | None = None,
    damping: float | str = "auto",
    max_sweeps: int = 50,
    tol: float = 1e-3,
    n_importance_samples: int = 100_000,
    compute_log_likelihood: bool = True,
    callback: Callable[[EPInfo], None] | None = None,
) -> az.InferenceData:
    """Fit a PyMC model by expectation propagation with just-in-time learned messages.

    Parameters
    ----------
    model : pymc.Model, optional
        Taken from the context when omitted.
    draws, chains : int
        Independent draws from the EP posterior, arranged as ``chains x draws`` so
        that ArviZ summaries and comparisons work as for MCMC output.
    random_seed : None, int, sequence of int, SeedSequence or Generator
        Seeds every random choice (KJIT features, oracles, posterior draws): the same
        seed gives bit-identical draws, ``log_likelihood`` and ``ep`` group (apart from
        its ``seconds_*`` timings); a ``Generator`` is used and advanced in place;
        ``None`` takes fresh entropy.
    progressbar : bool
        Show a progress bar over EP sweeps.
    method : {"kjit", "oracle", "quadrature"}
        Tilted moments of black-box factors: a KJIT operator in front of an oracle
        (default), the oracle alone (importance sampling), or quadrature (one or two
        latent variables per factor only). Without ``operators``, EP that converged on
        operators in front of quadrature or the grid goes on from there with that oracle
        alone, within ``max_sweeps`` (``", finished by its oracle"`` in
        ``ep.attrs["factor_methods"]``): an operator's small per-message error adds up over
        a plate's instances, and its answers are not kept anyway.
    oracle : {"auto", "quadrature", "importance"}
        The oracle behind KJIT operators; ``"auto"`` uses quadrature where a factor
        allows it and importance sampling elsewhere, and lets quadrature answer
        directly (no operator) a factor whose instances share a latent: ten or more
        instances reading one latent element or projection, where an operator's
        systematic error would add up on that latent; without ``operators``, also a
        factor of fewer than 50 instances (fewer than an operator's first fit needs). A
        likelihood with covariates on two or three of its parameters (a ZIP's ``psi`` and
        ``mu``, a Normal's mean and log scale) gets one joint Gaussian site per
        observation over its linear predictors, answered on a grid in their joint cavity
        (:mod:`pmkjit.ep.joint`), since separate sites drop their correlation.
        ``"quadrature"`` keeps an operator in front of quadrature for every factor.
    operators : str or os.PathLike, optional
        Directory of learned KJIT operators (created if missing; it must be writable):
        operators found there are loaded (so a second fit of a similar model needs few
        or no oracle calls) and all operators are written back after the fit; the
        operators' own fixed point is then kept (no finish by the oracle). See
        :class:`pmkjit.ep.OperatorStore`.
    damping : "auto" or float in (0, 1]
        Weight of new sites in each EP update. ``"auto"`` starts undamped and halves
        the weight (down to 0.05) after a sweep that changes the posterior more than the
        larger of the last two kept sweeps (an overshoot), or on a slow period-2
        oscillation (successive changes in opposite directions, shrinking by less than
        half over two sweeps); a sweep that changes it more than twice as much is also
        undone (above 0.05). A sweep that changes it less than half as much as the last
        one doubles the weight (up to 1). A sweep in which a factor's update was
        rejected (it would have made the posterior improper) halves the weight and does
        not count as convergence; if the last sweep still had one, EP starts again from
        the priors at the smallest weight, which the same rules then raise
        (``ep.attrs["restarts"]``). Where six sweeps in a row contract by a slow linear
        recurrence, the sites jump to its fixed point (``ep.attrs["extrapolations"]``).
        A float fixes the damping and turns these rules off. See
        :mod:`pmkjit.ep.schedule`.
    max_sweeps : int
        Most EP sweeps run (``EPNotConvergedWarning`` when EP has not converged by then).
    tol : float
        Convergence: largest change of a posterior mean (in posterior sds) or log sd
        between sweeps, divided by the damping of the sweep.
    n_importance_samples : int
        Samples per message tuple of the importance-sampling oracle.
    compute_log_likelihood : bool
        Add the ``log_likelihood`` group (needed by ``az.compare`` / ``az.loo``).
    callback : callable, optional
        Called after every sweep with its :class:`pmkjit.ep.EPInfo` (sweep number,
        change, damping, guard events, and per KJIT factor the predictive variance of
        every message and which ones went to the oracle), e.g. to plot the operator's
        uncertainty over time. A model whose factors are all exact needs no sweep, and
        the callback is not called.

    Returns
    -------
    arviz.InferenceData
        Groups ``posterior`` (with the model's coords, dims and deterministics),
        ``log_likelihood`` (with ``compute_log_likelihood``), ``observed_data`` and
        ``constant_data`` (where the model has observations and ``pm.Data`` or other
        constants), and ``ep`` (sweeps, convergence trace, guard events, oracle calls,
        time in each part, and the EP posterior itself in closed form: see
        :func:`ep_posterior`).

    Notes
    -----
    A non-centred group effect read by several observations per element,
    ``a = pm.Deterministic("a", mu + tau * z)`` with ``a[group]``, or written inline,
    ``mu + tau * z[group]``, is fitted in its centred form ``a ~ Normal(mu, tau)`` (the
    same model; EP's factorised messages are accurate on it and not on the non-centred
    one); ``z`` is then computed from the draws and ``ep.attrs["centred"]`` names it. See
    :func:`pmkjit.graph.centre.centre_non_centred`.

    The posterior draws of the real-valued latents are made given each draw of the
    scales they are Normal under (``tau`` above, a Normal likelihood's ``sigma``), with
    those scales importance-reweighted from EP's marginals to the marginals this implies
    (``ep.attrs["draws_given_scales"]`` says whether they were, ``ep.attrs["scale_pareto_k"]``
    is the weights' Pareto k); so the draws keep the funnel of a hierarchy and a
    non-centred ``z ~ Normal(0, 1)`` has its posterior spread. See :mod:`pmkjit.ep.conditional`.

    Raises
    ------
    UnsupportedModelError
        Naming the variable and the reason when the model is outside what pmkjit
        supports (including a model without free variables).
    OperatorFileError
        When ``operators`` is not a writable directory, or a file in it is corrupt, of
        another version or written for another factor (naming the file).
    ValueError, TypeError
        For an argument out of its range or of the wrong type (naming the argument).

    Warns
    -----
    EPNotConvergedWarning
        When EP stops at ``max_sweeps`` or without reaching a fixed point.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if oracle not in _ORACLES:
        raise ValueError(f"oracle must be one of {_ORACLES}, got {oracle!r}")
    if isinstance(damping, str):
        if damping != "auto":
            raise ValueError(f"damping must be 'auto' or a float in (0, 1], got {damping!r}")
    elif (isinstance(damping, bool) or not isinstance(damping, (int, float, np.integer, np.floating))
          or not 0.0 < damping <= 1.0):
        raise ValueError(f"damping must be 'auto' or in (0, 1], got {damping!r}")
    if callback is not None and not callable(callback):
        # (it was first called after the first sweep: "'str' object is not callable")
        raise TypeError(f"callback must be a callable taking a pmkjit.ep.EPInfo, got {callback!r}")
    draws = _count("draws", draws, minimum=1)
    chains = _count("chains", chains, minimum=1)
    max_sweeps = _count("max_sweeps", max_sweeps, minimum=1)
    n_importance_samples = _count("n_importance_samples", n_importance_samples, minimum=1)
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating)) or not tol >= 0:
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    adaptive = damping == "auto"
    step = 1.0 if adaptive else float(damping)
    original = pm.modelcontext(model)
    if not isinstance(original, pm.Model):
        raise TypeError(f"model must be a pymc.Model, got {type(original).__name__} {original!r}")
    _drop_repeated_observed(original)
    if not original.free_RVs:
        # pm.sample refuses this too; EP would otherwise run no sweep and fail building an
        # InferenceData without a posterior ("'InferenceData' object has no attribute 'posterior'")
        raise UnsupportedModelError(
            "the model has no free (latent) variables, so there is no posterior to fit: its "
            f"observations ({', '.join(v.name for v in original.observed_RVs) or 'none'}) depend on data "
            "only; use pm.sample_prior_predictive or pm.draw for forward samples"
        )
    rng = as_generator(random_seed, "random_seed")
    # an unusable directory is refused now, not after EP when the operators are written back
    store = OperatorStore(operators) if operators is not None else None
    timings: dict[str, float] = {}
    t_fit = t0 = time.perf_counter()
    with default_initial_values(original):
        model, centred = _centred(original)
        model, sticks = _rewritten(stick_break_dirichlet, model)  # Dirichlets as stick-breaking Betas
        model, bounded = _rewritten(rescale_uniform_intervals, model)  # Uniform(a, b) as a + (b - a) Uniform(0, 1)
        model, potentials = _rewritten(potentials_as_observations, model)  # as observed CustomDists
    # one rewrite serves the factor graph, the deterministics and the log-likelihood
    model = observed_as_data(model)
    try:
        graph = build_factor_graph(model, random_seed=int(rng.integers(2**31 - 1)))
    except UnsupportedModelError as err:
        if not bounded:
            raise
        # a refusal names the model's variables, not the hidden latent of a rescaled one
        message = str(err)
        for name in bounded:
            message = message.replace(f"{UNIT_PREFIX}{name}", name)
        raise UnsupportedModelError(message) from None
    timings["graph"] = time.perf_counter() - t0

    warn_scales_traded_through_latents(graph)
    warn_latent_conditions(original)  # (the names the user wrote)
    warn_latent_skewness(model)
    methods, kjits, oracles = _methods(graph, method, oracle, store, n_importance_samples, tol, rng)
    # (not for likelihoods fitted as one site: their law keeps the correlation)
    likelihood_sites = frozenset(
        fi for fi, m in enumerate(methods) if isinstance(m, (CollapsedLikelihood, GroupedLikelihood, NestedLikelihood)))
    warn_non_centred(graph, likelihood_sites)
    warn_bounded_beside_linear(graph, signed_latents(original, bounded), one_site=likelihood_sites)
    # EP's own linear algebra is on the joint Gaussian of the real latents (tens to
    # hundreds of dimensions) and on N x dim plate arrays: too small for OpenBLAS's threads
    # to pay, and on a shared machine their spinning made each posterior update ~100x
    # slower (0.3 s instead of 3 ms for N = 10,000, d = 20). KJIT predictions spread over
    # the cores by themselves.
    blas = single_threaded_blas() if graph.n_theta <= _THREADED_BLAS_DIM else nullcontext()
    with blas:
        t0 = time.perf_counter()
        state, prior = engine.init(graph, rng)
        timings["init"] = time.perf_counter() - t0

        t_ep = time.perf_counter()
        with _progress(progressbar, max_sweeps if graph.factors else 0) as advance:
            run = schedule.run(graph, prior, state, methods, damping=step, adaptive=adaptive, tol=tol,
                               max_sweeps=max_sweeps, callback=callback, advance=advance, timings=timings)
            restarted = adaptive and run.rejected > 0
            if restarted:
                # Updates still rejected in the last sweep, even at the smallest step: the
                # sites are stuck where earlier sweeps put them. In parallel EP the first
                # sweep computes every site from the priors' cavities, and hundreds of sites
                # on one latent overshoot together (a two-component mixture with a latent
                # weight, N = 500, "converged" so 48 NUTS sds off before rejected sweeps
                # halved the step); a run that starts at the smallest step, which the
                # schedule raises while the sweeps contract, does not take that first leap.
                again = schedule.run(graph, prior, engine.init(graph, rng)[0], methods,
                                     damping=schedule.MIN_AUTO_DAMPING, adaptive=True, tol=tol,
                                     max_sweeps=max_sweeps, callback=callback, advance=advance, timings=timings,
                                     first_sweep=run.sweeps + 1)
                if again.converged and not again.rejected:
                    run = _after(run, again)
            # Learned operators that EP could not converge with, where their oracle is
            # deterministic: EP is run again from the priors with those factors answered by
            # the oracle alone. A heteroscedastic regression's operator (Normal(a + b x,
            # exp(c0 + c1 x)), N = 200) was trusted by its spot checks while EP wandered for
            # 50 sweeps and stopped 19 NUTS sds off; its quadrature oracle alone converges to
            # NUTS's posterior in 16 (continuing from where EP stopped, it had not in 50).
            finished = _oracle_finish(methods) if method == "kjit" and not run.converged else {}
            # Converged on operators' answers: where their oracle is exact and cheap and no
            # store keeps the operators for later runs (whose point is to spare the oracle),
            # EP goes on from that fixed point with the oracle alone. An operator's
            # systematic error, small per message, adds up over the instances whose sites
            # land on the same few latents: a logistic regression on 569 breast-cancer
            # cases (5 coefficients) converged 0.29 posterior sd off where quadrature EP is
            # within 0.06 (robustness round 31). From the operator's fixed point the oracle
            # converges in a few sweeps, within what is left of max_sweeps; a finish that does
            # not converge there (or has an update rejected) leaves the operator's fit as it was.
            polish = _oracle_finish(methods) if method == "kjit" and run.converged and store is None else {}
            if polish and max_sweeps > run.sweeps:
                polished = [polish.get(fi, m) for fi, m in enumerate(methods)]
                more = schedule.run(graph, prior, run.state, polished, damping=run.step, adaptive=adaptive, tol=tol,
                                    max_sweeps=max_sweeps - run.sweeps, callback=callback, advance=advance,
                                    timings=timings, first_sweep=run.sweeps + 1)
                if more.converged and not more.rejected:
                    methods, finished, run = polished, polish, _after(run, more)
            elif finished:
                methods = [finished.get(fi, m) for fi, m in enumerate(methods)]
                # (from the smallest step where the first run's updates were rejected, as the
                # restart above; the oracle's run replaces the operator's even unconverged: its
                # tilted moments have no learned error)
                first = schedule.MIN_AUTO_DAMPING if restarted else step
                run = _after(run, schedule.run(graph, prior, engine.init(graph, rng)[0], methods, damping=first,
                                               adaptive=adaptive, tol=tol, max_sweeps=max_sweeps, callback=callback,
                                               advance=advance, timings=timings, first_sweep=run.sweeps + 1))
        timings["ep"] = time.perf_counter() - t_ep
        state, trace, events, sweeps = run.state, run.trace, run.events, run.sweeps
        events["finished_by_oracle"] = len(finished)
        converged, unanswered, rejected, step = run.converged, run.unanswered, run.rejected, run.step
        events["restarts"] = int(restarted)
        if converged and unanswered:
            # the posterior stopped moving, but not everywhere for the right reason: an
            # entry whose tilted moments were refused keeps a site from an earlier sweep (a
            # single observation ordering two cutpoints, 19 cavity sds out of order, left EP
            # "converged" 36 NUTS sds off before the order factors)
            warnings.warn(
                f"EP converged with {unanswered} factor instance{'s' if unanswered > 1 else ''} left unanswered in "
                "its last sweep (tilted moments the oracle could not compute); their sites are from an earlier "
                "sweep, and the posterior may be off near them: compare with pm.sample",
                UserWarning,
                stacklevel=2,
            )
        if rejected:
            # a factor whose every update would make the posterior improper keeps its old
            # sites; with damping="auto" only when the restart above did not fit either
            # (its run is dropped, and the first one's sites are returned)
            warnings.warn(
                f"EP {'converged' if converged else 'stopped'} with {rejected} site update{'s' if rejected > 1 else ''} "
                "rejected in its last sweep (each would have made the posterior improper, even damped); those "
                "sites are from an earlier sweep and EP stopped short of a fixed point: the posterior may be far "
                "off. " + ("A restart from the priors at the smallest damping did not converge without rejected "
                           "updates either; compare with pm.sample" if restarted else
                           'damping="auto" (the default) restarts from the priors in this case; compare with pm.sample'),
                UserWarning,
                stacklevel=2,
            )
        if not converged:
            importance = any(getattr(o, "kind", None) == "importance" for o in oracles)
            warnings.warn(_not_converged_message(run, tol, importance), EPNotConvergedWarning, stacklevel=2)
        if store is not None:
            # an operator EP could not converge with is not kept for later fits
            _write_back(store, graph, [None if fi in finished else k for fi, k in enumerate(kjits)])

        # factors fitted as one site (likelihoods and hierarchical priors) are drawn from their law
        one_site = {fi: m for fi, m in enumerate(methods)
                    if isinstance(m, (CollapsedLikelihood, CollapsedPrior, GroupedLikelihood, NestedLikelihood)) and m.current}
        # likelihoods fitted as one site, whole or per group (their marginals are their laws' projections)
        whole = [fi for fi, m in one_site.items()
                 if isinstance(m, (CollapsedLikelihood, GroupedLikelihood, NestedLikelihood))]
        t0 = time.perf_counter()
        with default_initial_values(original):
            idata, given, jointly = assemble_inference_data(model, graph, state, draws, chains, rng,
                                                            compute_log_likelihood, one_site)
        timings["draws"] = time.perf_counter() - t0
        with _named_as_written(bounded, sys._getframe(1).f_globals, sticks):
            warn_one_site_refused(graph, methods)
            dropped = warn_one_site_dropped_correlation(graph, methods)
            warn_nested_groups_correlated(graph, methods)
            warn_correlated_pairs(graph, state, collapsed=frozenset(whole), jointly=frozenset(jointly), warned=dropped)
            # a grouped Student-t's nu is drawn from its groups' laws only where they could be drawn
            # (else from EP's Gamma, short of the law's right tail: 0.74 of NUTS's sd)
            warn_latent_degrees_of_freedom(model, whole=frozenset(
                graph.factors[fi].name for fi in whole
                if not isinstance(one_site[fi], (GroupedLikelihood, NestedLikelihood)) or fi in jointly))
            # (its own generator: drawing from rng would change every fit's posterior draws)
            warn_correlated_hyperparameters(graph, state, np.random.default_rng(0), jointly=frozenset(jointly))
            warn_overlapping_components(graph, state)
        t0 = time.perf_counter()
        with default_initial_values(original):
            warn_impossible_observations(idata, model, graph.ordered)
        timings["draws"] += time.perf_counter() - t0
        # the centring and observed_as_data rewrites rebuild the model, whose free variables
        # come out in another order (x's parent after the regression coefficients)
        idata = as_original(idata, original)
        for group in ("log_likelihood", "observed_data"):
            # a potential fitted as an observed CustomDist is no observation (pm.sample leaves it out)
            if potentials and group in idata:
                kept = idata[group].drop_vars([p for p in potentials if p in idata[group]])
                if kept.data_vars:
                    setattr(idata, group, kept)
                else:
                    # a model whose likelihood is all potentials has none: an empty group made
                    # az.loo fail with an IndexError instead of saying there is no log-likelihood
                    del idata[group]
        warn_unconditional_centred_draws(model, graph, centred, given)
        ep = ep_group(graph, state, trace, events, sweeps, converged, kjits, oracles, timings, method, step,
                      finished=frozenset(finished))
        ep.attrs["centred"] = ", ".join(centred)
        # how the draws of the real latents were made (pmkjit.ep.conditional)
        ep.attrs["draws_given_scales"] = "no" if given is None else (
            "reweighted" if given.reweighted else "given EP's scale marginals")
        if given is not None:
            ep.attrs["scale_pareto_k"] = given.pareto_k
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "ep" is not one of ArviZ's schema groups
            idata.add_groups({"ep": ep})
        # what pm.sample records, so tools that read the posterior's provenance see EP's
        idata.posterior.attrs.update(
            inference_library="pmkjit",
            inference_library_version=__version__,
            inference_method=f"expectation propagation ({method})",
            sampling_time=time.perf_counter() - t_fit,
        )
        return idata


def _drop_repeated_observed(model: pm.Model) -> None:
    """Remove repeats of a variable from ``model.observed_RVs`` (in place).

    ``pm.sample_posterior_predictive(idata)`` with an ``observed_data`` group (every
    InferenceData of ``pm.sample`` and of :func:`fit`) extends the model's own list in
    place with the observed variables again (PyMC 5.28). A later fit then counted every
    likelihood twice: a logistic regression refitted after a posterior predictive check
    came out with two identical likelihood factors and different draws. PyMC's
    ``model.logp()`` itself fails on such a model; the repeats carry nothing, and
    dropping them restores the model as the user built it.
    """
    lists = model.observed_RVs
    while isinstance(lists, list):  # a sub-model's list extends its parents' (PyMC's treelist)
        unique = list(dict.fromkeys(lists))
        if len(unique) < len(lists):
            list.__setitem__(lists, slice(None), unique)  # treelist forbids item assignment
        lists = getattr(lists, "parent", None)


@contextlib.contextmanager
def _named_as_written(bounded: list[str], caller: dict, sticks: list[str] = ()):
    """Re-issue the warnings raised inside with each rescaled latent named as the user wrote it.

    A latent on an interval, ``kappa ~ pm.Pareto(1.5, 1)``, is fitted as a hidden
    ``__pmkjit_unit_kappa`` (``kappa = 1 + v``); the posterior diagnostics named that hidden
    latent (robustness round 30). Its sds are the latent's times the interval's width, so
    the name is replaced by ``kappa (as rescaled)``: the longest names first, whole names only
    (``sigma`` must not be replaced inside ``sigma_a``). The diagnostics attribute their
    warnings to the caller of :func:`fit`; they are re-issued with that caller's module and
    warning registry (``caller``: its globals), so the user's filters and "once per place"
    apply to them as to any other, and re-issued even if a diagnostic fails. A pm.Dirichlet's
    hidden stick-breaking Betas (``sticks``: the Dirichlets' names) are named the same way,
    ``frac (its stick-breaking fraction 0)`` for ``__pmkjit_stick_frac_0`` (robustness round
    32: a Dirichlet-multinomial's correlation warning named them).
    """
    if not bounded and not sticks:
        yield
        return

    def names(prefix: str, found: list[str], index: str = "") -> re.Pattern:
        return re.compile(re.escape(prefix) + "(" + "|".join(
            re.escape(n) for n in sorted(found, key=len, reverse=True)) + ")" + index + r"(?!\w)")

    def rename(text: str) -> str:
        if bounded:
            text = names(UNIT_PREFIX, bounded).sub(r"\1 (as rescaled)", text)
        if sticks:
            text = names(STICK_PREFIX, sticks, r"_(\d+)").sub(r"\1 (its stick-breaking fraction \2)", text)
        return text

    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for w in caught:
            warnings.warn_explicit(rename(str(w.message)), w.category, w.filename,
                                   w.lineno, module=caller.get("__name__"),
                                   registry=caller.setdefault("__warningregistry__", {}))


def _rewritten(rewrite, model: pm.Model) -> tuple[pm.Model, list[str]]:
    """``rewrite(model)`` (a model and the names it rewrote), or ``(model, [])`` where it fails.

    The rewrites only change how EP sees a model it could also take as written: a graph one
    cannot rewrite (an unusual PyMC construct) goes on unchanged, and a Dirichlet left as it
    is is then refused by the factor graph, by name.
    """
    try:
        return rewrite(model)
    except Exception:  # noqa: BLE001
        return model, []


def _centred(model: pm.Model) -> tuple[pm.Model, list[str]]:
    """``model`` with its non-centred group effects centred (see :mod:`pmkjit.graph.centre`)."""
    return _rewritten(centre_non_centred, model)


def _not_converged_message(run: schedule.EPRun, tol: float, importance: bool) -> str:
    """Why EP did not converge: still moving, or stopped without a fixed point."""
    head = f"EP did not converge in {run.sweeps} sweep{'s' if run.sweeps > 1 else ''}"
    last, limit = run.trace[-1], run.limit_step
    if last >= tol * limit:
        return (f"{head} (last change {last:.2g} > tol x damping = {tol:g} x {limit:g} = {tol * limit:.2g}: a sweep "
                f"damped by {limit:g} moves only that fraction of the way); raise max_sweeps or tol"
                + (". With importance sampling, Monte Carlo noise in the tilted moments keeps every sweep changing "
                   "the posterior: raise n_importance_samples" if importance else ""))
    # the posterior stopped moving, but not at a fixed point
    if run.silent:
        return (f"{head}: the posterior stopped moving, but no instance of {', '.join(run.silent)} got an answer in "
                "the last sweep (tilted moments the oracle could not compute), so those sites stayed where an "
                "earlier sweep put them; compare with pm.sample")
    if run.rejected:
        return f"{head}: it stopped with site updates rejected (see the warning above); compare with pm.sample"
    return (f"{head}: its last sweep moved no site (every tilted moment refused, or every cavity improper); "
            "compare with pm.sample")


def _after(first: schedule.EPRun, second: schedule.EPRun) -> schedule.EPRun:
    """``second``, a run made after ``first`` (a restart), with both runs' sweeps counted."""
    second.trace = first.trace + second.trace
    second.sweeps += first.sweeps
    second.events = {k: v + second.events[k] for k, v in first.events.items()}
    return second


def _oracle_finish(methods: list) -> dict:
    """Per factor whose KJIT operator sits in front of a deterministic oracle (quadrature or
    the grid, whose answers converge where the operator's need not): that oracle."""
    return {fi: m.oracle for fi, m in enumerate(methods)
            if isinstance(m, KJITMethod) and getattr(m.oracle, "kind", None) in ("quadrature", "grid")}


def _count(name: str, value, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _methods(graph, method, oracle, store, n_samples, tol, rng):
    methods, kjits, oracles = [], [], []
    # With a store, factors of one form (one key, one file) share one operator: each
    # learning its own, only the one written last was kept (two logistic likelihoods of
    # one model: 152 and 167 oracle calls, one file).
    by_key: dict[str, KJITOperator] = {}
    for f in graph.factors:
        sub = np.random.default_rng(rng.integers(2**63 - 1))
        if f.analytic is not None:
            semi = (PositiveMethod() if f.analytic == "positive" else
                    NormalScaleMethod(f.analytic.removeprefix("normal-")))
            methods.append(semi)
            kjits.append(None)
            oracles.append(NoOracle("exact" if f.analytic == "positive" else "semi-analytic"))
            continue
        if f.mixture is not None:
            # a mixture of Normals: exact up to one 1-D integral per latent scale, for any
            # method (as the Normal factors with a latent scale above)
            methods.append(NormalMixtureMethod(f))
            kjits.append(None)
            oracles.append(NoOracle("semi-analytic"))
            continue
        one_site = oracle == "auto" and method == "kjit"
        integrated = one_site and f.linear_normal is not None and integrates_gaussian_inputs(f)
        if f.linear_normal is not None and (integrated or not (one_site and (collapsible(f) or groupable(f)))):
            # a Normal likelihood whose Gaussian inputs integrate out given the others (a
            # measurement-error regression): exact in them, the grid over the rest, for any
            # method; a likelihood of a few shared scalars keeps its one site below, and one
            # of more shared scalars has one site with its Gaussian ones integrated out
            # (c + A exp(-k t): instance by instance, EP crawled and stopped 0.7 sd off)
            kind = "grid" if grid_possible(f) else "importance"
            semi = LinearNormalMethod(f, FactorOracle(f, kind, n_samples=n_samples, rng=sub))
            if integrated:
                semi = CollapsedLinearNormal(f, semi)
            methods.append(semi)
            kjits.append(None)
            oracles.append(semi)
            continue
        if f.joint:
            # class predictors with one joint site: a grid in the joint cavity, no operator
            joint = JointQuadrature(f, sub, n_samples=min(n_samples, 4096))
            methods.append(joint)
            kjits.append(None)
            oracles.append(joint)
            continue
        can_quad = quadrature_possible(f)
        if method == "quadrature" and not can_quad:
            raise UnsupportedModelError(
                f"{f.name}: method='quadrature' needs factors with one or two latent variables and a density; "
                f"{f.description} has {len(f.latent_inputs)} latent inputs (use method='kjit' or 'oracle')"
            )
        if method == "quadrature" or not f.latent_inputs:
            kind = "quadrature"
        elif method == "oracle":
            kind = "importance"
        else:
            kind = "quadrature" if (oracle == "quadrature" or (oracle == "auto" and can_quad)) else (
                "grid" if oracle == "auto" and grid_possible(f) else "importance")
            if oracle == "quadrature" and not can_quad:
                raise UnsupportedModelError(f"{f.name}: oracle='quadrature' is not possible for {f.description}")
        orc = FactorOracle(f, kind, n_samples=n_samples, rng=sub)
        oracles.append(orc)
        # A latent read by many instances receives all their sites: a KJIT operator's
        # systematic error, shared by similar inputs, is then added coherently that many
        # times on one variable (a latent variance or shape went from 0.01 to 0.26
        # posterior sd off, or stopped converging). Where quadrature is possible it
        # answers those factors directly; KJIT stays where inputs are distinct.
        # The same holds for importance sampling on a factor with fewer instances than
        # an operator's first fit needs (the non-centred eight schools, mu + tau * eta[j]:
        # 8 instances share mu and tau). Its operator is fitted on answers pooled over
        # sweeps for the same few data points, so its kernel widths are set by the
        # differences between instances and it stays blind to the moving cavities: it
        # trusted itself while tau drifted from 3.6 to 0.04. Larger factors keep their
        # operator: importance sampling alone took 200 s on N = 80-90 (3 latents), no
        # more accurate.
        shared = oracle == "auto" and shares_a_latent(f) and (
            kind in ("quadrature", "grid") or f.size < FEW_INSTANCES)
        # An operator for fewer instances than its first fit needs is fitted on answers
        # pooled over sweeps for the same few data points too, whose kernel widths are set
        # by the differences between the instances, not by the moving cavities; its
        # systematic error then moved a hierarchical logistic model (10 units, one Binomial
        # per unit's own effect, nothing shared) by 0.01-0.03 posterior sd every sweep, not
        # converged in 50 sweeps, where quadrature converges in 9 (robustness round 15).
        # Quadrature or the grid on so few entries costs little: they answer directly.
        # Not when the user gave an operator store: an operator kept between runs learns
        # from every run's answers, which is what the store is asked for.
        few = oracle == "auto" and store is None and kind in ("quadrature", "grid") and f.size < FEW_INSTANCES
        # A censored likelihood is the base's density below a bound and its survival
        # function at it: a jump in the observed value that an operator's smooth kernel
        # spreads over its neighbours. On a censored Weibull regression (N = 50) KJIT left
        # the mean 0.12-0.23 posterior sd off where quadrature EP is within 0.01 sd (the
        # same model uncensored: KJIT within 0.003 sd). A hurdle or zero-inflated
        # likelihood jumps the same way between its point mass and its density (a hurdle
        # LogNormal: psi 0.83 by KJIT, 0.79 +- 0.05 exact, 0.79 by the oracle alone). The
        # oracle answers these directly, whichever it is (a bound may also be infinite).
        direct = shared or few or f.point_masses
        # A likelihood of two or three linear predictors (a distributional regression) gets
        # one joint site per instance over them, answered on a grid in its joint cavity, where
        # an operator's or the oracle's rank-one sites drop the predictors' correlation within
        # an observation (a ZIP with covariates on both parts: sds 0.79-0.95 of NUTS's, the
        # joint site's 0.89-1.02; 3-20 times faster on nine such models); a one-site method
        # for the whole likelihood, where one applies, keeps it (per-group location and scale).
        join_predictors = oracle == "auto" and method == "kjit" and joinable(f)
        if join_predictors and not direct:
            methods.append(_joined(f, sub, n_samples, oracles))
            kjits.append(None)
        elif method == "kjit" and f.latent_inputs and not direct:
            op = by_key.get(f.key) or (store.load(f) if store is not None else None)
            pending = store.load_pending(f) if store is not None and op is None else None
            k = KJITMethod(f, orc, op, tolerance=tol, rng=sub, pending=pending)
            if store is not None:
                by_key.setdefault(f.key, k.operator)
            kjits.append(k)
            methods.append(k)
        elif (oracle == "auto" and method == "kjit" and collapsible(f) and kind in ("quadrature", "grid")
              and (order := order_constraints(f, graph)) is not None):
            # every instance reads the same few scalars: one site for the whole likelihood,
            # whose correlation of those scalars instance-by-instance sites drop
            # (NegativeBinomial(n=n, p=p): sds 0.32 of NUTS's), with the order of a mixture's
            # ordered means inside its law
            collapsed = CollapsedLikelihood(f, orc, order)
            if collapsed.pair_inputs:
                # scalars two inputs read in common (a and b - a): one joint site on those
                # inputs, where their own sites left b's sd at 9.9 times NUTS's
                pair_shared_scalars(f, collapsed)
            kjits.append(None)
            methods.append(collapsed)
            oracles[-1] = collapsed
        elif oracle == "auto" and method == "kjit" and groupable(f) and kind in ("quadrature", "grid"):
            # each group of observations reads its own few scalars (pm.Gamma(alpha=shape[g],
            # beta=rate[g])): one site per group, where instance-by-instance sites left sds
            # at 0.30-0.53 of NUTS's, unwarned
            collapsed = GroupedLikelihood(f, orc)
            kjits.append(None)
            methods.append(collapsed)
            oracles[-1] = collapsed
        elif oracle == "auto" and method == "kjit" and nestable(f) and kind in ("quadrature", "grid"):
            # group effects beside a scalar every group reads (a negative binomial's shared
            # alpha): one site for the whole likelihood, each group's scalar integrated at each
            # node of the shared ones, where instance-by-instance sites (and per-group ones)
            # left alpha's sd at 0.74 of NUTS's
            collapsed = NestedLikelihood(f, orc)
            kjits.append(None)
            methods.append(collapsed)
            oracles[-1] = collapsed
        elif oracle == "auto" and method == "kjit" and collapsible_prior(f) and kind in ("quadrature", "grid"):
            # a hierarchical prior's instances share their hyperparameters: one site for the
            # whole prior, exact given the outputs' other messages, where instance-by-instance
            # sites left a hyper-scale over six groups at 0.75 of NUTS's sd, unwarned
            collapsed = CollapsedPrior(f, orc, rng=sub, graph=graph)
            kjits.append(None)
            methods.append(collapsed)
            oracles[-1] = collapsed
        elif join_predictors:
            methods.append(_joined(f, sub, n_samples, oracles))
            kjits.append(None)
        else:
            kjits.append(None)
            methods.append(orc)
    return methods, kjits, oracles


def _joined(f, rng: np.random.Generator, n_samples: int, oracles: list) -> JointQuadrature:
    """Give ``f`` its joint site (:func:`pmkjit.ep.joint.join`) and the grid that answers it,
    which also replaces its oracle (the last of ``oracles``) and falls back on that oracle,
    as rank-one sites, where the grid cannot resolve an answer."""
    join(f)
    oracles[-1] = JointQuadrature(f, rng, n_samples=min(n_samples, 4096), fallback=oracles[-1])
    return oracles[-1]


def _write_back(store: OperatorStore, graph, kjits: list) -> None:
    """Write every fitted operator to the store, once per key, and keep answers too few to fit on."""
    by_key: dict[str, list] = {}
    for f, k in zip(graph.factors, kjits):
        if k is not None:
            by_key.setdefault(f.key, []).append((f, k))
    for group in by_key.values():
        f, k = group[0]
        if k.fitted:  # the factors of one key share the operator
            store.save(f, k.operator)
            store.drop_pending(f)
            continue
        answers = [a for a in (k.pending_answers() for _, k in group) if a is not None]
        if answers:  # too few to fit on yet: keep for the next fit, every factor's
            store.save_pending(f, *concatenate_answers(answers))


class _progress:
    """A rich progress bar over sweeps (or nothing)."""

    def __init__(self, enabled: bool, total: int):
        self.enabled = enabled and total > 0
        self.total = total

    def __enter__(self):
        if not self.enabled:
            return lambda change: None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("EP sweeps"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                 TextColumn("change {task.fields[change]}"), TimeElapsedColumn())
        self.progress.__enter__()
        task = self.progress.add_task("ep", total=self.total, change="-")

        def advance(change: float) -> None:
            self.progress.update(task, advance=1, change=f"{change:.2e}")

        return advance

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)
        return False


