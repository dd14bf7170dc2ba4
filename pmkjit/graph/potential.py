"""Rewrite a ``pm.Potential`` of scalar latents as an observed ``pm.CustomDist`` with that log-density.

A potential adds ``f(latents)`` to the model's log-density: a soft constraint
(``pm.Potential("shrink", -0.5 * (b / 0.3) ** 2)``) or a likelihood written by hand
(``pm.Potential("lik", pm.logp(pm.Normal.dist(mu, s), y).sum())``). To EP it is one factor
over the latents it reads, exactly what an observed ``pm.CustomDist`` whose ``logp=`` is
``f`` is (the advice pmkjit's refusal gave; the observed value is a dummy the density
ignores). Potentials were refused before (robustness round 16). A potential of vector
latents is one function of all their elements, which a factor evaluated one instance at a
time cannot take; but the ones users write are sums of elementwise terms (an AR(1) by hand,
``pm.logp(pm.Normal.dist(0.8 * x[:-1], s), x[1:]).sum()``, a penalty, a soft sum-to-zero
constraint on ``a.sum()``), and each term becomes an observed ``pm.CustomDist`` whose density
is the term itself, entry by entry, with the term as its parameter for the model walk to
decompose (robustness round 18; before, refused). A potential of vector latents that is no
such sum (``logsumexp`` of a vector) is refused by the walk, naming it.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.model.fgraph import (
    ModelFreeRV,
    ModelPotential,
    model_from_fgraph,
    model_observed_rv,
)
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors, toposort

from pmkjit.graph.pytensor_tools import drop_outputs, model_fgraph, parameter_checks_to_ninf

#: the class name of the CustomDist a rewritten potential becomes starts with this
POTENTIAL_PREFIX = "Potential_"

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
    fg, _ = model_fgraph(model)
    free = [o for o in fg.outputs if o.owner is not None and isinstance(o.owner.op, ModelFreeRV)]
    rewritten: list[str] = []
    for node in list(fg.toposort()):
        if not isinstance(node.op, ModelPotential):
            continue
        out = node.outputs[0]
        expr = node.inputs[0]
        reads = set(ancestors([expr]))
        latents = [v for v in free if v in reads]
        if not latents:
            continue  # a potential of data only: left to the refusal
        vector = any(v.ndim != 0 for v in latents)
        try:
            terms = _terms(_unwrapped(expr, deterministics_only=True), set(free))
        except Exception:  # noqa: BLE001 - a graph it cannot split: of scalars, still one factor of its density
            if vector:
                raise
            terms = None
        if vector and terms is None:
            continue  # no sum of elementwise terms: left to the refusal
        # A potential of scalar latents that is a sum over data of terms of them (a censored
        # tail by hand, -(exp(b0 + b1 * x) * c).sum(); a likelihood by hand) is also one factor
        # per entry, which reads the scalars through each entry's linear predictor like any
        # likelihood. As one factor of b0 and b1 its sites on the two were separate, so their
        # correlation was lost: sds 1.07 of the exact ones (robustness round 30), where
        # pm.Censored's entries are within 1%.
        if terms is None:
            shapes = None
        elif vector:
            shapes = [_shape(t, latents) for t in terms]
        else:
            shapes = [_entrywise(t, latents) for t in terms]  # None for a term that is not
        if shapes is not None and all(s is not None for s in shapes):
            names = [out.name] if len(terms) == 1 else [f"{out.name}[{k}]" for k in range(len(terms))]
            for term, term_name, shape in zip(terms, names, shapes):
                rv = pm.CustomDist.dist(term, logp=_itself, class_name=f"{POTENTIAL_PREFIX}{out.name}")
                observed = model_observed_rv(rv, pt.as_tensor(np.zeros(shape)))
                observed.name = term_name
                fg.add_output(observed, import_missing=True)
            drop_outputs(fg, [out])
            rewritten.extend(names)
            continue
        name = out.name
        if expr.ndim:
            expr = expr.sum()  # the model's log-density sums a potential's entries
        # f over placeholders, cut from the model's graph (which model_from_fgraph rewrites)
        dummies = [v.type() for v in latents]
        body = _unwrapped(graph_replace(expr, dict(zip(latents, dummies)), strict=False))

        def logp(value, *params, _body=body, _dummies=tuple(dummies)):
            # the potential at the factor's latents, whatever the (dummy) observed value; the
            # factor's density is evaluated on batches of instances (params with a leading
            # axis), along which f, sums over data included, is vectorised
            params = [pt.as_tensor(p) for p in params]
            return vectorize_graph(_body, replace=dict(zip(_dummies, params))) + 0.0 * value

        rv = pm.CustomDist.dist(*latents, logp=logp, class_name=f"{POTENTIAL_PREFIX}{name}")
        observed = model_observed_rv(rv, pt.as_tensor(np.zeros(())))
        observed.name = name
        fg.add_output(observed, import_missing=True)
        drop_outputs(fg, [out])
        rewritten.append(name)
    if not rewritten:
        return model, []
    return model_from_fgraph(fg, mutate_fgraph=True), rewritten


def _entrywise(term, latents) -> tuple[int, ...] | None:
    """The shape of ``term`` if it is a vector of entries that each read the scalar ``latents``
    only through elementwise operations (and selections and broadcasts of them), so that each
    entry is a factor of its own that the model walk decomposes; else None."""
    from pytensor.tensor.elemwise import DimShuffle, Elemwise
    from pytensor.tensor.subtensor import AdvancedSubtensor, AdvancedSubtensor1, Subtensor

    if term.ndim == 0:
        return None
    try:
        shape = _shape(term, latents)
    except Exception:  # noqa: BLE001 - a shape it cannot tell: one factor of the whole density
        return None
    if int(np.prod(shape)) < 2:
        return None
    allowed = (Elemwise, DimShuffle, Subtensor, AdvancedSubtensor, AdvancedSubtensor1)
    reads = set(latents)  # the variables that depend on a latent, filled in graph order
    for node in toposort([term]):
        if not any(i in reads for i in node.inputs):
            continue  # data: any operation
        if not isinstance(node.op, allowed):
            return None
        reads.update(node.outputs)
    return shape


def _shape(term, latents) -> tuple[int, ...]:
    """The shape of a potential's term: its static shape, or, where it reads ``pm.Data`` (whose
    length is not static), evaluated with the latents replaced by zeros of their shapes."""
    if all(n is not None for n in term.type.shape):
        return tuple(int(n) for n in term.type.shape)
    stand_ins = {v: pt.zeros(tuple(int(n) for n in v.type.shape), dtype=v.dtype) for v in latents}
    return tuple(int(n) for n in graph_replace(term.shape, stand_ins, strict=False).eval())


def _itself(value, term):
    """The log-density of a potential's term, which is its parameter (the observed value is a dummy)."""
    return term + 0.0 * value


def _terms(expr, free: set) -> list | None:
    """A potential of vector latents as a list of terms whose entries add up to it, or None.

    A potential over a vector is one function of all its elements, which EP's factors,
    evaluated one instance at a time, cannot take: refused before robustness round 18. But
    the potentials users write are mostly sums of elementwise terms: a likelihood by hand,
    ``pm.logp(pm.Normal.dist(a[g] + b * x, s), y).sum()``, a penalty ``-0.5 * (beta**2).sum()``,
    a soft sum-to-zero constraint ``pm.logp(pm.Normal.dist(0, 0.01), a.sum())`` (a function of
    one linear projection). Each term becomes the parameter of an observed ``pm.CustomDist``
    whose density is that parameter, entry by entry, and the model walk decomposes it like any
    likelihood's parameter (linear slots, elements of positive latents, data): where it cannot
    (``logsumexp`` of a vector), the refusal names the potential. Terms are read through ``+``,
    ``-``, a full ``sum`` and products and quotients of a sum by constants; a term without a
    sum is one entry per entry of its value (PyMC sums a potential's entries). PyMC's
    parameter checks in a ``pm.logp`` become ``-inf`` entry by entry.
    """
    from pytensor.tensor.elemwise import CAReduce, Elemwise
    import pytensor.scalar as ps

    def latent(v) -> bool:
        return any(a in free for a in ancestors([v]))

    def split(v, sign: float) -> list:
        node = v.owner
        if node is not None and isinstance(node.op, CAReduce) and isinstance(node.op.scalar_op, ps.Add) \
                and (node.op.axis is None or set(node.op.axis) == set(range(node.inputs[0].ndim))):
            return [(node.inputs[0], sign)]
        if node is not None and isinstance(node.op, Elemwise) and v.ndim == 0:
            op = node.op.scalar_op
            if isinstance(op, ps.Add):
                return [t for i in node.inputs for t in split(i, sign)]
            if isinstance(op, ps.Sub):
                return split(node.inputs[0], sign) + split(node.inputs[1], -sign)
            if isinstance(op, ps.Neg):
                return split(node.inputs[0], -sign)
            if isinstance(op, (ps.Mul, ps.TrueDiv)):
                inner = [i for i in node.inputs if latent(i)]
                if len(inner) == 1 and (isinstance(op, ps.Mul) or inner[0] is node.inputs[0]):
                    parts = split(inner[0], 1.0)
                    if len(parts) == 1 and parts[0][0] is not inner[0]:
                        # c * sum(e) = sum(c * e) for a constant c
                        others = [i for i in node.inputs if i is not inner[0]]
                        term, s0 = parts[0]
                        scaled = term
                        for o in others:
                            scaled = scaled * o if isinstance(op, ps.Mul) else scaled / o
                        return [(scaled, sign * s0)]
        return [(v, sign)]

    terms = []
    for term, sign in split(expr, 1.0):
        if not latent(term):
            continue  # a constant: no factor
        term = parameter_checks_to_ninf(term)
        terms.append(term if sign > 0 else -term)
    return terms or None


def _unwrapped(var, deterministics_only: bool = False):
    """``var`` with the model's bookkeeping ops replaced by their values.

    All of them (a ``pm.Deterministic`` it reads, the latents' own wrappers), or with
    ``deterministics_only`` only the ``pm.Deterministic``s, so that the latents stay
    recognisable as the model's free variables.
    """
    from pymc.model.fgraph import ModelDeterministic, ModelVar

    kind = ModelDeterministic if deterministics_only else ModelVar
    wrapped = [v for v in ancestors([var]) if v.owner is not None and isinstance(v.owner.op, kind)]
    if not wrapped:
        return var
    return _unwrapped(graph_replace(var, {v: v.owner.inputs[0] for v in wrapped}, strict=False), deterministics_only)
