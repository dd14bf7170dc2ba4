"""The log-density of a multivariate likelihood as a function of a few scalar latents.

A multivariate observation whose parameters read only a handful of scalar latents (the
marginal likelihood of a Gaussian process, ``pm.MvNormal(0, eta**2 * K(ls) + s**2 * I)``,
or any ``pm.MvNormal``, ``pm.MvStudentT`` or ``pm.DirichletMultinomial`` whose parameters
are built from scalars) is one EP factor of one instance: its tilted law is the cavity of
those scalars times the whole density, a law of at most three numbers, which
:class:`~pmkjit.ep.collapsed.CollapsedLikelihood` integrates (adaptive quadrature, or a grid in
the law's own frame) and draws from jointly, as for a likelihood of shared scalars. The oracles evaluate the factor's
density at thousands of points at once; :func:`scalar_log_density` compiles it once, with
the observation as a constant and the scalars as batch vectors
(:func:`pytensor.graph.replace.vectorize_graph`), and evaluates it in chunks so that the
batch of ``n x n`` covariance matrices a point each stays within memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.compile.mode import Mode
from pytensor.graph.basic import Variable
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import ancestors

from pmkjit.errors import UnsupportedModelError
from pmkjit.graph.keys import graph_key
from pmkjit.graph.pytensor_tools import compile_function, in_point_slices, parameter_checks_to_ninf

__all__ = ["scalar_log_density", "MAX_SCALARS"]

# The collapsed likelihood's most latents (:mod:`pmkjit.ep.collapsed`: adaptive quadrature
# for two, a rotated grid in the law's own frame for three, joint draws from either). The
# grid oracle takes up to six, but one instance by it alone did not settle: a Gaussian
# process with a linear mean (five latents) moved 0.05-0.1 a sweep for six sweeps, at
# 8-25 s a sweep, where three on the rotated grid converge in four at 2 s.
MAX_SCALARS = 3
_FULL_REWRITES = Mode(linker="cvm", optimizer="fast_run")
_CHUNK_ENTRIES = 2_000_000  # points x entries of the observation's largest parameter, evaluated at once


def scalar_log_density(model: pm.Model, rv: Variable, y: np.ndarray,
                       latents: Sequence[tuple[Variable, tuple[int, ...]]],
                       size: int) -> tuple[Callable[[Sequence[np.ndarray]], np.ndarray], str]:
    """``(log_density, fingerprint)`` of observed ``rv`` at ``y`` as a function of ``latents``.

    The density is the model's own term for ``rv`` (``model.logp(vars=[rv])``, in the
    latents' value variables, each replaced by its transform of the latent's value), not
    ``pm.logp(rv, y)``: for a ``pm.GaussianRandomWalk`` the latter did not depend on its
    ``sigma`` at all, so its factor was a constant and the posterior the prior, silently.

    Parameters
    ----------
    model : pymc.Model
        The model holding ``rv``.
    rv : Variable
        The observed random variable (its parameters read ``latents`` and constants only).
    y : ndarray
        Its observed value (for the fingerprint).
    latents : sequence of (Variable, shape)
        The latent random variables the parameters read and their shapes; the density is
        a function of their elements, in C order, latent after latent.
    size : int
        The number of entries of the largest parameter (the chunk of points evaluated at
        once is ``_CHUNK_ENTRIES / size``).

    Returns
    -------
    log_density : callable
        ``log_density(values)`` with ``values`` a list of arrays of one shape (one per
        element), returning the summed log-density at each point, of that shape; ``-inf``
        where PyMC's parameter checks fail.
    fingerprint : str
        A hash of the density's graph and the observation, for the factor's key: the data
        are inside the density, not a data slot, so two data sets are two factors.
    """
    logp = parameter_checks_to_ninf(model.logp(vars=[rv], jacobian=False, sum=True))
    standins = [v.type() for v, _ in latents]
    values = {}
    for (v, _), standin in zip(latents, standins, strict=True):
        transform = model.rvs_to_transforms.get(v)
        values[model.rvs_to_values[v]] = standin if transform is None else transform.forward(standin, *v.owner.inputs)
    logp = graph_replace(logp, values, strict=False)
    missing = set(model.value_vars) & set(ancestors([logp]))
    if missing:
        raise UnsupportedModelError(f"{rv.name}: its density reads {', '.join(sorted(m.name for m in missing))} beyond the latents given")
    batch, replace = [], {}
    for (v, shape), standin in zip(latents, standins, strict=True):
        elements = [pt.vector(f"in{len(batch) + k}", dtype=v.dtype) for k in range(int(np.prod(shape, dtype=int)))]
        batch += elements
        # each point's elements make the latent's value at that point, in its own shape
        replace[standin] = pt.stack(elements, axis=-1).reshape((-1, *shape))
    batched = vectorize_graph(logp, replace=replace)
    # PyTensor's full rewrites, not pmkjit's cheap-to-compile mode: vectorising leaves every
    # matrix operation blockwise, a Python loop over the points, and the full rewrites lift
    # the ones with a constant operand out of it (a pm.MvStudentT's solve against its constant
    # scale: 9 instead of 810 us a point, for 10 s more compilation)
    fn = compile_function(batch, batched, mode=_FULL_REWRITES)
    chunk = max(1, _CHUNK_ENTRIES // max(1, size))
    dtypes = [b.dtype for b in batch]

    def log_density(values: Sequence[np.ndarray]) -> np.ndarray:
        shape = np.shape(values[0])
        flat = [np.ravel(np.broadcast_to(v, shape)).astype(d) for v, d in zip(values, dtypes, strict=True)]
        with np.errstate(all="ignore"):
            # each point a whole density (a Cholesky factorisation of an n x n covariance
            # for an MvNormal)
            out = in_point_slices(fn, flat, chunk)
        out[np.isnan(out)] = -np.inf
        return out.reshape(shape)

    digest = hashlib.sha1(np.ascontiguousarray(y, dtype=float).tobytes()).hexdigest()
    return log_density, graph_key(batched, batch, extra=[digest])
