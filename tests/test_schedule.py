"""The sweep schedule (pmkjit.ep.schedule) on linear fixed-point iterations of known modes.

EP near its fixed point is a linear map of the posterior's coordinates: a sweep damped by
a moves x to x + a (T x - x). With T = lambda I the error shrinks by 1 - a (1 - lambda) per
sweep, so the rules can be checked against the closed form: a period-2 mode (lambda near
-1) needs the damping halved, a slow monotone mode (lambda near 1) must keep it at 1.
"""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from pmkjit.ep import engine, schedule
from pmkjit.ep.engine import EPInfo


def _linear_sweeps(monkeypatch, lam, x0=(1.0, -0.5, 0.25)):
    """Patch engine.sweep with x <- x + damping (T x - x) around the fixed point 0 (sds 1).

    ``lam`` is T's eigenvalue (T = lam I) or the matrix T itself; the state is x itself,
    and engine.combine, which extrapolations call, the weighted sum of states.
    """
    T = np.asarray(lam, float) if np.ndim(lam) == 2 else lam * np.eye(len(x0))

    def sweep(graph, prior, state, methods, *, damping):
        new = state + damping * (T @ state - state)
        change = new - state
        return new, EPInfo(max_change=float(np.abs(change).max()), change=change, updated=1)

    monkeypatch.setattr(engine, "sweep", sweep)
    monkeypatch.setattr(engine, "combine", lambda graph, prior, states, w: sum(wi * x for wi, x in zip(w, states)))
    return SimpleNamespace(factors=[object()]), np.asarray(x0, float)


def _sweeps_to_tol(rate: float, first_change: float, tol: float = 1e-3) -> int:
    """Sweeps of a contraction by ``rate`` until a change is below ``tol`` (the first is ``first_change``)."""
    return int(np.ceil(np.log(tol / first_change) / np.log(rate))) + 1


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
    monkeypatch.setattr(schedule, "_SLOW_MODULUS", (1.0, 1.0))  # no extrapolation: sweeps alone
    graph, x0 = _linear_sweeps(monkeypatch, lam=0.8)
    steps = []
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=60,
                       callback=lambda info: steps.append(info.damping))
    assert run.converged and run.events["oscillation_halvings"] == 0
    assert set(steps) == {1.0}
    # 0.8**k * 0.2 < 1e-3 from k = 24: the undamped closed form
    assert run.sweeps == _sweeps_to_tol(0.8, 0.2)


def test_a_slow_monotone_contraction_is_extrapolated_to_its_fixed_point(monkeypatch):
    """With T = 0.8 I the changes obey u_{j+1} = 0.8 u_j: six sweeps identify it, and
    x* = (x_m - 0.8 x_{m-1}) / 0.2 is the fixed point 0 itself; one sweep confirms it."""
    graph, x0 = _linear_sweeps(monkeypatch, lam=0.8)
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=60)
    assert run.converged and run.events["extrapolations"] == 1 and run.events["extrapolations_undone"] == 0
    assert run.sweeps == schedule._EXTRAPOLATION_WINDOW + 1
    np.testing.assert_allclose(run.state, 0.0, atol=1e-12)


def test_a_slow_rotation_is_extrapolated_to_its_fixed_point(monkeypatch):
    """A complex pair 0.9 exp(+-0.4 pi i): successive changes nearly orthogonal, no
    direction repeats, the size shrinks 10% a sweep; order two recovers x* exactly."""
    angle = 0.4 * np.pi
    R = 0.9 * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    graph, x0 = _linear_sweeps(monkeypatch, lam=R, x0=(1.0, -0.5))
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=100)
    assert run.converged and run.events["extrapolations"] == 1
    np.testing.assert_allclose(run.state, 0.0, atol=1e-10)
    monkeypatch.setattr(schedule, "_SLOW_MODULUS", (1.0, 1.0))
    plain = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=100)
    assert plain.converged and plain.sweeps > 3 * run.sweeps


def test_a_jump_that_lands_farther_away_is_undone(monkeypatch):
    """If the sweep after a jump moves farther than the one before it, the run returns to
    where the jump started and sweeps on without jumping: the same fixed point."""
    graph, x0 = _linear_sweeps(monkeypatch, lam=0.8)
    monkeypatch.setattr(engine, "combine", lambda graph, prior, states, w: 50.0 * states[-1])
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=60)
    assert run.converged and run.events["extrapolations"] == 1 and run.events["extrapolations_undone"] == 1
    assert np.abs(run.state).max() < 5e-3
    # the undone jump costs one sweep, and none is tried again
    assert run.sweeps == _sweeps_to_tol(0.8, 0.2) + 1


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


def test_a_steady_drift_away_from_an_unstable_point_keeps_the_damping(monkeypatch):
    """x <- x + a g(x), g(x) = 0.15 x (1 - x^2): 0 is unstable (each undamped sweep grows
    the change by 1.15, aligned with the last), 1 is stable (T'(1) = 0.7). No damping
    stabilises a real mode above 1 (a damped sweep grows it by 1 + 0.15 a > 1): halving on
    each slightly longer sweep only slowed the escape, and at the smallest step EP crawled
    for 80 sweeps (a three-component mixture, benchmarks/gallery_vs_nuts.py)."""
    def sweep(graph, prior, state, methods, *, damping):
        new = state + damping * 0.15 * state * (1.0 - state**2)
        change = new - state
        return new, EPInfo(max_change=float(np.abs(change).max()), change=change, updated=1, damping=damping)

    monkeypatch.setattr(engine, "sweep", sweep)
    monkeypatch.setattr(engine, "combine", lambda graph, prior, states, w: sum(wi * x for wi, x in zip(w, states)))
    graph, x0 = SimpleNamespace(factors=[object()]), np.array([0.05])
    steps = []
    run = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=60,
                       callback=lambda info: steps.append(info.damping))
    assert run.converged and abs(run.state[0] - 1.0) < 5e-3
    # the escape (1.15 a sweep, from 0.05 to ~0.5) takes ~17 sweeps at step 1
    assert min(steps) == 1.0 and run.sweeps <= 40
    monkeypatch.setattr(schedule, "_ALIGNED_DRIFT", None)  # every longer sweep an overshoot
    crawl = schedule.run(graph, None, x0, [], damping=1.0, adaptive=True, tol=1e-3, max_sweeps=60)
    assert not crawl.converged and crawl.state[0] < 0.2


def test_a_random_walk_with_a_latent_step_reaches_the_same_fixed_point_in_fewer_sweeps(monkeypatch):
    """A local-level model (N = 40): the step's sites and the 40 levels' drift together
    by 0.9 a sweep, 58 sweeps to converge. The jump over that mode must land on the
    fixed point that sweeping alone reaches, in fewer sweeps."""
    import pmkjit
    import pymc as pm

    rng = np.random.default_rng(5)
    y = np.cumsum(0.3 * rng.normal(size=40)) + 0.5 * rng.normal(size=40)

    def fit():
        with pm.Model() as m:
            step, noise = pm.HalfNormal("step", 1.0), pm.HalfNormal("noise", 1.0)
            pm.GaussianRandomWalk("level", sigma=step, init_dist=pm.Normal.dist(0, 5), shape=40)
            pm.Normal("y", m["level"], noise, observed=y)
        with pytest.warns(UserWarning, match="random walk with a latent step size"):
            idata = pmkjit.fit(model=m, random_seed=1, progressbar=False, draws=10, max_sweeps=200,
                               compute_log_likelihood=False)
        assert idata.ep.attrs["converged"]
        return idata.ep.attrs, pmkjit.ep_posterior(idata)

    jumped, q = fit()
    monkeypatch.setattr(schedule, "_SLOW_MODULUS", (1.0, 1.0))
    swept, q_ref = fit()
    assert jumped["extrapolations"] >= 1 and swept["extrapolations"] == 0
    assert jumped["sweeps"] < 0.6 * swept["sweeps"]
    for name in ("step", "noise", "level"):
        sd = np.sqrt(q_ref[name].var())
        assert np.abs(q[name].mean() - q_ref[name].mean()).max() < 0.01 * sd.min(), name
        assert np.abs(np.log(np.sqrt(q[name].var()) / sd)).max() < 0.01, name


def _nuts_moments(model, names, seed=0):
    import pymc as pm

    with model:
        trace = pm.sample(1000, tune=1000, chains=2, cores=1, random_seed=seed, progressbar=False,
                          compute_convergence_checks=False)
    return {n: (trace.posterior[n].mean(("chain", "draw")).values, trace.posterior[n].std(("chain", "draw")).values)
            for n in names}


def _assert_near_nuts(idata, reference, z_max, ratio):
    for name, (m, s) in reference.items():
        me = idata.posterior[name].mean(("chain", "draw")).values
        se = idata.posterior[name].std(("chain", "draw")).values
        assert np.all(np.abs(me - m) / s < z_max), (name, me, m, s)
        assert np.all((se / s > ratio[0]) & (se / s < ratio[1])), (name, se / s)


@pytest.mark.slow
def test_studentt_with_a_latent_nu_converges_by_halving_on_its_oscillation(monkeypatch):
    """The gallery's Student-t regression with nu ~ Gamma(2, 0.1) (N = 60): at step 1 its
    sweeps alternated for 50 sweeps, shrinking 5% a sweep, and EP did not converge."""
    import pmkjit
    import pymc as pm

    rng = np.random.default_rng(5)  # the gallery's data (benchmarks/gallery_vs_nuts.py, seed 5)
    x = rng.normal(size=60)
    rng.choice(60, 8, replace=False)
    y = 1.0 + 0.5 * x + rng.standard_t(4.0, 60)

    def model():
        with pm.Model() as m:
            a, b = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5)
            s, nu = pm.HalfNormal("s", 2), pm.Gamma("nu", 2.0, 0.1)
            pm.StudentT("y", nu=nu, mu=a + b * x, sigma=s, observed=y)
        return m

    # instance by instance (by default this likelihood is one site, pmkjit.ep.collapsed,
    # which converges in a few sweeps without oscillating)
    with monkeypatch.context() as patch:
        patch.setattr(sys.modules["pmkjit.fit"], "collapsible", lambda factor: False)
        with pytest.warns(UserWarning, match="degrees of freedom depend on the latent nu"):
            idata = pmkjit.fit(model=model(), random_seed=5, progressbar=False, compute_log_likelihood=False)
    assert idata.ep.attrs["converged"] and idata.ep.attrs["oscillation_halvings"] >= 1
    nuts = _nuts_moments(model(), ["a", "b", "s", "nu"])
    # nu is left out: its posterior is its long-tailed prior's, which EP's Gamma narrows
    _assert_near_nuts(idata, {k: v for k, v in nuts.items() if k != "nu"}, z_max=0.2, ratio=(0.8, 1.2))
    # as one site, nu too: its draws come from the collapsed law
    idata = pmkjit.fit(model=model(), random_seed=5, progressbar=False, compute_log_likelihood=False)
    assert idata.ep.attrs["converged"] and "y: collapsed grid" in idata.ep.attrs["factor_methods"]
    _assert_near_nuts(idata, nuts, z_max=0.1, ratio=(0.9, 1.1))


@pytest.mark.slow
def test_a_large_mixture_whose_updates_are_rejected_at_step_one_fits_at_a_smaller_step():
    """N = 500 two-component mixture with a Beta weight: the undamped first sweep left every
    later update of the mixture's sites inadmissible at step 1 ("converged" in 3 sweeps, 48
    NUTS sds off). Rejected sweeps now halve the step until the updates are admitted."""
    import pmkjit
    import pymc as pm

    rng = np.random.default_rng(0)
    y = np.where(rng.random(500) < 0.3, rng.normal(-2, 1, 500), rng.normal(2, 1, 500))

    def model():
        with pm.Model() as m:
            p = pm.Beta("p", 2.0, 2.0)
            mu = pm.Normal("mu", [-1.0, 1.0], 5.0, shape=2, transform=pm.distributions.transforms.ordered,
                           initval=[-1.0, 1.0])
            s = pm.HalfNormal("s", 2.0)
            pm.Mixture("y", w=pm.math.stack([p, 1.0 - p]), comp_dists=pm.Normal.dist(mu, s), observed=y)
        return m

    idata = pmkjit.fit(model=model(), random_seed=0, progressbar=False, compute_log_likelihood=False)
    assert idata.ep.attrs["converged"] and idata.ep.attrs["rejected_updates"] > 0
    _assert_near_nuts(idata, _nuts_moments(model(), ["p", "mu", "s"]), z_max=0.3, ratio=(0.8, 1.25))
