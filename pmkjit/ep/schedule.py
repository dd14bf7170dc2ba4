"""The sweep schedule of EP: damping, undone overshoots and the convergence test.

:func:`run` repeats :func:`pmkjit.ep.engine.sweep` until the posterior stops moving.
With ``adaptive=True`` (``pmkjit.fit(damping="auto")``) it starts undamped and adapts
the damping to what the sweeps do:

* a sweep that moves farther than the larger of the last two kept ones (an overshoot)
  halves the damping; one that moves more than twice as far is also undone; but a sweep
  that moves a little farther (at most 1.25 times) in the direction of the last one is a
  steady drift, not an overshoot, and keeps the step: a real mode above 1 grows at every
  damping (by 1 + a (lambda - 1) > 1), so halving only slows EP's way out of where its
  first sweeps put it;
* a sweep in which a factor's update was rejected (it would have made the posterior
  improper, even at a sixteenth of the step) halves the damping too, and is not taken
  for convergence: the factor's sites did not move because they could not; one at the
  smallest damping ends the run (``pmkjit.fit`` then starts again from the priors);
* a sweep in which a factor got no answer at all (every instance's tilted moments
  refused) is not taken for convergence either, whatever the other factors did;
* a sweep that moves less than half as far as the last one, or two shrinking sweeps in
  a row, double it (up to 1);
* a slow period-2 oscillation (successive changes pointing in opposite directions while
  their size shrinks by less than half over two sweeps) halves it;
* a slow linear mode is jumped over: when six sweeps in a row at one step, with no
  guard event and no oracle call, change the posterior by a linear recurrence of order
  one or two (one slow eigenvalue, or a pair: a rotation, a slow drift under a wobble)
  whose largest eigenvalue has modulus in (0.5, 0.99), the sites move to the
  recurrence's fixed point (minimal polynomial extrapolation) and sweeping goes on from
  there. A latent scale coupled to many Gaussian latents (a random walk's step) contracts
  like that, about 0.9 a sweep: 50-120 sweeps where the jump needs 25-35. If the sweep
  after a jump moves farther than the one before it, the jump is undone and not tried
  again in the run. The fixed point is EP's own either way: convergence is still a sweep
  that moves less than ``tol``.

Distances are changes divided by the sweep's damping (a damped sweep moves only that
fraction of the way), so heavy damping cannot pass for convergence: EP has converged
when a sweep's change is below ``tol`` times its damping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pmkjit.ep import engine
from pmkjit.ep.engine import EPInfo, EPState

__all__ = ["EPRun", "run", "MIN_AUTO_DAMPING"]

MIN_AUTO_DAMPING = 0.05
_REVERT_FACTOR = 2.0  # a sweep changing the posterior this many times more than the last kept ones is undone
# a sweep retried at half the step after being undone is kept if its distance is still more
# than this fraction of the undone one's: the step was not what made it large
_FUTILE_RETRY = 0.75
# Successive changes with a cosine below this point in opposite directions...
_ANTI_ALIGNED = -0.5
# ... and an oscillation that keeps more than this fraction of its size over two sweeps
# is slow: a period-2 mode of eigenvalue lambda in (-1, -0.7); halving the damping
# turns it into (1 + lambda) / 2, which is nearly 0.
_SLOW_TWO_SWEEPS = 0.5
# A slow linear mode: over _EXTRAPOLATION_WINDOW consecutive clean sweeps at one step, the
# changes follow a linear recurrence of order one or two (one real eigenvalue, or a pair:
# a rotation, a slow mode under a period-2 wobble) to within _RECURRENCE_RESIDUAL, with
# the largest eigenvalue's modulus in _SLOW_MODULUS (slow enough to be worth a jump,
# and contracting) ...
# A kept sweep whose change has a cosine above _ALIGNED_DRIFT with the last one and whose
# distance is at most _DRIFT_GROWTH times the reference is a steady drift, not an overshoot.
_ALIGNED_DRIFT = 0.9
_DRIFT_GROWTH = 1.25
_EXTRAPOLATION_WINDOW = 6
_RECURRENCE_RESIDUAL = 0.1
_SLOW_MODULUS = (0.5, 0.99)

EVENTS = ("skipped_improper_cavity", "damping_halvings", "rejected_updates", "unanswered")


@dataclass
class EPRun:
    """What a run of sweeps did.

    Attributes
    ----------
    state : EPState
        The posterior after the last kept sweep.
    trace : list of float
        ``max_change`` of every sweep, undone ones included.
    events : dict of str to int
        Guard events summed over the kept sweeps, ``reverted_sweeps`` (undone
        overshoots), ``oscillation_halvings`` (damping halved on a slow oscillation),
        ``extrapolations`` (jumps over a slow linear mode) and ``extrapolations_undone``.
    sweeps : int
        Sweeps run, undone ones included.
    converged : bool
    unanswered, rejected : int
        Unanswered instances and rejected site updates of the last kept sweep.
    silent : list of str
        Factors of the last kept sweep none of whose instances got an answer.
    step : float
        Damping the next sweep would have used.
    limit_step : float
        Damping of the last sweep (convergence needs its change below ``tol`` times it).
    """

    state: EPState
    trace: list[float] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    sweeps: int = 0
    converged: bool = False
    unanswered: int = 0
    rejected: int = 0
    silent: list[str] = field(default_factory=list)
    step: float = 1.0
    limit_step: float = 1.0


def run(graph, prior, state: EPState, methods: list[Callable], *, damping: float, adaptive: bool, tol: float,
        max_sweeps: int, callback: Callable[[EPInfo], None] | None = None,
        advance: Callable[[float], None] | None = None, timings: dict[str, float] | None = None,
        first_sweep: int = 1) -> EPRun:
    """Sweep until convergence or ``max_sweeps``.

    Parameters
    ----------
    graph, prior, state
        From :func:`pmkjit.ep.engine.init`.
    methods : list of callables
        One per factor (see :func:`pmkjit.ep.engine.sweep`).
    damping : float in (0, 1]
        The first sweep's damping (the only one unless ``adaptive``).
    adaptive : bool
        Adapt the damping to the sweeps (module docstring).
    tol : float
        Convergence tolerance on a sweep's change divided by its damping.
    max_sweeps : int
    callback : callable, optional
        Called with every sweep's :class:`~pmkjit.ep.engine.EPInfo`.
    advance : callable, optional
        Called with every sweep's change (a progress bar).
    timings : dict, optional
        Seconds per part of a sweep, added to.
    first_sweep : int
        Number given to the first sweep's ``EPInfo.sweep`` (a restart continues the count).
    """
    step = float(damping)
    out = EPRun(state=state, step=step, limit_step=step,
                events={**{k: 0 for k in EVENTS}, "reverted_sweeps": 0, "oscillation_halvings": 0,
                            "extrapolations": 0, "extrapolations_undone": 0},
                converged=not graph.factors)
    accepted: list[float] = []  # distances still to go (change / step) of the sweeps kept
    last_change: np.ndarray | None = None  # signed change of the last kept sweep
    anti_streak = 0  # kept sweeps in a row pointing against the one before
    last_undone: float | None = None  # distance of the sweep just undone, if the last one was
    clean: list[tuple] = []  # (state, change, step) of consecutive clean kept sweeps at one step
    extrapolated: tuple[EPState, float] | None = None  # (state before, its distance) after an extrapolation
    may_extrapolate = adaptive
    for n in range(max_sweeps if graph.factors else 0):
        previous = out.state
        out.state, info = engine.sweep(graph, prior, out.state, methods, damping=step)
        info.sweep = first_sweep + n
        out.sweeps = n + 1
        if callback is not None:
            callback(info)
        out.limit_step = step_used = step
        # A sweep that moved no site because every answer was refused (a tilted law
        # the oracle could not resolve, an update that broke the posterior) changes
        # nothing: that is a stall, not convergence.
        # So is a sweep in which one factor got no answer at all while others moved: a
        # shifted exponential whose loc jumped past the data in the first undamped sweep
        # had every entry unanswered from then on, and EP "converged" on the other
        # factor's sites with loc at 61 (the data put it below 2.007; robustness round 15).
        stalled = (info.updated == 0 and info.unanswered + info.rejected_updates > 0) or bool(info.silent)
        # A factor whose update was rejected (it would have made the posterior improper even
        # at a sixteenth of the step) kept its old sites: the sweep changed nothing there,
        # which is no evidence of a fixed point, and the step was too large for it.
        rejected = adaptive and info.rejected_updates > 0
        done = info.max_change < tol * step and not stalled and not rejected
        # Sweeps are compared by that distance, not by their raw changes: a sweep
        # after the step was doubled moves twice as far by design. Comparing raw
        # changes called it an overshoot and halved the step again, a cycle between
        # two steps (0.05 and 0.1 on a LogNormal regression with a HalfCauchy scale:
        # not converged in 50 sweeps, where damping=1 converges in 9).
        distance = info.max_change / step
        # Parallel EP often contracts with a period-2 wobble (small, large, smaller,
        # ...): measured against the last kept sweep alone, every large one of a
        # converging wobble was an overshoot. Against the larger of the last two,
        # only a sweep that moves farther than both is.
        reference = max(accepted[-2:]) if accepted else np.inf
        # A sweep a little longer than the last ones and pointing their way is a steady
        # drift (EP leaving an unstable point along one real mode), which no damping
        # stops: halving on each such sweep left a three-component mixture at the
        # smallest step, creeping out of its first sweeps' mode for 80 sweeps (change
        # 0.03 a sweep, cosine 1.00, each 1-4% longer); at step 1 it converges in 44.
        # Longer or less aligned sweeps stay overshoots: the stochastic volatility
        # model's erratic ones (cosine 0.78, 1.9 times longer) need the halving.
        drift = (_ALIGNED_DRIFT is not None and last_change is not None
                 and _cosine(info.change, last_change) > _ALIGNED_DRIFT and distance <= _DRIFT_GROWTH * reference)
        overshoot = adaptive and (rejected or (distance > reference and not drift))
        # Parallel updates of many sites computed from one cavity overshoot where
        # the latents are strongly correlated (a logistic regression on an
        # uncentred covariate: b0 and b1 at correlation -0.98). Keeping the
        # overshoot threw EP 30-60 posterior sds away, where a KJIT operator,
        # trained nearer the start, then answered unsure of nothing: a sweep that
        # more than doubles the last kept change is undone and retried with half
        # the step. A mild increase is kept (and the step halved): undoing those
        # too left a hierarchical model crawling at step 0.125 without converging
        # in 50 sweeps.
        # A retried sweep that moves as far at half the step as it did undone is not
        # an overshoot of the step, so undoing it again would only repeat it: on
        # crossed random effects (5 x 4 levels) each such run undid six sweeps down
        # to the smallest step, then climbed back, and EP did not converge in 50
        # sweeps where damping=1 converges in 30.
        futile = last_undone is not None and distance > _FUTILE_RETRY * last_undone
        reverted = (overshoot and distance > _REVERT_FACTOR * reference
                    and step > MIN_AUTO_DAMPING and not futile)
        last_undone = distance if reverted else None
        # A slow period-2 oscillation never overshoots (each sweep a little shorter than
        # the one before last) and its steady shrinking doubled the step back to 1: a
        # Student-t regression with a latent nu alternated for 50 sweeps at step 1,
        # shrinking 5% a sweep (cosine of successive changes -0.998), not converged; a
        # step of 0.5 there contracts 40-fold per sweep.
        anti = (not reverted and last_change is not None
                and _cosine(info.change, last_change) < _ANTI_ALIGNED)
        anti_streak = anti_streak + 1 if anti else 0
        oscillating = (adaptive and not overshoot and anti_streak >= 2 and len(accepted) >= 2
                       and distance > _SLOW_TWO_SWEEPS * accepted[-2] and step > MIN_AUTO_DAMPING)
        if overshoot or oscillating:
            step = max(0.5 * step, MIN_AUTO_DAMPING)
            if oscillating:
                out.events["oscillation_halvings"] += 1
                anti_streak = 0
        elif adaptive and accepted and (distance < 0.5 * accepted[-1] or (
                len(accepted) >= 2 and accepted[-1] < accepted[-2])):
            # contracting fast, or steadily (two kept sweeps in a row): a step halved
            # early (often in the first sweeps) need not stay small, where each sweep
            # closes only that fraction of the gap (a damped sweep's distance shrinks
            # by about the step, never by half)
            step = min(2.0 * step, 1.0)
        out.trace.append(info.max_change)
        if timings is not None:
            for k, v in info.seconds.items():
                timings[k] = timings.get(k, 0.0) + v
        if advance is not None:
            advance(info.max_change)
        if extrapolated is not None:
            before, before_distance = extrapolated
            extrapolated = None
            if distance > before_distance or stalled or rejected:
                # the jump did not shorten the way (the map was not linear that far out):
                # back to where it started, and no more jumps in this run
                out.state = before
                step = step_used  # the jump, not the step, made that sweep long
                out.events["extrapolations_undone"] += 1
                may_extrapolate = False
                clean = []
                continue
        if reverted:
            out.state = previous
            out.events["reverted_sweeps"] += 1
            continue
        accepted.append(distance)
        last_change = info.change
        for k in EVENTS:
            out.events[k] += getattr(info, k)
        out.unanswered, out.rejected, out.silent = info.unanswered, info.rejected_updates, info.silent
        if done:
            out.converged = True
            break
        # Only sweeps of one fixed map make a recurrence: the same step, no guard event,
        # and no oracle call (a KJIT operator that learned from one answers differently).
        is_clean = (not stalled and not rejected and info.damping_halvings == 0 and info.unanswered == 0
                    and not any(a.any() for a in info.asked.values()))
        if may_extrapolate and is_clean and not overshoot and not oscillating:
            if clean and (clean[-1][0] is not previous or clean[-1][2] != step_used):
                clean = []
            if not clean:
                clean = [(previous, np.zeros(0), step_used)]
            clean.append((out.state, np.nan_to_num(info.change), step_used))
            if len(clean) > _EXTRAPOLATION_WINDOW:
                jump = _extrapolate(graph, prior, clean)
                clean = clean[1:]  # no slow mode yet: look again after the next sweep
                if jump is not None:
                    clean = []
                    extrapolated = (out.state, distance)
                    out.state = jump
                    out.events["extrapolations"] += 1
        else:
            clean = []
        if rejected and out.limit_step <= MIN_AUTO_DAMPING:
            # rejected at the smallest step: more sweeps from here only repeat it (each
            # costs a full sweep of tilted moments), so the caller may start afresh
            break
    out.step = step
    return out


def _extrapolate(graph, prior, clean: list) -> EPState | None:
    """The fixed point of a slow linear mode, or None where there is none.

    ``clean`` holds (state, change, step) of the start and of consecutive sweeps. If the
    changes u_j satisfy u_{j+k} + c_{k-1} u_{j+k-1} + ... + c_0 u_j = 0 (k = 1 or 2), so
    do the errors x_j - x*, and x* = (x_{m} + c_{k-1} x_{m-1} + ... + c_0 x_{m-k}) / p(1)
    with p(z) = z^k + c_{k-1} z^(k-1) + ... + c_0 (minimal polynomial extrapolation).
    The coefficients are fitted on the changes (in posterior sds, so every latent
    counts alike); the extrapolation is applied to the sites.
    """
    u = np.array([ch for _, ch, _ in clean[1:]])  # (sweeps, coordinates)
    m = len(u)
    for k in (1, 2):
        A = np.stack([u[j : m - k + j] for j in range(k)], axis=-1).reshape(-1, k)
        b = -u[k:].reshape(-1)
        if not np.any(b):
            return None
        c, *_ = np.linalg.lstsq(A, b, rcond=None)
        if np.linalg.norm(A @ c - b) > _RECURRENCE_RESIDUAL * np.linalg.norm(b):
            continue
        roots = np.roots(np.concatenate([[1.0], c[::-1]]))
        if not _SLOW_MODULUS[0] < np.abs(roots).max() < _SLOW_MODULUS[1]:
            return None
        weights = np.concatenate([c, [1.0]]) / (1.0 + c.sum())  # of x_{m-k}, ..., x_m
        return engine.combine(graph, prior, [x for x, _, _ in clean[-k - 1 :]], weights)
    return None


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0), np.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0)
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norm) if norm > 0 else 0.0
