"""Factor graphs built once per model, shared by the tests that ask which method a factor takes.

Building a model's factor graph compiles its log-densities; the which-factors tests ask about
several likelihoods of one model, so each model's graph is built once and kept.
"""

from __future__ import annotations

from pmkjit.graph import build_factor_graph

# model id -> (model, its factor graph); the model is kept so that its id is not reused
_GRAPHS: dict[int, tuple] = {}


def factor(model, name: str):
    """The factor named ``name`` in ``model``'s factor graph (the graph is built once)."""
    if id(model) not in _GRAPHS:
        _GRAPHS[id(model)] = (model, build_factor_graph(model))
    (f,) = [f for f in _GRAPHS[id(model)][1].factors if f.name == name]
    return f
