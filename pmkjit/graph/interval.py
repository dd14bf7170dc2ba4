"""Rewrite a ``pm.Uniform(lower, upper)`` latent on another interval as a rescaled ``Uniform(0, 1)``.

EP in pmkjit keeps real latents in one joint Gaussian and positive or unit-interval
latents as Gamma or Beta messages, so a latent on any other interval has no message. But
``x ~ Uniform(a, b)`` with constant bounds is exactly ``x = a + (b - a) u`` with
``u ~ Uniform(0, 1)``, a Beta(1, 1) latent whose prior EP takes in its own family. The
model is rewritten before EP: each such ``x`` becomes a hidden ``u`` and a
``pm.Deterministic`` of the original name, which the posterior reports like any draw of
``x``. This is how PyMC users write an AR coefficient (``rho ~ pm.Uniform(-1, 1)``) and the
old habit ``sigma ~ pm.Uniform(0, 10)``, both refused as "an interval other than (0, 1) or
(0, inf)" before (robustness round 16).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import ModelFreeRV, fgraph_from_model, model_deterministic, model_free_rv, model_from_fgraph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.random.basic import UniformRV

__all__ = ["rescale_uniform_intervals", "UNIT_PREFIX"]

UNIT_PREFIX = "__pmkjit_unit_"  # the hidden Uniform(0, 1) latents (pmkjit.fit leaves them out of the posterior)


def rescale_uniform_intervals(model: pm.Model) -> tuple[pm.Model, list[str]]:
    """``model`` with every ``Uniform(lower, upper)`` latent on an interval other than (0, 1) rescaled.

    Parameters
    ----------
    model : pymc.Model

    Returns
    -------
    (model, names)
        The rewritten model (``model`` itself when nothing was rewritten) and the names of
        the Uniform latents that are now deterministics ``lower + (upper - lower) * u`` of
        ``UNIT_PREFIX`` latents ``u ~ Uniform(0, 1)``. A Uniform whose bounds depend on a
        latent, are infinite, or that has no interval transform (``transform=None``: the
        user asked for no rescaling of its value) is left as it is.
    """
    candidates = [rv for rv in model.free_RVs if isinstance(rv.owner.op, UniformRV)
                  and type(model.rvs_to_transforms.get(rv)).__name__ == "Interval"]
    if not candidates:
        return model, []
    fg, _ = fgraph_from_model(model)
    free = {o for o in fg.outputs if o.owner is not None and isinstance(o.owner.op, ModelFreeRV)}
    rewritten: list[str] = []
    for node in list(fg.toposort()):
        if not isinstance(node.op, ModelFreeRV):
            continue
        wv = node.outputs[0]
        rv, _value, *dims = node.inputs
        if rv.owner is None or not isinstance(rv.owner.op, UniformRV) or node.op.transform is None:
            continue
        _rng, size, lower, upper = rv.owner.inputs
        if any(a in free for a in ancestors([lower, upper])):
            continue  # a latent bound: the support moves with it (left to the factor graph)
        lo, hi = (np.asarray(b.eval(), dtype=float) for b in (lower, upper))
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(hi > lo)):
            continue
        if np.all(lo == 0) and np.all(hi == 1):
            continue  # already a unit-interval latent
        name = f"{UNIT_PREFIX}{wv.name}"
        shape = tuple(int(s) for s in rv.shape.eval())
        u = pt.random.uniform(0.0, 1.0, size=shape, rng=pytensor.shared(np.random.default_rng(0)))
        u.name = name
        value = u.type(name=name)
        unit = model_free_rv(u, value, pm.distributions.transforms.logodds, *dims)
        unit.name = name
        fg.add_output(unit, import_missing=True)
        # lower + width * u keeps x's shape and dims; broadcasting bounds are constants
        x = model_deterministic(pt.as_tensor(lo) + pt.as_tensor(hi - lo) * unit, *dims)
        x.name = wv.name
        fg.replace_all([(wv, x)], import_missing=True)
        for i in reversed(range(len(fg.outputs))):
            if fg.outputs[i] is wv:
                fg.remove_output(i)
        rewritten.append(wv.name)
    if not rewritten:
        return model, []
    return model_from_fgraph(fg, mutate_fgraph=True), rewritten

