"""Keys that identify a black-box factor across models and processes.

The operator store (:mod:`pmkjit.ep.store`) files a trained KJIT operator under a hash of
its factor's graph: the ops and constants of the sampling graph (and log-density), with
input names and memory addresses taken out, plus a fingerprint of any Python code a
``pm.Simulator`` or ``pm.CustomDist`` calls. Two models that write the same factor find
the same operator; a changed factor does not.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import pytensor
from pytensor.graph.basic import Variable




def describe_graph(g: Variable) -> str:
    """A short name for a deterministic's graph (its outermost ops), for a factor's description."""
    ops = []
    node = g.owner
    while node is not None and len(ops) < 4:
        ops.append(type(getattr(node.op, "scalar_op", node.op)).__name__.lower())
        node = node.inputs[0].owner if node.inputs else None
    return "(".join(ops) + "(...)" + ")" * max(len(ops) - 1, 0) if ops else "identity"


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def graph_key(out: Variable, inputs: list, extra: Sequence = ()) -> str:
    """A hash of the graph's structure (ops and constants), independent of names.

    ``extra``: further graphs (the factor's log-density) or strings (a simulator's
    fingerprint) that distinguish factors with the same sampling graph.
    """
    text = pytensor.printing.debugprint(out, file="str", print_type=True, id_type="")
    for e in extra:
        text += "\n" + (e if isinstance(e, str) else pytensor.printing.debugprint(e, file="str", print_type=True,
                                                                                  id_type=""))
    # a random variable's generator prints with its memory address ("RNG(<Generator(PCG64)
    # at 0x7f...>)"), different in every model and process: without this the key changed
    # with every fit and stored operators of sampled factors were never found again
    text = _ADDRESS.sub("", text)
    for i, v in enumerate(inputs):
        text = text.replace(v.name, f"in{i}")
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def has_no_random(op) -> bool:
    """A ``pm.CustomDist`` made without ``random=`` (PyMC's placeholder raises when sampled)."""
    fn = getattr(type(op), "_random_fn", None)
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__qualname__", "") == "default_not_implemented.<locals>.func"


def function_fingerprint(fn) -> str:
    """The code, constants, defaults and closure values of a Python function (best effort)."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    cells = []
    for c in fn.__closure__ or ():
        try:
            cells.append(repr(c.cell_contents))
        except ValueError:  # an empty cell
            cells.append("<empty>")
    return "|".join([getattr(fn, "__module__", "") or "", fn.__qualname__, code.co_code.hex(), repr(code.co_consts),
                     repr(code.co_names), repr(getattr(fn, "__defaults__", None)), *cells])


def simulator_fingerprint(op) -> str:
    """What makes one ``pm.Simulator`` differ from another with the same parameter graph."""
    parts = [function_fingerprint(op.fn)]
    for attr in ("distance", "sum_stat"):
        v = getattr(op, attr, None)
        parts.append(v if isinstance(v, str) else function_fingerprint(v) if callable(v) else repr(v))
    eps = getattr(op, "epsilon", None)
    eps = getattr(eps, "data", eps)
    parts.append(repr(np.asarray(eps).tolist()) if eps is not None else "None")
    return _ADDRESS.sub("", "simulator:" + "|".join(parts))
