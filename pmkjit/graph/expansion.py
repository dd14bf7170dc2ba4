"""Rewrites that let the model walk read products and reductions it otherwise refuses.

The walk (``_Builder._walk``) reads a parameter as an elementwise function of per-instance
slots. Three common expressions are not elementwise, yet have that form once written out:

* **a constant matrix times a vector that mixes Gaussian and other latents**,
  ``phi @ (beta * sqrt(psd(ell, eta)))``: a Hilbert-space GP (``pm.gp.HSGP``) whose length
  scale and amplitude are latent, or a regression whose coefficients are scaled by latents
  per coefficient. Not affine in the Gaussian ``beta`` as a whole (the scales are latent),
  it is, column by column, ``sum_j phi[:, j] * beta[j] * s_j(ell, eta)``: each term an
  elementwise product of a data column, one Gaussian scalar and a function of scalars
  (:func:`expand_product`). A Normal likelihood of it is then affine in the ``beta[j]``
  given the scalars, which :mod:`pmkjit.ep.collapsed_linear` integrates in closed form.
* **a function of scalar latents through non-elementwise operations** (``prod(ls)``,
  ``dot(omega ** 2, ls ** 2)`` inside the spectral density above; the whole spectral density
  as the prior sd of a centred HSGP's coefficients): a few values, which the walk reads as
  a function of those scalars and the rebuild vectorises over instances with
  :func:`pytensor.graph.replace.vectorize_graph` (:func:`vectorised_scalar_function`).
* **the sum or product of a short latent vector's entries**, ``pm.math.sum(ab)`` in the rat
  tumours' hyperprior ``pm.Potential("p(a, b)", -2.5 * log(sum(ab)))`` over positive ``ab``:
  written out as ``ab[0] + ab[1]`` (:func:`expand_reduction`), a function of two elements.
  Refused before as "neither affine nor elementwise", though ``ab[0] + ab[1]`` was read. Up to
  :data:`MAX_REDUCED_ENTRIES` entries: the written-out term is one factor of that many latent
  elements, which a one-site law integrates on a grid (a sum of four positive scalars in a
  potential: 7 s; of five: 183 s; of six: a 6-D grid factor, not converged in 50 sweeps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor.basic import MakeVector
from pytensor.tensor.blockwise import Blockwise
from pytensor.scalar import Add, Mul
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.subtensor import AdvancedSubtensor, AdvancedSubtensor1

from pmkjit.graph.pytensor_tools import evaluate_constant, latent_ancestors, left_expanding, unwrapped

__all__ = ["MAX_EXPANDED_COLUMNS", "MAX_REDUCED_ENTRIES", "Expanded", "ScalarFunction", "entries", "expand_product",
           "expand_reduction", "is_scalar_function", "vectorised_scalar_function"]

# Columns a product is written out into: each is a data slot and a latent input of the
# factor, and a Normal likelihood integrates the Gaussian ones jointly (a k x k system per
# grid node); an HSGP uses 10-50 basis functions.
MAX_EXPANDED_COLUMNS = 64
# Entries a sum or product of latents is written out into (see the module's docstring)
MAX_REDUCED_ENTRIES = 4


@dataclass(frozen=True)
class Expanded:
    """A walk leaf standing for ``expression``, the same values written elementwise;
    ``product``: a matrix product written out column by column (a factor of as many latent
    inputs as columns), not the few entries of a reduction."""

    expression: Variable
    product: bool = True


@dataclass(frozen=True)
class ScalarFunction:
    """A walk leaf: a function of the one-element latents ``latents``; ``entry``, where it has
    several entries, the leaf of the data input saying which one each instance reads."""

    latents: tuple
    entry: Variable | None


def _is_dot(op) -> bool:
    return isinstance(op, Dot) or (isinstance(op, Blockwise) and isinstance(op.core_op, Dot))


def _constant_rows(node, latents) -> np.ndarray | None:
    """The constant 1-D integer index of ``x[idx]``, else None."""
    if not isinstance(node.op, (AdvancedSubtensor, AdvancedSubtensor1)) or len(node.inputs) != 2:
        return None
    idx = node.inputs[1]
    if latent_ancestors(idx, latents) or idx.ndim != 1 or not str(idx.dtype).startswith(("int", "uint")):
        return None
    try:
        return np.asarray(evaluate_constant(idx), dtype=np.int64)
    except Exception:  # noqa: BLE001  (not a constant: not this rewrite's case)
        return None


def element(v: Variable, j: int) -> Variable:
    """``v[j]`` of a vector ``v``, pushed through elementwise operations (a 0-d graph).

    An input broadcast along the vector's axis (a scalar latent expanded by PyMC) is read
    as the scalar it is; what is not elementwise is indexed where it stands.
    """
    v = unwrapped(v)  # pm.Deterministic
    node = v.owner
    if node is not None and isinstance(node.op, MakeVector):  # pt.stack of scalars
        return node.inputs[j]
    if node is not None and isinstance(node.op, DimShuffle) and left_expanding(node.op) \
            and node.inputs[0].ndim == 0:
        return node.inputs[0]
    if v.type.broadcastable[0]:
        return v[0]
    if node is not None and isinstance(node.op, Elemwise) and len(node.outputs) == 1:
        return node.op(*[element(i, j) for i in node.inputs])
    return v[j]


def expand_product(var: Variable, latents: Sequence[Variable]) -> Variable | None:
    """``var`` written out column by column if it is ``C @ v`` with a constant matrix ``C``.

    Recognised: ``C @ v`` and ``C @ v[:, None]`` (``pm.gp.HSGP.prior``'s form), under
    squeezes and a constant integer index of the rows (``f[idx]``), with ``v`` of at most
    :data:`MAX_EXPANDED_COLUMNS` entries depending on ``latents``. Returns the vector
    ``sum_j C[:, j] * v[j]`` (with ``v[j]`` pushed through elementwise operations by
    :func:`element`), of ``var``'s shape, or None.
    """
    if var.ndim != 1:
        return None
    x, rows = var, None
    if x.owner is not None and (idx := _constant_rows(x.owner, latents)) is not None:
        rows, x = idx, x.owner.inputs[0]
    while x.owner is not None and isinstance(x.owner.op, DimShuffle):
        x = x.owner.inputs[0]
    node = x.owner
    if node is None or not _is_dot(node.op) or len(node.inputs) != 2:
        return None
    C, v = node.inputs
    if C.ndim != 2 or latent_ancestors(C, latents) or not latent_ancestors(v, latents):
        return None
    if v.ndim == 2:
        if v.type.shape[1] != 1:
            return None
        v = v[:, 0] if not (v.owner is not None and isinstance(v.owner.op, DimShuffle)
                            and tuple(v.owner.op.new_order) == (0, "x")) else v.owner.inputs[0]
    if v.ndim != 1:
        return None
    C_value = np.asarray(evaluate_constant(C), dtype=float)
    if C_value.ndim != 2 or C_value.shape[1] > MAX_EXPANDED_COLUMNS:
        return None
    if rows is not None:
        C_value = C_value[rows]
    # only a vector of C's rows (not a broadcast or reshaped product) keeps var's entries
    if var.type.shape[0] is not None and var.type.shape[0] != C_value.shape[0]:
        return None
    terms = [pt.as_tensor(C_value[:, j]) * element(v, j) for j in range(C_value.shape[1])
             if np.any(C_value[:, j])]
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else pt.add(*terms)


def expand_reduction(var: Variable, latents: Sequence[Variable]) -> Variable | None:
    """``var`` written out entry by entry if it is the sum or the product of all the entries of
    a vector of at most :data:`MAX_REDUCED_ENTRIES` entries depending on ``latents``
    (``v[0] + v[1] + ...``, each ``v[j]`` pushed through elementwise operations by
    :func:`element`); else None."""
    node = var.owner
    if node is None or var.ndim != 0 or not isinstance(node.op, CAReduce) or len(node.inputs) != 1:
        return None
    combine = {Add: pt.add, Mul: pt.mul}.get(type(node.op.scalar_op))
    x = node.inputs[0]
    n = x.type.shape[0] if x.ndim == 1 else None
    if combine is None or n is None or not 1 <= n <= MAX_REDUCED_ENTRIES or not latent_ancestors(x, latents):
        return None
    terms = [element(x, j) for j in range(n)]
    return pt.cast(terms[0] if n == 1 else combine(*terms), var.dtype)


def _size(var: Variable) -> int:
    return int(np.prod(var.type.shape, dtype=int))


def is_scalar_function(var: Variable, deps: Sequence[Variable], sizes: Sequence[int], plate) -> bool:
    """Whether ``var`` reads only latents of one element each and has few entries, which
    broadcast to ``plate``."""
    if not deps or any(s != 1 for s in sizes) or None in var.type.shape:
        return False
    size = _size(var)
    try:
        np.broadcast_shapes(var.type.shape, tuple(plate))
    except ValueError:
        return False
    return size <= MAX_EXPANDED_COLUMNS and len(var.type.shape) <= len(plate)


def entries(var: Variable, plate) -> np.ndarray:
    """Which of ``var``'s entries each instance of ``plate`` reads (``var`` broadcast to it), flat."""
    return np.broadcast_to(np.arange(_size(var)).reshape(var.type.shape), tuple(plate)).ravel()


def vectorised_scalar_function(var: Variable, latents: Sequence[Variable], inputs: Sequence[Variable],
                               entry: Variable | None) -> Variable:
    """``var`` (a function of the one-element ``latents``) at each instance's own entry.

    ``inputs[k]`` is a flat vector of values of ``latents[k]``, one per instance, and
    ``entry`` (None for one entry) the flat vector of the entry of ``var`` each instance
    reads (:func:`entries`: a data input, since instances come in any order and number);
    the result is the flat vector of those entries at those values. ``var`` is evaluated
    whole at each instance: it has at most :data:`MAX_EXPANDED_COLUMNS` entries.
    """
    replace = {lat: pt.shape_padright(inp, lat.ndim) for lat, inp in zip(latents, inputs)}
    out = vectorize_graph(var, replace=replace)  # (n, *var.shape)
    if var.type.ndim == 0:
        return out
    flat = out.reshape((out.shape[0], -1))
    if entry is None:
        return flat[:, 0]
    return flat[pt.arange(flat.shape[0]), pt.cast(entry, "int64")]
