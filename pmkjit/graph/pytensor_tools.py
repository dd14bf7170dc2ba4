"""PyTensor plumbing: evaluating model sub-graphs on batches of latent values.

Everything here compiles with PyTensor's C op implementations and its cheapest graph
rewrites (no fusion): the graphs are small elementwise expressions evaluated on large
numpy arrays; each op's C code is generic, compiled once per machine and cached, so a
function compiles in about 0.1 s and evaluates as fast as numpy (see ``_MODE``).
"""

from __future__ import annotations

import warnings

from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import Mode
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.compile.ops import ViewOp
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.shape import SpecifyShape

__all__ = ["compile_function", "latent_ancestors", "affine_coefficients", "evaluate_constant",
           "parameter_checks_to_ninf", "lift_indexing", "drop_outputs"]

# PyTensor's C implementation of each op with its cheapest graph rewrites: the C code of
# an op is generic (per dtype and rank), compiled once per machine and cached, so a
# function compiles in ~0.1 s; the Python implementation (FAST_COMPILE) runs an n-ary
# Mul, a Cast, Softplus or a fused Composite through a per-element Python call (a StudentT
# log-density took 3.6 s on 168,100 points instead of 0.03 s, and quadrature of a robust
# regression with a latent scale minutes per sweep). Without a C compiler "c|py" falls
# back to the Python implementation.
_MODE = Mode(linker="c|py", optimizer="fast_compile")
_AFFINE_RTOL = 1e-8


def compile_function(inputs: Sequence[Variable], outputs, **kwargs) -> Callable:
    """``pytensor.function`` in the cheap-to-compile mode pmkjit uses throughout."""
    kwargs.setdefault("allow_input_downcast", True)
    kwargs.setdefault("mode", _MODE)
    return pytensor.function(list(inputs), outputs, on_unused_input="ignore", **kwargs)


def latent_ancestors(var: Variable, latents: Sequence[Variable]) -> list[Variable]:
    """The members of ``latents`` that ``var`` depends on, in the order of ``latents``."""
    found = set(ancestors([var], blockers=list(latents)))
    return [v for v in latents if v in found]


def evaluate_constant(var: Variable) -> np.ndarray:
    """Value of a graph with no latent inputs (data containers are read as they are now)."""
    return np.asarray(compile_function([], var)())


def model_fgraph(model):
    """``pymc.model.fgraph.fgraph_from_model(model)``, without PyMC's warning about GP objects.

    PyMC warns whenever a model holding a ``pm.gp`` object's variables (``*_hsgp_coeffs_``,
    ``*_rotated_``) is turned into a graph, because using the old GP object with the new
    model would bring back the old variables. pmkjit's rewrites make such a copy for their own
    use, which the user never sees, so the warning (which a user of ``pm.gp.HSGPPeriodic``
    got on every fit) says nothing true about their code.
    """
    from pymc.model.fgraph import fgraph_from_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected variables likely created by GP objects")
        return fgraph_from_model(model)


def drop_outputs(fg, variables) -> None:
    """Remove every output of the model graph ``fg`` that is one of ``variables``.

    The model rewrites (centring, stick-breaking, interval rescaling, potentials) replace a
    model variable by another and must drop the old one from the outputs, or
    ``model_from_fgraph`` would rebuild it.
    """
    drop = set(variables)
    for i in reversed(range(len(fg.outputs))):
        if fg.outputs[i] in drop:
            fg.remove_output(i)


def affine_coefficients(
    var: Variable, block: Sequence[tuple[Variable, slice, tuple[int, ...]]], n_dims: int, plate: tuple[int, ...],
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Write ``var`` (broadcast to ``plate`` and flattened) as ``A @ theta + c``, if it is affine.

    Parameters
    ----------
    var : graph depending on the latents of ``block`` only
    block : (latent, slice of theta, shape) for every real-valued latent
    n_dims : length D of theta
    plate : shape ``var`` is broadcast to
    rng : generator for the two random points that check the fit

    Returns
    -------
    (A, c) with ``A`` of shape ``(prod(plate), D)`` and ``c`` of shape ``(prod(plate),)``,
    or ``None`` when ``var`` is not affine in theta.

    Notes
    -----
    ``var`` is evaluated at ``theta = 0``, at the D unit vectors and at two random
    points, all in one vectorised call; the unit vectors give ``A`` exactly for an
    affine map and the random points reject anything else.
    """
    theta = pt.vector("theta", shape=(n_dims,))
    replace = {rv: theta[sl].reshape(shape) for rv, sl, shape in block}
    expr = clone_replace(var, replace)
    batch = pt.matrix("theta_batch")
    batched = vectorize_graph(expr, {theta: batch})
    f = compile_function([batch], batched)
    # in the input's precision: float32 latents (floatX = "float32") would round the random
    # points on the way in, and the check below compare values at the rounded points with
    # A at the exact ones
    points = np.vstack([np.zeros((1, n_dims)), np.eye(n_dims), rng.normal(size=(2, n_dims))]).astype(batch.dtype)
    points = points.astype(float)
    values = np.asarray(f(points), dtype=float)
    # numpy broadcasting aligns the variable's axes right, after the batch axis of points
    extra = len(plate) - (values.ndim - 1)
    if extra > 0:
        values = values.reshape((values.shape[0],) + (1,) * extra + values.shape[1:])
    try:
        values = np.broadcast_to(values, (points.shape[0],) + tuple(plate)).reshape(points.shape[0], -1)
    except ValueError:
        return None
    c = values[0]
    with np.errstate(invalid="ignore", over="ignore"):
        # (-inf - -inf: a potential's constraint, switch(mu[1] > mu[0], 0, -inf), is not
        # affine, and is no reason to warn the user either)
        A = (values[1 : n_dims + 1] - c).T
        check = points[-2:] @ A.T + c
        # Round-off is relative to each entry's own terms at the point, |c| + sum |A_j p_j|.
        # A bound scaled by the largest |A| over all entries passed anything: on uncentred
        # data, 1 + exp(b * t + a) at t = 53-81 has "coefficients" e^t ~ 1e35, and its
        # probe differences of 1e28 fell within 1e-8 of that, so an exp was taken for an
        # affine map (a Challenger logistic model ended 8 NUTS sd off, sd 3e-6 of NUTS's)
        terms = np.abs(c) + np.abs(points[-2:]) @ np.abs(A).T
    scale = 1.0 + np.abs(values[-2:]) + terms
    # an expression computed in float32 (pytensor.config.floatX = "float32") rounds at
    # 6e-8 of its values: at 1e-8, a + b * x was not affine and an exact Normal likelihood
    # became a black-box factor (KJIT, 10 s instead of 3 s); 1e-5 is still far below any
    # nonlinearity the random points would show
    rtol = max(_AFFINE_RTOL, 100.0 * np.finfo(expr.dtype).eps) if expr.dtype in ("float32", "float16") else _AFFINE_RTOL
    with np.errstate(invalid="ignore", over="ignore"):
        # (an exp of a linear predictor on uncentred data, x ~ 2000, overflows at the random
        # points: inf - inf is no reason to warn the user)
        affine = np.all(np.abs(check - values[-2:]) <= rtol * scale)
    if not affine:
        return None
    return np.ascontiguousarray(A), np.array(c)


def _follows_batch(cond: Variable, expr: Variable) -> bool:
    """Whether ``cond`` can be applied entry by entry to ``expr`` (its shape broadcasts along it).

    A mixture's check on its weights has the components' axis (length 2 for a zero-inflated
    likelihood), not the batch's: applied elementwise it met the batch of 100 entries in an
    Elemwise of incompatible shapes.
    """
    if cond.ndim > expr.ndim:
        return False
    for c, e in zip(cond.type.shape[::-1], expr.type.shape[::-1]):
        if c is not None and c != 1 and c != e:
            return False
    return True


def parameter_checks_to_ninf(logp: Variable) -> Variable:
    """``logp`` with PyMC's parameter checks turned into ``-inf``, entry by entry.

    PyMC guards a log-density with ``CheckParameterValue(expr, all(cond_1) & ...)``,
    which raises ``ParameterValueError`` when any entry's parameters are invalid (a
    sampled scale that underflowed to 0, a mean ``exp(eta)`` that overflowed), and which
    PyMC's own compiler turns into ``switch(cond, expr, -inf)`` on the *scalar* ``all``:
    one bad entry would zero the weight of a whole batch of samples. Here each condition
    is applied elementwise instead (the conditions of a flat, batched log-density are
    elementwise), falling back to the scalar switch for a guard of any other form.
    """
    from pymc.logprob.utils import CheckParameterValue
    from pytensor.graph.replace import graph_replace
    from pytensor.graph.traversal import toposort
    from pytensor.tensor.basic import MakeVector, ScalarFromTensor
    from pytensor.tensor.math import All

    def conditions(cond: Variable) -> list[Variable] | None:
        node = cond.owner
        if node is not None and isinstance(node.op, ScalarFromTensor):
            node = node.inputs[0].owner
        if node is None or not isinstance(node.op, All) or node.inputs[0].owner is None:
            return None
        inner = node.inputs[0].owner
        parts = inner.inputs if isinstance(inner.op, MakeVector) else [node.inputs[0]]
        out = []
        for part in parts:
            n = part.owner
            if n is None or not isinstance(n.op, All) or n.op.axis not in (None, tuple(range(n.inputs[0].ndim))):
                return None
            out.append(n.inputs[0])
        return out

    def to_ninf(node):
        expr, *conds = node.inputs
        parts = [c for cond in conds for c in (conditions(cond) or [None])]
        # a check on a parameter with a core axis (a categorical's probabilities, one row
        # per entry) holds for an entry when it holds along that axis: applied to the whole
        # batch, one sample's invalid row (ordinal cutpoints out of order) zeroed them all
        parts = [pt.all(c, axis=-1) if c is not None and c.ndim == expr.ndim + 1 else c for c in parts]
        if any(c is None or not _follows_batch(c, expr) for c in parts):
            ok = pt.all([pt.all(c) for c in conds])
        else:
            ok = parts[0]
            for c in parts[1:]:
                ok = pt.and_(ok, c)
        return pt.cast(pt.switch(ok, expr, -np.inf), node.outputs[0].dtype)

    # One guard at a time, by graph_replace, which copies the graph above the guard and
    # leaves the caller's nodes as they are. A rewrite of the graph in place (a
    # FunctionGraph without cloning) changed nodes that the model's own graph shares: a
    # potential's terms are cut from it, and a marginalised changepoint written as
    # logsumexp of pm.logp(pm.Poisson.dist(...)) corrupted it (a KeyError, robustness round 36).
    while True:
        node = next((n for n in toposort([logp])
                     if isinstance(n.op, CheckParameterValue) and n.op.can_be_replaced_by_ninf), None)
        if node is None:
            return logp
        logp = graph_replace(logp, {node.outputs[0]: to_ninf(node)}, strict=False)


def lift_indexing(var: Variable) -> Variable:
    """``var`` with integer-array indexing of elementwise expressions pushed into their inputs.

    ``(z * s)[group]`` becomes ``z[group] * s`` (an input broadcast along the indexed axis,
    like the scalar ``s``, is left as it is), recursively: the non-centred hierarchical
    effect ``pm.Deterministic("u", z * sd)[group]`` is then an elementwise function of a
    linear slot ``z[group]`` and a scalar latent, which the model walk understands. Of
    integer-array indexing, only a single one-dimensional index on the first axis is lifted
    (``x[idx]``), which keeps the result's shape, and a constant boolean mask of all of
    ``x``'s axes (``x[mask]``, the rows PyMC's imputation of missing observations selects
    from a likelihood's parameters), as the integer index of the mask's flat positions into ``x`` raveled
    (through inputs that only broadcast a column or row against the mask, too). An outer
    product ``pt.outer(x, y)`` (a ``Dot`` of a column and a row) becomes the elementwise
    ``x[:, None] * y[None, :]`` on the way. Constant basic indexing that takes an entry on
    some axis is lifted too: ``exp(v)[0]`` becomes ``exp(v[0])`` and ``exp(W)[:, 0]``
    ``exp(W[:, 0])`` (slices alone are left to the walk, which reads them).
    A new graph is returned (the model's graph is not modified); ``var`` itself when there
    is nothing to lift.
    """
    from pymc.distributions.distribution import SymbolicRandomVariable
    from pytensor.tensor.random.op import RandomVariable
    from pytensor.tensor.subtensor import AdvancedSubtensor, AdvancedSubtensor1, Subtensor, indices_from_subtensor

    memo: dict[Variable, Variable] = {}

    def picked(node):
        # x[i], x[i, j], x[:, j]: constant basic indexing of an elementwise x that takes an
        # entry on some axis (lam = exp(log_lam) read as lam[0] and lam[1] in a mixture's
        # components, exp(W)[:, 0]: refused as "through Subtensor"); slices alone are read
        # by the walk as they are
        if not isinstance(node.op, Subtensor):
            return None
        index = []
        for ix in indices_from_subtensor(node.inputs[1:], node.op.idx_list):
            parts = ix if not isinstance(ix, slice) else (ix.start, ix.stop, ix.step)
            parts = parts if isinstance(parts, tuple) else (parts,)
            if any(p is not None and not isinstance(p, Constant) for p in parts):
                return None
            values = [None if p is None else int(p.data) for p in parts]
            index.append(slice(*values) if isinstance(ix, slice) else values[0])
        if not any(isinstance(ix, int) for ix in index):
            return None
        x = unwrapped(node.inputs[0])
        if x.owner is None or not isinstance(x.owner.op, Elemwise):
            return None
        return x, tuple(index)

    def entry(inp: Variable, index: tuple) -> Variable:
        broadcast = inp.type.broadcastable
        taken = [a for a, ix in enumerate(index) if isinstance(ix, int)]
        node = inp.owner
        if (node is not None and isinstance(node.op, DimShuffle) and all(node.op.new_order[a] == "x" for a in taken)
                and all(node.op.new_order[a] == "x" or ix == slice(None) for a, ix in enumerate(index))):
            # an input broadcast along the axes taken: those axes dropped (a scalar expanded
            # to a row is the scalar again, so the walk reads it as the scalar latent it is)
            order, source = [o for a, o in enumerate(node.op.new_order) if a not in taken], node.inputs[0]
            return source if order == list(range(source.ndim)) else source.dimshuffle(order)
        # along a broadcast axis every entry is its one entry
        return inp[tuple(0 if broadcast[a] and isinstance(ix, int) else slice(None) if broadcast[a] else ix
                         for a, ix in enumerate(index))]

    def indexed(node):
        if isinstance(node.op, AdvancedSubtensor1):
            x, idx = node.inputs
        elif isinstance(node.op, AdvancedSubtensor) and len(node.inputs) == 2:
            x, idx = node.inputs
        else:
            return None
        flat: tuple[int, ...] | None = None
        if idx.dtype == "bool" and isinstance(idx, Constant) and idx.ndim == x.ndim >= 1:
            # x[mask] is x.ravel()[flatnonzero(mask)] (numpy's C order for both)
            flat = tuple(idx.data.shape) if idx.ndim > 1 else None
            idx = pt.constant(np.flatnonzero(np.asarray(idx.data).ravel()).astype(np.int64))
        if idx.ndim != 1 or not idx.dtype.startswith(("int", "uint")) or x.ndim < 1:
            return None
        x = unwrapped(x)
        if x.owner is None or not isinstance(x.owner.op, Elemwise):
            return None
        return x, idx, flat

    def part(inp: Variable, idx: Variable, flat: tuple[int, ...] | None) -> Variable:
        if flat is None:
            return inp if inp.type.broadcastable[0] else inp[idx]
        if all(inp.type.broadcastable):
            # a scalar: squeezed, it broadcasts against the selection (flattened to shape
            # (1,) it lost its broadcast flag once the affine probes vectorised the graph)
            return inp.squeeze()
        inp = unwrapped(inp)
        if inp.owner is not None and isinstance(inp.owner.op, Elemwise) and len(inp.owner.outputs) == 1:
            return inp.owner.op(*[part(i, idx, flat) for i in inp.owner.inputs])
        inner = _expanded(inp)
        if inner is not None and inp.ndim == len(flat):
            # a column or row broadcast against the mask's shape (x[:, None] in an outer
            # product): the selected entries read the elements at their coordinates along
            # the axes it does not broadcast, an integer index into its input raveled, which
            # lift() pushes further down (where it is elementwise in the latents)
            coords = np.unravel_index(np.asarray(idx.data), flat)
            shape = tuple(1 if b else n for b, n in zip(inp.type.broadcastable, flat))
            own = np.ravel_multi_index(tuple(np.zeros_like(c) if b else c
                                             for c, b in zip(coords, inp.type.broadcastable)), shape)
            source = inner if inner.ndim == 1 else inner.flatten()
            return source[pt.constant(own.astype(np.int64))]
        # broadcast to the mask's constant shape: x.shape would tie data to the latents'
        # shape graph, and latent_ancestors would then find latents in the data
        return pt.broadcast_to(inp, flat).flatten()[idx]

    def rebuilt(x: Variable, inputs: list[Variable]) -> Variable:
        # the elementwise x's op on lifted inputs: the output standing for x
        out = x.owner.op(*inputs)
        return out[x.owner.outputs.index(x)] if isinstance(out, (list, tuple)) else out

    def lift(v: Variable) -> Variable:
        if v in memo:
            return memo[v]
        node = v.owner
        out = v
        if node is not None and isinstance(node.op, (RandomVariable, SymbolicRandomVariable)):
            # a random variable (a latent) is a leaf: rebuilt because its own parameters were
            # rewritten (an outer product in pm.gp.HSGP's spectral density) it would be a
            # copy of the latent, no longer read as the latent
            node = None
        if node is not None:
            entry_of = picked(node)
            found = indexed(node) if entry_of is None else None
            if entry_of is not None:
                x, index = entry_of
                out = rebuilt(x, [lift(entry(inp, index)) for inp in x.owner.inputs])
            elif found is not None:
                x, idx, flat = found
                out = rebuilt(x, [lift(part(inp, idx, flat)) for inp in x.owner.inputs])
            elif _outer_product(node):
                # dot(x[:, None], y[None, :]) (pt.outer) is x[:, None] * y[None, :]: elementwise,
                # which the model walk can read (the piecewise-exponential survival model of
                # PyMC's gallery, lambda_ = pt.outer(exp(beta * x), lambda0), was refused)
                out = lift(node.inputs[0]) * lift(node.inputs[1])
            else:
                new = [lift(i) for i in node.inputs]
                if any(a is not b for a, b in zip(new, node.inputs)):
                    out = node.clone_with_new_inputs(new, strict=False).outputs[node.outputs.index(v)]
        memo[v] = out
        return out

    return lift(var)


def _outer_product(node) -> bool:
    """Whether ``node`` is a matrix product of a column ``(n, 1)`` and a row ``(1, k)``."""
    from pytensor.tensor.math import Dot

    if not isinstance(node.op, Dot) or len(node.inputs) != 2:
        return False
    x, y = node.inputs
    return x.ndim == 2 and y.ndim == 2 and x.type.broadcastable[1] and y.type.broadcastable[0]


def _expanded(var: Variable) -> Variable | None:
    """The input of ``var`` if ``var`` only inserts broadcastable axes into it (``x[:, None]``)."""
    node = var.owner
    if node is None or not isinstance(node.op, DimShuffle):
        return None
    kept = [d for d in node.op.new_order if d != "x"]
    if kept != list(range(node.inputs[0].ndim)):
        return None  # a transpose or a dropped axis
    return node.inputs[0]


def largest_static_size(graph: Variable) -> int:
    """The most entries of any variable in ``graph``, its axes of unknown length counted as 1.

    A log-density over a batch of instances has the batch as its unknown axis; what is left
    is one instance's work (1 for an elementwise density, the table's size for a potential
    summing over a table of data).
    """
    from pytensor.graph.traversal import ancestors

    sizes = [int(np.prod([1 if n is None else n for n in v.type.shape], dtype=np.int64))
             for v in ancestors([graph]) if hasattr(v.type, "shape")]
    return max(sizes, default=1)


def in_point_slices(fn: Callable, args: Sequence[np.ndarray], step: int) -> np.ndarray:
    """``fn(*args)`` on flat arrays of points, at most ``step`` points a call, as one flat array.

    For a compiled density of which each point is a whole table or factorisation (a
    multivariate likelihood's covariance, a potential summing over data): its
    intermediates hold the point count times that size, so the points go in slices
    (not a loop over data points).
    """
    n = args[0].size
    out = np.empty(n)
    for lo in range(0, n, step):
        out[lo:lo + step] = fn(*[a[lo:lo + step] for a in args])
    return out


def unwrapped(var: Variable) -> Variable:
    """``var`` under the ``ViewOp`` and ``SpecifyShape`` that ``pm.Deterministic`` wraps it in."""
    while var.owner is not None and isinstance(var.owner.op, (ViewOp, SpecifyShape)):
        var = var.owner.inputs[0]
    return var


def pass_through(op) -> bool:
    """Ops that leave values unchanged on flat per-instance vectors."""
    if isinstance(op, DimShuffle):
        # a squeeze to a scalar keeps the one value it has: select_entries squeezes a scalar
        # parameter broadcast by PyMC (ExpandDims of 2 * sigma) before selecting entries,
        # and the walk refused a likelihood split by data (rho * y[:-1] with a zero in y)
        # whose scale was an expression of a latent
        return left_expanding(op) or not op.new_order  # (PyTensor drops only size-1 axes)
    return isinstance(op, (ViewOp, SpecifyShape))


def elementwise_nodes(outputs: Sequence[Variable]) -> list:
    """The nodes reached from ``outputs`` through elementwise and pass-through ops, and those ops' inputs.

    These are the nodes whose values follow a likelihood's entries in numpy's broadcasting
    order, as the model walk (``_Builder._walk``) reads them.
    """
    found, stack, seen = [], list(outputs), set()
    while stack:
        var = stack.pop()
        node = var.owner
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node.op, Elemwise) or pass_through(node.op):
            found.append(node)
            stack.extend(node.inputs)
    return found


def replace_elementwise(outputs: Sequence[Variable], old: Variable, new: Variable) -> list[Variable]:
    """``outputs`` with ``old`` replaced by ``new`` along their elementwise paths (``elementwise_nodes``).

    The nodes above ``old`` are applied again to their new inputs, so that their shapes
    follow ``new``'s (a branch may broadcast where the switch it replaces did not: a scalar
    rate under a switch over 110 entries); everything else, the latents included, is kept
    as it is (a clone would copy the latents, and ``latent_ancestors`` goes by identity).
    A ``SpecifyShape`` on the way, which would insist on the old shape, is dropped.
    """
    memo: dict[Variable, Variable] = {old: new}

    def rebuilt(var: Variable) -> Variable:
        if var in memo:
            return memo[var]
        node = var.owner
        out = var
        if node is not None and (isinstance(node.op, Elemwise) or pass_through(node.op)):
            inputs = [rebuilt(i) for i in node.inputs]
            if isinstance(node.op, SpecifyShape):
                out = inputs[0]
            elif any(a is not b for a, b in zip(inputs, node.inputs)):
                out = node.op.make_node(*inputs).outputs[node.outputs.index(var)]
        memo[var] = out
        return out

    return [rebuilt(v) for v in outputs]


def left_expanding(op: DimShuffle) -> bool:
    """A DimShuffle that only adds broadcast axes on the left (numpy broadcasting order)."""
    order = [o for o in op.new_order]
    kept = [o for o in order if o != "x"]
    if kept != sorted(kept) or len(kept) != op.input_ndim:
        return False
    first = next((i for i, o in enumerate(order) if o != "x"), len(order))
    return all(o == "x" for o in order[:first]) and all(o != "x" for o in order[first:])
