"""``pmkjit.fit``: expectation propagation on a PyMC model, returned as ArviZ InferenceData."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import xarray as xr
from scipy.linalg import solve_triangular
from pymc.model.transform.optimization import freeze_dims_and_data
from pymc.backends.arviz import coords_and_dims_for_inferencedata, find_constants, find_observations
from pytensor.graph.traversal import ancestors

from pmkjit import __version__  # defined before pmkjit imports this module
from pmkjit._parallel import single_threaded_blas
from pmkjit._random import RandomState, as_generator
from pmkjit.ep import engine, schedule
from pmkjit.ep.conditional import ConditionalDraws, conditional_draws
from pmkjit.ep.methods import FactorOracle, KJITMethod, concatenate_answers, grid_possible, quadrature_possible
from pmkjit.ep.joint import JointQuadrature
from pmkjit.ep.mixture import NormalMixtureMethod, overlapping_components
from pmkjit.ep.normal_scale import NormalScaleMethod
from pmkjit.ep.truncation import PositiveMethod
from pmkjit.ep.engine import EPInfo
from pmkjit.ep.store import OperatorStore
from pmkjit.errors import UnsupportedModelError
from pmkjit.families import Gaussian, family_by_name
from pmkjit.families.base import ExponentialFamily
from pmkjit.operators import KJITOperator
from pmkjit.graph import build_factor_graph
from pmkjit.graph.centre import HIDDEN_PREFIX, centre_non_centred
from pmkjit.graph.interval import UNIT_PREFIX, rescale_uniform_intervals, signed_latents
from pmkjit.graph.potential import potentials_as_observations
from pmkjit.graph.simplex import STICK_PREFIX, stick_break_dirichlet
from pmkjit.graph.factor_graph import ElementSlot, LinearSlot
from pmkjit.graph.observed import default_initial_values, observed_as_data
from pmkjit.graph.pytensor_tools import evaluate_constant

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
        latent variables per factor only).
    oracle : {"auto", "quadrature", "importance"}
        The oracle behind KJIT operators; ``"auto"`` uses quadrature where a factor
        allows it and importance sampling elsewhere, and lets quadrature answer
        directly (no operator) a factor whose instances share a latent: ten or more
        instances reading one latent element or projection, where an operator's
        systematic error would add up on that latent; without ``operators``, also a
        factor of fewer than 50 instances (fewer than an operator's first fit needs).
        ``"quadrature"`` keeps an operator in front of quadrature for every factor.
    operators : str or os.PathLike, optional
        Directory of learned KJIT operators (created if missing; it must be writable):
        operators found there are loaded (so a second fit of a similar model needs few
        or no oracle calls) and all operators are written back after the fit. See
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
        model, _ = _rewritten(stick_break_dirichlet, model)  # Dirichlets as stick-breaking Betas
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

    _warn_non_centred(graph)
    _warn_latent_conditions(original)  # (the names the user wrote)
    _warn_bounded_beside_linear(graph, signed_latents(original, bounded))
    _warn_latent_degrees_of_freedom(model)
    methods, kjits, oracles = _methods(graph, method, oracle, store, n_importance_samples, tol, rng)
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
                    again.trace = run.trace + again.trace
                    again.sweeps += run.sweeps
                    again.events = {k: v + again.events[k] for k, v in run.events.items()}
                    run = again
        timings["ep"] = time.perf_counter() - t_ep
        state, trace, events, sweeps = run.state, run.trace, run.events, run.sweeps
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
            _write_back(store, graph, kjits)

        _warn_correlated_pairs(graph, state)
        # (its own generator: drawing from rng would change every fit's posterior draws)
        _warn_correlated_hyperparameters(graph, state, np.random.default_rng(0))
        _warn_overlapping_components(graph, state)
        t0 = time.perf_counter()
        with default_initial_values(original):
            idata, given = _inference_data(model, graph, state, draws, chains, rng, compute_log_likelihood)
            _warn_impossible_observations(idata, model, graph.ordered)
        timings["draws"] = time.perf_counter() - t0
        # the centring and observed_as_data rewrites rebuild the model, whose free variables
        # come out in another order (x's parent after the regression coefficients)
        idata = _as_original(idata, original)
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
        _warn_unconditional_centred_draws(model, graph, centred, given)
        ep = _ep_group(graph, state, trace, events, sweeps, converged, kjits, oracles, timings, method, step)
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


def _warn_unconditional_centred_draws(model, graph, centred: list[str], given: ConditionalDraws | None) -> None:
    """Warn where a centred ``z = (a - loc) / scale`` was computed from independent draws of ``a`` and ``scale``.

    That is the case when the draws given the scales were not made (beyond their work
    budget or their number of scale elements, or a conditional precision not positive
    definite), or when ``a``'s centred prior is no semi-analytic Normal factor (``z`` with a
    prior mean other than 0): ``z``'s draws are then a ratio of EP's factorised marginals,
    several times too wide where the scale is uncertain (radon with varying intercepts and
    slopes written non-centred, 85 counties, D = 172: the slopes' ``z`` sds 4-10 times
    NUTS's, the effects and scales themselves within 0.1 sd; robustness round 12), silently.
    """
    if not centred:
        return
    semi = {f.name for f in graph.factors if f.analytic is not None and f.from_prior}
    loose = []
    for z in centred:
        # the latents z is a deterministic of: its centred latent, loc's and scale's
        latent = [v.name for v in model.free_RVs if v in ancestors([model[z]])]
        if given is None or not any(name in semi for name in latent):
            loose.append(z)
    if not loose:
        return
    why = ("the draws given the scales were not made (ep.attrs['draws_given_scales'] == 'no': "
           f"{graph.n_theta} real latents or their scale elements beyond the work budget, or a conditional "
           "precision not positive definite)" if given is None else
           "its centred prior is not a semi-analytic Normal factor (z has a prior mean other than 0)")
    warnings.warn(
        f"{', '.join(loose)}: the non-centred effect was fitted centred, but {why}, so each draw of "
        f"{', '.join(loose)} is (effect - loc) / scale of independent draws of the effect and its scale, "
        "whose spread can be several times the posterior's (the effects and scales themselves are not affected; "
        "see docs/ep.md, \"Posterior draws given the scales\")",
        UserWarning,
        stacklevel=3,
    )


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


def _warn_impossible_observations(idata: az.InferenceData, model: pm.Model, ordered: Sequence[str] = ()) -> None:
    """Warn where posterior draws give observations zero density.

    The posterior of the model is zero there, so EP's approximation puts mass where the
    data are impossible. That happens where a likelihood's support moves with a latent (a
    shifted distribution ``loc + Exponential``, ``Uniform(0, theta)``), whose bound EP's
    Gaussian and Gamma messages do not hold: a shifted exponential with ``loc ~ Normal(0, 1)``
    (N = 80, every observation above 2.007) came out with ``loc`` at 61 (NUTS: 1.99 +- 0.016),
    every observation impossible at every draw, "converged" with only a warning about
    unanswered entries (robustness round 15); ``Uniform(0, theta)`` put 15% of the draws of
    ``theta`` below the largest observation. Read from the ``log_likelihood`` group, or,
    without one, from the log-likelihood of at most 100 draws. Draws whose ``ordered``
    vectors are out of order are left out: ``_inference_data`` has said how many there are,
    and PyMC's ordinal densities are zero at every observation there.
    """
    if not model.observed_RVs:
        return
    posterior = idata.posterior
    if "log_likelihood" not in idata:
        n = posterior.sizes["draw"] * posterior.sizes["chain"]
        posterior = posterior.isel(draw=slice(None, None, max(1, n // 100)))
        try:
            loglik = pm.compute_log_likelihood(az.InferenceData(posterior=posterior), model=model,
                                               extend_inferencedata=False, progressbar=False)
        except Exception:  # noqa: BLE001 - a check must not fail the fit
            # PyMC's elementwise log-likelihood fails on some models EP fits (a mixture with a
            # data column (N, 1) in a component's scale: a runtime broadcasting error), which
            # is why compute_log_likelihood=False is there
            return
    else:
        loglik = idata.log_likelihood
    n_draws = posterior.sizes["chain"] * posterior.sizes["draw"]
    unordered = np.zeros(n_draws, bool)
    for name in ordered:
        x = np.asarray(posterior[name]).reshape(n_draws, -1)
        unordered |= np.any(np.diff(x, axis=-1) <= 0, axis=-1)
    for name, values in loglik.data_vars.items():
        ll = np.asarray(values).reshape(n_draws, -1)
        # zero density, or parameters outside their domain
        per_draw = (np.isneginf(ll) | np.isnan(ll)) & ~unordered[:, None]
        if not per_draw.any():
            continue
        share = per_draw.any(axis=1).mean()
        entries = int(per_draw.any(axis=0).sum())
        percent = f"{share:.0%}" if share >= 0.01 else f"{share:.2%}"  # one draw in 2,000 is not "0%"
        warnings.warn(
            f"{name}: {entries} of {per_draw.shape[1]} observation{'s' if per_draw.shape[1] > 1 else ''} "
            f"{'have' if entries > 1 else 'has'} zero density at {percent} of the posterior draws, where the "
            "model's posterior is zero: "
            + ("EP's posterior is nowhere near the data (EP failed). " if share == 1.0 else
               "EP's posterior puts mass where the data are impossible. ")
            + "This happens where the likelihood's support moves with a latent parameter (a shifted "
            "distribution, a Uniform bound, a parameter used as a probability without a link), a bound EP's "
            "Gaussian and Gamma messages do not hold; " + ("use pm.sample for this model" if share == 1.0 else
                                                          "compare with pm.sample"),
            UserWarning,
            stacklevel=3,
        )


def _as_original(idata: az.InferenceData, original: pm.Model) -> az.InferenceData:
    """The posterior of a rewritten model with the original model's variables in its order."""
    post = idata.posterior
    order = [n for n in _sample_order(original) if n in post]
    # (the centred latent of an effect the user did not name, a Dirichlet's stick-breaking
    # Betas and a rescaled Uniform's unit latent are not the model's)
    hidden = (HIDDEN_PREFIX, STICK_PREFIX, UNIT_PREFIX)
    idata.posterior = post[order + [v for v in post.data_vars if v not in order and not v.startswith(hidden)]]
    return idata


def _sample_order(model: pm.Model) -> list[str]:
    """Variable names in the order of ``pm.sample``'s posterior.

    ``pm.sample`` records ``model.unobserved_value_vars``: the free variables without a
    transform first, then those with one, then the deterministics, so a Normal ``b``
    declared after a ``HalfNormal`` ``tau`` comes before it. The free variables'
    declaration order put ``az.summary`` rows of an EP fit and a NUTS trace of the same
    model in different orders.
    """
    plain = [rv.name for rv in model.free_RVs if model.rvs_to_transforms.get(rv) is None]
    transformed = [rv.name for rv in model.free_RVs if model.rvs_to_transforms.get(rv) is not None]
    return plain + transformed + [d.name for d in model.deterministics]


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
                    NormalScaleMethod("scale" if f.analytic == "normal-scale" else "precision"))
            methods.append(semi)
            kjits.append(None)
            oracles.append(_NoOracle("exact" if f.analytic == "positive" else "semi-analytic"))
            continue
        if f.mixture is not None:
            # a mixture of Normals: exact up to one 1-D integral per latent scale, for any
            # method (as the Normal factors with a latent scale above)
            methods.append(NormalMixtureMethod(f))
            kjits.append(None)
            oracles.append(_NoOracle("semi-analytic"))
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
            kind in ("quadrature", "grid") or f.size < _SMALL_FACTOR)
        # An operator for fewer instances than its first fit needs is fitted on answers
        # pooled over sweeps for the same few data points too, whose kernel widths are set
        # by the differences between the instances, not by the moving cavities; its
        # systematic error then moved a hierarchical logistic model (10 units, one Binomial
        # per unit's own effect, nothing shared) by 0.01-0.03 posterior sd every sweep, not
        # converged in 50 sweeps, where quadrature converges in 9 (robustness round 15).
        # Quadrature or the grid on so few entries costs little: they answer directly.
        # Not when the user gave an operator store: an operator kept between runs learns
        # from every run's answers, which is what the store is asked for.
        few = oracle == "auto" and store is None and kind in ("quadrature", "grid") and f.size < _SMALL_FACTOR
        # A censored likelihood is the base's density below a bound and its survival
        # function at it: a jump in the observed value that an operator's smooth kernel
        # spreads over its neighbours. On a censored Weibull regression (N = 50) KJIT left
        # the mean 0.12-0.23 posterior sd off where quadrature EP is within 0.01 sd (the
        # same model uncensored: KJIT within 0.003 sd). A hurdle or zero-inflated
        # likelihood jumps the same way between its point mass and its density (a hurdle
        # LogNormal: psi 0.83 by KJIT, 0.79 +- 0.05 exact, 0.79 by the oracle alone). The
        # oracle answers these directly, whichever it is (a bound may also be infinite).
        direct = shared or few or f.point_masses
        if method == "kjit" and f.latent_inputs and not direct:
            op = by_key.get(f.key) or (store.load(f) if store is not None else None)
            pending = store.load_pending(f) if store is not None and op is None else None
            k = KJITMethod(f, orc, op, tolerance=tol, rng=sub, pending=pending)
            if store is not None:
                by_key.setdefault(f.key, k.operator)
            kjits.append(k)
            methods.append(k)
        else:
            kjits.append(None)
            methods.append(orc)
    return methods, kjits, oracles


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


_SHARED_INSTANCES = 10
_SMALL_FACTOR = 50  # KJITMethod's min_fit: below it, a first fit pools sweeps


def _row_keys(slot: LinearSlot, with_offset: bool = True) -> np.ndarray:
    """One number per row of a linear slot, equal for equal rows (``A`` and, optionally, ``c``).

    A fixed random projection of each row: sorting B numbers is cheap where ``A``
    (B x n_theta) may be hundreds of megabytes.
    """
    A = np.asarray(slot.A).reshape(slot.size, -1)
    r = np.random.default_rng(0).standard_normal(A.shape[1] + 1)  # fixed: a hash, not a draw
    keys = A @ r[:-1]
    return keys + slot.c * r[-1] if with_offset else keys


def _distinct_rows(slot: LinearSlot) -> int:
    """Number of distinct projections among the rows of a linear slot (``c`` ignored)."""
    return int(np.unique(_row_keys(slot, with_offset=False)).size)


def _warn_latent_degrees_of_freedom(model: pm.Model) -> None:
    """Warn where a Student-t likelihood's degrees of freedom ``nu`` depend on a latent.

    EP's marginal of ``nu`` comes out too narrow, with no sign of it in the run: its
    posterior has a long right tail, and is correlated with the likelihood's scale, which
    the factor's independent messages drop. Reviewed against NUTS or a grid, sds of ``nu``
    0.42 and 0.52 of NUTS's on robust regressions with a latent scale (N = 150 and 120, both
    converged; the scale's 0.66-0.72) and 0.20 on a location model (robustness rounds 14 and
    15), 0.79-0.83 on the gallery's N = 60 regression, and 0.63-0.90 of the exact sd with a
    known scale (N = 30-60, four data sets); the locations were within 0.2 sd.
    """
    latents = set(model.free_RVs)
    for rv in model.observed_RVs:
        if type(rv.owner.op).__name__ != "StudentTRV":
            continue
        nu = rv.owner.op.dist_params(rv.owner)[0]
        names = [v.name for v in ancestors([nu], blockers=model.free_RVs) if v in latents]
        if names:
            warnings.warn(
                f"{rv.name}: the Student-t's degrees of freedom depend on the latent {', '.join(names)}, whose EP "
                "posterior comes out too narrow (sd 0.2-0.9 of the exact one on reviewed models: its long right tail "
                "and its correlation with the scale are lost; the scale's sd may be too small too, the locations "
                "are accurate): compare with pm.sample for the uncertainty of nu, or fix nu",
                UserWarning,
                stacklevel=3,
            )


def _warn_latent_conditions(model: pm.Model) -> None:
    """Warn where a likelihood switches on a condition of a latent (an unknown changepoint).

    ``pm.math.switch(switchpoint >= years, early, late)`` with a continuous latent
    ``switchpoint`` makes each observation's density a step function of it, and the
    posterior of a changepoint is a staircase EP's Gaussian, Beta or Gamma message cannot
    follow: the coal-mining disasters model with ``switchpoint ~ pm.Uniform(1851, 1962)``
    (111 years) came out 4.8-8.1 NUTS sds off, with sds 0.43-1.19 of NUTS's, and only a
    warning that EP had not converged (robustness round 16). A switch on data is split
    into its branches by the factor graph and is not warned about.
    """
    import pytensor.scalar as ps
    from pytensor.tensor.elemwise import Elemwise

    free = set(model.free_RVs)
    for rv in model.observed_RVs:
        params = list(rv.owner.inputs)
        for var in ancestors(params, blockers=list(free)):
            node = var.owner
            if node is None or var is not node.outputs[0] or not isinstance(node.op, Elemwise):
                continue
            if not isinstance(node.op.scalar_op, (ps.GE, ps.GT, ps.LE, ps.LT)) or len(node.inputs) != 2:
                continue
            # a latent against data that vary by entry (switchpoint >= years, x > threshold):
            # PyMC's numerically stable functions (normal_lcdf in pm.OrderedProbit) compare a
            # latent expression with a constant, and are continuous
            sides = [sorted({v.name for v in ancestors([i], blockers=list(free)) if v in free}) for i in node.inputs]
            if bool(sides[0]) == bool(sides[1]):
                continue
            try:
                data = evaluate_constant(node.inputs[0 if not sides[0] else 1])
            except Exception:  # noqa: BLE001 - not a constant: not data
                continue
            latents = sides[0] or sides[1]
            if data.size > 1 and np.unique(data).size > 1:
                warnings.warn(
                    f"{rv.name}: its parameters switch on a condition of the latent {', '.join(latents)} (an unknown "
                    "changepoint or threshold), so each observation's density is a step function of it, whose "
                    "posterior EP's Gaussian, Beta or Gamma messages cannot follow: the fit may be far off (a "
                    "Poisson changepoint over 111 years: 5-8 NUTS sds). Use pm.sample, or marginalise the "
                    "changepoint over its possible values (pm.Mixture with one component per value)",
                    UserWarning,
                    stacklevel=3,
                )
                break


def _warn_bounded_beside_linear(graph, signed: set[str]) -> None:
    """Warn where a signed latent rewritten from a bounded interval is read beside another signed latent.

    ``rho ~ pm.Uniform(-1, 1)`` is fitted as ``-1 + 2 u`` with a Beta latent ``u``
    (:mod:`pmkjit.graph.interval`), outside the joint Gaussian of the real latents: in
    ``pm.Normal("y", c + rho * y[:-1], s)`` the factor's inputs ``c`` and ``u`` get
    independent messages, and their posterior correlation is lost (robustness round 16, an
    AR(1) with an intercept, T = 100: ``c`` and ``rho`` with 0.73 of NUTS's sds, converged,
    silently; a logistic regression with ``Uniform(-10, 10)`` priors on both coefficients,
    an importance-sampled factor of two Beta latents, 1.4 NUTS sds off). Beside a scale
    (``sigma ~ pm.Uniform(0, 10)``, itself rescaled or not) it was fine (sd ratios
    1.00-1.01), so only real latents and other signed rescaled ones count.
    """
    if not signed:
        return
    hidden = {f"{UNIT_PREFIX}{name}": name for name in signed}
    for f in graph.factors:
        # (a deterministic factor is a likelihood's link, exp(a + b * x) of a Poisson)
        if f.kind not in ("likelihood", "deterministic") or f.analytic is not None:
            continue
        ins = [f.inputs[i] for i in f.latent_inputs]
        mine = sorted({hidden[s.variable] for s in ins if isinstance(s, ElementSlot) and s.variable in hidden})
        others = sum(isinstance(s, LinearSlot) for s in ins) + len(mine)
        if mine and others >= 2:
            warnings.warn(
                f"{f.name}: the likelihood reads {', '.join(mine)} (a latent on a bounded interval, fitted as a "
                "rescaled Beta or Gamma latent) beside "
                + ("a linear predictor of the real-valued latents" if len(mine) == 1 else "each other")
                + "; EP's factorised messages ignore their posterior correlation, so posterior sds may be too "
                "small and means off (0.73 of NUTS's sds for an AR(1) coefficient rho ~ Uniform(-1, 1) beside an "
                "intercept). A Normal prior keeps a coefficient in the joint Gaussian of the real latents; or "
                "compare with pm.sample",
                UserWarning,
                stacklevel=3,
            )


def _warn_correlated_pairs(graph, state, threshold: float = 0.6, sd_ratio: float = 0.8) -> None:
    """Warn where a likelihood of two shared latents correlates them strongly.

    EP gives each latent its own message, so the posterior correlation of two latents read
    together is left out, and each marginal is about as narrow as the other's conditional:
    sds about ``sqrt(1 - rho**2)`` of the exact ones. Two parametrisations users write
    for counts came out so, converged and silently (robustness round 16):
    ``pm.NegativeBinomial(n=n, p=p)`` with latent ``n`` and ``p`` (0.32 of NUTS's sds) and
    ``pm.BetaBinomial(alpha=a, beta=b)`` with latent ``a`` and ``b`` (0.46). Where every
    instance reads the same two scalars (ElementSlots of one element, or LinearSlots of one
    projection), the likelihood summed over its instances is their joint log-likelihood;
    times the factor's cavity (EP's posterior without this factor's sites) it is the law a
    joint site would give, computed on a 2-D grid in the latents' unconstrained coordinates
    (:func:`_joint_law`), whose correlation and marginal sds are compared with EP's. Where
    the grid cannot be made (an improper cavity, too many instances) ``rho`` is read from
    the curvature of the summed likelihood at EP's posterior means instead, by central
    differences. The curvature at one point alone missed a banana-shaped likelihood:
    ``pm.Rice(nu, sigma)`` with both latent (N = 80, robustness round 17) gave -0.50 there,
    no warning, and EP's sds were 0.45 and 0.56 of NUTS's (the joint law: correlation -0.8).
    """
    h = 1e-3
    steps = np.array([(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)], dtype=float) * h
    for fi, f in enumerate(graph.factors):
        if f.kind != "likelihood" or f.analytic is not None or f.logp is None or f.pair_slots \
                or len(f.latent_inputs) != 2 or f.observed is None:
            continue
        values, moves, names, points = [], [], [], []
        for i, slot in enumerate(f.inputs):
            if i not in f.latent_inputs:
                values.append(np.asarray(slot.values, dtype=float))
                continue
            if isinstance(slot, ElementSlot):
                if not np.all(slot.index == slot.index[0]):
                    break
                fam = slot.family
                x = fam.from_natural(state.element_natural[slot.variable][slot.index[0]]).mean()
                u = float(fam.to_unconstrained(np.asarray(x)))
                values.append(None)
                moves.append(lambda d, _u=u, _fam=fam, _n=slot.size: np.broadcast_to(
                    _fam.from_unconstrained(_u + d)[:, None], (d.size, _n)))
                points.append(lambda xs, _n=slot.size: np.broadcast_to(xs[:, None], (xs.size, _n)))
                names.append(slot.variable)
            elif isinstance(slot, LinearSlot):
                A = np.asarray(slot.A)
                if not np.allclose(A, A[:1]) or not np.any(A[0]):
                    break
                eta = A @ np.asarray(state.mu) + slot.c
                values.append(None)
                moves.append(lambda d, _eta=eta: _eta[None, :] + d[:, None])
                points.append(lambda xs, _c=eta - eta[0]: xs[:, None] + _c[None, :])
                names.append(slot.label)
            else:
                break
        else:
            joint = _joint_law(graph, state, fi, f, values, points)
            if joint is not None:
                rho, ratios = joint
                if abs(rho) > threshold or min(ratios) < sd_ratio:
                    warnings.warn(
                        f"{f.name}: the likelihood correlates {names[0]} and {names[1]} at about {rho:.2f} (their "
                        "joint law under this likelihood, on a grid), which EP's separate messages for them leave "
                        f"out: EP's posterior sds of {names[0]} and {names[1]} are {ratios[0]:.2f} and "
                        f"{ratios[1]:.2f} of that law's (NegativeBinomial(n=n, p=p) with latent n and p: 0.32 of "
                        "NUTS's). A parametrisation with less correlated parameters (a mean and a dispersion: "
                        "NegativeBinomial(mu, alpha), BetaBinomial(mu * kappa, (1 - mu) * kappa)) fits better; or "
                        "compare with pm.sample",
                        UserWarning,
                        stacklevel=3,
                    )
                continue
            try:
                with np.errstate(all="ignore"):
                    k = iter(range(2))
                    ins = tuple(m(steps[:, next(k)]) if v is None else np.broadcast_to(v, (len(steps), v.size))
                                for v, m in _zip_moves(values, moves))
                    y = np.broadcast_to(np.asarray(f.observed, dtype=float), (len(steps), f.observed.size))
                    ll = np.sum(f.logp(np.ascontiguousarray(y), tuple(np.ascontiguousarray(a) for a in ins)), axis=1)
                ll = np.asarray(ll, dtype=float).reshape(3, 3)
            except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
                continue
            h11 = (ll[2, 1] - 2 * ll[1, 1] + ll[0, 1]) / h**2
            h22 = (ll[1, 2] - 2 * ll[1, 1] + ll[1, 0]) / h**2
            h12 = (ll[2, 2] - ll[2, 0] - ll[0, 2] + ll[0, 0]) / (4 * h**2)
            if not (np.isfinite([h11, h22, h12]).all() and h11 < 0 and h22 < 0):
                continue
            rho = h12 / np.sqrt(h11 * h22)  # the correlation of the inverse of the precision -H
            if abs(rho) > threshold:
                warnings.warn(
                    f"{f.name}: the likelihood correlates {names[0]} and {names[1]} at about {rho:.2f} (its "
                    "curvature at EP's posterior means), which EP's separate messages for them leave out: their "
                    f"posterior sds may be about {np.sqrt(max(0.0, 1 - rho**2)):.2f} of the exact ones "
                    "(NegativeBinomial(n=n, p=p) with latent n and p: 0.32 of NUTS's). A parametrisation with less "
                    "correlated parameters (a mean and a dispersion: NegativeBinomial(mu, alpha), "
                    "BetaBinomial(mu * kappa, (1 - mu) * kappa)) fits better; or compare with pm.sample",
                    UserWarning,
                    stacklevel=3,
                )


def _warn_correlated_hyperparameters(graph, state, rng, threshold: float = 0.6, sd_ratio: float = 0.8,
                                     n_draws: int = 32, n_grid: int = 61, max_evaluations: float = 2e7) -> None:
    """Warn where a prior's two shared latent parameters are strongly correlated a posteriori.

    The hyperparameters of a prior read by many latents (``theta_i ~ Gamma(alpha, beta)``,
    the BUGS pumps model) are inputs of every instance of the prior factor, whose sites
    drop their posterior correlation, as a likelihood's do (see
    :func:`_warn_correlated_pairs`): EP's sds of ``alpha`` and ``beta`` were 0.70 and 0.72 of
    NUTS's, converged and without a warning (robustness round 18). The law checked is
    their cavity (EP's marginals without this factor's sites) times the prior's log-density
    averaged over ``n_draws`` draws of each instance's latent from its EP marginal (the
    mean-field law of the two given the latents), on a grid in their unconstrained
    coordinates as in :func:`_joint_law`; its correlation and marginal sds are compared
    with EP's. Instances beyond ``max_evaluations / (n_grid**2 * n_draws)`` are subsampled
    and their sum scaled up.
    """
    for fi, f in enumerate(graph.factors):
        if f.kind != "prior" or f.logp is None or f.analytic is not None or len(f.latent_inputs) != 2 \
                or len(f.inputs) != 2 or f.size < 2 or not isinstance(f.output, (ElementSlot, LinearSlot)):
            continue
        if not all(isinstance(s, ElementSlot) and np.all(s.index == s.index[0]) for s in f.inputs):
            continue
        marg = engine._marginals(graph, None, state, f)
        cavities, ep_sd, centre, half = [], [], [], []
        for k in range(2):
            m = marg[k][:1]
            c = type(m).from_natural(m.natural - np.sum(np.asarray(state.sites[fi][k], dtype=float), axis=0))
            um, uv = m.unconstrained_moments()
            if not (np.all(c.is_proper()) and np.isfinite(um).all() and np.isfinite(uv).all() and uv[0] > 0):
                break
            cavities.append(c)
            ep_sd.append(float(np.sqrt(m.var()[0])))
            centre.append(float(um[0]))
            half.append(12.0 * float(np.sqrt(uv[0])))
        else:
            out = marg[2]
            rows = np.arange(f.size)
            keep = int(max(1, min(f.size, max_evaluations // (n_grid * n_grid * n_draws))))
            if keep < f.size:
                rows = np.sort(rng.choice(f.size, keep, replace=False))
            with np.errstate(all="ignore"):
                draws = np.asarray(out[rows].sample(rng, n_draws), dtype=float).T.reshape(-1)  # (rows * draws,)
            scale = f.size / rows.size / n_draws

            def law(lo, hi, n):
                us = [np.linspace(lo[k], hi[k], n[k]) for k in range(2)]
                xs = [type(cavities[k]).from_unconstrained(us[k]) for k in range(2)]
                logd = np.empty((n[0], n[1]))
                with np.errstate(all="ignore"):
                    for a in range(n[0]):
                        ins = (np.full((n[1], draws.size), xs[0][a]), np.repeat(xs[1][:, None], draws.size, axis=1))
                        val = np.ascontiguousarray(np.broadcast_to(draws, (n[1], draws.size)))
                        logd[a] = scale * np.sum(np.asarray(f.logp(val, ins), dtype=float), axis=1)
                    logd += cavities[0].logpdf_unconstrained(us[0][None, :])[0][:, None]
                    logd += cavities[1].logpdf_unconstrained(us[1][None, :])[0][None, :]
                logd = np.where(np.isfinite(logd), logd, -np.inf)
                if not np.isfinite(logd.max()):
                    raise FloatingPointError
                w = np.exp(logd - logd.max())
                w /= w.sum()
                mu_u = [float(np.sum(w.sum(axis=1 - k) * us[k])) for k in range(2)]
                sd_u = [float(np.sqrt(np.sum(w.sum(axis=1 - k) * (us[k] - mu_u[k]) ** 2))) for k in range(2)]
                return xs, w, mu_u, sd_u

            lo = [centre[k] - half[k] for k in range(2)]
            hi = [centre[k] + half[k] for k in range(2)]
            try:
                for attempt in range(10):
                    xs, w, mu_u, sd_u = law(lo, hi, (n_grid, n_grid))
                    if min(sd_u) <= 0:
                        raise FloatingPointError
                    if attempt == 0:
                        lo = [mu_u[k] - 8.0 * sd_u[k] for k in range(2)]
                        hi = [mu_u[k] + 8.0 * sd_u[k] for k in range(2)]
                        continue
                    edges = [(w[0].sum(), w[-1].sum()), (w[:, 0].sum(), w[:, -1].sum())]
                    wide = False
                    for k in range(2):
                        width = hi[k] - lo[k]
                        if edges[k][0] > 1e-8:
                            lo[k], wide = lo[k] - 0.5 * width, True
                        if edges[k][1] > 1e-8:
                            hi[k], wide = hi[k] + 0.5 * width, True
                    if not wide:
                        break
                else:
                    continue
                n = [int(min(max(n_grid, np.ceil(5.0 * (hi[k] - lo[k]) / sd_u[k]) + 1), 301)) for k in range(2)]
                xs, w, _, _ = law(lo, hi, n)
            except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
                continue
            X0, X1 = xs[0][:, None], xs[1][None, :]
            m0, m1 = np.sum(w * X0), np.sum(w * X1)
            s0, s1 = np.sqrt(np.sum(w * (X0 - m0) ** 2)), np.sqrt(np.sum(w * (X1 - m1) ** 2))
            if not (s0 > 0 and s1 > 0):
                continue
            rho = float(np.sum(w * (X0 - m0) * (X1 - m1)) / (s0 * s1))
            ratios = (ep_sd[0] / s0, ep_sd[1] / s1)
            names = [s.variable for s in f.inputs]
            if abs(rho) > threshold or min(ratios) < sd_ratio:
                warnings.warn(
                    f"{f.name}: its prior's parameters {names[0]} and {names[1]} are correlated at about {rho:.2f} "
                    f"a posteriori (their law given EP's draws of {f.name}, on a grid), which EP's separate messages "
                    f"for them leave out: EP's posterior sds of {names[0]} and {names[1]} are {ratios[0]:.2f} and "
                    f"{ratios[1]:.2f} of that law's (the BUGS pumps model, Gamma(alpha, beta) with both latent: 0.70 "
                    "of NUTS's). A mean-dispersion parametrisation (Gamma(alpha, alpha / mu), Beta(mu * kappa, "
                    "(1 - mu) * kappa)) fits better; or compare with pm.sample",
                    UserWarning,
                    stacklevel=3,
                )


def _warn_overlapping_components(graph, state) -> None:
    """Warn where a fitted mixture of Normals has two components on top of each other.

    The symptom of a poor mode of the posterior (:func:`pmkjit.ep.mixture.overlapping_components`),
    which EP reaches from its priors without any sign in its own convergence.
    """
    for f in graph.factors:
        for j, k, m_j, m_k, s_j, s_k in overlapping_components(f, state):
            warnings.warn(
                f"{f.name}: mixture components {j} and {k} overlap after EP (means {m_j:.3g} and {m_k:.3g}, "
                f"sds {s_j:.3g} and {s_k:.3g}): EP may have settled in a poor mode of the mixture's posterior "
                "(two components on one cluster, a broad one covering another); compare with pm.sample",
                UserWarning,
                stacklevel=3,
            )


def _joint_law(graph, state, fi, f, values, points, n_grid: int = 81, max_evaluations: float = 2e7):
    """Correlation of a factor's two shared latents in the law a joint site would give, and
    EP's marginal sds over that law's: ``(rho, (ratio_0, ratio_1))``, or None.

    The law is the factor's cavity (each latent's EP marginal divided by the factor's summed
    sites on it) times the likelihood summed over its instances, on a ``n_grid`` x ``n_grid``
    grid in the latents' unconstrained coordinates: first over 12 of EP's marginal sds each
    way (EP's sds may be a third of the law's), then over 8 of that pass's sds around its
    mean, widened by half on every side whose edge holds more than 1e-8 of the mass, and
    last at a fifth of the law's sd per node (up to 501 nodes an axis). None where a cavity
    is improper, the last grid would take more than ``max_evaluations`` density
    evaluations, the density cannot be evaluated, or ten passes do not contain the law.
    """
    if f.size * n_grid * n_grid * 4 > max_evaluations:
        return None
    marg = engine._marginals(graph, None, state, f)
    cavities, ep_sd, centre, half = [], [], [], []
    for k, i in enumerate(f.latent_inputs):
        m = marg[i][:1]
        site = np.asarray(state.sites[fi][k], dtype=float)
        if isinstance(f.inputs[i], LinearSlot):
            # instance n's site is on eta_n = eta_0 + d_n: the same Gaussian in eta_0, shifted
            d = np.broadcast_to(np.asarray(f.inputs[i].c, dtype=float), (f.size,))
            d = d - d[0]
            site = np.stack([site[:, 0] + 2.0 * site[:, 1] * d, site[:, 1]], axis=1)
        natural = m.natural - np.sum(site, axis=0)
        c = type(m).from_natural(natural)
        if not np.all(c.is_proper()):
            return None
        um, uv = m.unconstrained_moments()
        if not (np.isfinite(um).all() and np.isfinite(uv).all() and uv[0] > 0):
            return None
        cavities.append(c)
        ep_sd.append(float(np.sqrt(m.var()[0])))
        centre.append(float(um[0]))
        half.append(12.0 * float(np.sqrt(uv[0])))
    y = np.asarray(f.observed, dtype=float).ravel()

    def law(lo, hi, n):
        us = [np.linspace(lo[k], hi[k], n[k]) for k in range(2)]
        xs = [type(cavities[k]).from_unconstrained(us[k]) for k in range(2)]
        logd = np.empty((n[0], n[1]))
        with np.errstate(all="ignore"):
            for a in range(n[0]):
                first = np.full(n[1], xs[0][a])
                ins, j = [], 0
                for v in values:
                    if v is None:
                        ins.append(np.ascontiguousarray(points[j](first if j == 0 else xs[1])))
                        j += 1
                    else:
                        ins.append(np.ascontiguousarray(np.broadcast_to(v, (n[1], v.size))))
                yy = np.ascontiguousarray(np.broadcast_to(y, (n[1], y.size)))
                logd[a] = np.sum(np.asarray(f.logp(yy, tuple(ins)), dtype=float), axis=1)
            logd += cavities[0].logpdf_unconstrained(us[0][None, :])[0][:, None]
            logd += cavities[1].logpdf_unconstrained(us[1][None, :])[0][None, :]
        logd = np.where(np.isfinite(logd), logd, -np.inf)
        if not np.isfinite(logd.max()):
            raise FloatingPointError
        w = np.exp(logd - logd.max())
        w /= w.sum()
        mu_u = [float(np.sum(w.sum(axis=1 - k) * us[k])) for k in range(2)]
        sd_u = [float(np.sqrt(np.sum(w.sum(axis=1 - k) * (us[k] - mu_u[k]) ** 2))) for k in range(2)]
        return us, xs, w, mu_u, sd_u

    lo = [centre[k] - half[k] for k in range(2)]
    hi = [centre[k] + half[k] for k in range(2)]
    try:
        for attempt in range(10):
            us, xs, w, mu_u, sd_u = law(lo, hi, (n_grid, n_grid))
            if attempt == 0 and min(sd_u) > 0:  # zoom to the law's own extent (EP's sds may be far off)
                lo = [mu_u[k] - 8.0 * sd_u[k] for k in range(2)]
                hi = [mu_u[k] + 8.0 * sd_u[k] for k in range(2)]
                continue
            # a banana's tail (Rice(nu, sigma): small nu with a larger sigma) reaches far to one
            # side: widen each side whose edge still holds mass
            edges = [(w[0].sum(), w[-1].sum()), (w[:, 0].sum(), w[:, -1].sum())]
            wide = False
            for k in range(2):
                width = hi[k] - lo[k]
                if edges[k][0] > 1e-8:
                    lo[k], wide = lo[k] - 0.5 * width, True
                if edges[k][1] > 1e-8:
                    hi[k], wide = hi[k] + 0.5 * width, True
            if not wide:
                break
        else:
            return None
        if min(sd_u) <= 0:
            return None
        # the last pass at a resolution of a fifth of the law's sd on each axis
        n = [int(min(max(n_grid, np.ceil(5.0 * (hi[k] - lo[k]) / sd_u[k]) + 1), 501)) for k in range(2)]
        if n[0] * n[1] * f.size > max_evaluations:
            return None
        us, xs, w, mu_u, sd_u = law(lo, hi, n)
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return None
    X0, X1 = xs[0][:, None], xs[1][None, :]
    m0, m1 = np.sum(w * X0), np.sum(w * X1)
    s0, s1 = np.sqrt(np.sum(w * (X0 - m0) ** 2)), np.sqrt(np.sum(w * (X1 - m1) ** 2))
    if not (s0 > 0 and s1 > 0):
        return None
    rho = float(np.sum(w * (X0 - m0) * (X1 - m1)) / (s0 * s1))
    return rho, (ep_sd[0] / s0, ep_sd[1] / s1)


def _zip_moves(values, moves):
    """``(value, move)`` per input: data have a value, latent inputs a move (in order)."""
    it = iter(moves)
    return [(v, None if v is not None else next(it)) for v in values]


def _warn_non_centred(graph) -> None:
    """Warn about a likelihood reading a repeated projection and other latents in a product.

    A factor of two or more linear slots and a positive latent is how a non-centred group
    effect ``mu + tau * z[g]`` arrives (an affine mean would be one slot). Where each
    ``z[g]`` is read by several instances, EP's factorised messages ignore the strong
    posterior correlation of ``mu``, ``z`` and ``tau`` once per instance: with 20
    observations per group (N = 120, 6 groups) the posterior sds of ``mu`` and ``tau``
    came out 0.07 and 0.04 for exact 0.44 and 0.41, silently. The centred form is exact
    to 0.04 sd there. One observation per ``z[j]`` (eight schools) is fine, so no warning.
    """
    for f in graph.factors:
        if f.kind != "likelihood" or f.analytic is not None:
            continue
        linear = [f.inputs[i] for i in f.latent_inputs if isinstance(f.inputs[i], LinearSlot)]
        scales = [f.inputs[i] for i in f.latent_inputs
                  if isinstance(f.inputs[i], ElementSlot) and f.inputs[i].family.name == "Gamma"]
        if len(linear) < 2 or not scales:
            continue
        for slot in linear:
            d = _distinct_rows(slot)
            if 1 < d and slot.size >= 2 * d:
                used = np.any(np.asarray(slot.A).reshape(slot.size, -1) != 0, axis=0)
                names = [v.name for v in graph.gaussian_variables if used[v.offset:v.offset + v.size].any()]
                warnings.warn(
                    f"{f.name}: the likelihood reads {', '.join(names)} ({d} distinct values repeated over "
                    f"{slot.size} observations) in a product with {', '.join(sorted({s.variable for s in scales}))}"
                    " and another linear predictor, as in a non-centred group effect mu + tau * z[group]. EP's "
                    "factorised messages can then underestimate posterior sds several-fold (see docs/ep.md, "
                    "Known limitations); the centred form a = pm.Normal('a', mu, tau), a[group], is "
                    "semi-analytic and accurate",
                    UserWarning,
                    stacklevel=3,
                )
                break


def shares_a_latent(factor, min_instances: int = _SHARED_INSTANCES) -> bool:
    """Whether ``min_instances`` instances of ``factor`` read one latent element or projection.

    A factor with fewer instances (but at least two) shares a latent when all of them
    read it: eight schools' sites on one ``tau`` add up an operator's error like ten do.
    """
    min_instances = max(2, min(min_instances, factor.size))
    for i in factor.latent_inputs:
        slot = factor.inputs[i]
        if isinstance(slot, ElementSlot):
            keys = slot.index.reshape(slot.size, -1)
        elif isinstance(slot, LinearSlot):
            keys = _row_keys(slot)[:, None]
        else:
            continue
        if slot.size >= min_instances and np.unique(keys, axis=0, return_counts=True)[1].max() >= min_instances:
            return True
    return False


def _method_label(kjit, oracle) -> str:
    if isinstance(oracle, _NoOracle):
        return oracle.label
    return f"kjit ({oracle.kind} oracle)" if kjit is not None else oracle.kind


class _NoOracle:
    """Stands in the per-factor oracle list for (semi-)analytic factors (never called)."""

    n_calls = 0

    def __init__(self, label: str):
        self.label = label


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


def _inference_data(model, graph, state, draws, chains, rng,
                    with_loglik) -> tuple[az.InferenceData, ConditionalDraws | None]:
    posterior = {}
    n = draws * chains
    z = rng.standard_normal((n, graph.n_theta)) if graph.n_theta else None
    elements = {v.name: v.family.from_natural(state.element_natural[v.name]).sample(rng, n).reshape(n, v.size)
                for v in graph.variables.values() if not v.in_gaussian_block}
    # the real latents given each draw of the scales they are Normal under (the funnel of
    # a hierarchy), else EP's joint Gaussian (pmkjit.ep.conditional)
    given = conditional_draws(graph, state, elements, n, rng)
    if given is not None:
        theta = given.theta
        elements.update(given.scales)
    elif graph.n_theta:
        theta = state.mu + solve_triangular(state.chol, z.T, lower=True, trans="T").T
    for v in graph.variables.values():
        if v.in_gaussian_block:
            x = theta[:, v.offset : v.offset + v.size]
            if v.name in graph.zero_sum:  # EP holds the sum near 0 (sd 1e-4); the model at 0
                x = x.reshape((n,) + v.shape)
                x = x - x.mean(axis=-1, keepdims=True)
        else:
            x = elements[v.name]
        posterior[v.name] = x.reshape((chains, draws) + v.shape)
    for name in graph.ordered:
        # EP's Gaussian for an ordered vector has tails past its order: say how many draws
        # fell there rather than alter them
        unordered = float(np.mean(np.any(np.diff(posterior[name], axis=-1) <= 0, axis=-1)))
        if unordered > 0:
            warnings.warn(
                f"{name}: {unordered:.1%} of the posterior draws of this ordered vector are out of order (EP's "
                "Gaussian approximation puts that mass past their order, which its order factors impose on the "
                "moments only); entries whose order the data leave uncertain, such as the cutpoints around a class "
                "with few observations, make it larger",
                UserWarning, stacklevel=3,
            )
    coords, dims = coords_and_dims_for_inferencedata(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.from_dict(
            posterior=posterior,
            observed_data={k: np.asarray(v) for k, v in find_observations(model).items()},
            constant_data={k: np.asarray(v) for k, v in find_constants(model).items()},
            coords=coords,
            dims=dims,
        )
        if graph.predictive:
            drawn = _predictive_draws(idata.get("posterior"), model, graph.predictive, rng, (chains, draws))
            if "posterior" in idata:
                idata.posterior = drawn
            else:
                idata.add_groups(posterior=drawn)
        # ``model`` reads observed variables as their data (observed_as_data, in fit):
        # pm.compute_deterministics evaluates the graph with only the free variables given,
        # so a deterministic reading an observed x (a + b * x) would otherwise get a fresh
        # random draw of x per posterior draw, not its data as in pm.sample
        det = pm.compute_deterministics(idata.posterior, model=model, merge_dataset=True, progressbar=False)
        idata.posterior = det
        if with_loglik and model.observed_RVs:
            pm.compute_log_likelihood(idata, model=model, progressbar=False)
    return idata, given


def _predictive_draws(posterior: xr.Dataset | None, model: pm.Model, names: list[str],
                      rng: np.random.Generator, shape: tuple[int, int]) -> xr.Dataset:
    """``posterior`` with the latents no factor reads drawn given each draw of the others.

    Their factors integrate to one over them, so the posterior of these variables given the
    data is their predictive: one forward draw per posterior draw of their parents, as
    ``pm.sample_posterior_predictive`` makes for observed variables (see
    :mod:`pmkjit.graph.predictive`).
    """
    seed = int(rng.integers(2**31 - 1))
    # PyMC announces which variables it draws ("Sampling: [...]"): captured, not printed,
    # and checked, since a variable drawn beside ours would replace its EP posterior draws
    log = logging.getLogger("pymc.sampling.forward")
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    saved = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    try:
        pp = _forward(posterior, model, names, seed, shape)
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
    for message in messages:
        if message.startswith("Sampling: [") and message.endswith("]"):
            drawn = {v.strip() for v in message[len("Sampling: ["):-1].split(",") if v.strip()}
            if not drawn <= set(names):
                raise RuntimeError(f"PyMC would redraw {sorted(drawn - set(names))} from their priors beside "
                                   f"{names}; please report this model to pmkjit")
    if posterior is None:
        posterior = xr.Dataset(coords={"chain": np.arange(shape[0]), "draw": np.arange(shape[1])})
    out = posterior.copy()
    for name in names:
        draws = np.asarray(pp[name])
        dims = ("chain", "draw") + tuple(model.named_vars_to_dims.get(name) or
                                         (f"{name}_dim_{i}" for i in range(draws.ndim - 2)))
        out[name] = (dims, draws)
        # the model's coordinates, or 0, 1, ... for a dimension without them, as ArviZ gives
        # pm.sample's y_unobserved_dim_0 (without, .sel(y_unobserved_dim_0=2) failed)
        out = out.assign_coords({d: np.asarray(model.coords[d]) if model.coords.get(d) is not None
                                 else np.arange(n) for d, n in zip(dims[2:], draws.shape[2:])
                                 if d not in out.coords})
    return out


def _forward(posterior: xr.Dataset | None, model: pm.Model, names: list[str], seed: int,
             shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Forward draws of ``names`` given each posterior draw (or from the prior, without one).

    The model's data are frozen into constants first: given a bare posterior, PyMC takes
    every ``pm.Data`` as possibly changed and redraws each free variable downstream of one
    from its prior (a latent whose prior sd was ``pm.Data(10.0)`` came back with the prior's
    sd, 9.9, instead of the posterior's 0.1), and the predictive-only ones with it.
    """
    model = freeze_dims_and_data(model)
    if posterior is None:  # every latent is unread: the posterior is the prior
        pp = pm.sample_prior_predictive(draws=int(np.prod(shape)), model=model, var_names=list(names),
                                        random_seed=seed, return_inferencedata=False)
        return {k: np.asarray(v).reshape(shape + np.shape(v)[1:]) for k, v in pp.items()}
    return pm.sample_posterior_predictive(posterior, model=model, var_names=list(names), random_seed=seed,
                                          progressbar=False, return_inferencedata=False)


def _ep_group(graph, state, trace, events, sweeps, converged, kjits, oracles, timings, method,
              damping) -> xr.Dataset:
    names = [f.description for f in graph.factors]
    data = {
        # the EP posterior in closed form: the joint Gaussian of the real-valued latents,
        # and the natural parameters of every other latent's element-wise message
        "gaussian_mean": (("theta",), np.asarray(state.mu, dtype=float)),
        "gaussian_cov": (("theta", "theta_"), _covariance(state.chol)),
        "convergence": (("sweep",), np.asarray(trace, dtype=float)),
        "oracle_calls": (("factor",), np.asarray([o.n_calls for o in oracles], dtype=int)),
        # entries quadrature or the grid refused and importance sampling answered instead
        "oracle_fallbacks": (("factor",), np.asarray([getattr(o, "n_fallback", 0) for o in oracles], dtype=int)),
        "kjit_predictions": (("factor",), np.asarray(
            [k.operator.n_predictions if k is not None else 0 for k in kjits], dtype=int)),
        # calls in which the oracle's spot checks found the operator's trusted predictions
        # wrong, and the oracle answered the whole batch (KJITMethod._spot_check)
        "kjit_distrusted": (("factor",), np.asarray(
            [k.n_distrusted if k is not None else 0 for k in kjits], dtype=int)),
        "factor_size": (("factor",), np.asarray([f.size for f in graph.factors], dtype=int)),
    }
    attrs = {
        "sweeps": int(sweeps),
        "converged": int(converged),
        "method": method,
        "damping_final": float(damping),
        **{k: int(v) for k, v in events.items()},
        **{f"seconds_{k}": float(v) for k, v in timings.items()},
        "factor_graph": graph.summary(),
        "weights": "; ".join(f"{f.name}: {f.density_source}" for f in graph.factors),
        # how each factor's messages were computed, e.g. "y: quadrature" for a factor whose
        # instances share a latent under method="kjit"
        "factor_methods": "; ".join(
            f"{f.name}: {_method_label(k, o)}" for f, k, o in zip(graph.factors, kjits, oracles)),
    }
    for v in graph.element_variables:
        data[f"natural__{v.name}"] = ((f"{v.name}__element", "natural_param"),
                                      np.asarray(state.element_natural[v.name], dtype=float))
    attrs["latent_families"] = "; ".join(f"{v.name}: {v.family.name}" for v in graph.variables.values())
    attrs["latent_shapes"] = "; ".join(f"{v.name}: {','.join(map(str, v.shape))}" for v in graph.variables.values())
    attrs["gaussian_offsets"] = "; ".join(f"{v.name}: {v.offset}" for v in graph.gaussian_variables)
    return xr.Dataset(data, coords={"sweep": np.arange(1, len(trace) + 1), "factor": names}, attrs=attrs)


def _covariance(chol: np.ndarray) -> np.ndarray:
    """Covariance from the Cholesky factor L of the posterior *precision* (P = L L^T)."""
    if chol.size == 0:
        return np.zeros((0, 0))
    from scipy.linalg import cho_solve

    return cho_solve((chol, True), np.eye(chol.shape[0]))


def _attr_map(text: str) -> dict[str, str]:
    return dict(item.split(": ", 1) for item in text.split("; ")) if text else {}


def ep_posterior(idata: az.InferenceData) -> dict[str, ExponentialFamily]:
    """The EP posterior marginals of every latent variable, as message batches.

    Parameters
    ----------
    idata : arviz.InferenceData
        Returned by :func:`fit`.

    Returns
    -------
    dict of str to ExponentialFamily
        Per latent variable, a batch of its (flattened) elements' marginals: Gaussian
        for real-valued latents (the joint Gaussian is ``idata.ep.gaussian_mean`` and
        ``idata.ep.gaussian_cov``), Gamma or Beta for positive or unit-interval ones.
        Exact, unlike moments estimated from the posterior draws.

    Notes
    -----
    The keys are the latents of the model EP ran, which :func:`fit` may have rewritten:
    a centred non-centred effect is its centred latent (``a``, not ``z``; an effect
    without a name is ``__pmkjit_centred_<z>``); a latent on another constant interval,
    ``r = lower + (upper - lower) * u``, is its hidden unit or positive latent
    ``__pmkjit_unit_<r>``; a ``pm.Dirichlet`` ``d`` is its stick-breaking Betas
    ``__pmkjit_stick_<d>_<k>``; variables drawn from their predictive after EP are
    absent. ``idata.ep.attrs["latent_families"]`` lists the keys.

    Raises
    ------
    ValueError
        If ``idata`` has no ``ep`` group with the posterior (not made by ``pmkjit.fit``).
    """
    ep = getattr(idata, "ep", None)
    if ep is None or "gaussian_mean" not in ep or "latent_families" not in ep.attrs:
        raise ValueError("idata has no EP posterior: pass the InferenceData returned by pmkjit.fit")
    families = _attr_map(ep.attrs["latent_families"])
    shapes = {k: tuple(int(n) for n in v.split(",") if n) for k, v in _attr_map(ep.attrs["latent_shapes"]).items()}
    offsets = {k: int(v) for k, v in _attr_map(ep.attrs["gaussian_offsets"]).items()}
    mean, cov = ep["gaussian_mean"].values, ep["gaussian_cov"].values
    out = {}
    for name, fam in families.items():
        if name in offsets:
            size = int(np.prod(shapes[name], dtype=int))
            sl = slice(offsets[name], offsets[name] + size)
            out[name] = Gaussian(mean[sl], np.diag(cov)[sl])
        else:
            out[name] = family_by_name(fam).from_natural(ep[f"natural__{name}"].values)
    return out
