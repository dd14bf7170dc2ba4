"""Turn a PyMC model into a :class:`~pmkjit.graph.factor_graph.FactorGraph`.

Each distribution parameter of each random variable is decomposed top-down:

* no latent ancestors: a constant (a scalar, or per-instance data);
* affine in the real-valued latents (checked numerically, see
  :func:`~pmkjit.graph.pytensor_tools.affine_coefficients`): a linear slot;
* a (possibly indexed or broadcast) positive or unit-interval latent: an element slot;
* an elementwise operation: decomposed further into its inputs.

The parameters are then an elementwise function of those slots, which is rebuilt on
flat vectors (one entry per factor instance and sample) so that it can be evaluated on
any batch. Recognised conjugate forms become exact factors; everything else becomes a
black-box factor with a forward sampler and, where PyMC can derive one, a log-density.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.distributions.censored import CensoredRV
from pymc.distributions.mixture import MixtureRV
from pymc.distributions.distribution import SymbolicRandomVariable, support_point
from pymc.distributions.simulator import SimulatorRV
from pymc.distributions.truncated import TruncatedRV
from pymc.pytensorf import find_rng_nodes, reseed_rngs
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.scalar import Mul as ScalarMul, Switch as ScalarSwitch
from pytensor.compile.ops import ViewOp
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.basic import Eye
from pytensor.tensor.shape import Shape, Shape_i, SpecifyShape
from pytensor.tensor.sharedvar import TensorSharedVariable

from pmkjit.errors import InvalidDataError, UnsupportedModelError
from pmkjit.families import Beta, Gamma, Gaussian
from pmkjit.graph.factor_graph import (
    BlackBoxFactor,
    DataSlot,
    ElementSite,
    ElementSlot,
    FEW_INSTANCES,
    MAX_PREDICTOR_RANK,
    pair_slots,
    FactorGraph,
    GaussianTerm,
    LatentVariable,
    LinearSlot,
)
from pmkjit.graph.expansion import (
    Expanded,
    ScalarFunction,
    entries,
    expand_product,
    expand_reduction,
    is_scalar_function,
    vectorised_scalar_function,
)
from pmkjit.graph.linear_normal import linear_normal_spec
from pmkjit.graph.mixture import normal_mixture_spec
from pmkjit.graph.multivariate import MAX_SCALARS, scalar_log_density
from pmkjit.graph.observed import observed_as_data
from pmkjit.graph.potential import POTENTIAL_PREFIX
from pmkjit.graph.predictive import predictive_only
from pmkjit.graph.simplex import STICK_PREFIX
from pmkjit.graph.pytensor_tools import (
    affine_coefficients,
    compile_function,
    elementwise_nodes,
    evaluate_constant,
    in_point_slices,
    largest_static_size,
    latent_ancestors,
    lift_indexing,
    parameter_checks_to_ninf,
    pass_through,
    replace_elementwise,
)
from pmkjit.graph.distributions import (
    NO_BOUND,
    abc_bandwidth,
    PartlyConstant,
    TIME_SERIES,
    bound_text,
    broadcast_mismatch,
    categorical_entries,
    check_elementwise_distribution,
    dist_params,
    distribution_label,
    flat_distribution,
    gaussian_process_hint,
    has_point_masses,
    last_axis_columns,
    mixture_parts,
    normal_autoregression,
    normal_walk,
    ordinal_parts,
    partial_observed,
    probed_support,
    refuse_partly_missing_rows,
    select_entries,
    softmax_input,
    truncated_support,
    unbroadcast,
)
from pmkjit.graph.keys import describe_graph, graph_key, has_no_random, simulator_fingerprint
from pmkjit.graph.link_recognition import ELEMENTWISE_HINTS, recognise_link
from pmkjit.operators.grid import GRID_NODES

try:  # private in PyMC 5 (the singledispatch behind every distribution's default transform)
    from pymc.distributions.transforms import _default_transform
except ImportError:  # pragma: no cover - a PyMC without it: judge a transform-less latent by its op
    _default_transform = None

__all__ = ["build_factor_graph"]

# Conjugate observations of a parameter: distribution op -> (parameter position, family,
# natural parameters of the message as a function of the observation and the other
# (constant) parameters, and the map from the PyMC parameter to the family's variable).
_CONJUGATE = {
    "BernoulliRV": (0, Beta, lambda y, params: np.stack([y, 1.0 - y], -1), "identity"),
    "BinomialRV": (1, Beta, lambda y, params: np.stack([y, params[0] - y], -1), "identity"),
    "PoissonRV": (0, Gamma, lambda y, params: np.stack([y, -np.ones_like(y)], -1), "identity"),
    "ExponentialRV": (0, Gamma, lambda y, params: np.stack([np.ones_like(y), -y], -1), "reciprocal"),
    "GammaRV": (1, Gamma, lambda y, params: np.stack([params[0] + 0.0 * y, -y], -1), "reciprocal"),
    "NormalRV": (1, Gamma, lambda y, params: np.stack([0.5 + 0.0 * y, -0.5 * (y - params[0]) ** 2], -1), "rsqrt"),
}
# Observations whose conjugate parameter may be a nonlinear function of latents: the
# paper's split into a deterministic factor and an analytic observation.
_SPLIT = ("BernoulliRV", "BinomialRV", "PoissonRV")


# Transforms whose names do not say which constructor the user called
_TRANSFORM_CONSTRUCTORS = {
    "CholeskyCovPacked": "a covariance from pm.LKJCholeskyCov",
    "SimplexTransform": "a batched pm.Dirichlet, or one with latent concentrations",
    "Ordered": "an ordered array other than a vector (transform=ordered)",
    "ZeroSumTransform": "a pm.ZeroSumNormal over several axes",
    "CircularTransform": "an angle, wrapped into (-pi, pi)",
}


# Distributions whose support moves with their parameters: an observation outside it at
# the points tried may be inside it elsewhere, so the support check leaves them alone.
_PARAMETER_SUPPORT = ("UniformRV", "TriangularRV", "ParetoRV", "DiscreteUniformRV", "HyperGeometricRV")
_STRUCTURAL = {
    "identity": lambda u: u,
    "reciprocal": lambda u: 1.0 / u,
    "rsqrt": lambda u: 1.0 / np.sqrt(u),
    "sqrt": np.sqrt,
}


def build_factor_graph(model: pm.Model, random_seed: int | None = 0) -> FactorGraph:
    """Extract the factor graph of ``model``.

    Parameters
    ----------
    model : pymc.Model
    random_seed : int, optional
        Seeds the random points of the linearity checks.

    Returns
    -------
    FactorGraph

    Raises
    ------
    UnsupportedModelError
        Naming the variable at fault and the reason (discrete latents, potentials,
        missing data, latents outside the reals / (0, 1) / (0, inf), parameters that
        depend on latents through non-elementwise operations, multivariate factors).
    """
    # an observed variable read by another variable stands for its data, as in model.logp
    return _Builder(observed_as_data(model), np.random.default_rng(random_seed)).build()


class _Builder:
    def __init__(self, model: pm.Model, rng: np.random.Generator):
        self.model = model
        self.rng = rng
        self.variables: dict[str, LatentVariable] = {}
        self.rv_of: dict[str, Variable] = {}
        self.graph: FactorGraph | None = None
        self._support_logp: dict[str, list[np.ndarray]] | None = None
        # likelihoods whose entries may be split by _likelihood_entries
        self._splittable = {rv.name for rv in model.observed_RVs}
        # latents with an ordered transform (ordinal cutpoints), in the order met
        self._ordered: list[str] = []

    # -------------------------------------------------------------- variables
    def build(self) -> FactorGraph:
        model = self.model
        if model.potentials:
            # pmkjit.fit rewrites a potential of scalar latents as an observed CustomDist
            # (pmkjit.graph.potential); what reaches here reads a vector latent
            names = [p.name or str(p) for p in model.potentials]
            vectors = sorted({rv.name for p in model.potentials for rv in latent_ancestors(p, model.free_RVs)
                              if rv.ndim > 0})
            raise UnsupportedModelError(
                f"pm.Potential terms {names} are not supported"
                + (f": they read the vector latent(s) {', '.join(vectors)}, and a potential is one function of "
                   "all its elements, which EP's elementwise factors cannot evaluate; pmkjit.fit takes a "
                   "potential of scalar latents; write the term as a prior or likelihood of the vector, or "
                   "use pm.sample" if vectors else
                   ": pmkjit needs each factor as a distribution it can sample from (write the term as an "
                   "observed pm.CustomDist instead)")
            )
        offset = 0
        predictive = predictive_only(model)
        for rv in predictive:
            self._check_drawable(rv)
        fitted = [rv for rv in model.free_RVs if rv not in predictive]
        for rv in fitted:
            family = self._family(rv)
            shape = tuple(int(s) for s in evaluate_constant(rv.shape))
            var = LatentVariable(rv.name, family, shape, offset if family is Gaussian else -1)
            if family is Gaussian:
                offset += var.size
            self.variables[rv.name] = var
            self.rv_of[rv.name] = rv
        self.graph = FactorGraph(variables=self.variables, n_theta=offset,
                                 predictive=[rv.name for rv in predictive])
        self.latent_rvs = fitted
        self.block = [
            (self.rv_of[v.name], slice(v.offset, v.offset + v.size), v.shape)
            for v in self.variables.values()
            if v.in_gaussian_block
        ]
        for rv in fitted:
            self._prior(rv)
            if rv.name in self._ordered:
                self._order_factor(rv)
        for rv in model.observed_RVs:
            self._likelihood(rv)
        self.graph.ordered = list(self._ordered)
        # after the factors, so that a refusal with a more specific message comes first
        self._check_prior_parameters(fitted)
        return self.graph

    def _order_factor(self, rv: Variable) -> None:
        """The order of an ordered vector: a factor ``1[x[k+1] - x[k] > 0]`` per neighbouring pair.

        The transform restricts the prior's density to the ordered vectors; these factors
        are that restriction, with exact tilted moments (``pmkjit.ep.truncation``).
        """
        var = self.variables[rv.name]
        n = var.size - 1
        if n < 1:
            return
        A = np.zeros((n, self.graph.n_theta))
        k = np.arange(n)
        A[k, var.offset + k + 1] = 1.0
        A[k, var.offset + k] = -1.0

        def no_sampler(ins, rng):  # never called: the factor's moments are exact
            raise RuntimeError("an order constraint has no forward sampler")

        def logp(x, ins):
            return np.where(np.asarray(ins[0]) > 0, 0.0, -np.inf)

        self.graph.factors.append(BlackBoxFactor(
            name=f"{rv.name} (order)", kind="likelihood",
            inputs=[LinearSlot(A, np.zeros(n), f"{rv.name}[k+1] - {rv.name}[k]")],
            sampler=no_sampler, logp=logp, density_source="pymc", key=f"order-{rv.name}",
            description=f"{rv.name}: order of its {var.size} entries (exact truncation)",
            observed=np.zeros(n), size=n, analytic="positive",
        ))

    def _check_prior_parameters(self, fitted: list[Variable]) -> None:
        """Refuse a prior whose constant parameters PyMC's own checks reject.

        ``pm.Normal("b", 0, -1.0)`` has precision 1 / sigma^2 = 1 as an EP site, so without
        this check it was fitted as ``Normal(0, 1)`` where ``pm.sample`` refuses the model
        (and ``sigma = 0`` failed deep in a Cholesky solve). PyMC's log-density, with its
        parameter checks as ``-inf``, is evaluated at PyMC's support point (the point
        ``pm.sample`` starts from) of each prior whose parameters read no latent; a prior with
        no finite density there is refused by name.
        """
        model = self.model
        constant = [rv for rv in fitted
                    if not any(latent_ancestors(p, model.free_RVs) for p in dist_params(rv))]
        if not constant:
            return
        checked, outputs = [], []
        for rv in constant:
            try:
                outputs.append(parameter_checks_to_ninf(pm.logp(rv, support_point(rv))))
                checked.append(rv)
            except Exception:  # noqa: BLE001 -- a courtesy check: a prior PyMC has no support point for is skipped
                continue
        if not checked:
            return
        try:
            # one small constant graph for all of them (the model's own initial point and
            # log-density took 0.1-0.3 s a build; this takes 0.05-0.2 s)
            logps = compile_function([], outputs)()
        except Exception:  # noqa: BLE001
            return
        for rv, logp in zip(checked, logps):
            bad = ~np.isfinite(np.asarray(logp, dtype=float))
            if not bad.any():
                continue
            # _finite refuses a missing value in a parameter with its own message (missing data)
            values = [np.asarray(_finite(evaluate_constant(p), rv.name, p), dtype=float) for p in dist_params(rv)]
            params = [np.array2string(v, threshold=6, precision=4) if v.size <= 6 else f"array of shape {v.shape}"
                      for v in values]
            prior = f"{type(rv.owner.op).__name__.removesuffix('RV')}({', '.join(params)})"
            if _stick_owner(rv.name) != rv.name:
                # named by the user's pm.Dirichlet, not by its hidden stick-breaking Beta
                raise InvalidDataError(
                    f"{_stick_owner(rv.name)}: its concentration has an entry of 0 or below (its stick-breaking "
                    f"{prior} has no density); pm.sample refuses this model too"
                )
            raise InvalidDataError(
                f"{rv.name}: its prior {prior} has no density at its initial value: its parameters fail "
                "PyMC's own checks (a scale or shape of 0 or below, bounds in the wrong order, ...); "
                "pm.sample refuses this model too"
            )

    def _check_drawable(self, rv: Variable) -> None:
        """Refuse, before EP, a latent that nothing reads and that cannot be drawn from its prior."""
        op = rv.owner.op
        if type(op).__name__ in ("FlatRV", "HalfFlatRV"):
            raise UnsupportedModelError(
                f"{rv.name}: its prior is improper ({type(op).__name__[:-2]}) and no other variable reads it, so its "
                "posterior is improper too: give it a proper prior or remove it"
            )
        if has_no_random(op):
            raise UnsupportedModelError(
                _NO_SAMPLER.format(name=rv.name) + "; no other variable reads it, so pmkjit draws it from its prior"
            )

    def _family(self, rv: Variable) -> type:
        name = rv.name
        if type(rv.owner.op).__name__ == "PartialObservedRV":
            # missing entries of a symbolic distribution read by another variable (those
            # that nothing reads are drawn from their predictive, pmkjit.graph.predictive)
            whole = rv.owner.inputs[0]
            observed = name[: -len("_unobserved")] if name.endswith("_unobserved") else name
            raise UnsupportedModelError(
                f"{observed}: the observed data contain missing values, which PyMC imputes as the latent {name}, "
                f"read by another variable; for {distribution_label(whole.owner.op)} PyMC imputes them through a "
                "PartialObservedRV of the whole variable, which pmkjit cannot use as a prior (missing values that "
                "nothing else reads are drawn from their predictive): drop or fill the missing entries, or give the "
                "variable a distribution such as Normal, StudentT or Gamma"
            )
        discrete = rv.dtype.startswith(("int", "uint", "bool"))
        if discrete and name.endswith("_unobserved") and name[: -len("_unobserved")] in self.model.named_vars:
            # missing values are latents like any other (PyMC's own imputation); those that
            # nothing reads never get here (pmkjit.graph.predictive)
            raise UnsupportedModelError(
                f"{name[: -len('_unobserved')]}: the observed data contain missing values, which PyMC imputes as "
                f"the discrete latent variable {name}, which another variable reads; EP cannot carry a discrete "
                "latent (missing counts that nothing else reads are drawn from their predictive): drop or fill the NaN "
                "entries"
            )
        if discrete:
            raise UnsupportedModelError(
                f"{name} is a discrete latent variable ({type(rv.owner.op).__name__}); EP in pmkjit needs continuous "
                "latents (marginalise it out, e.g. with pm.Mixture)"
            )
        op = rv.owner.op
        # a ZeroSumNormal's support is its zero-sum axes (two for an interaction's table),
        # held exactly by _zero_sum_prior however many they are
        if getattr(op, "ndim_supp", 0) > 1 and type(op).__name__ != "ZeroSumNormalRV":
            raise UnsupportedModelError(f"{name}: matrix-valued latent variables are not supported")
        if isinstance(op, CensoredRV):
            # point masses at the bounds: a Gaussian message put mass beyond them (sd 0.63
            # where NUTS's is 0.45)
            raise UnsupportedModelError(
                f"{name} is a latent pm.Censored (point masses at its bounds), which EP's densities cannot "
                "approximate; censoring is for observations (a latent clipped value is pm.math.clip of a latent)"
            )
        transform = self.model.rvs_to_transforms.get(rv)
        if transform is None and _default_transform is not None:
            # the family follows the support, not the sampler's parametrisation:
            # HalfNormal(transform=None) or Uniform(0, 1, default_transform=None) is still
            # positive or in (0, 1), and a Gaussian message would put mass where its
            # density is zero (negative posterior draws of a scale)
            transform = _default_transform(op, rv)
        tname = type(transform).__name__ if transform is not None else None
        if tname is None:
            if (getattr(op, "ndim_supp", 0) == 1 and type(op).__name__ not in ("MvNormalRV", "ICARRV")
                    and not normal_walk(rv) and not normal_autoregression(rv)):
                hint = TIME_SERIES.get(type(op).__name__, ("", ""))[1]
                raise UnsupportedModelError(
                    f"{name}: multivariate latent {distribution_label(op)} is not supported (only MvNormal){hint}"
                )
            if isinstance(op, SymbolicRandomVariable) and getattr(op, "ndim_supp", 0) == 0:
                # PyMC gives some symbolic distributions no transform though their support is
                # bounded (pm.LogitNormal in PyMC 5.28; a CustomDist with dist= unless the user
                # passes one): as a Gaussian latent, pm.LogitNormal's probabilities were drawn
                # below 0, and every observation's log-likelihood at those draws was -inf
                return probed_support(rv) or Gaussian
            return Gaussian
        if tname == "ZeroSumTransform" and type(op).__name__ == "ZeroSumNormalRV":
            return Gaussian
        if tname == "Ordered" and getattr(op, "ndim_supp", 0) == 0 and rv.ndim == 1:
            # a real vector (the cutpoints of an ordinal outcome) whose density is its
            # distribution's on the ordered vectors: EP carries it in the Gaussian block and
            # the order as factors of its own (_order_factor)
            self._ordered.append(name)
            return Gaussian
        if tname == "LogTransform":
            return Gamma
        if tname == "LogOddsTransform":
            return Beta
        if tname == "Interval":
            lower, upper = (np.asarray(evaluate_constant(pt.as_tensor(b))) if b is not None else None
                            for b in transform.args_fn(*rv.owner.inputs))
            if isinstance(op, TruncatedRV):
                lower, upper = truncated_support(op, rv, lower, upper)
            if lower is not None and upper is not None and np.all(lower == 0) and np.all(upper == 1):
                return Beta
            if lower is not None and upper is None and np.all(lower == 0):
                return Gamma
            where = (f"({bound_text(lower, -np.inf)}, {bound_text(upper, np.inf)}), an interval other than (0, 1) or (0, inf)"
                     if all(b is None or b.size == 1 for b in (lower, upper)) else "an interval other than (0, 1) or (0, inf)")
            raise UnsupportedModelError(
                f"{name} lives on {where}; "
                + ("rescale it to (0, 1) (e.g. a Beta or Uniform(0, 1) variable and a Deterministic)"
                   if lower is not None and upper is not None else
                   "write it as its bound plus or minus a positive latent, in a Deterministic")
                + ("; for a scale, a HalfNormal, Exponential or HalfCauchy prior is the usual choice"
                   if lower is not None and np.all(lower == 0) else "")
            )
        what = _TRANSFORM_CONSTRUCTORS.get(tname)
        if tname == "ChainedTransform":
            # transform=ordered on a positive distribution (a Gamma or Exponential vector of
            # mixture rates): PyMC chains log and ordered, and the refusal said only
            # "has transform ChainedTransform" (robustness round 16)
            chain = [type(t).__name__ for t in getattr(transform, "transform_list", [])]
            what = f"the chain {' then '.join(chain) or tname}"
            if "Ordered" in chain and chain[0] in ("LogTransform", "LogOddsTransform"):
                what = ("an ordered vector of positive or (0, 1) values (transform=ordered on a "
                        f"{distribution_label(op)} chains {' and '.join(chain)}); pmkjit orders real vectors only: "
                        "order the logs instead, log_x = pm.Normal(..., transform=pm.distributions.transforms.ordered) "
                        "and x = pm.math.exp(log_x)")
                raise UnsupportedModelError(f"{name} is {what}")
        raise UnsupportedModelError(
            f"{name} has transform {tname}" + (f" ({what}, which pmkjit does not support)" if what else "")
            + "; pmkjit supports latents on the reals, (0, 1) and (0, inf)"
            + (self._latent_covariance_readers(rv) + "; for correlated group effects use independent ones with "
               "their own scales, or pm.sample" if tname == "CholeskyCovPacked" else "")
            + ("; pmkjit.fit takes a one-dimensional pm.Dirichlet with constant concentrations (as independent "
               "stick-breaking Betas)" if tname == "SimplexTransform" else "")
            + (f"; give the angle a prior on the reals instead, e.g. {name} = pm.Normal(\"{name}\", 0, 1.5): "
               "a pm.VonMises likelihood is periodic in its mu, so an angle need not be wrapped into (-pi, pi)"
               if tname == "CircularTransform" else "")
        )

    def _latent_covariance_readers(self, rv: Variable) -> str:
        """``"; it is the covariance of MvNormal b, ..."``: the MvNormals whose covariance reads ``rv``.

        The refusal of a ``pm.LKJCholeskyCov`` is raised on the Cholesky latent, before any
        MvNormal is reached: this names the variables the user wrote with it, and what
        pmkjit supports for them.
        """
        readers = [
            other.name for other in self.model.basic_RVs
            if type(other.owner.op).__name__ == "MvNormalRV"
            and latent_ancestors(other.owner.op.dist_params(other.owner)[1], [rv])
        ]
        if not readers:
            return ""
        return (f"; it is the covariance of MvNormal {', '.join(readers)}, and pmkjit supports MvNormal "
                f"{_MVNORMAL_SUPPORTED}")

    # ---------------------------------------------------------- decomposition
    def _decompose(self, var: Variable, plate: tuple[int, ...], owner: str) -> dict:
        """Leaves of ``var``: {id: (leaf variable, slot or scalar constant)} plus the rebuild order."""
        leaves: dict[int, tuple[Variable, object]] = {}
        self._walk(var, plate, owner, leaves, seen=set())
        return leaves

    def _walk(self, var: Variable, plate, owner: str, leaves: dict, seen: set, bound: bool = False) -> None:
        """Record the leaves of ``var``; ``bound``: a censoring bound, whose entries may be infinite."""
        if id(var) in seen:
            return
        seen.add(id(var))
        deps = latent_ancestors(var, self.latent_rvs)
        if not deps:
            value = np.asarray(evaluate_constant(var))
            if bound:
                # upper=np.where(censored, t, np.inf): an infinite entry is no bound for that
                # observation, which PyMC's censored density reads as such; NaN is still refused
                _finite(np.where(np.isinf(value), 0.0, value), owner, var)
                if value.size > 1:
                    # data, as 1e150: the same density for any observation below it; the
                    # importance oracle takes data as point masses, refuses infinite ones
                    # and rejects an entry whose point mass has no finite second moment
                    value = np.clip(np.asarray(value, dtype=float), -NO_BOUND, NO_BOUND)
            else:
                value = _finite(value, owner, var)
            if value.size == 1:
                leaves[id(var)] = (var, float(value.reshape(())))
            else:
                leaves[id(var)] = (var, DataSlot(self._broadcast(value, plate, owner, var), _label(var)))
            return
        dep_vars = [self.variables[d.name] for d in deps]
        if all(v.in_gaussian_block for v in dep_vars):
            affine = affine_coefficients(var, self.block, self.graph.n_theta, plate, self.rng)
            if affine is not None:
                A, c = affine
                if np.abs(A).max(initial=0.0) <= _CONSTANT_ATOL * max(1.0, np.abs(c).max(initial=0.0)):
                    # Latent in the graph but constant in value: pm.Gamma(mu=exp(eta),
                    # sigma=exp(eta) / 2) has alpha = mu**2 / sigma**2 = 4. As a linear slot
                    # with A = 0 it was a second latent input of zero cavity variance: the
                    # factor became a 2-D quadrature one, 196 s and not converged in 50
                    # sweeps at N = 50 (NUTS 3 s). A constant is what it is.
                    leaves[id(var)] = (var, float(c[0]) if np.all(c == c[0]) else DataSlot(c.copy(), _label(var)))
                    return
                constant = np.abs(A).max(axis=1) <= _CONSTANT_ATOL * max(1.0, np.abs(c).max(initial=0.0))
                if constant.any() and owner in self._splittable:
                    raise PartlyConstant(constant)
                leaves[id(var)] = (var, LinearSlot(A, c, _label(var)))
                return
        if len(deps) == 1 and not dep_vars[0].in_gaussian_block:
            index = self._element_index(var, deps[0], plate)
            if index is not None:
                leaves[id(var)] = (var, ElementSlot(deps[0].name, index, dep_vars[0].family, _label(var)))
                return
        node = var.owner
        if node is not None and isinstance(node.op, Elemwise):
            for inp in node.inputs:
                self._walk(inp, plate, owner, leaves, seen)
            return
        if node is not None and pass_through(node.op):
            self._walk(node.inputs[0], plate, owner, leaves, seen)
            return
        bad_shape = broadcast_mismatch(var, plate)
        if bad_shape is not None:
            # The usual cause: pm.set_data on the covariates or group index (40 rows) and
            # not on the observations (80). The affine and index probes cannot broadcast
            # such an expression, so it used to be refused for the wrong reason ("depends on
            # latent a through AdvancedSubtensor ..., neither affine ... nor elementwise").
            raise UnsupportedModelError(
                f"{owner}: an expression in its parameters ({_label(var)}) has shape {bad_shape}, which does not "
                f"broadcast to the variable's shape {tuple(plate)} (for a likelihood, the observed data's shape); after "
                "pm.set_data on covariates or indices, set the observations to the same length too"
            )
        # NaN data under a non-elementwise operation (a covariate matrix with a missing value
        # in X @ b) make the affine probe NaN: refused as "neither affine ... nor elementwise"
        # (robustness round 16), where the data are at fault
        _no_nan_data(var, owner)
        expanded, product = expand_product(var, self.latent_rvs), True
        if expanded is None:
            expanded, product = expand_reduction(var, self.latent_rvs), False  # sum(ab): ab[0] + ab[1]
        if expanded is not None:  # phi @ (beta * sqrt(psd(ell, eta))): column by column
            leaves[id(var)] = (var, Expanded(expanded, product))
            self._walk(expanded, plate, owner, leaves, seen)
            return
        if is_scalar_function(var, deps, [v.size for v in dep_vars], plate):  # prod(ls), dot(w ** 2, ls ** 2)
            for d in deps:
                self._walk(d, plate, owner, leaves, seen)
            entry = None
            if var.type.ndim and int(np.prod(var.type.shape)) > 1:
                entry = pt.constant(entries(var, plate).astype(float))
                leaves[id(entry)] = (entry, DataSlot(entry.data.copy(), f"entry of {_label(var)}"))
            leaves[id(var)] = (var, ScalarFunction(tuple(deps), entry))
            return
        op_name = type(node.op).__name__ if node is not None else "an input"
        inner = _inner_operations(var, self.latent_rvs)
        # a pm.Dirichlet's hidden stick-breaking Betas were named as the latents, and nothing
        # said why its element frac[k] could not be read (robustness round 20): name the
        # Dirichlet and what it can be read by
        names = list(dict.fromkeys(_stick_owner(d.name) for d in deps))
        dirichlets = [d.name for d in deps if d.name.startswith(STICK_PREFIX)]
        raise UnsupportedModelError(
            f"{owner}: its parameters depend on latent {', '.join(names)} through {op_name} "
            f"({_label(var)}{'; inside it: ' + inner if inner else ''}), which is neither affine in the "
            "real-valued latents nor elementwise; pmkjit "
            "needs each observation's parameters to be an elementwise function of linear predictors and "
            "scalar latents" + gaussian_process_hint(deps, inner)
            + ("; a pm.Dirichlet is read as a whole only (the p of a pm.Categorical or pm.Multinomial, or "
               "mixture weights), not element by element: a probability read alone is a pm.Beta of its own "
               "(frac[k] of pm.Dirichlet(a) is Beta(a[k], sum(a) - a[k]) a priori)" if dirichlets else "")
        )

    def _element_index(self, var: Variable, rv: Variable, plate) -> np.ndarray | None:
        """Indices into ``rv`` if ``var`` only selects or broadcasts its elements.

        Probed at ``i + 0.25`` and ``3 i + 1.75`` for element ``i``: values that no power or
        other simple function of the latent maps onto themselves (the probes 0, 1, 2 i + 1
        of a scalar were fixed points of ``s**2`` and ``sqrt(s)``, so ``sigma=s**2`` was read
        as ``sigma=s``).
        """
        size = self.variables[rv.name].size
        shape = self.variables[rv.name].shape
        probe = pt.vector("probe", shape=(size,))
        expr = pytensor.clone_replace(var, {rv: probe.reshape(shape)})
        base = np.arange(size, dtype=float)
        try:
            f = compile_function([probe], expr)
            with np.errstate(all="ignore"):
                idx = np.broadcast_to(np.asarray(f(base + 0.25), dtype=float), plate) - 0.25
                moved = np.broadcast_to(np.asarray(f(3.0 * base + 1.75), dtype=float), plate)
        except (ValueError, TypeError):
            return None
        if not np.all(np.isfinite(idx)) or not np.allclose(idx, np.round(idx), rtol=0.0, atol=1e-9):
            return None
        idx = np.round(idx)
        if idx.size and (idx.min() < 0 or idx.max() >= size) or not np.allclose(moved, 3.0 * idx + 1.75, rtol=1e-12, atol=0.0):
            return None
        return idx.astype(np.int64).ravel()

    def _broadcast(self, value: np.ndarray, plate, owner: str, var) -> np.ndarray:
        try:
            return np.broadcast_to(np.asarray(value, dtype=float), plate).ravel().copy()
        except ValueError:
            # an unnamed constant (a numpy covariate in ``b * x``) has its values as its str:
            # the message printed "parameter [ 1.230153 ... 74900e-01]"
            what = f"parameter {var.name}" if var.name else "a constant array (data) in its parameters"
            raise UnsupportedModelError(
                f"{owner}: {what} of shape {np.shape(value)} does not broadcast to the variable's shape {plate} "
                "(for a likelihood, the observed data's shape)"
            ) from None

    def _rebuild(self, params: Sequence[Variable], leaves: dict) -> tuple[list, list, list[Variable]]:
        """Parameters as graphs of flat vectors: (inputs in slot order, slots, flat parameter graphs)."""
        inputs, slots, memo = [], [], {}
        rewritten = {}
        for key, (leaf, slot) in leaves.items():
            if isinstance(slot, (Expanded, ScalarFunction)):
                rewritten[key] = slot  # rebuilt from the slots it reads, below
            elif isinstance(slot, float):
                memo[key] = pt.constant(slot)
            else:
                # The same latent quantity reached twice (kappa in both Beta parameters
                # mu * kappa and (1 - mu) * kappa; eta in exp(eta) and 0.5 * eta + 1) is one
                # input: two slots would be two independent EP variables, each given a site
                # by the same factor, which counts the factor twice.
                match = next(((j, sc) for j, t in enumerate(slots) if (sc := _slot_scale(t, slot)) is not None), None)
                if match is not None:
                    same, scale = match
                    base = inputs[same] if scale == 1.0 else float(scale) * inputs[same]
                    offset = slot.c - scale * slots[same].c if isinstance(slot, LinearSlot) else None
                    if offset is None or not np.any(offset):
                        memo[key] = base
                        continue
                    if np.all(offset == offset[0]):
                        memo[key] = base + float(offset[0])
                        continue
                    d = pt.vector(f"in{len(inputs)}")
                    inputs.append(d)
                    slots.append(DataSlot(offset, f"{slot.label} - {scale:g} x {slots[same].label}"))
                    memo[key] = base + d
                    continue
                v = pt.vector(f"in{len(inputs)}")
                memo[key] = v
                inputs.append(v)
                slots.append(slot)

        def rebuild(var: Variable) -> Variable:
            if id(var) in memo:
                return memo[id(var)]
            node = var.owner
            if isinstance(rewritten.get(id(var)), Expanded):
                out = rebuild(rewritten[id(var)].expression)
            elif id(var) in rewritten:
                found = rewritten[id(var)]
                out = vectorised_scalar_function(var, found.latents, [rebuild(d) for d in found.latents],
                                                 None if found.entry is None else rebuild(found.entry))
            elif pass_through(node.op):
                out = rebuild(node.inputs[0])
            else:
                out = node.op(*[rebuild(i) for i in node.inputs])
                if isinstance(out, (list, tuple)):
                    out = out[node.outputs.index(var)]
            memo[id(var)] = out
            return out

        return inputs, slots, [rebuild(p) for p in params]

    # ---------------------------------------------------------------- factors
    def _prior(self, rv: Variable) -> None:
        var = self.variables[rv.name]
        plate = var.shape
        op = rv.owner.op
        params = [lift_indexing(p) for p in dist_params(rv)]
        opname = type(op).__name__
        if opname in ("FlatRV", "HalfFlatRV"):
            self.graph.improper_prior.append(rv.name)
            return
        if var.in_gaussian_block:
            if opname == "NormalRV" and self._try_gaussian_term(rv, params, prior=True):
                return
            if opname == "NormalRV" and self._try_normal_scale(rv, params, prior=True):
                return
            if opname == "MvNormalRV":
                self._mvnormal(rv, params, prior=True)
                return
            if opname == "RandomWalkRV":
                self._random_walk_prior(rv)
                return
            if opname == "AutoRegressiveRV":
                self._autoregressive_prior(rv)
                return
            if opname == "ZeroSumNormalRV":
                self._zero_sum_prior(rv)
                return
            if opname == "ICARRV":
                self._icar_prior(rv)
                return
        else:
            consts = [self._constant(p, rv.name) for p in params]
            if all(c is not None for c in consts):
                natural = _conjugate_prior(opname, var.family, consts)
                if natural is not None:
                    natural = np.broadcast_to(natural, plate + (2,)).reshape(-1, 2)
                    self.graph.element_sites.append(
                        ElementSite(f"prior of {rv.name}", rv.name, np.arange(var.size), natural.copy())
                    )
                    return
        if getattr(op, "ndim_supp", 0) != 0:
            raise UnsupportedModelError(f"{rv.name}: multivariate prior {opname} with random parameters")
        output = (
            LinearSlot(_unit_rows(var, self.graph.n_theta), np.zeros(var.size), rv.name)
            if var.in_gaussian_block
            else ElementSlot(rv.name, np.arange(var.size), var.family, rv.name)
        )
        self._black_box(rv, params, plate, kind="prior", output=output)

    def _likelihood(self, rv: Variable) -> None:
        if type(rv.owner.op).__name__ == "MinibatchRandomVariable":
            # total_size= reweights the log-likelihood by total_size / N (minibatch ADVI);
            # the op wraps the distribution, so the walk would fail on it obscurely
            raise UnsupportedModelError(
                f"{rv.name}: total_size= (a minibatch likelihood, scaled by total_size / N) is not supported; "
                "EP needs the full data set as observed and no total_size"
            )
        op = rv.owner.op
        y = np.asarray(self.model.rvs_to_values[rv].data if hasattr(self.model.rvs_to_values[rv], "data")
                       else evaluate_constant(self.model.rvs_to_values[rv]), dtype=float)
        if not np.all(np.isfinite(y)):
            bad = np.argwhere(~np.isfinite(y))[0].tolist()
            raise InvalidDataError(f"observed {rv.name} has non-finite values (first at index {bad})")
        partial = partial_observed(rv)
        if type(op).__name__ == "MultinomialRV" and partial is None and y.ndim == 2:
            self._multinomial(rv, y)
            self._check_support(rv, y)
            return
        if type(op).__name__ == "MvNormalRV":
            # rows missing whole (NaN everywhere) are already gone: PyMC imputes them as a
            # separate MvNormal latent that nothing reads (drawn from its predictive)
            params = [lift_indexing(p) for p in dist_params(rv)]
            if not any(latent_ancestors(p, self.latent_rvs) for p in params):
                return  # no latent parameter: a constant factor
            if latent_ancestors(params[1], self.latent_rvs):
                # a latent covariance of a few scalars (a Gaussian process's marginal
                # likelihood) is one factor of them; of more, refused naming them
                if not self._scalar_likelihood(rv, y):
                    self._mvnormal(rv, params, prior=False, y=y)
                return
            try:
                self._mvnormal(rv, params, prior=False, y=y)
            except _NotAffineMean:
                if not self._scalar_likelihood(rv, y):  # a mean of a few scalars: one factor of them
                    raise
            return
        if partial is not None and type(partial[0].owner.op).__name__ == "MvNormalRV":
            refuse_partly_missing_rows(rv, partial[1])
        if getattr(op, "ndim_supp", 0) != 0:
            if partial is None and self._scalar_likelihood(rv, y):
                return
            # named by the distribution, not by PyMC's PartialObservedRV around it (an
            # MvNormal with a NaN in some of a row's entries)
            dist = op if partial is None else partial[0].owner.op
            raise UnsupportedModelError(
                f"{rv.name}: multivariate likelihood {distribution_label(dist)} is supported where its parameters "
                f"read at most {MAX_SCALARS} latent elements in all, and these read "
                f"{_element_count(dist_params(rv), self.latent_rvs, self.variables)}; write it elementwise"
                + ELEMENTWISE_HINTS.get(type(dist).__name__, "").format(name=rv.name)
            )
        if partial is None:
            self._likelihood_entries(rv, y, None)
        else:
            # PyMC imputes the missing entries of a symbolic distribution (Weibull,
            # pm.Truncated, a CustomDist with dist=) with a PartialObservedRV node over the
            # whole variable, whose observed output is the entries ~mask of it: those
            # entries of the whole variable's distribution are this likelihood
            base, observed = partial
            full = np.full(observed.shape, np.nan)
            full[observed] = y.ravel()
            self._likelihood_entries(base, full, observed, whole=observed)
        # after the walk, which refuses NaN in the parameters with that reason (a NaN
        # covariate also makes the entry's density -inf)
        self._check_support(rv, y)

    def _scalar_likelihood(self, rv: Variable, y: np.ndarray) -> bool:
        """One factor for a multivariate likelihood whose parameters read at most
        ``MAX_SCALARS`` latent elements in all (:mod:`pmkjit.graph.multivariate`); False,
        adding nothing, where they read more (refused by the caller, naming them)."""
        latents = list(dict.fromkeys(d for p in dist_params(rv) for d in latent_ancestors(p, self.latent_rvs)))
        shapes = [self.variables[d.name].shape for d in latents]
        counts = [int(np.prod(s, dtype=int)) for s in shapes]
        if not latents or sum(counts) > MAX_SCALARS:
            return False
        leaves: dict = {}
        seen: set = set()
        for d, shape, count in zip(latents, shapes, counts):
            flat = d.ravel() if shape else d
            for k in range(count):
                self._walk(flat[k] if shape else flat, (1,), rv.name, leaves, seen)
        slots = [slot for _, slot in leaves.values()]
        if len(slots) != sum(counts):
            return False
        size = _entries(dist_params(rv), y)
        log_density, fingerprint = scalar_log_density(self.model, rv, y, list(zip(latents, shapes)), size)
        label = distribution_label(rv.owner.op)
        # The density's own support check is the only one this observation gets (the
        # elementwise one cannot read it): where no prior draw of the latents gives it a
        # finite density, the data are outside the support, and every grid would be empty
        n = 16
        drawn = pm.draw(latents, draws=n, random_seed=int(self.rng.integers(2**31 - 1)))
        points = [a for d in drawn for a in np.asarray(d, dtype=float).reshape(n, -1).T]
        if not np.any(np.isfinite(log_density(points))):
            raise InvalidDataError(
                f"observed {rv.name}: its {label} density is zero at all of {n} prior draws of "
                f"{', '.join(dict.fromkeys(_stick_owner(d.name) for d in latents))}; check that the observed values "
                "lie in its support (a DirichletMultinomial's rows must sum to n)"
            )

        def logp(x, ins, _f=log_density):
            # the observation is inside the density: ``x`` is the factor's one stand-in entry
            return _f([np.broadcast_to(a, np.shape(x)) for a in ins])

        def sampler(ins, rng, _name=rv.name, _what=label):  # EP never draws from a likelihood's output
            raise UnsupportedModelError(f"{_name}: the {_what} likelihood of scalar latents has no elementwise sampler")

        names = ", ".join(dict.fromkeys(_stick_owner(d.name) for d in latents))
        self.graph.factors.append(BlackBoxFactor(
            name=rv.name, kind="likelihood", inputs=slots, sampler=sampler, logp=logp, density_source="pymc",
            key=f"likelihood-scalars-{fingerprint}", description=f"{rv.name}: likelihood {label} of {names}",
            observed=np.zeros(1), size=1, evaluation_cost=size,
        ))
        return True

    def _likelihood_entries(self, rv: Variable, y: np.ndarray, mask: np.ndarray | None,
                            whole: np.ndarray | None = None) -> None:
        """The factors of the entries ``mask`` of likelihood ``rv`` (all of them for ``None``).

        Entries whose parameters read a latent in some places and only data in others
        (``a + b * x`` with a covariate ``x`` that has missing values, which PyMC imputes
        as latents: ``x`` joins the data and ``x_unobserved``) are split into factors of
        their own, so that every slot of a factor is latent in all of its instances: a
        slot that is constant for some instances gave those instances a cavity of zero
        variance, which EP skipped as improper, and the factor's information was lost.
        ``whole``: the entries that make up the observed variable (its observed entries
        when ``rv`` is the whole of a partly observed variable), all of them for ``None``.
        """
        graph = self.graph
        start = len(graph.factors)
        sizes = len(graph.gaussian_terms), len(graph.element_sites)
        try:
            self._likelihood_factor(rv, y, mask)
        except PartlyConstant as split:
            full = np.ones(y.shape, bool) if mask is None else mask
            constant = np.zeros(y.shape, bool)
            constant[full] = split.rows  # split.rows follows the selected entries in C order
            del graph.factors[start:], graph.gaussian_terms[sizes[0]:], graph.element_sites[sizes[1]:]
            self._likelihood_entries(rv, y, constant, whole)
            self._likelihood_entries(rv, y, full & ~constant, whole)
            return
        if mask is not None and (whole is None or not np.array_equal(mask, whole)):
            total = mask.size if whole is None else int(whole.sum())
            label = f"{rv.name} ({int(mask.sum())} of {total} entries)"
            for f in self.graph.factors[start:]:
                f.name = label
                f.description = f.description.replace(rv.name, label, 1)

    def _likelihood_factor(self, rv: Variable, y: np.ndarray, mask: np.ndarray | None) -> None:
        op = rv.owner.op
        opname = type(op).__name__
        if opname == "CategoricalRV":
            self._categorical(rv, y, mask)
            return
        params = [lift_indexing(p) for p in dist_params(rv)]
        if mask is not None:
            params = [lift_indexing(select_entries(p, y.shape, mask)) for p in params]
            y = y[mask]
        plate = y.shape
        params = self._data_switches(params, plate, rv.name)
        if not any(latent_ancestors(p, self.latent_rvs) for p in params):
            return  # no latent parameter: a constant factor
        if opname == "NormalRV" and self._try_gaussian_term(rv, params, prior=False, y=y):
            return
        if opname in _CONJUGATE and self._try_conjugate(rv, opname, params, y):
            return
        if opname == "NormalRV" and self._try_normal_scale(rv, params, prior=False, y=y):
            return
        if opname == "LogNormalRV" and np.all(y > 0):
            # log y ~ Normal(mu, sigma): the density differs by the constant Jacobian 1/y only, so
            # the exact and semi-analytic Normal factors apply to the logged observations
            log_y = np.log(y)
            if self._try_gaussian_term(rv, params, prior=False, y=log_y):
                return
            if self._try_normal_scale(rv, params, prior=False, y=log_y):
                return
        if opname in _SPLIT and self._try_split(rv, opname, params, y):
            return
        self._black_box(rv, params, plate, kind="likelihood", observed=y.ravel())

    def _data_switches(self, params: list[Variable], plate: tuple[int, ...], owner: str) -> list[Variable]:
        """``params`` with each choice between latents made by data resolved entry by entry.

        A switch over latents with a condition that is data (a known changepoint,
        ``pm.math.switch(t >= 40, late, early)``; ``pm.math.where``) reads both branches'
        latents in every entry, though each entry's density depends on one of them: a
        Poisson of two Gamma rates became one black-box factor of both rates, answered by
        importance sampling (not converged in 50 sweeps, 58 s, where NUTS takes 2 s). The
        same holds for a product with data that is zero in some entries, the indicator
        arithmetic ``early * (t < 40) + late * (t >= 40)`` (a factor of four inputs, the
        two rates and both indicators: 22 s, not converged). Where the choice is the same
        at every entry of ``plate`` the switch is its branch and the product with zeros is
        0; where it differs, a likelihood is split into the entries on either side
        (``PartlyConstant``, as for a partly constant slot: each side is then one branch,
        here a conjugate Poisson of one rate). A product with data other than 0/1 is split
        only where its zero entries read no latent at all (an exposure of 0); a covariate's
        zero that leaves other latents read (``k * t`` at ``t = 0``) chooses nothing. A
        choice affine in the real-valued latents as a whole (``where(x > 0, b1 * x, b2 * x)``,
        ``b1 * treated``) is one linear slot already and is left as it is, and so is one met
        below a non-elementwise operation, whose data do not follow the entries.
        """
        while True:
            for node in elementwise_nodes(params):
                out = node.outputs[0]
                choice = self._data_choice(node, plate)
                if choice is None:
                    continue
                chosen, if_true, if_false, indicators = choice
                if chosen.all() or not chosen.any():
                    replacement = if_true if chosen.all() else if_false
                    if replacement is None:
                        continue  # a product with data that is nowhere zero: nothing to resolve
                    params = replace_elementwise(params, out, replacement)
                    break  # new nodes above it: look again
                if not indicators and any(latent_ancestors(p, self.latent_rvs)
                                          for p in replace_elementwise(params, out, if_false)):
                    # A covariate that is zero at some entries (k * t at t = 0 of a decay
                    # c + A * exp(-k * t)) picks no branch where those entries still read
                    # latents: split off, they became a factor of their own (reading c + A),
                    # and the rest, fitted as one site over (c, A, k), lost the correlation of
                    # c and A (a Poisson decay: sds 0.43-0.72 of NUTS's, robustness round 44).
                    # Where they read none (an exposure of 0) they are a constant factor.
                    continue
                deps = latent_ancestors(out, self.latent_rvs)
                if owner in self._splittable and not (
                    all(self.variables[d.name].in_gaussian_block for d in deps)
                    and affine_coefficients(out, self.block, self.graph.n_theta, plate, self.rng) is not None
                ):
                    raise PartlyConstant(chosen.ravel())
            else:
                return params

    def _data_choice(self, node, plate: tuple[int, ...]) -> tuple[np.ndarray, Variable | None, Variable, bool] | None:
        """For a switch on data or a product with data, over latents: (entries choosing the first
        way, what the node is where all do, what it is where none do, whether the data are all
        0 or 1); None for any other node.

        A switch chooses its first branch where its condition holds; a product is itself
        where its data factors are nonzero and 0 where one is zero.
        """
        if not isinstance(node.op, Elemwise) or len(node.outputs) != 1:
            return None
        out = node.outputs[0]
        if isinstance(node.op.scalar_op, ScalarSwitch):
            data, first, other = [node.inputs[0]], node.inputs[1], node.inputs[2]
        elif isinstance(node.op.scalar_op, ScalarMul):
            data = [i for i in node.inputs if not latent_ancestors(i, self.latent_rvs)]
            first, other = None, pt.constant(np.zeros((), dtype=out.dtype))
        else:
            return None
        if not data or any(latent_ancestors(d, self.latent_rvs) for d in data) \
                or not latent_ancestors(out, self.latent_rvs):
            return None
        try:
            chosen = np.ones(plate, bool)
            indicators = True
            for d in data:
                value = _stored_value(d)
                if value is None:
                    value = evaluate_constant(d)
                value = np.broadcast_to(np.asarray(value), plate)
                chosen = chosen & value.astype(bool)
                indicators = indicators and bool(np.isin(value, (0, 1)).all())
        except ValueError:
            return None  # does not follow the entries: left to the walk
        return chosen, first, other, indicators

    def _categorical(self, rv: Variable, y: np.ndarray, mask: np.ndarray | None) -> None:
        """``pm.Categorical(p=softmax(eta, axis=-1))`` or ``logit_p=eta``: one black-box factor.

        The ``K`` columns of ``eta`` are the factor's inputs (linear predictors, one slot
        each; a constant reference column is a constant): each observation's class
        probabilities are a softmax of its ``K`` linear predictors, which no elementwise
        parameter expresses, so the factor rebuilds the softmax over its flat inputs.
        """
        p = dist_params(rv)[0]
        # the observed rows of a variable with missing values: PyMC's y_observed reads
        # p[observed_mask] of the whole variable's probabilities
        rows = None
        if (p.owner is not None and type(p.owner.op).__name__ in ("AdvancedSubtensor", "AdvancedSubtensor1")
                and len(p.owner.inputs) == 2 and p.owner.inputs[0].ndim == p.ndim == 2
                and not latent_ancestors(p.owner.inputs[1], self.latent_rvs)):
            rows = np.asarray(evaluate_constant(p.owner.inputs[1]))
            p = p.owner.inputs[0]
            n_full = p.type.shape[0]
            if n_full is None:
                n_full = int(np.asarray(evaluate_constant(p.shape[0])))
            rows = (n_full, rows)
        p = unbroadcast(p)
        eta = softmax_input(p)
        ordinal = None if eta is not None else ordinal_parts(p)
        if ordinal is not None:
            self._ordinal(rv, y, mask, *ordinal, rows=rows)
            return
        # "CategoricalRV" first: pm.OrderedLogistic and pm.OrderedProbit build one too
        refusal = (f"{rv.name}: CategoricalRV with these class probabilities ({_label(p)}) is not supported: pmkjit "
                   "reads pm.Categorical with p=pm.math.softmax(eta, axis=-1) or logit_p=eta, eta affine in the "
                   "real-valued latents (multinomial logistic regression), with one vector p of elementwise "
                   "expressions shared by all observations (e.g. a pm.Dirichlet), pm.OrderedLogistic and "
                   "pm.OrderedProbit (sigma=1)")
        if eta is None and p.ndim == 1:
            # class probabilities that are elementwise expressions of the latents, one per
            # class (a Dirichlet's stick-breaking weights): a factor of the latents they read
            try:
                self._categorical_probabilities(rv, last_axis_columns(p), y, mask)
            except InvalidDataError:
                raise  # bad data, not an unsupported model: its own message
            except UnsupportedModelError as err:
                raise UnsupportedModelError(f"{refusal} ({err})") from None
            return
        if eta is None:
            raise UnsupportedModelError(refusal)
        columns, y = categorical_entries(last_axis_columns(eta), y, mask, rows)
        if not any(latent_ancestors(c, self.latent_rvs) for c in columns):
            return  # constant class probabilities: a constant factor
        self._class_factor(
            rv, columns, y,
            lambda flat: pt.special.softmax(pt.stack(flat, axis=-1), axis=-1),
            lambda flat: pt.special.log_softmax(pt.stack(flat, axis=-1), axis=-1),  # no underflow to log(0)
            joint="class predictors",
        )

    def _categorical_probabilities(self, rv: Variable, columns: list, y: np.ndarray, mask) -> None:
        """``pm.Categorical(p)`` with ``p`` one vector of class probabilities read by every observation.

        ``columns`` are the ``K`` probabilities, expressions of the latents (``w`` of a
        ``pm.Dirichlet`` is ``K - 1`` stick-breaking Betas, see :mod:`pmkjit.graph.simplex`).
        Each observation's density is ``log(p_y / sum_k p_k)``, as PyMC normalises ``p``; the
        factor's inputs are the latents the columns read, with factorised sites (for
        stick-breaking Betas the tilted law of a class is a product over the sticks, so the
        sites are exact).
        """
        if mask is not None:
            y = y[mask]
        if not any(latent_ancestors(c, self.latent_rvs) for c in columns):
            return

        def log_p(flat: list) -> Variable:
            probs = pt.stack(flat, axis=-1)
            return pt.log(probs) - pt.log(pt.sum(probs, axis=-1, keepdims=True))

        self._class_factor(rv, columns, y, lambda flat: pt.exp(log_p(flat)), log_p, joint=None)

    def _multinomial(self, rv: Variable, counts: np.ndarray) -> None:
        """``pm.Multinomial(n, p=softmax(eta, axis=-1))``: counts ``(N, K)`` over softmax classes.

        The log-likelihood of a row is ``sum_k y_k log p_k`` up to a constant, so the
        counts enter the factor as data inputs beside the class predictors, which share
        one joint site per row as a categorical's do.
        """
        n, p = dist_params(rv)
        if latent_ancestors(n, self.latent_rvs):
            raise UnsupportedModelError(f"{rv.name}: a pm.Multinomial with a latent number of trials is not supported")
        p = unbroadcast(p)
        eta = softmax_input(p)
        # p=softmax(eta): the classes' predictors share a joint site; a single vector of
        # probabilities (a Dirichlet's stick-breaking weights) is read elementwise
        general = eta is None and p.ndim == 1
        if eta is None and not general:
            raise UnsupportedModelError(
                f"{rv.name}: pm.Multinomial is supported with p=pm.math.softmax(eta, axis=-1), eta affine in the "
                f"real-valued latents, or with one vector p shared by all rows; its p here is {_label(p)}"
            )
        columns = last_axis_columns(p if general else eta)
        K = len(columns)
        if not any(latent_ancestors(c, self.latent_rvs) for c in columns):
            return
        data = [pt.as_tensor_variable(np.ascontiguousarray(counts[:, k])) for k in range(K)]

        def log_probabilities(inputs: Variable) -> Variable:
            if not general:
                return pt.special.log_softmax(inputs, axis=-1)
            return pt.log(inputs) - pt.log(pt.sum(inputs, axis=-1, keepdims=True))  # PyMC normalises p

        def log_p(flat: list) -> Variable:
            # the counts are data inputs, whose flat vectors follow the predictors'
            eta_flat, y_flat = flat[:K], flat[K:]
            terms = pt.stack(y_flat, axis=-1) * log_probabilities(pt.stack(eta_flat, axis=-1))
            return pt.sum(pt.switch(pt.eq(pt.stack(y_flat, axis=-1), 0), 0.0, terms), axis=-1)

        def make_dist(flat: list) -> Variable:  # a stand-in sampler: EP never draws from a likelihood
            return pm.Categorical.dist(p=pt.exp(log_probabilities(pt.stack(flat[:K], axis=-1))))

        def make_logp(flat: list, value: Variable) -> Variable:
            return log_p(flat)

        n_factors = len(self.graph.factors)
        self._black_box(rv, columns + data, (counts.shape[0],), kind="likelihood",
                        observed=np.zeros(counts.shape[0]), make_dist=make_dist, make_logp=make_logp)
        if not general:
            self._make_joint(rv, n_factors, what="class predictors")

    def _class_factor(self, rv: Variable, columns: list, y: np.ndarray, make_p, log_p, *,
                      joint: str | None) -> None:
        """A categorical likelihood of ``columns``.

        ``joint`` names the latent inputs when they share one joint Gaussian site (class
        predictors, an ordinal outcome's predictor and cutpoints); ``None`` keeps the usual
        factorised sites (class probabilities read elementwise). ``make_p(flat)`` gives the class probabilities ``(n, K)`` from the flat inputs and
        ``log_p(flat)`` their logarithms. The factor's log-density is ``log_p[y]`` alone,
        ``-inf`` where it is not finite: PyMC's categorical density is ``-inf`` wherever
        any class's probability is negative, which for ordinal cutpoints out of order cut
        the tilted law along every cutpoint, also those the observation does not read, and
        a grid cannot integrate such a jump (an ordered logit's cutpoints' tilted means 0.5
        prior sd off); latent cutpoints are kept in order by factors of their own
        (``_order_factor``).
        """

        # every column is one class's predictor (a softmax) or the linear predictor and the
        # cutpoints (an ordinal outcome: one class more than cutpoints): K classes either way
        K = len(columns)
        bad = (y < 0) | (y > K - 1) | (y != np.round(y))
        if bad.any():
            # PyMC's density is -inf there (pm.sample refuses the model); the factor's
            # log p[y] read class K as an index error and class -1 as the last class
            raise InvalidDataError(
                f"{rv.name}: the observed value {y.ravel()[np.flatnonzero(bad.ravel())[0]]:g} ({int(bad.sum())} of "
                f"{y.size} entries) is not a class of this outcome (0 to {K - 1}); pm.sample refuses it too"
            )

        def categorical(flat: list) -> Variable:
            return pm.Categorical.dist(p=make_p(flat))

        def logp(flat: list, value: Variable) -> Variable:
            lp = pt.take_along_axis(log_p(flat), pt.cast(value, "int64")[:, None], axis=-1)[:, 0]
            return pt.switch(pt.isnan(lp), -np.inf, lp)

        n_factors = len(self.graph.factors)
        self._black_box(rv, columns, y.shape, kind="likelihood", observed=y.ravel(), make_dist=categorical,
                        make_logp=logp)
        if joint is not None:
            self._make_joint(rv, n_factors, joint)

    def _make_joint(self, rv: Variable, n_factors: int, what: str) -> None:
        """Give the factor just built (if any) one joint Gaussian site over its latent inputs."""
        if len(self.graph.factors) == n_factors:
            return
        f = self.graph.factors[-1]
        slots = [f.inputs[i] for i in f.latent_inputs]
        if len(slots) < 2:
            return
        if not all(isinstance(s, LinearSlot) for s in slots):
            raise UnsupportedModelError(
                f"{rv.name}: a categorical outcome whose {what} read a positive or unit-interval latent is not "
                "supported; pmkjit needs them affine in real-valued latents"
            )
        # one joint Gaussian site per observation over the inputs (pmkjit.ep.joint)
        f.pair_slots = pair_slots(slots)
        f.description += f" (joint site over {len(slots)} {what})"

    def _ordinal(self, rv: Variable, y: np.ndarray, mask: np.ndarray | None, eta: Variable,
                 cutpoints: Variable, compute_p, rows=None) -> None:
        """``pm.OrderedLogistic`` or ``pm.OrderedProbit(eta, cutpoints)``: ``eta`` and each cutpoint are inputs.

        With latent cutpoints the inputs share one joint site per observation, as a
        softmax's class predictors do (``_categorical``): the outcome's probabilities
        depend on the differences ``c_k - eta``.
        """
        columns, y = categorical_entries([lift_indexing(eta)] + last_axis_columns(cutpoints), y, mask, rows)
        if not any(latent_ancestors(c, self.latent_rvs) for c in columns):
            return

        def ordinal_p(flat: list) -> Variable:
            return compute_p(flat[0], pt.stack(flat[1:], axis=-1))

        self._class_factor(rv, columns, y, ordinal_p, lambda flat: pt.log(ordinal_p(flat)),
                           joint="linear predictor and cutpoints")

    def _check_support(self, rv: Variable, y: np.ndarray) -> None:
        """Refuse observed values of zero density (outside the distribution's support).

        The conjugate and split factors only read the observation into natural parameters:
        a Bernoulli 2, a Binomial count above n or a negative Exponential time gave a
        posterior without complaint, and a Beta observation of exactly 1 had its instance's
        site silently skipped. PyMC's log-density is evaluated elementwise at the model's
        initial point and at two jittered points; an entry that is ``-inf`` at all three is
        refused (``pm.sample`` refuses such a model at its starting point too).
        """
        if self._support_logp is None:
            self._support_logp = _observed_logps(self.model, self.rng)
        values = self._support_logp.get(rv.name)
        # a multivariate likelihood (pm.Multinomial) has one density per row of y
        if values is None or values[0].shape != y.shape[:y.ndim - getattr(rv.owner.op, "ndim_supp", 0)]:
            return
        bad = np.all([np.isneginf(v) for v in values], axis=0)
        if not bad.any():
            return
        if type(rv.owner.op).__name__.startswith(POTENTIAL_PREFIX):
            raise InvalidDataError(f"{rv.name}: the potential is -inf for every value of the latents tried, so the "
                                   "model has no density anywhere; pm.sample refuses it too")
        idx = np.argwhere(bad)[0]
        what = (f"value {y[tuple(idx)]:g} (index {idx.tolist()}, {int(bad.sum())} of {y.size} entries)"
                if bad.shape == y.shape else
                f"row [{', '.join(f'{v:g}' for v in y[tuple(idx)])}] (index {idx.tolist()}, {int(bad.sum())} of "
                f"{bad.size} rows)")
        law = type(rv.owner.op).__name__[:-2] or type(rv.owner.op).__name__
        if bad.all() and bad.size > 1:
            # every entry at once is a parameter out of its range (sigma=-1) more often than data
            raise InvalidDataError(
                f"{rv.name}: every observed {'value' if bad.shape == y.shape else 'row'} has zero density under "
                f"{law} for any value of the latents tried (the first: {what}): a parameter is out of its range "
                "(a scale of 0 or below, a probability outside [0, 1], n below the counts), or the data lie outside "
                "the distribution's support; pm.sample refuses it too")
        raise InvalidDataError(
            f"{rv.name}: the observed {what} has zero density under {law} "
            "for any value of the latents tried: it lies outside the distribution's support (e.g. a count "
            "above n, a negative time, a proportion of exactly 0 or 1 for a Beta, a multinomial row that "
            "does not sum to n); pm.sample refuses it too"
        )

    def _constant(self, p: Variable, owner: str) -> np.ndarray | None:
        if latent_ancestors(p, self.latent_rvs):
            return None
        return _finite(evaluate_constant(p), owner, p)

    def _affine_mean(self, mu: Variable, plate: tuple[int, ...], owner: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``mu`` broadcast to ``plate`` and flattened, as ``(A, c)`` with ``mu = A @ theta + c``.

        A constant has ``A = 0``; ``None`` when ``mu`` reads a latent outside the Gaussian
        block or is not affine in it (the caller then tries another factor or refuses).
        """
        value = self._constant(mu, owner)
        if value is not None:
            B = int(np.prod(plate, dtype=int))
            return np.zeros((B, self.graph.n_theta)), self._broadcast(value, plate, owner, mu)
        if not all(self.variables[d.name].in_gaussian_block for d in latent_ancestors(mu, self.latent_rvs)):
            return None
        return affine_coefficients(mu, self.block, self.graph.n_theta, plate, self.rng)

    def _try_gaussian_term(self, rv, params, *, prior: bool, y=None, rows=None, plate=None, label=None) -> bool:
        """Exact Normal factor: constant scale, affine mean.

        ``rows`` (with its ``plate``) replaces the prior's variable by linear combinations of
        the Gaussian block (a random walk's increments); ``label`` names the term.
        """
        mu, sigma = params
        sigma_v = self._constant(sigma, rv.name)
        if sigma_v is None:
            return False
        if plate is None:
            plate = self.variables[rv.name].shape if prior else y.shape
        mean = self._affine_mean(mu, plate, rv.name)
        if mean is None:
            return False
        A, c = mean
        B = c.shape[0]
        prec = 1.0 / self._broadcast(sigma_v, plate, rv.name, sigma) ** 2
        if prior:
            unit = _unit_rows(self.variables[rv.name], self.graph.n_theta) if rows is None else rows
            R, target = unit - A, np.zeros(B)
            c = -c
        else:
            R, target = A, y.ravel()
        name = f"prior of {label or rv.name}" if prior else f"likelihood of {rv.name}"
        self.graph.gaussian_terms.append(GaussianTerm(name, R, c, target, prec))
        return True

    def _try_normal_scale(self, rv, params, *, prior: bool, y=None, rows=None, plate=None, label=None) -> bool:
        """Normal with an affine mean and a latent Gamma- or Beta-family scale, precision or variance.

        ``rows``, ``plate`` and ``label`` as for :meth:`_try_gaussian_term`.
        """
        mu, sigma = params
        deps = latent_ancestors(sigma, self.latent_rvs)
        if len(deps) != 1 or self.variables[deps[0].name].family not in (Gamma, Beta):
            return False
        var = self.variables[rv.name] if prior else None
        if plate is None:
            plate = var.shape if prior else y.shape
        D, B = self.graph.n_theta, int(np.prod(plate, dtype=int))
        # a variance (sigma=pm.math.sqrt(s2), s2 ~ pm.InverseGamma: the conjugate habit of BUGS
        # models) was a black-box prior or a 2-D quadrature likelihood: a hierarchical variance's
        # posterior sd 0.79 of NUTS's (robustness round 31), where the Normal given it is exact
        links = (("identity", "normal-scale"), ("rsqrt", "normal-precision"), ("sqrt", "normal-variance"))
        for link, name in links:
            found = self._scaled_linked_index(sigma, deps[0], plate, link)
            if found is not None:
                index, multiplier = found
                break
        else:
            return False
        if not prior and self._constant(mu, rv.name) is not None:
            return False  # a constant mean leaves one latent: plain 1-D quadrature is exact
        mean = self._affine_mean(mu, plate, rv.name)
        if mean is None:
            return False
        A, c = mean
        if prior:  # the residual x - mu, "observed" at 0
            A, c, observed = (_unit_rows(var, D) if rows is None else rows) - A, -c, np.zeros(B)
        else:
            observed = y.ravel()
        if not np.allclose(multiplier, 1.0, rtol=1e-12, atol=0.0):
            # sd = m * s with constants m (sigma ~ pm.Uniform(0, 50), rescaled as 50 * u;
            # weights s / sqrt(w)): N(y; eta, m^2 s^2) is N(y / m; eta / m, s^2) / m, the same
            # factor in s up to a constant per entry, so the observation and the mean are
            # divided by m. It was 2-D quadrature (or the grid): Rethinking's height model with
            # sigma ~ Uniform(0, 50), 18 s and 43 s on two models where NUTS took 10 s and 19 s
            A, c, observed = A / multiplier[:, None], c / multiplier, observed / multiplier
        label = label or rv.name
        slots = [LinearSlot(A, c, f"{label} - mean" if prior else f"mean of {rv.name}"),
                 ElementSlot(deps[0].name, index, self.variables[deps[0].name].family, deps[0].name)]
        what = "prior" if prior else "likelihood"
        self.graph.factors.append(BlackBoxFactor(
            name=label, kind="likelihood", inputs=slots, sampler=None, logp=None, density_source="pymc",
            key=f"{name}", description=f"{label}: {what} Normal with latent "
            f"{name.removeprefix('normal-')} {deps[0].name} (semi-analytic)",
            observed=observed, size=B, analytic=name, from_prior=prior,
        ))
        return True

    def _random_walk_prior(self, rv) -> None:
        """A Gaussian random walk: Normal factors on its initial value and on its increments.

        ``pm.GaussianRandomWalk("z", mu, sigma, init_dist=..., shape=(..., T))`` is
        ``z[..., 0] ~ init_dist`` and ``z[..., t] - z[..., t - 1] ~ Normal(mu, sigma)``: each
        is a Normal prior on rows of the joint Gaussian (exact with a constant scale,
        semi-analytic with a latent one), as the centred hierarchical prior is on
        ``x - mu``. The walk's innovations are laid out time first, ``(T - 1, ...)``.
        """
        var = self.variables[rv.name]
        D = self.graph.n_theta
        init, innovations = rv.owner.inputs[0], rv.owner.inputs[1]
        cols = var.offset + np.arange(var.size).reshape(var.shape)
        first = cols[..., 0].ravel()
        now, before = np.moveaxis(cols[..., 1:], -1, 0).ravel(), np.moveaxis(cols[..., :-1], -1, 0).ravel()
        R0 = np.zeros((first.size, D))
        R0[np.arange(first.size), first] = 1.0
        R1 = np.zeros((now.size, D))
        R1[np.arange(now.size), now] = 1.0
        R1[np.arange(now.size), before] = -1.0
        for dist, rows, what in ((init, R0, "initial value"), (innovations, R1, "increments")):
            params = [lift_indexing(p) for p in dist_params(dist)]
            plate = tuple(int(n) for n in evaluate_constant(dist.shape))
            step = self._normal_rows(rv, params, rows, plate, what, "Gaussian random walk")
            if step is None:
                continue
            warnings.warn(
                f"{rv.name}: a Gaussian random walk with a latent step size ({step}); EP's sites on its {what} "
                f"ignore their correlation, so EP's own marginal of {step} is approximate (on reviewed models 0.25 "
                "to 1.2 posterior sds off and up to 1.6 times too wide) and EP may not converge in 50 sweeps. The "
                f"posterior draws reweight {step} to the marginal the walk's Gaussian implies where the linear "
                "algebra is cheap enough (ep.attrs['draws_given_scales'] == 'reweighted': see docs/ep.md), which "
                "put it within 0.1 NUTS sd on reviewed models; check the others against pm.sample",
                UserWarning,
                stacklevel=4,
            )

    def _normal_rows(self, rv, params, rows, plate, what: str, kind: str) -> str | None:
        """A Normal prior ``params`` on ``rows`` of the joint Gaussian (a series' initial values or
        increments): an exact term with a constant scale, else the semi-analytic factor, whose
        latent scale's name is returned (None for an exact term); refused naming ``what``."""
        label = f"{rv.name} ({what})"
        if self._try_gaussian_term(rv, params, prior=True, rows=rows, plate=plate, label=label):
            return None
        if not self._try_normal_scale(rv, params, prior=True, rows=rows, plate=plate, label=label):
            raise UnsupportedModelError(
                f"{rv.name}: the {what} of this {kind} need a scale that is a constant or one positive latent "
                "(sigma, its precision or its variance) and a mean affine in the real-valued latents"
            )
        return self.graph.factors[-1].inputs[1].variable

    def _autoregressive_prior(self, rv) -> None:
        """``pm.AR``: Normal factors on its first ``p`` values and on its innovations.

        ``pm.AR("z", rho, sigma, init_dist=pm.Normal.dist(...), steps=T - p)`` is
        ``z[..., :p] ~ init_dist`` and ``z[t] - rho[0] z[t - 1] - ... - rho[p - 1] z[t - p] ~
        Normal(c, sigma)`` (``c = rho[0]`` and the lags from ``rho[1]`` with ``constant=True``):
        with constant coefficients (one vector, or one per series of a batch of series),
        Normal priors on rows of the joint Gaussian, like a
        random walk's increments (exact with a constant ``sigma``, semi-analytic with a
        latent one). Refused as "only MvNormal" before robustness round 31.
        """
        var = self.variables[rv.name]
        D = self.graph.n_theta
        rhos, sigma, init = rv.owner.inputs[0], rv.owner.inputs[1], rv.owner.inputs[2]
        p, constant = int(rv.owner.op.ar_order), bool(rv.owner.op.constant_term)
        rho = self._constant(rhos, rv.name)
        batch = var.shape[:-1]
        try:
            # one coefficient vector per series: (..., p) broadcast over the series' batch axes
            rho = None if rho is None else np.broadcast_to(np.asarray(rho, float), batch + (p + constant,))
        except ValueError:
            raise UnsupportedModelError(
                f"{rv.name}: a pm.AR whose rho of shape {np.shape(rho)} does not broadcast to its series' "
                f"batch shape {batch} with {p + constant} coefficients"
            ) from None
        if rho is None:
            raise UnsupportedModelError(
                f"{rv.name}: a pm.AR needs constant coefficients rho (a latent rho makes its innovations "
                "products of latents, which EP's Gaussian factors cannot hold); fix rho, or compare with pm.sample"
            )
        rho = rho.reshape(-1, p + constant)  # (series, coefficients)
        c, lags = (rho[:, 0], rho[:, 1:]) if constant else (np.zeros(rho.shape[0]), rho)
        cols = var.offset + np.arange(var.size).reshape(var.shape)
        T = var.shape[-1]
        first = cols[..., :p].ravel()
        now = np.moveaxis(cols[..., p:], -1, 0).reshape(T - p, -1)  # (T - p, batch), time first
        R0 = np.zeros((first.size, D))
        R0[np.arange(first.size), first] = 1.0
        R1 = np.zeros((now.size, D))
        rows = np.arange(now.size).reshape(now.shape)
        R1[rows, now] = 1.0
        for k in range(p):
            lagged = np.moveaxis(cols[..., p - 1 - k : T - 1 - k], -1, 0).reshape(T - p, -1)
            np.add.at(R1, (rows, lagged), -lags[None, :, k])
        innovations = [pt.constant(np.broadcast_to(c, (T - p, c.size)).reshape((T - p,) + batch)), lift_indexing(sigma)]
        plan = ((dist_params(init), R0, "initial values", tuple(int(n) for n in evaluate_constant(init.shape))),
                (innovations, R1, "innovations", (T - p,) + var.shape[:-1]))
        for params, rows_, what, plate in plan:
            step = self._normal_rows(rv, [lift_indexing(q) for q in params], rows_, plate, what, "pm.AR")
            if step is None:
                continue
            warnings.warn(
                f"{rv.name}: an autoregression with a latent scale ({step}) on its {what}; EP's sites on them "
                f"ignore their correlation, so EP's own marginal of {step} is approximate, as for a random walk "
                "with a latent step size (docs/ep.md); the posterior draws reweight it where the linear algebra is "
                "cheap enough (ep.attrs['draws_given_scales'] == 'reweighted'); check against pm.sample",
                UserWarning,
                stacklevel=4,
            )

    def _zero_sum_prior(self, rv) -> None:
        """``pm.ZeroSumNormal``: Normal factors on orthonormal contrasts, and the sums held at 0.

        Over ``k`` zero-sum axes (``n_zerosum_axes``, the last ``k``) of sizes ``K_1..K_k``
        its law is ``N(0, sigma^2 P_1 x ... x P_k)`` with ``P_i = I - J / K_i``: in the
        orthonormal basis made of each axis's Helmert contrasts and its direction
        ``1 / sqrt(K_i)``, the ``prod (K_i - 1)`` products of contrasts are independent
        ``N(0, sigma)`` (exact with a constant ``sigma``, semi-analytic with a latent one,
        like a hierarchical prior), and every other product of basis vectors has no
        variance. EP's joint Gaussian cannot hold a singular prior, so those directions get
        the precision ``_ZERO_SUM_PRECISION`` (a posterior sd of 1e-4 for the sums), and the
        draws are projected back onto the sums of zero (:mod:`pmkjit.inference_data`).
        """
        from scipy.linalg import helmert

        var = self.variables[rv.name]
        D = self.graph.n_theta
        k = int(getattr(rv.owner.op, "ndim_supp", 1))
        sizes = var.shape[len(var.shape) - k:]
        cell = int(np.prod(sizes))
        cols = (var.offset + np.arange(var.size)).reshape(-1, cell)  # (batch, cells of the zero-sum axes)
        # each axis's orthonormal basis, its contrasts first: rows of the Kronecker product
        # whose every factor is a contrast are the free directions, the others are held at 0
        basis, free = np.ones((1, 1)), np.ones(1, bool)
        for K in sizes:
            basis = np.kron(basis, np.vstack([helmert(K), np.full((1, K), 1.0 / np.sqrt(K))]))
            free = np.kron(free, np.arange(K) < K - 1).astype(bool)
        H, S1 = basis[free], basis[~free]
        n_free, batch = H.shape[0], cols.shape[0]

        def rows_of(M: np.ndarray) -> np.ndarray:
            R = np.zeros((batch, M.shape[0], D))
            R[np.arange(batch)[:, None, None], np.arange(M.shape[0])[None, :, None], cols[:, None, :]] = M
            return R.reshape(-1, D)

        sigma = dist_params(rv)[0]  # (..., 1, ..., 1): one scale per batch entry
        for _ in range(k - 1):
            sigma = sigma[..., 0]
        plate = var.shape[: len(var.shape) - k] + (n_free,)
        params = [pt.constant(0.0), lift_indexing(sigma)]
        label = f"{rv.name} (zero-sum contrasts)"
        rows = rows_of(H)
        if not (self._try_gaussian_term(rv, params, prior=True, rows=rows, plate=plate, label=label)
                or self._try_normal_scale(rv, params, prior=True, rows=rows, plate=plate, label=label)):
            raise UnsupportedModelError(
                f"{rv.name}: a ZeroSumNormal needs a sigma that is a constant or one positive latent"
            )
        S = rows_of(S1)
        self.graph.gaussian_terms.append(GaussianTerm(
            f"sums of {rv.name} at 0", S, np.zeros(S.shape[0]), np.zeros(S.shape[0]),
            np.full(S.shape[0], _ZERO_SUM_PRECISION)))
        self.graph.zero_sum[rv.name] = k

    def _icar_prior(self, rv) -> None:
        """``pm.ICAR``: Normal factors on the differences of neighbours, and a soft sum at 0.

        PyMC's density of ``pm.ICAR("phi", W, sigma, zero_sum_stdev)`` is
        ``-sum_{i~j} (phi_i - phi_j)^2 / (2 sigma^2) - (sum phi / (zero_sum_stdev N))^2 / 2``
        (each edge of ``W`` once) plus a constant: exact Gaussian terms on the rows
        ``e_i - e_j`` and ``1``, so EP fits it exactly, as it fits a random walk's increments.
        Its pairwise part carries no ``log sigma`` normaliser, so with a latent ``sigma`` it
        is not a Normal law in ``sigma`` and is refused (the BYM models scale a unit ICAR
        outside it instead: ``sigma * phi``). A graph of several connected components leaves
        each component's level but one free in the prior, which EP's joint Gaussian cannot
        start from; it is refused, naming the components.
        """
        from scipy.sparse.csgraph import connected_components

        var = self.variables[rv.name]
        D = self.graph.n_theta
        W, sigma, zero_sum_stdev = dist_params(rv)
        if rv.ndim != 1:
            raise UnsupportedModelError(f"{rv.name}: a batch of pm.ICAR fields (shape {var.shape}) is not supported; "
                                        "one field over one graph is")
        if latent_ancestors(sigma, self.latent_rvs):
            raise UnsupportedModelError(
                f"{rv.name}: a pm.ICAR whose sigma is latent is not supported: PyMC's ICAR density has no "
                "log(sigma) normalising term, so it is not a Normal law in sigma; give the ICAR sigma=1 and "
                f"scale it outside, as the BYM models do (sigma * {rv.name})"
            )
        if latent_ancestors(zero_sum_stdev, self.latent_rvs):
            raise UnsupportedModelError(f"{rv.name}: a pm.ICAR whose zero_sum_stdev is latent is not supported; "
                                        "give it a constant")
        W = np.asarray(evaluate_constant(W))
        sd = float(np.asarray(evaluate_constant(sigma)))
        zs = float(np.asarray(evaluate_constant(zero_sum_stdev)))
        if not (np.isfinite(sd) and sd > 0 and np.isfinite(zs) and zs > 0):
            # PyMC's density is -inf (or NaN) there: no posterior to fit
            raise InvalidDataError(f"{rv.name}: a pm.ICAR needs sigma > 0 and zero_sum_stdev > 0 (got sigma={sd}, "
                                   f"zero_sum_stdev={zs})")
        N = W.shape[0]
        n_parts, part = connected_components(W != 0, directed=False)
        if n_parts > 1:
            sizes = np.bincount(part)
            raise UnsupportedModelError(
                f"{rv.name}: the adjacency matrix of this pm.ICAR has {n_parts} connected components (sizes "
                f"{', '.join(map(str, sizes[:10]))}{', ...' if n_parts > 10 else ''}; islands), and its one soft "
                "sum-to-zero constraint leaves the levels of all but one free in the prior, where EP's joint "
                "Gaussian needs a proper start; connect the islands to a neighbour in W, or fit each component's "
                "field as its own pm.ICAR"
            )
        node1, node2 = np.nonzero(np.tril(W == 1, k=-1))  # each edge once, as PyMC's density counts it
        cols = var.offset + np.arange(N)
        R = np.zeros((node1.size, D))
        R[np.arange(node1.size), cols[node1]] = 1.0
        R[np.arange(node1.size), cols[node2]] = -1.0
        self.graph.gaussian_terms.append(GaussianTerm(
            f"prior of {rv.name} (differences of neighbours)", R, np.zeros(node1.size), np.zeros(node1.size),
            np.full(node1.size, 1.0 / sd**2)))
        S = np.zeros((1, D))
        S[0, cols] = 1.0
        self.graph.gaussian_terms.append(GaussianTerm(
            f"soft sum of {rv.name} at 0", S, np.zeros(1), np.zeros(1), np.array([1.0 / (zs * N) ** 2])))

    def _mvnormal(self, rv: Variable, params: Sequence[Variable], *, prior: bool,
                  y: np.ndarray | None = None) -> None:
        """``pm.MvNormal`` as an exact Gaussian factor: constant covariance, affine mean.

        Each row ``x_b`` of the variable's batch (the last axis is the vector; a latent's
        rows are its own entries of ``theta``, an observed one's are the data ``y_b``) has
        the factor ``N(x_b; A_b theta + c_b, Sigma_b)``. With ``Sigma_b = L_b L_b^T`` it is
        ``prod_k N(0; [L_b^{-1} (x_b - A_b theta - c_b)]_k, 1)`` up to a constant: unit
        precisions on the rows whitened by a triangular solve (no inverse). Any mean that is
        constant or affine in the real latents works (``mu=mu_global`` of a hierarchy,
        ``mu=X @ B`` of a multi-output regression), as does any parametrisation that folds
        to a constant covariance (``cov=``, ``chol=``, ``tau=``, batched or not).

        Raises
        ------
        UnsupportedModelError
            For a covariance that depends on a latent (``pm.LKJCholeskyCov``, a latent
            scale), one that is not symmetric positive definite, or a mean that is not
            affine in the real-valued latents.
        """
        mu, cov = params
        name = rv.name
        plate = self.variables[name].shape if prior else y.shape
        D, K = self.graph.n_theta, plate[-1]
        L = self._mvnormal_cholesky(rv, cov, plate)
        mean = self._affine_mean(mu, plate, name)
        if mean is None:
            deps = latent_ancestors(mu, self.latent_rvs)
            outside = [d.name for d in deps if not self.variables[d.name].in_gaussian_block]
            why = (f"{', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not real-valued" if outside
                   else "it is not affine in them")
            raise _NotAffineMean(
                f"{name}: the mean of this MvNormal depends on latent {', '.join(d.name for d in deps)}, and {why}; "
                f"pmkjit supports MvNormal {_MVNORMAL_SUPPORTED}"
            )
        A, c = mean
        if prior:  # the residual x - mu, "observed" at 0
            R, c, target = _unit_rows(self.variables[name], D) - A, -c, np.zeros(c.shape[0])
        else:
            R, target = A, y.ravel()
        rows = np.concatenate([R, c[:, None], target[:, None]], axis=1)
        white = _whiten(L, rows.reshape(-1, K, D + 2)).reshape(-1, D + 2)
        self.graph.gaussian_terms.append(GaussianTerm(
            f"prior of {name}" if prior else f"likelihood of {name}",
            white[:, :D], white[:, D], white[:, D + 1], np.ones(white.shape[0]),
        ))

    def _mvnormal_cholesky(self, rv: Variable, cov: Variable, plate: tuple[int, ...]) -> np.ndarray:
        """Cholesky factor of an MvNormal's constant covariance: ``(K, K)``, or ``(B, K, K)`` per row.

        One factor when every row has the same covariance (the usual case, and one
        triangular solve for all rows), one per row of the batch otherwise.
        """
        name, K = rv.name, plate[-1]
        deps = latent_ancestors(cov, self.latent_rvs)
        if deps:
            raise UnsupportedModelError(
                f"{name}: the covariance of this MvNormal depends on latent {', '.join(d.name for d in deps)}, "
                f"which is not supported; pmkjit supports MvNormal {_MVNORMAL_SUPPORTED} (for correlated effects "
                "with a latent covariance, use independent ones with their own scales, or pm.sample)"
            )
        value = np.asarray(self._constant(cov, name), dtype=float)
        try:
            covs = np.broadcast_to(value, plate[:-1] + (K, K)).reshape(-1, K, K)
        except ValueError:
            raise UnsupportedModelError(
                f"{name}: its covariance of shape {value.shape} does not broadcast to the batch {plate[:-1]} of "
                f"{K} x {K} matrices"
            ) from None
        if covs.shape[0] == 0:
            return np.eye(K)
        if np.all(covs == covs[0]):
            covs = covs[:1]
        # relative to each matrix's largest entry: chol @ chol.T or PyMC's inverse of tau= may
        # round an off-diagonal pair differently
        scale = np.abs(covs).max(axis=(-2, -1), keepdims=True)
        if not np.all(np.abs(covs - np.swapaxes(covs, -1, -2)) <= 1e-10 * scale):
            raise UnsupportedModelError(f"{name}: the covariance of this MvNormal is not symmetric")
        try:
            L = np.linalg.cholesky(covs)
        except np.linalg.LinAlgError:
            raise UnsupportedModelError(
                f"{name}: the covariance of this MvNormal is not positive definite (its Cholesky factorisation "
                "failed)"
            ) from None
        return L[0] if L.shape[0] == 1 else L

    def _try_conjugate(self, rv, opname, params, y) -> bool:
        pos, family, natural_fn, link = _CONJUGATE[opname]
        others = [self._constant(p, rv.name) for i, p in enumerate(params) if i != pos]
        if any(o is None for o in others):
            return False
        deps = latent_ancestors(params[pos], self.latent_rvs)
        if len(deps) != 1 or self.variables[deps[0].name].family is not family:
            return False
        index = self._linked_index(params[pos], deps[0], y.shape, link)
        if index is None:
            return False
        others = [np.broadcast_to(o, y.shape).ravel() for o in others]
        natural = natural_fn(y.ravel(), others)
        self.graph.element_sites.append(ElementSite(f"likelihood of {rv.name}", deps[0].name, index, natural))
        return True

    def _linked_index(self, var, rv, plate, link: str) -> np.ndarray | None:
        """Indices ``i`` with ``var = link(rv[i])`` elementwise, if ``var`` is such a selection.

        Two probes, neither containing 1 (a fixed point of every power: with the probe
        1, 2, ... a scalar's ``sqrt(s2)`` passed as ``1 / sqrt(s2)``, so
        ``Normal(0, pm.math.sqrt(s2))`` was read as a precision).
        """
        found = self._scaled_linked_index(var, rv, plate, link)
        if found is None or not np.allclose(found[1], 1.0, rtol=self._probe_rtol(var), atol=0.0):
            return None
        return found[0]

    @staticmethod
    def _probe_rtol(var) -> float:
        # float32 graphs (floatX = "float32") agree with the link to their own precision only:
        # at 1e-12 a Normal's latent scale was no scale, and the semi-analytic factor a 2-D
        # quadrature one (14 s instead of 0.5 s); the links told apart differ by far more
        return 1e-12 if var.dtype == "float64" and pytensor.config.floatX == "float64" else 1e-5

    def _scaled_linked_index(self, var, rv, plate, link: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``(i, c)`` with ``var = c * link(rv[i])`` elementwise, ``c > 0`` constant per entry, if so.

        Three probes, none containing 1 (see :meth:`_linked_index`). The ratio of two probes'
        values, ``link(b1[i]) / link(b2[i])``, is monotone in ``i`` for these links and does not
        depend on ``c``: it tells which element each entry reads; ``c`` is then the first
        probe's value over the link's, and the other two probes check both. A scale with a
        constant factor (``sigma ~ pm.Uniform(0, 50)``, rescaled as ``50 * u``; a centred
        ``Normal(mu, 2 * tau)``; ``s / np.sqrt(w)`` with weights ``w``) is so.
        """
        size = self.variables[rv.name].size
        probe = pt.vector("probe", shape=(size,))
        expr = pytensor.clone_replace(var, {rv: probe.reshape(self.variables[rv.name].shape)})
        f = compile_function([probe], expr)
        fn = _STRUCTURAL[link]
        rtol = self._probe_rtol(var)  # (probe has floatX, expr var's dtype)
        i = np.arange(size, dtype=float)
        bases = (1.5 + i, 0.35 + 2.5 * i, 0.8 + 1.7 * i)
        got = []
        for base in bases:
            try:
                with np.errstate(all="ignore"):
                    got.append(np.broadcast_to(np.asarray(f(base), dtype=float), plate).ravel())
            except ValueError:
                return None
        tables = [fn(base) for base in bases]
        with np.errstate(all="ignore"):
            ratio, table = got[0] / got[1], tables[0] / tables[1]
        if not np.all(np.isfinite(ratio)):
            return None
        # invert the ratio: which element produced each entry
        order = np.argsort(table)
        pos = np.clip(np.searchsorted(table[order], ratio), 0, size - 1)
        lower = np.clip(pos - 1, 0, size - 1)
        closer = np.abs(table[order][lower] - ratio) < np.abs(table[order][pos] - ratio)
        cand = order[np.where(closer, lower, pos)]
        with np.errstate(all="ignore"):
            scale = got[0] / tables[0][cand]
        if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
            return None
        for g, t in zip(got, tables):
            if not np.allclose(scale * t[cand], g, rtol=rtol, atol=0):
                return None
        return cand.astype(np.int64), scale

    def _try_split(self, rv, opname, params, y) -> bool:
        pos, family, natural_fn, _ = _CONJUGATE[opname]
        others = [self._constant(p, rv.name) for i, p in enumerate(params) if i != pos]
        if any(o is None for o in others):
            return False
        plate = y.shape
        param = params[pos]
        leaves = self._decompose(param, plate, rv.name)
        self._refuse_expanded(rv, leaves)
        n_latent = sum(isinstance(slot, (LinearSlot, ElementSlot)) for _, slot in leaves.values())
        if not n_latent:
            return True  # constant in value (w * x at x = 0, split off by _likelihood_entries): no factor
        if 2 <= n_latent <= max(GRID_NODES):
            # A deterministic factor has quadrature for one input only; with two, the
            # likelihood's own density has quadrature, where the split left importance
            # sampling: a logistic regression with a positive slope, logit_p = a + b * x with
            # b ~ LogNormal(0, 1) (N = 100, robustness round 18), did not converge in 50
            # sweeps (81 s), 0.51 NUTS sd off. With three to six the likelihood has the
            # Gauss-Hermite grid: a Poisson rate E exp(b0 + sigma * phi) over an ICAR field
            # did not converge in 50 sweeps split (importance sampling, robustness round 30).
            # (More stay split: importance sampling in front of a KJIT operator.)
            return False
        if n_latent == 1 and int(np.prod(plate, dtype=int)) < FEW_INSTANCES and any(
                isinstance(slot, LinearSlot) and 2 <= np.linalg.matrix_rank(slot.A) <= MAX_PREDICTOR_RANK
                for _, slot in leaves.values()):
            # a small regression's predictor alone (the bioassay, Challenger's O-rings): the
            # likelihood stays whole so that it may be one site with its exact law on a grid
            # (pmkjit.ep.collapsed), whose draws keep the skew a Gaussian's lose
            return False
        inputs, slots, (g,) = self._rebuild([param], leaves)
        function = compile_function(inputs, g)
        others_flat = [np.broadcast_to(o, plate).ravel() for o in others]
        natural = natural_fn(y.ravel(), others_flat)
        scipy_fn = recognise_link(g, inputs)

        def sampler(ins, rng, _f=function):
            shape = ins[0].shape
            return np.asarray(_f(*[np.ravel(a) for a in ins]), dtype=float).reshape(shape)

        key_graph = graph_key(g, inputs)
        desc = f"{rv.name}: deterministic {describe_graph(g)} -> {family.name} parameter of {opname[:-2]}"
        self.graph.factors.append(BlackBoxFactor(
            name=rv.name, kind="deterministic", inputs=slots, sampler=sampler, logp=None,
            density_source="deterministic", key=f"det-{family.name}-{key_graph}", description=desc,
            output_family=family, output_natural=natural, function=sampler, scipy_function=scipy_fn,
            size=int(np.prod(plate, dtype=int)),
        ))
        return True

    def _black_box(self, rv, params, plate, *, kind: str, output=None, observed=None, make_dist=None,
                   make_logp=None) -> None:
        """A black-box factor of ``rv`` whose parameters are ``params`` over ``plate``.

        ``make_dist(flat_params)`` builds the distribution from the parameters as flat
        vectors (default: ``rv``'s own, rebuilt); it lets a distribution whose parameters
        have a core dimension (a categorical's probabilities) be given elementwise inputs.
        ``make_logp(flat_params, value)``, if given, is the factor's log-density graph
        (default: PyMC's of that distribution).
        """
        op = rv.owner.op
        opname = type(op).__name__
        leaves: dict = {}
        seen: set = set()
        if make_dist is None:
            check_elementwise_distribution(rv, self.latent_rvs)
        if kind != "likelihood" and has_no_random(op):
            # EP starts a latent's prior site from forward samples (and importance sampling
            # draws from it): PyMC's own NotImplementedError surfaced mid-fit, from PyTensor
            raise UnsupportedModelError(_NO_SAMPLER.format(name=rv.name))
        bounds = range(len(params) - 2, len(params)) if isinstance(op, CensoredRV) else ()
        for i, p in enumerate(params):
            self._walk(p, plate, rv.name, leaves, seen, bound=i in bounds)
        B = int(np.prod(plate, dtype=int))
        if kind == "likelihood" and not any(isinstance(slot, (LinearSlot, ElementSlot)) for _, slot in leaves.values()):
            return  # its parameters are constant in value (latents that cancel out): a constant factor
        if not any(not isinstance(slot, float) for _, slot in leaves.values()):
            # all parameters are scalars: a zero "plate" input gives the sampler its batch shape
            anchor = pt.constant(0.0)
            leaves[id(anchor)] = (anchor, DataSlot(np.zeros(B), "plate"))
        inputs, slots, flat_params = self._rebuild(params, leaves)
        flat_params = [pt.broadcast_to(p, (pt.shape(inputs[0])[0],)) if inputs and p.ndim == 0 else p
                       for p in flat_params]
        new_rv = flat_distribution(rv, flat_params) if make_dist is None else make_dist(flat_params)
        sampler_fn = compile_function(inputs, new_rv)
        rngs = find_rng_nodes([new_rv])
        if not rngs:
            rngs = [v for v in sampler_fn.maker.fgraph.inputs if "RandomGenerator" in str(v.type)]

        def sampler(ins, rng, _f=sampler_fn, _rngs=rngs, _name=rv.name, _what=distribution_label(op)):
            shape = np.shape(ins[0]) if ins else (1,)
            reseed_rngs(_rngs, int(rng.integers(2**63 - 1)))
            try:
                out = _f(*[np.ravel(a) for a in ins])
            except Exception as err:  # noqa: BLE001 - PyMC's own failure, reported with the variable's name
                # PyMC's sampler of a truncated StudentT with an infinite bound fails inside
                # PyTensor ("Range exceeds valid bounds" from numpy) mid-fit, naming nothing
                raise UnsupportedModelError(
                    f"{_name}: PyMC's forward sampler of {_what} failed ({type(err).__name__}: "
                    f"{str(err).splitlines()[0] if str(err) else ''}); EP needs forward samples of it"
                    + (" (PyMC samples a truncation through the base distribution's cdf: a finite bound, "
                       "or pm.TruncatedNormal for a Normal, may avoid this)" if isinstance(op, TruncatedRV) else "")
                ) from err
            return np.asarray(out, dtype=float).reshape(shape)

        logp, source, cost = None, "pymc", 1
        # The key must tell apart factors that sample alike but weigh differently: two
        # ``pm.CustomDist(logp=...)`` with different log-densities have the same sampling
        # graph, and an operator learned on one was silently reused for the other.
        key_extra: list = []
        if isinstance(op, SimulatorRV):
            source = "abc-kernel"
            key_extra.append(simulator_fingerprint(op))
        else:
            try:
                value = pt.vector("value", dtype=rv.dtype)
                logp_graph = pm.logp(new_rv, value) if make_logp is None else make_logp(flat_params, value)
                key_extra.append(logp_graph)
                logp_fn = compile_function([value, *inputs], parameter_checks_to_ninf(logp_graph))
                if B == 1:
                    # one instance whose density may sum over a table (a potential of scalars)
                    cost = largest_static_size(logp_graph)
                # Points per evaluation: a density that is a whole table at each point (a
                # potential summing out a changepoint, candidate years x years) holds cost
                # entries per point, and a quadrature grid's 25,921 points of a 111 x 111
                # table took more than 24 GiB (robustness round 36)
                step = max(1, _LOGP_ENTRIES // cost) if cost > 1 else None

                def logp(x, ins, _f=logp_fn, _dtype=rv.dtype, _step=step):
                    shape = np.shape(x)
                    xs = np.ravel(x).astype(_dtype)
                    flat = [np.ravel(np.broadcast_to(a, shape)) for a in ins]
                    if _step is None:
                        return np.asarray(_f(xs, *flat), dtype=float).reshape(shape)
                    return in_point_slices(_f, [xs, *flat], _step).reshape(shape)
            except NotImplementedError:
                source = "abc-kernel"
        key_graph = graph_key(new_rv, inputs, extra=key_extra)
        self._check_sizes(rv.name, slots, B)
        if source == "abc-kernel":
            if kind != "likelihood":
                raise UnsupportedModelError(
                    f"{rv.name}: PyMC derives no density for this latent's distribution {opname}"
                )
            eps = abc_bandwidth(op, observed)
            warnings.warn(
                f"{rv.name}: PyMC has no density for {opname}; the oracle weighs forward samples by a Gaussian "
                f"kernel of width {eps:.3g} on their distance to the observed value (ABC-EP)",
                UserWarning,
                stacklevel=4,
            )
            natural = np.stack([observed / eps**2, np.full_like(observed, -0.5 / eps**2)], -1)
            self.graph.factors.append(BlackBoxFactor(
                name=rv.name, kind="deterministic", inputs=slots, sampler=sampler, logp=None,
                density_source="abc-kernel", key=f"abc-{opname}-{key_graph}",
                description=f"{rv.name}: simulator {opname} (ABC kernel, eps={eps:.3g})",
                output_family=Gaussian, output_natural=natural, size=B,
            ))
            return
        desc = f"{rv.name}: {'likelihood' if kind == 'likelihood' else 'prior'} {opname[:-2] or opname}"
        mixture = None
        if kind == "likelihood" and make_dist is None and make_logp is None and isinstance(op, MixtureRV):
            components = mixture_parts(rv)[1]
            if all(c.owner is not None and type(c.owner.op).__name__ == "NormalRV" for c in components):
                mixture = normal_mixture_spec(inputs, slots, flat_params, len(components), compile_function)
                if mixture is not None:
                    desc += " (semi-analytic mixture of Normals)"
        linear = None
        if kind == "likelihood" and make_dist is None and make_logp is None and opname == "NormalRV":
            linear = linear_normal_spec(inputs, slots, flat_params, compile_function)
        if linear is None:
            self._refuse_expanded(rv, leaves)
        fam = output.family if output is not None else None
        self.graph.factors.append(BlackBoxFactor(
            name=rv.name, kind=kind, inputs=slots, sampler=sampler, logp=logp, density_source=source,
            key=f"{kind}-{fam.name if fam else 'obs'}-{key_graph}", description=desc, output=output,
            output_family=fam, observed=observed, size=B, point_masses=has_point_masses(rv), mixture=mixture,
            linear_normal=linear, evaluation_cost=cost,
        ))

    def _refuse_expanded(self, rv, leaves: dict) -> None:
        """Refuse a factor whose parameters hold a product written out column by column
        (:func:`~pmkjit.graph.expansion.expand_product`) unless a Normal's closed form takes it.

        Written out, the product is a factor of as many latent inputs as columns, which only
        a Normal likelihood's closed form integrates: a Poisson HSGP with a latent length
        scale was split into a deterministic factor of 12 inputs and ran 50 sweeps of
        importance sampling (250 s) without converging.
        """
        expanded = [leaf for leaf, slot in leaves.values() if isinstance(slot, Expanded) and slot.product]
        if not expanded:
            return
        deps = latent_ancestors(expanded[0], self.latent_rvs)
        raise UnsupportedModelError(
            f"{rv.name}: its parameters read a data matrix times a vector of latents "
            f"({', '.join(d.name for d in deps)}) that is not affine in the Gaussian ones; pmkjit writes such a "
            "product out column by column only in the mean of a Normal likelihood (the Gaussian latents "
            "integrated in closed form given the others)" + gaussian_process_hint(deps, "")
        )

    def _check_sizes(self, name: str, slots, B: int) -> None:
        for s in slots:
            if s.size != B:
                raise UnsupportedModelError(f"{name}: a parameter slot has {s.size} entries, expected {B}")


# -------------------------------------------------------------------- helpers
def _entries(params, y: np.ndarray) -> int:
    """The most entries of the observation and of any parameter: what one evaluation of a
    multivariate density costs, in elementwise densities (an MvNormal's ``n x n`` covariance
    for ``n`` values; an observed AR's ``n`` values, whatever the order)."""
    sizes = [y.size]
    for p in params:
        shape = p.type.shape
        if any(d is None for d in shape):
            try:
                shape = tuple(int(d) for d in p.shape.eval())
            except Exception:  # noqa: BLE001 - a shape that needs the latents' values: assume the covariance's
                shape = (y.size * (y.shape[-1] if y.ndim else 1),)
        sizes.append(int(np.prod(shape, dtype=int)))
    return max(sizes)


class _NotAffineMean(UnsupportedModelError):
    """An MvNormal's mean is not affine in the real latents (its exact factor is refused)."""


def _element_count(params, latents, variables) -> str:
    """``"n (a, b, ...)"``: the latent elements ``params`` read, for a refusal's message."""
    found = list(dict.fromkeys(d for p in params for d in latent_ancestors(p, latents)))
    n = sum(variables[d.name].size for d in found)
    return f"{n} ({', '.join(dict.fromkeys(_stick_owner(d.name) for d in found))})"


def _label(var: Variable) -> str:
    return var.name or (type(var.owner.op).__name__ if var.owner is not None else str(var))


def _observed_logps(model: pm.Model, rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    """Elementwise log-density of every elementwise observed variable (and a multinomial's
    per row) at three points.

    The model's initial point and two points jittered by U(-1, 1) in the transformed
    space (as ``pm.sample`` jitters its start), so that a parameter which is invalid
    only at the initial point (``lam = b * x`` at ``b = 0``) does not count as bad data.
    A non-finite entry of the initial point (``pm.Normal("s", 0, 1, transform=log)``
    starts at ``log(0) = -inf``) is replaced by 0 in the transformed space before the
    jitter: EP does not start from the initial point, and a latent that is invalid there
    made every point invalid, so that the data were refused as lying outside the support.
    Variables whose density PyMC cannot derive are left out.
    """
    latents = list(model.free_RVs)
    obs = []
    for rv in model.observed_RVs:
        if type(rv.owner.op).__name__ in _PARAMETER_SUPPORT:
            continue
        if type(rv.owner.op).__name__ == "MultinomialRV":
            obs.append(rv)  # one density per row, which _check_support reads row by row
            continue
        partial = partial_observed(rv)
        try:
            # refused with its own reason later
            check_elementwise_distribution(rv if partial is None else partial[0], latents)
        except UnsupportedModelError:
            continue
        obs.append(rv)
    if not obs:
        return {}
    try:
        point = {k: np.where(np.isfinite(v), v, 0.0) for k, v in model.initial_point().items()}
        inputs = [v for v in model.value_vars if v.name in point]
        graphs = model.logp(vars=obs, sum=False, jacobian=False)
        fn = compile_function(inputs, [parameter_checks_to_ninf(g) for g in graphs])
        points = [point] + [{k: v + rng.uniform(-1.0, 1.0, np.shape(v)) for k, v in point.items()}
                            for _ in range(2)]
        with np.errstate(all="ignore"):
            evals = [fn(*[np.asarray(p[v.name], dtype=v.dtype) for v in inputs]) for p in points]
    except Exception:  # noqa: BLE001 - the factors check their own densities later
        _refuse_mismatched_shapes(model, obs)
        return {}
    return {rv.name: [np.asarray(e[i], dtype=float) for e in evals] for i, rv in enumerate(obs)}


def _refuse_mismatched_shapes(model: pm.Model, obs: list[Variable]) -> None:
    """Name the likelihood whose parameters' shapes do not fit its observed data.

    PyMC builds a multinomial of rows of 4 against 3 probabilities without complaint and
    fails only when its log-density is built; pmkjit's factors read the probabilities and
    the rows apart and fitted such a model silently. ``pm.sample`` refuses it too."""
    for rv in obs:
        try:
            model.logp(vars=[rv], sum=False, jacobian=False)
        except ValueError as err:
            if "shape" in str(err).lower():
                data = model.rvs_to_values[rv]
                shape = getattr(getattr(data, "data", None), "shape", None)
                raise UnsupportedModelError(
                    f"{rv.name}: PyMC cannot build its log-density ({err}): its parameters' shapes do not fit "
                    + (f"its observed data's shape {tuple(shape)}" if shape is not None else "its observed data")
                    + "; pm.sample refuses it too") from None
        except Exception:  # noqa: BLE001 - another reason, refused later by its own factor if at all
            continue


def _finite(value: np.ndarray, owner: str, var: Variable) -> np.ndarray:
    """``value`` (a constant parameter or data array of ``owner``) if it has no NaN or inf.

    A NaN in a covariate or in a constant parameter (a missing value in a pandas column
    used as a predictor) would otherwise reach EP as an improper point-mass message or a
    NaN precision, failing later with an error that names neither the variable nor the data.
    """
    value = np.asarray(value)
    if value.dtype.kind not in "fc" or np.all(np.isfinite(value)):
        return value
    # an infinite bound (TruncatedNormal's upper=inf) is legitimate; NaN, or inf mixed with
    # finite entries (log of a zero covariate), is missing or broken data
    bad = np.isnan(value) if np.all(np.isinf(value) | np.isnan(value)) else ~np.isfinite(value)
    if not bad.any():
        return value
    what = "NaN" if np.isnan(value).any() else "infinite values"
    where = f", first at index {np.argwhere(bad)[0].tolist()}" if value.ndim else ""
    name = f"data {var.name}" if var.name else f"a constant of shape {value.shape}"
    raise InvalidDataError(
        f"{owner}: a parameter depends on {name} containing {what} ({int(bad.sum())} of {value.size} entries"
        f"{where}); pmkjit needs finite data: drop or fill the missing entries"
    )


def _no_nan_data(var: Variable, owner: str) -> None:
    """Refuse, naming ``owner`` and the data, NaN in a constant or ``pm.Data`` among ``var``'s ancestors."""
    for leaf in ancestors([var]):
        value = _stored_value(leaf)
        if value is not None and value.dtype.kind in "fc" and np.isnan(value).any():
            _finite(value, owner, leaf)


def _stored_value(var: Variable) -> np.ndarray | None:
    """The value a constant or a ``pm.Data`` holds, read as it is; None for anything else."""
    if isinstance(var, Constant):
        return np.asarray(var.data)
    if isinstance(var, TensorSharedVariable):
        return np.asarray(var.get_value(borrow=True))
    return None


def _slot_scale(a, b) -> float | None:
    """``s`` when slot ``b`` carries ``s`` times slot ``a``'s latent values plus constants, else None.

    Element slots match only themselves (``s = 1``); linear slots ``A_b = s A_a`` for one
    nonzero scalar ``s`` (to rounding: ``0.5 * eta`` and ``eta`` of the same predictor).
    """
    if isinstance(a, ElementSlot) and isinstance(b, ElementSlot):
        return 1.0 if a.variable == b.variable and np.array_equal(a.index, b.index) else None
    if not (isinstance(a, LinearSlot) and isinstance(b, LinearSlot)) or a.A.shape != b.A.shape:
        return None
    if np.array_equal(a.A, b.A):
        return 1.0
    pivot = np.unravel_index(np.argmax(np.abs(a.A)), a.A.shape)
    if a.A[pivot] == 0.0 or b.A[pivot] == 0.0:
        return None
    scale = float(b.A[pivot] / a.A[pivot])
    tol = 1e-12 * np.max(np.abs(b.A))
    return scale if np.allclose(b.A, scale * a.A, rtol=0.0, atol=tol) else None


def _unit_rows(var: LatentVariable, n_theta: int) -> np.ndarray:
    """Rows of the identity selecting ``var``'s entries of theta, ``(var.size, n_theta)``."""
    rows = np.zeros((var.size, n_theta))
    rows[np.arange(var.size), var.offset + np.arange(var.size)] = 1.0
    return rows


def _whiten(L: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``L_b^{-1} M_b`` for each ``b`` by triangular solves.

    Parameters
    ----------
    L : ndarray, (K, K) or (B, K, K)
        Lower Cholesky factors: one shared by every ``b``, or one each.
    M : ndarray, (B, K, m)

    Returns
    -------
    ndarray, (B, K, m)
    """
    from scipy.linalg import solve_triangular

    if L.ndim == 3:
        return solve_triangular(L, M, lower=True)  # batched since SciPy 1.15
    B, K, m = M.shape
    # one factor: a single solve with the rows' columns side by side
    out = solve_triangular(L, np.moveaxis(M, 1, 0).reshape(K, B * m), lower=True)
    return np.moveaxis(out.reshape(K, B, m), 0, 1)


def _conjugate_prior(opname: str, family: type, consts: list) -> np.ndarray | None:
    """Natural parameters of a prior in the variable's own family, if it is one."""
    if family is Gamma and opname == "GammaRV":
        alpha, scale = consts
        return np.stack(np.broadcast_arrays(alpha - 1.0, -1.0 / scale), -1)
    if family is Gamma and opname == "ExponentialRV":
        (scale,) = consts
        return np.stack(np.broadcast_arrays(np.zeros_like(scale, dtype=float), -1.0 / scale), -1)
    if family is Beta and opname == "BetaRV":
        a, b = consts
        return np.stack(np.broadcast_arrays(a - 1.0, b - 1.0), -1).astype(float)
    if family is Beta and opname == "UniformRV":
        return np.zeros(2)
    return None


def _inner_operations(var: Variable, latents: Sequence[Variable], limit: int = 3) -> str:
    """The first non-elementwise operations between ``var`` and the latents, for a message.

    The walk stops at the outermost operation it cannot see through, often a reshaping
    one: a Gaussian process with a latent length scale was refused "through DimShuffle
    (DimShuffle)", where the cause is the Cholesky factor of its covariance inside
    (``pm.gp.Latent``: ``f = cholesky(K(ls)) @ v``). Named variables passed on the way
    are listed too.
    """
    found: list[str] = []
    queue, seen = [var], set()
    while queue and len(found) < limit:
        v = queue.pop(0)
        if id(v) in seen or v.owner is None or not latent_ancestors(v, latents) or v in latents:
            continue
        seen.add(id(v))
        op = v.owner.op
        if isinstance(op, (Eye, Shape, Shape_i)):
            continue  # reads the latents' shapes only (the jitter eye(K.shape[0]) of a GP covariance)
        label = None
        if v is not var and v.name:
            label = repr(v.name)
        elif not isinstance(op, (Elemwise, DimShuffle, ViewOp, SpecifyShape)) and v is not var:
            label = str(getattr(op, "core_op", op))
        if label is not None and label not in found:
            found.append(label)
        queue.extend(v.owner.inputs)
    return ", ".join(found)


# below this (relative to the constant), the coefficients of an affine expression are rounding
_CONSTANT_ATOL = 1e-12
_LOGP_ENTRIES = 4_000_000  # entries of a density's intermediates evaluated at once (one table per point)
_NO_SAMPLER = ("{name}: a latent pm.CustomDist needs a forward sampler; this one has only logp= "
               "(give it random= or write it with dist=)")
# what the MvNormal refusals say is supported
_MVNORMAL_SUPPORTED = ("latents and likelihoods with a constant covariance (cov=, chol= or tau= of constants or "
                       "data, batched or not) and a mean that is constant or affine in the real-valued latents, "
                       f"and likelihoods whose mean and covariance read at most {MAX_SCALARS} latent elements in all "
                       "(a Gaussian process's marginal likelihood)")
_ZERO_SUM_PRECISION = 1e8  # of a ZeroSumNormal's sum: no variance in the model, sd 1e-4 in EP's




def _stick_owner(name: str) -> str:
    """The pm.Dirichlet a hidden stick-breaking Beta belongs to (its own name otherwise)."""
    if not name.startswith(STICK_PREFIX):
        return name
    return f"{name[len(STICK_PREFIX):].rsplit('_', 1)[0]} (a pm.Dirichlet)"
