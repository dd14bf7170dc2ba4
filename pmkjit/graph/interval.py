"""Rewrite a latent on an interval other than (0, 1) or (0, inf) as a standardised latent and its bounds.

EP in pmkjit keeps real latents in one joint Gaussian and positive or unit-interval
latents as Gamma or Beta messages, so a latent on any other interval has no message. But
with constant bounds such a latent is an affine map of a positive or unit-interval one:
``x ~ Uniform(a, b)`` is exactly ``x = a + (b - a) u`` with ``u ~ Uniform(0, 1)`` (a Beta(1, 1)
latent whose prior EP takes in its own family), and any other law on ``(a, inf)``,
``(-inf, b)`` or ``(a, b)`` (``pm.Pareto``, a ``pm.TruncatedNormal``, ``pm.Triangular``,
``pm.Interpolated``) is
``a + v``, ``b - v`` or ``a + (b - a) v`` with ``v`` the same law shifted and scaled (a
``pm.CustomDist`` of the original random variable, whose density PyMC derives and whose
sampler is the original's; a black-box prior). The model is rewritten before EP: each such
``x`` becomes a hidden ``v`` and a ``pm.Deterministic`` of the original name, which the
posterior reports like any draw of ``x``. This is how PyMC users write an AR coefficient
(``rho ~ pm.Uniform(-1, 1)``), the old habit ``sigma ~ pm.Uniform(0, 10)`` and the rats
model's ``kappa ~ pm.Pareto(1.5, 1)``, all refused as "an interval other than (0, 1) or
(0, inf)" before (robustness round 16).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.model.fgraph import ModelFreeRV, model_deterministic, model_free_rv, model_from_fgraph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.random.basic import UniformRV
from pymc.distributions.truncated import TruncatedRV
from pytensor.tensor.random.op import RandomVariable

from pmkjit.graph.pytensor_tools import drop_outputs, evaluate_constant, model_fgraph

__all__ = ["rescale_uniform_intervals", "signed_latents", "UNIT_PREFIX"]

UNIT_PREFIX = "__pmkjit_unit_"  # the hidden Uniform(0, 1) latents (pmkjit.fit leaves them out of the posterior)


def _standardised(rv, lo, hi, shape):
    """``rv``'s distribution mapped onto (0, inf) or (0, 1): ``x - lo``, ``hi - x`` or ``(x - lo) / (hi - lo)``.

    A ``pm.CustomDist`` of the same random variable op and parameters, whose density PyMC
    derives through the affine map and whose forward sampler is the original one's. A law
    with core parameters (``pm.Interpolated``'s table) keeps them as constants of the
    closure; ``ValueError`` where they are not constant or differ between entries.
    """
    op = rv.owner.op
    params = op.dist_params(rv.owner)
    lo_t = None if lo is None else pt.as_tensor(lo)
    hi_t = None if hi is None else pt.as_tensor(hi)
    ndims = list(getattr(op, "ndims_params", None) or [0] * len(params))
    if any(n > 0 for n in ndims):
        # parameters with a core dimension (pm.Interpolated's table of x and pdf points) are
        # constants of the law, not per-entry parameters: they stay in the closure (PyMC's
        # Interpolated density reads them as constants), one table for every entry, and a
        # zero parameter gives the batch its shape
        constants = []
        for p, n in zip(params, ndims):
            value = np.asarray(evaluate_constant(p))  # raises for a parameter that is not constant
            rows = value.reshape((-1,) + value.shape[value.ndim - n:])
            if not np.all(rows == rows[0]):
                raise ValueError("a law whose entries have different tables")
            constants.append(pt.constant(rows[0]))
        params = [pt.as_tensor(np.zeros(shape))]

        def dist(zero, size):
            # the batch is the zero parameter's shape: PyMC passes no size when the
            # parameters imply it (the factor graph's rebuilt, batched distribution)
            return _mapped(op(*constants, size=pt.shape(zero)))
    else:
        def dist(*args):
            *p, size = args
            return _mapped(op(*p, size=size))

    def _mapped(x):
        if hi_t is None:
            return x - lo_t
        if lo_t is None:
            return hi_t - x
        return (x - lo_t) / (hi_t - lo_t)

    return pm.CustomDist.dist(*params, dist=dist, shape=shape, class_name=f"Standardised{type(op).__name__}")


def rescale_uniform_intervals(model: pm.Model) -> tuple[pm.Model, list[str]]:
    """``model`` with every latent on a constant interval other than (0, 1) or (0, inf) standardised.

    Parameters
    ----------
    model : pymc.Model

    Returns
    -------
    (model, names)
        The rewritten model (``model`` itself when nothing was rewritten) and the names of
        the latents that are now deterministics (``lower + (upper - lower) * v``,
        ``lower + v`` or ``upper - v``) of ``UNIT_PREFIX`` latents ``v``. A latent whose
        bounds depend on a latent, one without an interval transform (``transform=None``)
        and one whose standardised law PyMC cannot sample are left as they are (the
        factor graph then refuses them, naming them).
    """
    candidates = [rv for rv in model.free_RVs
                  if type(model.rvs_to_transforms.get(rv)).__name__ == "Interval" and isinstance(rv.owner.op, RandomVariable)]
    if not candidates:
        return model, []
    fg, _ = model_fgraph(model)
    free = {o for o in fg.outputs if o.owner is not None and isinstance(o.owner.op, ModelFreeRV)}
    rewritten: list[str] = []
    for node in list(fg.toposort()):
        if not isinstance(node.op, ModelFreeRV):
            continue
        wv = node.outputs[0]
        rv, _value, *dims = node.inputs
        transform = node.op.transform
        if rv.owner is None or not isinstance(rv.owner.op, RandomVariable) or type(transform).__name__ != "Interval":
            continue
        bounds = transform.args_fn(*rv.owner.inputs)
        if any(b is not None and any(a in free for a in ancestors([b])) for b in bounds):
            continue  # a latent bound: the support moves with it (left to the factor graph)
        lo, hi = (None if b is None else np.asarray(evaluate_constant(pt.as_tensor(b)), dtype=float) for b in bounds)
        if isinstance(rv.owner.op, TruncatedRV):
            # within its base's support: pm.Truncated(pm.Gamma.dist(2, 1), upper=6) has the
            # transform (-inf, 6) but lives on (0, 6); as 6 - v with a positive v, EP's Gamma
            # message of v would reach past 6 and x below 0
            from pmkjit.graph.distributions import truncated_support

            lo, hi = truncated_support(rv.owner.op, rv, lo, hi)
        lo = None if lo is None or np.all(np.isneginf(lo)) else lo
        hi = None if hi is None or np.all(np.isposinf(hi)) else hi
        if lo is None and hi is None or any(b is not None and not np.all(np.isfinite(b)) for b in (lo, hi)):
            continue
        if lo is not None and np.all(lo == 0) and (hi is None or np.all(hi == 1)):
            continue  # already a positive or unit-interval latent
        if hi is not None and lo is not None and not np.all(hi > lo):
            continue
        name = f"{UNIT_PREFIX}{wv.name}"
        shape = tuple(int(s) for s in rv.shape.eval())
        if isinstance(rv.owner.op, UniformRV) and lo is not None and hi is not None:
            # exactly Uniform(0, 1): a Beta(1, 1) prior, in its own family
            u = pt.random.uniform(0.0, 1.0, size=shape, rng=pytensor.shared(np.random.default_rng(0)))
        else:
            try:
                u = _standardised(rv, lo, hi, shape)
                pm.draw(u, random_seed=0)  # EP draws from it: a sampler PyMC cannot rebuild is refused later
            except Exception:  # noqa: BLE001
                continue  # left as it is: the factor graph refuses it, naming it and its interval
        u.name = name
        value = u.type(name=name)
        unit_transform = pm.distributions.transforms.log if hi is None or lo is None \
            else pm.distributions.transforms.logodds
        unit = model_free_rv(u, value, unit_transform, *dims)
        unit.name = name
        fg.add_output(unit, import_missing=True)
        # broadcasting bounds are constants; x keeps its shape and dims
        if hi is None:
            back = pt.as_tensor(lo) + unit
        elif lo is None:
            back = pt.as_tensor(hi) - unit
        else:
            back = pt.as_tensor(lo) + pt.as_tensor(hi - lo) * unit
        x = model_deterministic(back, *dims)
        x.name = wv.name
        fg.replace_all([(wv, x)], import_missing=True)
        drop_outputs(fg, [wv])
        rewritten.append(wv.name)
    if not rewritten:
        return model, []
    return model_from_fgraph(fg, mutate_fgraph=True), rewritten



def signed_latents(model: pm.Model, names: list[str]) -> set[str]:
    """Those of ``names`` (latents with an interval transform) whose interval reaches below 0.

    A latent on ``(-1, 1)`` or ``(-10, 10)`` is a coefficient or a correlation, read in a
    linear predictor; one on ``(0, 10)`` or ``(1, inf)`` is a scale, a rate or a
    probability. Only the former loses much when its rescaled latent leaves the joint
    Gaussian of the real latents (``pmkjit.fit`` warns about it).
    """
    signed = set()
    for rv in model.free_RVs:
        transform = model.rvs_to_transforms.get(rv)
        if rv.name not in names or type(transform).__name__ != "Interval":
            continue
        lower = transform.args_fn(*rv.owner.inputs)[0]
        try:
            if lower is None or np.any(np.asarray(evaluate_constant(pt.as_tensor(lower)), dtype=float) < 0):
                signed.add(rv.name)
        except Exception:  # noqa: BLE001 - a bound that cannot be evaluated: signed, to be safe
            signed.add(rv.name)
    return signed
