"""Make model variables that read an observed variable read its observed data instead.

In PyMC an observed variable used in another variable's parameters stands for its data:
``x = pm.Normal("x", mx, 1, observed=xd)``, ``pm.Normal("y", a + b * x, s, observed=yd)``
is a regression on ``xd`` (with a model for ``xd``), and ``model.logp`` and ``pm.sample``
replace ``x`` by ``xd``. The model walk follows each parameter's graph, where ``x`` is
still the random variable: ``b * x`` was refused as depending "on latent mx through
NormalRV (x)", and with constant parameters (``pm.Normal("x", 0, 1, observed=xd)``)
``x`` was evaluated as one random draw, a silently wrong covariate (a = 2.57, b = 0.14
where the exact posterior means are 0.62 and 1.95).
"""

from __future__ import annotations

import warnings

from collections.abc import Iterator
from contextlib import contextmanager

import pymc as pm
from pymc.model.fgraph import ModelObservedRV, model_from_fgraph
from pytensor.graph.fg import Output
from pytensor.graph.traversal import ancestors

from pmkjit.graph.pytensor_tools import model_fgraph

__all__ = ["default_initial_values", "observed_as_data"]


@contextmanager
def default_initial_values(model: pm.Model) -> Iterator[None]:
    """Hide the model's ``initval=`` settings for the duration of the block.

    EP starts from its priors and never reads a latent's initial value, but PyMC's
    ``fgraph_from_model`` (behind ``pm.compute_log_likelihood`` and the model rewrites)
    raises ``NotImplementedError: Cannot convert models with non-default initial_values``:
    a model with ``pm.Normal("b", 0, 1, initval=0.1)`` crashed after EP had converged, and
    its non-centred effects were silently left non-centred. The values are restored on exit.

    PyMC's warning that a model holding ``pm.gp`` variables was copied ("Detected variables
    likely created by GP objects") is silenced in the block too, as in
    :func:`~pmkjit.graph.pytensor_tools.model_fgraph`: the copies are pmkjit's own (a
    ``pm.gp.Latent`` classifier got it from the check of impossible observations,
    robustness round 46).
    """
    saved = dict(model.rvs_to_initial_values)
    try:
        for rv in model.rvs_to_initial_values:
            model.rvs_to_initial_values[rv] = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected variables likely created by GP objects")
            yield
    finally:
        model.rvs_to_initial_values.clear()
        model.rvs_to_initial_values.update(saved)


def _reads_an_observed(model: pm.Model) -> bool:
    """Whether some variable of ``model`` other than an observed one itself reads one."""
    observed = set(model.observed_RVs)
    if not observed:
        return False
    inputs = [i for rv in model.basic_RVs for i in rv.owner.inputs] + list(model.deterministics)
    return any(v in observed for v in ancestors(inputs))


def observed_as_data(model: pm.Model) -> pm.Model:
    """``model`` with every use of an observed variable by another variable replaced by its data.

    Parameters
    ----------
    model : pymc.Model

    Returns
    -------
    pymc.Model
        ``model`` itself where no variable reads an observed one (the common case), else
        a rewritten copy with the same variables, coords and dims; the observed variables
        keep their own distributions and data.
    """
    if not _reads_an_observed(model):
        return model
    with default_initial_values(model):  # fgraph_from_model refuses initval= settings
        fg, _ = model_fgraph(model)
    for node in list(fg.toposort()):
        if not isinstance(node.op, ModelObservedRV):
            continue
        var, data = node.outputs[0], node.inputs[1]
        data = var.type.filter_variable(data, allow_convert=True)
        for client, i in list(fg.clients[var]):
            if not isinstance(client.op, Output):
                fg.change_node_input(client, i, data, reason="observed_as_data")
    return model_from_fgraph(fg, mutate_fgraph=True)
