"""Rewrite a Dirichlet latent as its stick-breaking construction of independent Betas.

EP in pmkjit keeps real latents in one joint Gaussian and positive or unit-interval
latents as independent Gamma or Beta messages; a simplex has no such message. But a
Dirichlet is exactly a product of independent Betas after stick breaking: with
``alpha = (a_0, ..., a_{K-1})``,

    v_k ~ Beta(a_k, a_{k+1} + ... + a_{K-1}),  k = 0, ..., K - 2,
    w_k = v_k prod_{j<k} (1 - v_j),  w_{K-1} = prod_{j<K-1} (1 - v_j),

gives ``w ~ Dirichlet(alpha)`` (Connor and Mosimann, 1969). So the model is rewritten
before EP: each one-dimensional Dirichlet with constant concentrations becomes ``K - 1``
hidden scalar Beta latents and a ``pm.Deterministic`` of the original name, which the
posterior reports like any Dirichlet draw. Its readers (a mixture's weights) then see the
Betas elementwise.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import ModelFreeRV, model_deterministic, model_free_rv, model_from_fgraph
from pymc.util import get_transformed_name
from pytensor.graph.traversal import ancestors
from pytensor.tensor.random.basic import DirichletRV
from pytensor.tensor.type_other import NoneTypeT

from pmkjit.graph.pytensor_tools import drop_outputs, model_fgraph

__all__ = ["stick_break_dirichlet", "STICK_PREFIX"]

STICK_PREFIX = "__pmkjit_stick_"  # the hidden Beta latents (pmkjit.fit leaves them out of the posterior)


def stick_break_dirichlet(model: pm.Model) -> tuple[pm.Model, list[str]]:
    """``model`` with every one-dimensional, constant-concentration Dirichlet stick-broken.

    Parameters
    ----------
    model : pymc.Model

    Returns
    -------
    (model, names)
        The rewritten model (``model`` itself when nothing was rewritten) and the names of
        the Dirichlet latents that are now deterministics of ``STICK_PREFIX`` Beta latents.
        A batched Dirichlet, or one whose concentrations depend on a latent, is left as it
        is (and refused by the factor graph, naming it).
    """
    if not any(isinstance(rv.owner.op, DirichletRV) for rv in model.free_RVs):
        return model, []
    fg, _ = model_fgraph(model)
    free = {o for o in fg.outputs if o.owner is not None and isinstance(o.owner.op, ModelFreeRV)}
    rewritten: list[str] = []
    for node in list(fg.toposort()):
        if not isinstance(node.op, ModelFreeRV):
            continue
        wv = node.outputs[0]
        rv, _value, *dims = node.inputs
        if rv.owner is None or not isinstance(rv.owner.op, DirichletRV):
            continue
        _rng, size, alpha = rv.owner.inputs
        if rv.ndim != 1 or not isinstance(size.type, NoneTypeT) and np.prod(size.eval()) != 1:
            continue
        if any(a in free for a in ancestors([alpha])):
            continue
        a = np.asarray(alpha.eval(), dtype=float).reshape(-1)
        sticks = []
        for k in range(a.size - 1):
            name = f"{STICK_PREFIX}{wv.name}_{k}"
            beta = pt.random.beta(a[k], a[k + 1:].sum(), rng=pytensor.shared(np.random.default_rng(k)))
            beta.name = name
            # the value lives in the transformed space and is named as PyMC names it
            # (model.initial_point() keys it so; a plain name left it out of checks that match them)
            transform = pm.distributions.transforms.logodds
            value = beta.type(name=get_transformed_name(name, transform))
            stick = model_free_rv(beta, value, transform)
            stick.name = name
            fg.add_output(stick, import_missing=True)
            sticks.append(stick)
        pieces, rest = [], pt.constant(1.0)
        for stick in sticks:
            pieces.append(stick * rest)
            rest = rest * (1.0 - stick)
        pieces.append(rest)
        # a stack of scalar expressions: the readers' walk indexes it back to each piece
        weights = model_deterministic(pt.stack(pieces), *dims)
        weights.name = wv.name
        fg.replace_all([(wv, weights)], import_missing=True)
        drop_outputs(fg, [wv])
        rewritten.append(wv.name)
    if not rewritten:
        return model, []
    return model_from_fgraph(fg, mutate_fgraph=True), rewritten
