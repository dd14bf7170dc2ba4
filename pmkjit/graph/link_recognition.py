"""Recognise known link functions in a deterministic's graph.

A logistic, exponential, probit or complementary log-log link of one linear predictor is
integrated by quadrature through its stable numpy form (:mod:`pmkjit.links`) rather than
sampled; multivariate likelihoods that have an elementwise form get a hint saying how to
write it.
"""

from __future__ import annotations


import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError

from pmkjit.links import cloglog_inverse, half_erfc



# how to write the commonest multivariate likelihoods elementwise (robustness round 17: an
# observed pm.AR or pm.GaussianRandomWalk was refused with "write it elementwise" alone,
# though each is a Normal of every value given the ones before it, which EP fits exactly
# with a constant scale and semi-analytically with a latent one)
ELEMENTWISE_HINTS = {
    "AutoRegressiveRV": (
        ": an AR(p) series is a Normal of each value given the p before it, e.g. for AR(1) "
        "pm.Normal(\"{name}\", rho * y[:-1], sigma, observed=y[1:]) (add the constant c + ... if "
        "constant=True, and the first values' init_dist as its own observation if it matters)"
    ),
    "RandomWalkRV": (
        ": a random walk observed is its increments, for a GaussianRandomWalk "
        "pm.Normal(\"{name}_diff\", mu, sigma, observed=np.diff(y)) (pm.RandomWalk: its innovation "
        "distribution; and the first value's init_dist as "
        "pm.Normal(\"{name}_0\", ..., observed=y[0])); a latent pm.GaussianRandomWalk read by a likelihood "
        "is supported"
    ),
    # robustness round 20: pm.DirichletMultinomial was refused with "write it elementwise"
    # alone, where it has no elementwise form as such; it is exactly a chain of BetaBinomials
    # (the Dirichlet's aggregation property), which pmkjit fits. Written over stick-breaking
    # fractions (a mean and a dispersion per link) it was within 0.07 NUTS sd, log-sd ratios
    # 0.97-1.00; with K separate concentration latents, alpha=a[k], beta=a[k+1] + ..., their
    # posterior correlation was lost (sds 0.74-0.83 of NUTS's). Since round 32 one whose
    # parameters read at most three latent elements (three categories and a concentration) is
    # one factor of them (pmkjit.graph.multivariate); this hint is for more categories
    "DirichletMultinomialRV": (
        ": a Dirichlet-multinomial of counts y (N x K) with concentrations conc * w is exactly a chain "
        "of BetaBinomials, one a category but the last, over the stick-breaking fractions v[k] = w[k] / "
        "(w[k] + ... + w[K-1]) as latents (pm.Beta(\"v_k\", 1, K - 1 - k) for w ~ Dirichlet(ones(K))): "
        "rest = 1; for k in range(K - 1): pm.BetaBinomial(f\"{name}_{{k}}\", n=y[:, k:].sum(axis=1), "
        "alpha=conc * rest * v[k], beta=conc * rest * (1 - v[k]), observed=y[:, k]); rest = rest * (1 - v[k])"
    ),
}


def recognise_link(g: Variable, inputs: list) -> object:
    """The numpy form of ``g`` when it is a known link of its one input, else None.

    ``sigmoid(u)`` -> ``scipy.special.expit``, ``exp(u)`` -> ``numpy.exp`` and
    ``0.5 * erfc(u)`` (``pm.math.invprobit`` once its ``-1/sqrt(2)`` is folded into the
    linear predictor) -> :func:`pmkjit.links.half_erfc`, ``1 - exp(-exp(u))`` and
    ``-expm1(-exp(u))`` (complementary log-log) -> :func:`pmkjit.links.cloglog_inverse`;
    quadrature then evaluates the
    output's logit or log stably (:mod:`pmkjit.links`).
    """
    from scipy import special

    if len(inputs) != 1 or g.owner is None or not isinstance(g.owner.op, Elemwise):
        return None
    name = type(g.owner.op.scalar_op).__name__
    args = g.owner.inputs
    if len(args) == 1 and args[0] is inputs[0]:
        return {"Sigmoid": special.expit, "Exp": np.exp}.get(name)
    if name == "Mul" and len(args) == 2:
        for half, other in (args, args[::-1]):
            if (other.owner is not None and isinstance(other.owner.op, Elemwise)
                    and type(other.owner.op.scalar_op).__name__ == "Erfc" and other.owner.inputs[0] is inputs[0]):
                try:
                    value = pt.get_underlying_scalar_constant_value(half)
                except NotScalarConstantError:
                    continue
                if value == 0.5:
                    return half_erfc
    if is_cloglog_inverse(g, inputs[0]):
        return cloglog_inverse
    return None


def scalar_op_name(v: Variable) -> str | None:
    """The scalar op's class name of an elementwise ``v`` (``"Exp"``, ``"Neg"``), else None."""
    if v.owner is None or not isinstance(v.owner.op, Elemwise):
        return None
    return type(v.owner.op.scalar_op).__name__


def is_constant_value(v: Variable, value: float) -> bool:
    try:
        return float(pt.get_underlying_scalar_constant_value(v)) == value
    except NotScalarConstantError:
        return False


def is_neg_exp_of(v: Variable, u: Variable) -> bool:
    """``v`` is ``-exp(u)`` (``Neg`` or a product with -1)."""
    name = scalar_op_name(v)
    if name == "Neg":
        inner = v.owner.inputs[0]
    elif name == "Mul" and len(v.owner.inputs) == 2:
        a, b = v.owner.inputs
        inner = b if is_constant_value(a, -1.0) else a if is_constant_value(b, -1.0) else None
        if inner is None:
            return False
    else:
        return False
    return scalar_op_name(inner) == "Exp" and inner.owner.inputs[0] is u


def is_cloglog_inverse(g: Variable, u: Variable) -> bool:
    """``g`` is ``1 - exp(-exp(u))`` or ``-expm1(-exp(u))`` (the complementary log-log link)."""
    name = scalar_op_name(g)
    if name == "Sub":
        one, e = g.owner.inputs
        return is_constant_value(one, 1.0) and scalar_op_name(e) == "Exp" and is_neg_exp_of(e.owner.inputs[0], u)
    if name == "Neg":
        e = g.owner.inputs[0]
        return scalar_op_name(e) == "Expm1" and is_neg_exp_of(e.owner.inputs[0], u)
    return False
