"""The sweep schedule (pmkjit.ep.schedule) on linear fixed-point iterations of known modes.

EP near its fixed point is a linear map of the posterior's coordinates: a sweep damped by
a moves x to x + a (T x - x). With T = lambda I the error shrinks by 1 - a (1 - lambda) per
sweep, so the rules can be checked against the closed form: a period-2 mode (lambda near
-1) needs the damping halved, a slow monotone mode (lambda near 1) must keep it at 1.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from pmkjit.ep import engine, schedule
from pmkjit.ep.engine import EPInfo


def _linear_sweeps(monkeypatch, lam: float, x0=(1.0, -0.5, 0.25)):
    """Patch engine.sweep with x <- x + damping (lam x - x) around the fixed point 0 (sds 1)."""
    def sweep(graph, prior, state, methods, *, damping):
        new = state + damping * (lam * state - state)
        change = new - state
        return new, EPInfo(max_change=float(np.abs(change).max()), change=change, updated=1)

    monkeypatch.setattr(engine, "sweep", sweep)
    return SimpleNamespace(factors=[object()]), np.asarray(x0, float)


def test_a_slow_period_two_oscillation_halves_the_damping(monkeypatch):
    graph, x0 = _linear_sweeps(monkeypatch, lam=-0.95)
    fixed = schedule.run(graph, None, x0, [], damping=1.0, adaptive=False, tol=1e-3, max_sweeps=50)
    # undamped, the error shrinks 5% a sweep: 0.95**50 = 0.077 > tol
    assert not fixed.converged
    auto = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=50)
    assert auto.converged and auto.sweeps <= 10
    assert auto.events["oscillation_halvings"] >= 1
    assert np.abs(auto.state).max() < 1e-3


def test_a_slow_monotone_contraction_keeps_the_damping(monkeypatch):
    """Successive changes point the same way: halving would only slow it down."""
    graph, x0 = _linear_sweeps(monkeypatch, lam=0.8)
    steps = []
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=60,
                       callback=lambda info: steps.append(info.damping))
    assert run.converged and run.events["oscillation_halvings"] == 0
    assert set(steps) == {1.0}
    # 0.8**k * 0.2 < 1e-3 from k = 24: the undamped closed form
    assert run.sweeps == int(np.ceil(np.log(1e-3 / 0.2) / np.log(0.8))) + 1


def test_a_fast_wobble_is_left_alone(monkeypatch):
    """A period-2 mode that halves in size every sweep converges by itself."""
    graph, x0 = _linear_sweeps(monkeypatch, lam=-0.5)
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=50)
    assert run.converged and run.events["oscillation_halvings"] == 0


@pytest.mark.parametrize("lam", [-0.99, -0.9, -0.75])
def test_oscillations_of_any_slow_rate_converge_with_auto_damping(monkeypatch, lam):
    graph, x0 = _linear_sweeps(monkeypatch, lam=lam)
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=50)
    assert run.converged and run.sweeps <= 15 and np.abs(run.state).max() < 1e-2
