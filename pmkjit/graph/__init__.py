"""From a PyMC model to the factor graph EP runs on."""

from pmkjit.graph.build import build_factor_graph
from pmkjit.graph.factor_graph import (
    BlackBoxFactor,
    DataSlot,
    ElementSite,
    ElementSlot,
    FactorGraph,
    GaussianTerm,
    LatentVariable,
    LinearSlot,
)

__all__ = [
    "build_factor_graph",
    "FactorGraph",
    "LatentVariable",
    "LinearSlot",
    "ElementSlot",
    "DataSlot",
    "GaussianTerm",
    "ElementSite",
    "BlackBoxFactor",
]
