"""Read PyMC distributions: their parameters, supports, labels and flat rebuilt forms.

The model walk in :mod:`pmkjit.graph.build` asks these questions of every random variable:
which parameters it has (``dist_params``, also of ``pm.Censored``, ``pm.Truncated``,
mixtures and hurdles), its support (probed where the op does not say), how a user wrote
it (for error messages), whether it is elementwise, and how to rebuild it on flat vectors
so that a factor can be evaluated on any batch of instances.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.distributions.censored import CensoredRV
from pymc.distributions.custom import CustomSymbolicDistRV
from pymc.distributions.mixture import Mixture, MixtureRV, _Hurdle, _HurdleRV
from pymc.distributions.distribution import SymbolicRandomVariable
from pymc.distributions.shape_utils import _change_dist_size
from pymc.distributions.simulator import SimulatorRV
from pymc.distributions.truncated import TruncatedRV
from pytensor.graph.basic import Constant, Variable
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.sharedvar import TensorSharedVariable
from pytensor.tensor.type_other import NoneConst

from pmkjit.errors import UnsupportedModelError
from pmkjit.graph.expansion import MAX_EXPANDED_COLUMNS
from pmkjit.families import Beta, Gamma
from pmkjit.graph.pytensor_tools import (
    compile_function,
    evaluate_constant,
    left_expanding,
    lift_indexing,
    pass_through,
)

try:  # private in PyMC 5 (the singledispatch behind every distribution's default transform)
    from pymc.distributions.transforms import _default_transform
except ImportError:  # pragma: no cover - a PyMC without it: judge a transform-less latent by its op
    _default_transform = None


# PyMC time-series distributions whose op names do not say how the user wrote them
# (``pm.GaussianRandomWalk`` builds a ``RandomWalkRV``), with what EP can do instead
TIME_SERIES = {
    "RandomWalkRV": (
        "pm.GaussianRandomWalk / pm.RandomWalk",
        "; Gaussian random walks (Normal initial value and Normal innovations) are supported",
    ),
    "AutoRegressiveRV": (
        "pm.AR",
        "; autoregressions with constant coefficients and a Normal init_dist are supported",
    ),
    "GARCH11RV": ("pm.GARCH11", ""),
    "EulerMaruyamaRV": ("pm.EulerMaruyama", ""),
}


# Distributions of distributions, by the constructors that build them (their op names,
# "MixtureRV" or "_HurdleRV", say neither pm.ZeroInflatedPoisson nor pm.HurdleGamma)
OF_DISTRIBUTIONS = {
    "MixtureRV": "pm.Mixture, pm.NormalMixture or a zero-inflated distribution such as pm.ZeroInflatedPoisson",
    "_HurdleRV": "a hurdle distribution such as pm.HurdlePoisson or pm.HurdleGamma",
    "CensoredRV": "pm.Censored",
}



def broadcast_mismatch(var: Variable, plate: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape of ``var`` if it does not broadcast to ``plate``, else None.

    Used only to give a failed walk its real reason. Shapes follow from the constants, the
    data and the latents' fixed shapes (no draw); a graph whose shape cannot be evaluated
    gives None.
    """
    try:
        shape = tuple(int(d) for d in pytensor.function([], var.shape, on_unused_input="ignore")())
    except Exception:  # noqa: BLE001
        return None
    try:
        return None if np.broadcast_shapes(shape, tuple(plate)) == tuple(plate) else shape
    except ValueError:  # does not broadcast at all
        return shape


def gaussian_process_hint(deps: Sequence[Variable], inner: str) -> str:
    """What to write instead, where a refusal comes from a Gaussian process with latent hyperparameters.

    ``pm.gp.HSGP`` and ``pm.gp.Latent`` with a latent length scale were refused with the
    operations PyMC builds inside them (``Dot``, ``Prod``, ``Cholesky``), which name neither
    the construct nor a way out (robustness round 18). With constant hyperparameters both
    are supported: an HSGP is then a linear regression on its basis functions (exact, or
    semi-analytic with a latent noise; within 0.09 NUTS sd on a 60-point example), a latent
    GP ``f = L v`` with a constant Cholesky factor. An HSGP with latent hyperparameters is
    supported under a Normal likelihood (:mod:`pmkjit.graph.expansion`).
    """
    names = [d.name for d in deps]
    coeffs = [n for n in names if n.endswith("_hsgp_coeffs")]
    if coeffs:
        hyper = [n for n in names if n not in coeffs]
        what = ", ".join(hyper) if hyper else "its covariance function's parameters"
        return (f"; this is pm.gp.HSGP ({coeffs[0]}) with latent hyperparameters ({what}): pmkjit fits those "
                f"under a Normal likelihood with at most {MAX_EXPANDED_COLUMNS} basis functions, and otherwise an "
                "HSGP whose covariance function has constant hyperparameters (a linear regression on its basis "
                f"functions), so fix {what} at constants (e.g. point estimates), or use pm.sample")
    if "Cholesky" in inner:
        return ("; a covariance that depends on latents (pm.gp.Latent with a latent length scale or amplitude): "
                "pmkjit supports pm.gp.Latent and pm.gp.Marginal with constant hyperparameters (fix ls and eta at "
                "constants, e.g. point estimates), or use pm.sample")
    return ""


class PartlyConstant(Exception):
    """The entries ``rows`` of a likelihood's plate need a factor apart from the others.

    Raised where a linear slot is constant in those entries and latent elsewhere, and where
    a switch on data picks one branch there and the other elsewhere (``_data_switches``).
    """

    def __init__(self, rows: np.ndarray):
        super().__init__("partly constant slot")
        self.rows = rows


def select_entries(param: Variable, plate: tuple[int, ...], mask: np.ndarray) -> Variable:
    """``param`` broadcast to ``plate``, at the entries ``mask`` (an index lift_indexing can push down).

    A parameter with one value (a scalar, or size-1 axes only) is the same at every entry
    and is returned as it is: broadcast and indexed, ``pm.Truncated``'s absent bound
    ``upper=inf`` became a data array of infinities, no longer recognisable as no bound,
    and EP refused it as an improper point mass mid-fit.
    """
    if all(param.type.broadcastable):
        # squeezed: a (1, 1) parameter beside the selection's 1-D plate failed PyTensor's
        # runtime broadcasting check
        return param.squeeze() if param.ndim else param
    if param.ndim == len(plate) and not any(param.type.broadcastable):
        return param[pt.constant(mask)]
    return pt.broadcast_to(param, plate)[pt.constant(mask)]


def mixture_parts(rv: Variable) -> tuple[list[Variable], list[Variable]]:
    """The weights (one elementwise expression per component) and components of a mixture.

    ``pm.ZeroInflatedPoisson(psi, mu)`` is a mixture of ``DiracDelta(0)`` and
    ``Poisson(mu)`` with weights ``stack([1 - psi, psi], axis=-1)``; the hurdle
    likelihoods are the same with a truncated (or continuous) component. Component ``k``'s
    weight is the stack's ``k``-th input where the weights are a stack, so that the walk
    sees ``1 - psi``, not an indexing of a vector.
    """
    from pytensor.graph.rewriting.utils import rewrite_graph
    from pytensor.tensor.basic import Join

    node = rv.owner
    weights, components = node.inputs[1], list(node.inputs[2:])
    if len(components) == 1:
        components = split_batched_component(rv, components[0], weights)
    K = len(components)

    node_w = weights.owner
    if node_w is not None and isinstance(node_w.op, Join):
        # weights that vary by observation, stack([1 - psi, psi], axis=-1) of vectors: a
        # join of (..., 1) pieces on the last axis, which canonicalize does not index through
        axis, *pieces = node_w.inputs
        if (int(evaluate_constant(axis)) % weights.ndim == weights.ndim - 1 and len(pieces) == K
                and all(p.type.shape[-1] == 1 for p in pieces)):
            return [rewrite_graph(p[..., 0], include=("canonicalize",)) for p in pieces], components
    # canonicalize turns stack(...)[..., k] into the k-th stacked expression
    parts = [rewrite_graph(weights[..., k], include=("canonicalize",)) for k in range(K)]
    return parts, components


def split_batched_component(rv: Variable, component: Variable, weights: Variable) -> list[Variable]:
    """``pm.NormalMixture`` and ``pm.Mixture`` with one batched ``comp_dists``, as ``K`` components.

    The component is one elementwise distribution whose last axis is the mixture's
    (``Normal.dist(mu, sigma)`` with ``mu`` of shape ``(K,)``): component ``k`` is the same
    distribution with every parameter taken at ``k`` on that axis (or as it is, where the
    parameter is broadcast along it), which is how PyMC's mixture reads it.
    """
    from pytensor.graph.rewriting.utils import rewrite_graph

    op = component.owner.op if component.owner is not None else None
    K = weights.type.shape[-1] if weights.ndim else None
    if K is None and weights.ndim and not reads_a_random_variable(weights):
        K = int(weights.shape[-1].eval())  # weights from pm.Data: a shared variable of unknown static shape
    elementwise = ((isinstance(op, RandomVariable) and all(n == 0 for n in op.ndims_params))
                   or (isinstance(op, SymbolicRandomVariable) and hasattr(op, "rv_op"))) and op.ndim_supp == 0
    if not elementwise or K is None or K < 2 or component.type.shape[-1] not in (K, None):
        raise UnsupportedModelError(
            f"{rv.name}: a mixture of one batched distribution is supported when that distribution is "
            "elementwise with the mixture's components along its last axis and a fixed number of "
            f"components (here {type(op).__name__ if op is not None else 'a constant'} with "
            f"{'an unknown number of' if K is None else K} components); write the components as a list, "
            "comp_dists=[pm.Normal.dist(mu[0], s), pm.Normal.dist(mu[1], s)]"
        )

    def at(p: Variable, k: int) -> Variable:
        if p.ndim == 0:
            return p
        part = p[..., 0] if last_axis_length(p) == 1 else p[..., k]
        return rewrite_graph(part, include=("canonicalize",))

    params = dist_params(component)
    return [flat_distribution(component, [at(p, k) for p in params]) for k in range(K)]


def last_axis_length(var: Variable) -> int | None:
    """Length of ``var``'s last axis: static, or inferred from the data it is shaped by (else None).

    A parameter scaled by a ``pm.Data`` column (``sigma=s * x`` with ``x`` of shape ``(N, 1)``)
    has no static length (shared variables may be resized), but broadcasts along the
    mixture's axis all the same; taking its entry ``k`` failed with an IndexError.
    """
    from pytensor.graph.rewriting.utils import rewrite_graph

    n = var.type.shape[-1]
    if n is not None:
        return n
    # the shape feature reduces the length to the shapes of the inputs it comes from
    length = rewrite_graph(var.shape[-1], include=("canonicalize", "ShapeOpt"))
    if reads_a_random_variable(length):
        return None
    return int(length.eval())


def reads_a_random_variable(var: Variable) -> bool:
    """Whether ``var`` depends on a random variable (a model latent), not only on data."""
    from pytensor.graph.traversal import ancestors

    return any(a.owner is not None and isinstance(a.owner.op, (RandomVariable, SymbolicRandomVariable))
               for a in ancestors([var]))


def has_point_masses(rv: Variable) -> bool:
    """Whether likelihood ``rv`` puts point masses on observed values (censoring, a DiracDelta component)."""
    op = rv.owner.op
    if isinstance(op, CensoredRV):
        return True
    if isinstance(op, (MixtureRV, _HurdleRV)):
        components = rv.owner.inputs[2:]  # the weights need not be rewritten for this
        return any(c.owner is not None and type(c.owner.op).__name__ == "DiracDeltaRV" for c in components)
    return False


def normal_walk(rv: Variable) -> bool:
    """Whether ``rv`` is a random walk with a Normal initial value and Normal innovations."""
    node = rv.owner
    if type(node.op).__name__ != "RandomWalkRV" or len(node.inputs) < 2:
        return False
    return all(d.owner is not None and type(d.owner.op).__name__ == "NormalRV" for d in node.inputs[:2])


def normal_autoregression(rv: Variable) -> bool:
    """Whether ``rv`` is a ``pm.AR`` with a Normal ``init_dist`` (its innovations are Normal)."""
    node = rv.owner
    if type(node.op).__name__ != "AutoRegressiveRV" or len(node.inputs) < 3:
        return False
    init = node.inputs[2]
    return init.owner is not None and type(init.owner.op).__name__ == "NormalRV"


def partial_observed(rv: Variable) -> tuple[Variable, np.ndarray] | None:
    """The whole variable and its observed entries, for the observed part of a partly observed one.

    PyMC imputes the missing entries of a distribution it cannot index (a symbolic one:
    ``pm.Weibull``, ``pm.Truncated``, a ``pm.CustomDist`` with ``dist=``, ...) with one
    ``PartialObservedRV`` node over the whole variable, whose outputs are its observed
    entries ``rv[~mask]`` and its missing ones ``rv[mask]``; a pure distribution (``Normal``,
    ``Poisson``, ...) gets two separate random variables instead. Returns ``None`` for
    anything but the observed output of such a node; else the whole variable (a copy of
    its node, named as the observed variable, for messages and factor names) and the
    boolean mask of its observed entries.
    """
    node = rv.owner
    if node is None or type(node.op).__name__ != "PartialObservedRV" or node.outputs.index(rv) != 0:
        return None
    whole, mask = node.inputs[:2]
    copy = whole.owner.clone()
    base = copy.outputs[whole.owner.outputs.index(whole)]
    base.name = rv.name
    missing = np.asarray(evaluate_constant(mask), dtype=bool)
    return base, ~np.broadcast_to(missing, tuple(int(d) for d in evaluate_constant(whole.shape)))


def refuse_partly_missing_rows(rv: Variable, observed: np.ndarray) -> None:
    """Refuse an observed MvNormal with NaN in some, not all, entries of a row.

    Such a row's likelihood would be exact (the marginal of its observed entries), but PyMC
    imputes its missing entries through a ``PartialObservedRV`` of the whole variable, and
    their predictive draws after EP (forward draws of whole rows) would ignore the row's
    observed entries, which in an MvNormal they depend on.

    Parameters
    ----------
    rv : the observed output of the ``PartialObservedRV`` (named ``<name>_observed``)
    observed : bool array of the whole variable's shape, True where an entry is observed
    """
    name = rv.name[: -len("_observed")] if rv.name.endswith("_observed") else rv.name
    partly = observed.any(axis=-1) & ~observed.all(axis=-1)
    first = np.argwhere(partly)[0].tolist() if partly.any() else []
    raise UnsupportedModelError(
        f"{name}: {int(partly.sum())} rows of this observed MvNormal have some entries missing (NaN) and others "
        f"observed (the first is row {first}); pmkjit supports rows that are observed whole or missing whole "
        "(those are drawn from their predictive), since the missing entries of a partly observed row would have "
        "to be drawn given its observed ones: drop those rows, fill their missing entries, or set the whole row "
        "to NaN"
    )


def dist_params(rv: Variable) -> list[Variable]:
    """The distribution parameters of random variable ``rv``, including ``pm.Truncated``'s.

    PyMC's generic truncation (``pm.Truncated`` of anything but a ``Normal``, which has its
    own ``TruncatedNormal``) is a symbolic variable without an extended signature, so its
    ``dist_params`` raised "extended_signature must be provided" from PyMC, naming neither
    the variable nor the construct. Its inputs are the base distribution's (generator,
    size, parameters) followed by the bounds; the parameters here are the base's
    parameters and then ``lower`` and ``upper``.

    Raises
    ------
    UnsupportedModelError
        For a truncation of a distribution that is not a plain ``RandomVariable`` (its
        inputs are then not laid out as above).
    """
    node = rv.owner
    op = node.op
    if isinstance(op, (MixtureRV, _HurdleRV)):
        weights, components = mixture_parts(rv)
        return weights + [p for c in components for p in dist_params(c)]
    if isinstance(op, CensoredRV):
        base = node.inputs[0]  # the base distribution's variable, then lower, upper
        if base.owner is None or not (isinstance(base.owner.op, RandomVariable) or (
                isinstance(base.owner.op, SymbolicRandomVariable) and hasattr(base.owner.op, "rv_op"))):
            raise UnsupportedModelError(
                f"{rv.name}: pm.Censored of {type(base.owner.op).__name__ if base.owner else 'a constant'} is not "
                "supported (pmkjit reads censorings of PyMC's elementwise distributions such as Normal, Weibull, "
                "Gamma or Poisson)"
            )
        bounds = list(node.inputs[1:3])
        if any(reads_a_random_variable(b) for b in bounds):
            # a latent bound is a model of the censoring itself; the factor would treat the
            # bound as a parameter of the density (c ~ N(1, 1) with data clipped at c: EP
            # 1.89 +- 0.39 against the exact truncated Normal's 1.80 +- 0.60, not converged)
            raise UnsupportedModelError(
                f"{rv.name}: a pm.Censored bound that depends on a latent variable is not supported; give the "
                "censoring bounds as data"
            )
        return list(base.owner.op.dist_params(base.owner)) + bounds
    if isinstance(op, TruncatedRV):
        base = op.base_rv_op
        if not isinstance(base, RandomVariable) or len(node.inputs) < 4:
            raise UnsupportedModelError(
                f"{rv.name}: pm.Truncated of {type(base).__name__} is not supported (pmkjit reads truncations "
                "of PyMC's elementwise distributions such as Normal, StudentT, Poisson or Gamma)"
            )
        return list(node.inputs[2:])  # [rng, size] of the base, then its parameters, lower, upper
    return list(op.dist_params(node))


def probed_support(rv: Variable) -> type | None:
    """Beta or Gamma where the log-density of ``rv`` says its support is (0, 1) or (0, inf), else None.

    Probed at -0.5, 0.5, 1.5 and 4 (every element at once), the parameters drawn once from
    their priors: (0, 1) is finite at 0.5 alone, (0, inf) at all but -0.5. Any failure reads
    as no bound found (a Gaussian latent, as before).
    """
    value = rv.type()
    try:
        logp = compile_function([value], pm.logp(rv, value, warn_rvs=False))
        shape = tuple(int(n) for n in evaluate_constant(rv.shape))
        with np.errstate(all="ignore"):
            finite = [bool(np.all(np.isfinite(logp(np.full(shape, v, dtype=rv.dtype))))) for v in (-0.5, 0.5, 1.5, 4.0)]
    except Exception:  # noqa: BLE001 - a probe, not a requirement
        return None
    if finite == [False, True, False, False]:
        return Beta
    if finite == [False, True, True, True]:
        return Gamma
    return None


def truncated_support(op: TruncatedRV, rv: Variable, lower: np.ndarray | None,
                       upper: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The support of a latent ``pm.Truncated``: its bounds within its base distribution's support.

    PyMC's transform of ``pm.Truncated(pm.Gamma.dist(2, 1), upper=6)`` is the interval
    ``(-inf, 6)``, its absent lower bound being minus infinity whatever the base: the
    refusal said the latent lives on ``(-inf, 6)`` and advised ``6 - `` a positive latent,
    which would be negative where the truncated Gamma is not. A positive base (a log
    transform) bounds it below by 0, a unit-interval one (log-odds) by 0 and 1; a
    ``pm.Truncated(pm.Gamma.dist(...), lower=0)`` or a positive base truncated below at 0
    is then an ordinary positive latent.
    """
    try:
        base = type(_default_transform(op.base_rv_op, rv)).__name__ if _default_transform is not None else None
    except Exception:  # noqa: BLE001 - a base whose transform needs its own parameters: the bounds as given
        return lower, upper
    if base in ("LogTransform", "LogOddsTransform"):
        lower = np.zeros(()) if lower is None else np.maximum(lower, 0.0)
    if base == "LogOddsTransform":
        upper = np.ones(()) if upper is None else np.minimum(upper, 1.0)
    return lower, upper


def distribution_label(op) -> str:
    """How the user wrote ``op``'s distribution, for messages.

    ``"pm.Truncated of StudentTRV"``, ``"pm.AR (AutoRegressiveRV)"`` (op names that do not
    say which constructor built them), else the op's name.
    """
    opname = type(op).__name__
    if isinstance(op, TruncatedRV):
        return f"pm.Truncated of {type(op.base_rv_op).__name__}"
    if isinstance(op, CensoredRV):
        return "pm.Censored"
    if opname in TIME_SERIES:
        return f"{TIME_SERIES[opname][0]} ({opname})"
    if opname in OF_DISTRIBUTIONS:
        return f"{opname} ({OF_DISTRIBUTIONS[opname]})"
    return opname


def check_elementwise_distribution(rv: Variable, latents: Sequence[Variable] = ()) -> None:
    """Refuse, before its parameters are walked, a distribution that is not elementwise.

    A parameter that *is* one of the model's latent variables (``alpha=a`` of a
    ``pm.Weibull``, whose symbolic parameters are not broadcast copies) is an ordinary
    parameter, not a distribution passed as a parameter.
    """
    op = rv.owner.op
    if isinstance(op, (CustomSymbolicDistRV, SimulatorRV)):
        return
    name = type(op).__name__
    dists = (RandomVariable, SymbolicRandomVariable)
    model_rvs = set(latents)
    if any(p.owner is not None and isinstance(p.owner.op, dists) and p not in model_rvs
           for p in dist_params(rv)):
        raise UnsupportedModelError(
            f"{rv.name}: {distribution_label(op)} takes another distribution as a parameter; pmkjit needs an "
            "elementwise distribution whose parameters are expressions of the latents (pm.Censored, pm.Truncated "
            "and mixtures of elementwise distributions, e.g. zero-inflated and hurdle likelihoods, are read): "
            "fit this model with pm.sample"
        )
    if isinstance(op, (MixtureRV, _HurdleRV)):
        # elementwise mixtures (zero-inflated, hurdle): the weights' core axis is split
        # into one expression per component by dist_params
        for c in mixture_parts(rv)[1]:
            if c.owner is None or getattr(c.owner.op, "ndim_supp", 0) != 0:
                raise UnsupportedModelError(f"{rv.name}: a mixture of multivariate components is not supported")
        return
    if getattr(op, "ndim_supp", 0) != 0 or any(n != 0 for n in (getattr(op, "ndims_params", None) or [])):
        # pm.OrderedLogistic / OrderedProbit are Categorical underneath: say so, the user
        # never wrote "Categorical"
        hint = (" (pm.Categorical, pm.OrderedLogistic and pm.OrderedProbit: a categorical outcome's "
                "probabilities are a vector per observation; pmkjit reads an observed pm.Categorical with "
                "p=pm.math.softmax(eta, axis=-1) or logit_p=eta)" if name == "CategoricalRV" else "")
        raise UnsupportedModelError(
            f"{rv.name}: {name} is not an elementwise distribution (its parameters have core dimensions){hint}"
        )


def unbroadcast(p: Variable) -> Variable:
    """``p`` without pass-through ops and leading broadcast axes (``softmax(a)`` of one vector ``a``
    broadcast to every observation, intercepts only)."""
    while p.owner is not None and (pass_through(p.owner.op) or (
            isinstance(p.owner.op, DimShuffle) and left_expanding(p.owner.op))):
        p = p.owner.inputs[0]
    return p


def softmax_input(p: Variable) -> Variable | None:
    """``eta`` if ``p`` is ``softmax(eta)`` along its last axis, else None."""
    node = p.owner
    if node is None or type(node.op).__name__ != "Softmax":
        return None
    axis = getattr(node.op, "axis", None)
    return node.inputs[0] if axis is None or axis % p.ndim == p.ndim - 1 else None


def last_axis_columns(var: Variable) -> list[Variable]:
    """``var[..., k]`` for every ``k`` of its last axis, simplified (a join's ``k``-th piece)."""
    from pytensor.graph.rewriting.utils import rewrite_graph

    K = var.type.shape[-1]
    if K is None:
        K = int(np.asarray(evaluate_constant(var.shape[-1])))
    return [lift_indexing(rewrite_graph(var[..., k], include=("canonicalize",))) for k in range(K)]


def categorical_entries(columns: list, y: np.ndarray, mask: np.ndarray | None, rows) -> tuple[list, np.ndarray]:
    """A categorical's per-class columns at its observed rows, then at the entries ``mask``.

    ``rows``: ``(n_full, index)`` where the probabilities were those of a whole variable
    with missing values (``index`` selects the observed rows), else None.
    """
    if rows is not None:
        n_full, index = rows
        columns = [lift_indexing(select_entries(c, (n_full,), index)) for c in columns]
    if mask is not None:
        columns = [lift_indexing(select_entries(c, y.shape, mask)) for c in columns]
        y = y[mask]
    return columns, y


def ordinal_parts(p: Variable) -> tuple[Variable, Variable, object] | None:
    """``(eta, cutpoints, compute_p)`` if ``p`` is an ordinal outcome's class probabilities, else None.

    PyMC builds ``pm.OrderedLogistic``'s from ``sigmoid(cutpoints - eta[..., None])`` and
    ``pm.OrderedProbit``'s from ``eta[..., None] - cutpoints`` (``compute_p`` of each). The
    candidate operands are taken from the graph and the whole ``p`` is checked numerically
    against ``compute_p`` of them at random values, so a look-alike graph is not mistaken
    for one (an ``OrderedProbit`` with ``sigma`` other than 1 is not recognised).
    """
    from pymc.distributions.discrete import OrderedLogistic, OrderedProbit
    from pytensor.graph.traversal import ancestors

    def padded(v: Variable) -> Variable | None:
        node = v.owner
        if node is not None and isinstance(node.op, DimShuffle) and node.op.new_order[-1] == "x":
            return node.inputs[0]
        return None

    candidates = []
    for v in ancestors([p]):
        node = v.owner
        if node is None or not isinstance(node.op, Elemwise) or type(node.op.scalar_op).__name__ != "Sub":
            continue
        a, b = node.inputs
        if padded(b) is not None:  # cutpoints - eta[..., None], under a sigmoid
            candidates.append((padded(b), a, OrderedLogistic.compute_p))
        if padded(a) is not None:  # eta[..., None] - cutpoints
            candidates.append((padded(a), b, lambda e, c: OrderedProbit.compute_p(e, c, 1.0)))
    rng = np.random.default_rng(0)
    for eta, cutpoints, compute_p in candidates:
        e, c = eta.type(), cutpoints.type()
        try:
            same = pytensor.clone_replace(p, {eta: e, cutpoints: c})
            if any(a.owner is not None and isinstance(a.owner.op, RandomVariable) for a in ancestors([same])):
                continue
            f = compile_function([e, c], [same, compute_p(e, c)])
            shape_e = tuple(1 if n is None else n for n in eta.type.shape)
            shape_c = tuple(3 if n is None else n for n in cutpoints.type.shape)
            got, want = f(rng.normal(size=shape_e), np.sort(rng.normal(size=shape_c), axis=-1))
        except Exception:  # noqa: BLE001 - any failure means "not this candidate"
            continue
        if np.shape(got) == np.shape(want) and np.allclose(got, want):
            return eta, cutpoints, compute_p
    return None


def bound_text(value: np.ndarray | None, default: float) -> str:
    """A scalar interval bound as printed in a message (``default`` where there is none)."""
    return f"{float(default if value is None else value.reshape(())):g}"


NO_BOUND = 1e150  # an infinite censoring bound as data (its square is finite)


def infinite_constant(var: Variable) -> bool:
    """Whether ``var`` is a constant whose entries are all infinite (an absent truncation bound)."""
    return isinstance(var, Constant) and np.all(np.isinf(np.asarray(var.data, dtype=float)))


def flat_distribution(rv: Variable, flat_params: list) -> Variable:
    """``rv``'s distribution with its parameters replaced by flat vectors (size from them)."""
    with warnings.catch_warnings():
        # PyMC's truncation of a discrete base (pm.Truncated, the hurdle count likelihoods)
        # builds a scan the old way: the DeprecationWarning is PyMC's, already raised when
        # the model was written, not the user's to act on
        warnings.filterwarnings("ignore", "Scan return signature will change", DeprecationWarning)
        return rebuilt_distribution(rv, flat_params)


def rebuilt_distribution(rv: Variable, flat_params: list) -> Variable:
    node = rv.owner
    op = node.op
    if isinstance(op, CustomSymbolicDistRV):
        f = _change_dist_size.dispatch(type(op))
        closure = dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__ or ())))
        if "dist" not in closure:
            raise UnsupportedModelError(f"{rv.name}: cannot rebuild this CustomDist for batched evaluation")
        return pm.CustomDist.dist(*flat_params, dist=closure["dist"], class_name=type(op).__name__)
    if isinstance(op, (MixtureRV, _HurdleRV)):
        # as laid out by dist_params: one weight per component, then each one's parameters
        _, components = mixture_parts(rv)
        weights, rest = flat_params[: len(components)], list(flat_params[len(components):])
        rebuilt = []
        for c in components:
            original = dist_params(c)
            # the walk hands constants back as floats; DiracDelta(0) of a count likelihood
            # must stay an integer, or PyMC refuses to mix discrete and continuous components
            flat = [pt.cast(f, o.dtype) if o.dtype.startswith(("int", "uint")) else f
                    for f, o in zip(rest[: len(original)], original)]
            rebuilt.append(flat_distribution(c, flat))
            rest = rest[len(original):]
        w = pt.stack([pt.as_tensor_variable(x) for x in weights], axis=-1)
        return (_Hurdle if isinstance(op, _HurdleRV) else Mixture).dist(w, rebuilt)
    if isinstance(op, CensoredRV):
        # as laid out by dist_params: the base's parameters, then the bounds; an absent
        # bound (the constant -inf or inf) is passed as none, as for pm.Truncated below
        *base_params, lower, upper = flat_params
        lower, upper = (None if infinite_constant(orig) else flat
                        for flat, orig in zip((lower, upper), node.inputs[1:3]))
        return pm.Censored.dist(rebuilt_distribution(node.inputs[0], base_params), lower=lower, upper=upper)
    if isinstance(op, TruncatedRV):
        # parameters as laid out by dist_params: the base distribution's, then the bounds
        *base_params, lower, upper = flat_params
        # An absent bound is the constant -inf or inf. Broadcast to the batch it is no longer
        # a constant, and PyMC's truncated log-density then evaluates the base's logcdf at
        # inf, NaN for a StudentT: every entry's density was NaN and EP silently returned
        # the prior (a truncated StudentT regression, N = 70: posterior = prior after 1 sweep,
        # reported as converged). An infinite constant bound is passed as no bound.
        lower, upper = (None if infinite_constant(orig) else flat
                        for flat, orig in zip((lower, upper), node.inputs[-2:]))
        base = op.base_rv_op(*base_params)
        return pm.Truncated.dist(base, lower=lower, upper=upper, max_n_steps=op.max_n_steps)
    if isinstance(op, SymbolicRandomVariable) and not isinstance(op, SimulatorRV) and hasattr(op, "rv_op"):
        # PyMC's own symbolic distributions (HalfCauchy, HalfStudentT, Weibull, ...): rebuilt by
        # their constructor from the flat parameters, when they are elementwise
        if op.ndim_supp != 0 or any(n != 0 for n in (op.ndims_params or [1])):
            raise UnsupportedModelError(f"{rv.name}: {type(op).__name__} is not an elementwise distribution")
        try:
            return type(op).rv_op(*flat_params, size=None)
        except TypeError as err:
            raise UnsupportedModelError(
                f"{rv.name}: distribution {type(op).__name__} cannot be rebuilt for batched evaluation ({err})"
            ) from None
    if isinstance(op, RandomVariable):
        if op.ndim_supp != 0 or any(n != 0 for n in op.ndims_params):
            raise UnsupportedModelError(f"{rv.name}: {type(op).__name__} is not an elementwise distribution")
        params = dist_params(rv)
        size = op.size_param(node)
        new_inputs = []
        for x in node.inputs:
            r = x
            for p, fp in zip(params, flat_params):
                if x is p:
                    r = fp
            if x is size:
                r = NoneConst
            new_inputs.append(r)
        new = node.clone_with_new_inputs(new_inputs, strict=False)
        return new.outputs[node.outputs.index(rv)]
    raise UnsupportedModelError(
        f"{rv.name}: distribution {type(op).__name__} cannot be rebuilt for batched evaluation "
        "(supported: elementwise PyMC distributions, pm.CustomDist with dist=..., pm.Simulator)"
    )


def abc_bandwidth(op, observed: np.ndarray) -> float:
    """A ``pm.Simulator``'s ABC bandwidth: its ``epsilon``, else a tenth of the data's sd."""
    eps = getattr(op, "epsilon", None)
    if eps is not None:
        value = np.asarray(eps.data if isinstance(eps, (Constant, TensorSharedVariable)) else eps, dtype=float)
        if value.size >= 1:
            return float(value.ravel()[0])
    return float(0.1 * np.std(observed) + 1e-8)
