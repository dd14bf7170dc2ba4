"""The factor graph pmkjit runs EP on: variables, slots and factors.

Latent variables come in two kinds:

* every real-valued latent of the model is a block of one joint Gaussian over
  ``theta`` (length ``D``); factors touch it through *linear slots*, scalar projections
  ``eta_b = A[b] @ theta + c[b]`` (one per factor instance ``b``), so a linear
  predictor ``X @ w + b`` is one slot and its EP sites are rank one;
* every positive or unit-interval latent is a batch of independent scalar Gamma or
  Beta messages; factors touch one element each through *element slots*.

A factor is a batch of ``B`` instances over a plate, all of the same form. Analytic
factors are constant: Gaussian terms (exact quadratic forms in ``theta``) and element
sites (conjugate messages, e.g. a Beta prior or a Bernoulli observation of ``p``).
Everything else is a :class:`BlackBoxFactor`, whose projected tilted beliefs come from
quadrature, importance sampling or a KJIT operator.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pmkjit.families import ExponentialFamily, Gaussian

__all__ = [
    "LatentVariable",
    "LinearSlot",
    "ElementSlot",
    "DataSlot",
    "GaussianTerm",
    "ElementSite",
    "BlackBoxFactor",
    "FactorGraph",
]


# Instances below which a likelihood is small: a KJIT operator's first fit needs this many
# distinct inputs (KJITMethod's min_fit; below it, its fits pool sweeps of the same few data
# points), so such a factor is answered directly, and one that reads a regression's
# predictor alone is one site whose law is exact on a grid (pmkjit.ep.collapsed), not a
# split link factor
FEW_INSTANCES = 50
# coordinates of such a predictor that a grid holds (pmkjit.ep.collapsed's regression laws)
MAX_PREDICTOR_RANK = 4


@dataclass(frozen=True)
class LatentVariable:
    """A free random variable of the model and its message family.

    Attributes
    ----------
    name : str
        The PyMC name.
    family : type
        ``Gaussian`` (part of the joint Gaussian block), ``Beta`` or ``Gamma``.
    shape : tuple of int
    offset : int
        First index in ``theta`` (Gaussian block only; -1 otherwise).
    """

    name: str
    family: type
    shape: tuple[int, ...]
    offset: int = -1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=int))

    @property
    def in_gaussian_block(self) -> bool:
        return self.family is Gaussian


@dataclass
class LinearSlot:
    """``eta_b = A[b] @ theta + c[b]``: a scalar projection of the Gaussian block."""

    A: np.ndarray
    c: np.ndarray
    label: str
    family: type = Gaussian

    @property
    def size(self) -> int:
        return self.c.shape[0]


def pair_slots(slots: list[LinearSlot]) -> list[LinearSlot]:
    """One slot ``eta_i + eta_j`` per pair ``i < j`` of ``slots``: where a joint Gaussian site's
    off-diagonal precision lives (see :attr:`BlackBoxFactor.pair_slots`)."""
    return [LinearSlot(a.A + b.A, a.c + b.c, f"{a.label} + {b.label}") for a, b in itertools.combinations(slots, 2)]


@dataclass
class ElementSlot:
    """Element ``index[b]`` of the flattened Beta or Gamma variable ``variable``."""

    variable: str
    index: np.ndarray
    family: type
    label: str

    @property
    def size(self) -> int:
        return self.index.shape[0]


@dataclass
class DataSlot:
    """Per-instance constants inside a black-box factor, seen by operators as point masses."""

    values: np.ndarray
    label: str

    @property
    def size(self) -> int:
        return self.values.shape[0]


@dataclass
class GaussianTerm:
    """An exact Gaussian factor ``prod_b N(y_b; R[b] @ theta + c[b], 1 / precision_b)``."""

    name: str
    R: np.ndarray
    c: np.ndarray
    y: np.ndarray
    precision: np.ndarray


@dataclass
class ElementSite:
    """A constant (conjugate) message of natural parameters ``natural[b]`` on element ``index[b]``."""

    name: str
    variable: str
    index: np.ndarray
    natural: np.ndarray


@dataclass
class BlackBoxFactor:
    """A batch of factor instances whose EP messages have no closed form.

    The operator convention is ``psi(x_out | x_in)`` with variables ordered
    ``(*inputs, output)``:

    * ``kind="likelihood"``: an observed output ``observed`` (seen by KJIT operators as a
      point mass); ``logp(y, inputs)`` is the factor's log-density.
    * ``kind="deterministic"``: ``x_out = function(*inputs)`` with a constant output
      message ``output_natural`` (the conjugate message of the observation of the
      parameter ``x_out``, e.g. Beta(y + 1, 2 - y) for a Bernoulli); the paper's split.
    * ``kind="prior"``: a latent output slot ``output`` with density ``logp``.

    Attributes
    ----------
    name : str
        The model variable the factor belongs to (used in messages and errors).
    inputs : list of slots
        Latent slots (linear or element) and data slots, in the operator's order.
    sampler : callable
        ``sampler(inputs, rng) -> x_out`` on arrays ``(S, b)`` (data broadcast).
    logp : callable or None
        ``logp(x_out, inputs) -> log psi``; ``None`` for deterministic factors.
    density_source : str
        How ``logp`` weighs samples: ``"pymc"`` (the model's density),
        ``"abc-kernel"`` (a kernel on the distance to the observed value) or
        ``"deterministic"``.
    analytic : str, optional
        ``"normal-scale"``, ``"normal-precision"`` or ``"normal-variance"``: a Normal factor
        with a latent scale (or precision, or variance) and a linear mean, whose tilted moments are semi-analytic;
        ``"positive"``: the indicator ``1[d > 0]`` of its one linear slot (the order of an
        ordered vector), whose tilted moments are a truncated normal's.
    from_prior : bool
        The factor is a latent's prior rewritten as a likelihood (its residual is the
        slot); EP initialises its site from the prior.
    point_masses : bool
        The likelihood puts point masses on some observed values: a ``pm.Censored`` one
        at its bounds (the base's cdf or survival function there, its density elsewhere),
        a zero-inflated or hurdle one at its ``DiracDelta`` component's value.
    pair_slots : list of LinearSlot
        Non-empty for a factor whose latent inputs (linear slots, ``m`` of them) share one
        joint Gaussian site per instance, as a categorical likelihood's class predictors
        must: its precision matrix is spread over the inputs' own slots (the diagonal
        less the off-diagonal sums) and one slot ``eta_i + eta_j`` per pair ``i < j``
        (the off-diagonal entries), so the posterior is assembled as for any slot.
    mixture : NormalMixtureSpec, optional
        For a likelihood that is a mixture of Normals whose weights are products of Beta
        latents' powers (:mod:`pmkjit.graph.mixture`): which inputs are each component's
        mean, scale and weight, for the semi-analytic tilted moments of
        :class:`pmkjit.ep.mixture.NormalMixtureMethod`.
    linear_normal : LinearNormalSpec, optional
        For a Normal likelihood of three or more latents whose mean is affine in some of its
        Gaussian inputs given the others (:mod:`pmkjit.graph.linear_normal`): those inputs
        integrate out in closed form, the rest on a grid
        (:class:`pmkjit.ep.linear_normal.LinearNormalMethod`).
    key : str
        Identifies the factor's form (graph and families, not names or data), so a
        learned operator can be reused by another model with the same factor.
    evaluation_cost : int
        What one evaluation of an instance's density costs, in elementwise densities: 1,
        except for a multivariate likelihood of a few scalars
        (:mod:`pmkjit.graph.multivariate`), whose one instance is a whole vector's density
        (the entries of its observation or largest parameter: ``n**2`` for an ``MvNormal`` of
        ``n`` values), and a factor of one instance whose density is a table (a potential
        summing over data: its largest intermediate's size); the grids that integrate over its
        latents size their budgets by it (and a table's density is evaluated at few enough
        points at once that their tables fit in memory).
    """

    name: str
    kind: str
    inputs: list
    sampler: Callable
    logp: Callable | None
    density_source: str
    key: str
    description: str
    output: object = None
    output_family: type | None = None
    observed: np.ndarray | None = None
    output_natural: np.ndarray | None = None
    function: Callable | None = None
    scipy_function: Callable | None = None
    size: int = 0
    analytic: str | None = None
    from_prior: bool = False
    point_masses: bool = False
    pair_slots: list = field(default_factory=list)
    mixture: object = None
    linear_normal: object = None
    evaluation_cost: int = 1

    @property
    def joint(self) -> bool:
        """Whether the latent inputs share one joint Gaussian site (see ``pair_slots``)."""
        return bool(self.pair_slots)

    @property
    def latent_inputs(self) -> list[int]:
        """Positions of the inputs that are latent (not data)."""
        return [i for i, s in enumerate(self.inputs) if not isinstance(s, DataSlot)]

    @property
    def families(self) -> tuple[type[ExponentialFamily], ...]:
        """Families of ``(*inputs, output)`` in the operator convention (data as point masses)."""
        from pmkjit.families import PointMass

        fams = [PointMass if isinstance(s, DataSlot) else s.family for s in self.inputs]
        if self.kind == "likelihood":
            fams.append(PointMass)
        else:
            fams.append(self.output_family)
        return tuple(fams)

    @property
    def targets(self) -> tuple[int, ...]:
        """Variables whose beliefs EP needs: latent inputs, and a latent output."""
        t = self.latent_inputs
        if self.kind == "prior":
            t = t + [len(self.inputs)]
        return tuple(t)

    @property
    def slots(self) -> list:
        """Latent slots in target order (where the sites live)."""
        s = [self.inputs[i] for i in self.latent_inputs]
        if self.kind == "prior":
            s.append(self.output)
        return s + list(self.pair_slots)


@dataclass
class FactorGraph:
    """What :func:`pmkjit.graph.build_factor_graph` extracts from a PyMC model."""

    variables: dict[str, LatentVariable]
    n_theta: int
    gaussian_terms: list[GaussianTerm] = field(default_factory=list)
    element_sites: list[ElementSite] = field(default_factory=list)
    factors: list[BlackBoxFactor] = field(default_factory=list)
    improper_prior: list[str] = field(default_factory=list)
    # free variables no factor reads (pmkjit.graph.predictive): drawn after EP from their
    # predictive given the others, so not in ``variables``
    predictive: list[str] = field(default_factory=list)
    # ZeroSumNormal latents and their numbers of zero-sum axes (the last ones), onto whose
    # sums of zero their draws are projected
    zero_sum: dict[str, int] = field(default_factory=dict)
    # latents with an ordered transform (ordinal cutpoints), kept in order by order factors
    ordered: list[str] = field(default_factory=list)

    @property
    def element_variables(self) -> list[LatentVariable]:
        return [v for v in self.variables.values() if not v.in_gaussian_block]

    @property
    def gaussian_variables(self) -> list[LatentVariable]:
        return [v for v in self.variables.values() if v.in_gaussian_block]

    def summary(self) -> str:
        """A few lines describing the graph (used in ``repr`` of results and in docs)."""
        lines = [f"Gaussian block: {self.n_theta} dims ({', '.join(v.name for v in self.gaussian_variables) or '-'})"]
        for v in self.element_variables:
            lines.append(f"{v.family.name} variable {v.name} shape {v.shape}")
        for t in self.gaussian_terms:
            lines.append(f"exact Gaussian factor: {t.name} ({t.y.shape[0]} terms)")
        for s in self.element_sites:
            lines.append(f"conjugate factor: {s.name} ({s.index.shape[0]} terms)")
        for f in self.factors:
            lines.append(f"black-box factor: {f.description} ({f.size} instances, weights: {f.density_source})")
        if self.predictive:
            lines.append(f"drawn from their predictive after EP (read by no factor): {', '.join(self.predictive)}")
        return "\n".join(lines)
