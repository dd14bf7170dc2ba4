"""Rewrite a ``pm.Potential`` of scalar latents as an observed ``pm.CustomDist`` with that log-density.

A potential adds ``f(latents)`` to the model's log-density: a soft constraint
(``pm.Potential("shrink", -0.5 * (b / 0.3) ** 2)``) or a likelihood written by hand
(``pm.Potential("lik", pm.logp(pm.Normal.dist(mu, s), y).sum())``). To EP it is one factor
over the latents it reads, exactly what an observed ``pm.CustomDist`` whose ``logp=`` is
``f`` is (the advice pmkjit's refusal gave; the observed value is a dummy the density
ignores). Potentials were refused before (robustness round 16). Only potentials whose
latents are all scalars are rewritten: a vector latent is one input per element, and
``f`` of the whole vector (``x[1:] - 0.8 * x[:-1]``, a sum over elements) is no function of
one element at a time, which is how a factor's density is evaluated. Those stay refused,
by name.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.model.fgraph import (
    ModelFreeRV,
    ModelPotential,
    fgraph_from_model,
    model_from_fgraph,
    model_observed_rv,
)
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors

from pmkjit.graph.pytensor_tools import drop_outputs

__all__ = ["potentials_as_observations"]


def potentials_as_observations(model: pm.Model) -> tuple[pm.Model, list[str]]:
    """``model`` with each potential of scalar latents an observed ``pm.CustomDist``.

    Parameters
    ----------
    model : pymc.Model

    Returns
    -------
    (model, names)
        The rewritten model (``model`` itself when nothing was rewritten) and the names of
        the potentials that are now observed variables (``pmkjit.fit`` leaves them out of
        the ``log_likelihood`` and ``observed_data`` groups, as ``pm.sample`` does).
    """
    if not model.potentials:
        return model, []
    fg, _ = fgraph_from_model(model)
    free = [o for o in fg.outputs if o.owner is not None and isinstance(o.owner.op, ModelFreeRV)]
    rewritten: list[str] = []
    for node in list(fg.toposort()):
        if not isinstance(node.op, ModelPotential):
            continue
        out = node.outputs[0]
        expr = node.inputs[0]
        reads = set(ancestors([expr]))
        latents = [v for v in free if v in reads]
        if not latents or any(v.ndim != 0 for v in latents):
            continue  # a vector latent, or a potential of data only: left to the refusal
        if expr.ndim:
            expr = expr.sum()  # the model's log-density sums a potential's entries
        name = out.name
        # f over placeholders, cut from the model's graph (which model_from_fgraph rewrites)
        dummies = [v.type() for v in latents]
        body = _unwrapped(graph_replace(expr, dict(zip(latents, dummies)), strict=False))

        def logp(value, *params, _body=body, _dummies=tuple(dummies)):
            # the potential at the factor's latents, whatever the (dummy) observed value; the
            # factor's density is evaluated on batches of instances (params with a leading
            # axis), along which f, sums over data included, is vectorised
            params = [pt.as_tensor(p) for p in params]
            return vectorize_graph(_body, replace=dict(zip(_dummies, params))) + 0.0 * value

        rv = pm.CustomDist.dist(*latents, logp=logp, class_name=f"Potential_{name}")
        observed = model_observed_rv(rv, pt.as_tensor(np.zeros(())))
        observed.name = name
        fg.add_output(observed, import_missing=True)
        drop_outputs(fg, [out])
        rewritten.append(name)
    if not rewritten:
        return model, []
    return model_from_fgraph(fg, mutate_fgraph=True), rewritten


def _unwrapped(var):
    """``var`` with the model's bookkeeping ops (a ``pm.Deterministic`` it reads) replaced by their values."""
    from pymc.model.fgraph import ModelVar

    wrapped = [v for v in ancestors([var]) if v.owner is not None and isinstance(v.owner.op, ModelVar)]
    if not wrapped:
        return var
    return _unwrapped(graph_replace(var, {v: v.owner.inputs[0] for v in wrapped}, strict=False))
