"""Expectation propagation on pmkjit factor graphs: pure, batched sweeps."""

from pmkjit.ep.engine import EPInfo, EPState, init, posterior_moments, sweep
from pmkjit.ep.schedule import EPRun, run
from pmkjit.ep.store import OperatorStore

__all__ = ["EPState", "EPInfo", "EPRun", "init", "sweep", "run", "posterior_moments", "OperatorStore"]
