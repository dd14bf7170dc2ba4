"""Recognising a Normal likelihood whose mean is affine in some Gaussian inputs given the rest.

A measurement-error regression ``y ~ Normal(a + b * x_true, s)`` with ``x_true`` latent is a
black-box factor of four latents (``x_true[n]``, ``a``, ``b``, ``s``): the product ``b *
x_true`` is not affine in the Gaussian latents as a whole, so neither the exact Gaussian
factor nor the semi-analytic Normal with a latent scale applies, and the Gauss-Hermite
grid over all four refused most entries (the tilted law is a thin, curved sheet along
``a + b x = y`` whose thickness is ``s``), which left them to importance sampling: EP did
not converge in 50 sweeps (robustness round 33). Given ``b``, though, the mean is affine
in ``(a, x_true[n])`` and the Normal integrates them out in closed form: what is left is a
smooth law of ``(b, s)`` (:class:`pmkjit.ep.linear_normal.LinearNormalMethod`).

As for the mixture of Normals (:mod:`pmkjit.graph.mixture`), the structure is read by
probing the factor's parameters as functions of its inputs, not by matching graph
patterns: the largest set of Gaussian inputs in which the mean is jointly affine and on
which the standard deviation does not depend, with one to six inputs left for the grid.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytensor

from pmkjit.families import Beta, Gamma, Gaussian
from pmkjit.graph.factor_graph import DataSlot, LinearSlot
from pmkjit.graph.mixture import probe_values

__all__ = ["LinearNormalSpec", "linear_normal_spec"]

_PROBES = 3  # independent probe sets, each a random line through the Gaussian inputs
_RTOL = 1e-7
_MAX_REST = 6  # the grid oracle's largest dimension
_MAX_GAUSSIAN = 10  # Gaussian inputs whose subsets are tried (at most 2 ** 10 of them); beyond, only all


@dataclass(frozen=True)
class LinearNormalSpec:
    """Which inputs of a Normal likelihood integrate out in closed form.

    Attributes
    ----------
    params : callable
        ``params(*inputs) -> [mu, sigma]`` on the factor's inputs as flat arrays (the
        factor's own parameter graphs, compiled).
    linear : tuple of int
        The Gaussian (linear-slot) inputs the mean is jointly affine in, whatever the
        other inputs are, and which the standard deviation does not read.
    rest : tuple of int
        The other latent inputs (one to six), integrated on a grid.
    gradients : callable or None
        ``gradients(*inputs) -> [mu, sigma, d mu / d inputs[i] for i in linear]``, compiled;
        None where PyTensor has no gradient of the mean, and the slopes come from steps.
    """

    params: Callable
    linear: tuple
    rest: tuple
    gradients: Callable | None = None

    def mean_and_slopes(self, ins: Sequence[np.ndarray], steps: Sequence[np.ndarray]) -> tuple:
        """``(mu, sigma, slopes)`` at the flat inputs ``ins``: the mean, the sd and the mean's
        slope in each of the :attr:`linear` inputs, ``(n,)`` each.

        The slopes are the compiled gradient's where there is one (one evaluation for all of
        them: an HSGP reads 10-50 Gaussian inputs), else the mean's change over one step
        ``steps[j]`` of input ``linear[j]`` (exact for an affine mean, up to round-off).
        """
        n = np.size(ins[0])

        def flat(values):
            return [np.broadcast_to(np.asarray(a, dtype=float), (n,)) for a in values]

        if self.gradients is not None:
            mu, sigma, *slopes = flat(self.gradients(*ins))
            return mu, sigma, slopes
        mu, sigma = flat(self.params(*ins))
        slopes = []
        for j, i in enumerate(self.linear):
            moved = list(ins)
            moved[i] = ins[i] + steps[j]
            slopes.append((flat(self.params(*moved))[0] - mu) / steps[j])
        return mu, sigma, slopes


def linear_normal_spec(inputs: Sequence, slots: Sequence, flat_params: Sequence,
                       compile_function: Callable) -> LinearNormalSpec | None:
    """The spec of a Normal likelihood ``[mu, sigma] = flat_params`` of three or more latent
    inputs, or None where no Gaussian input integrates out (or none is left for the grid).

    Parameters
    ----------
    inputs : the factor's input variables (flat vectors), in slot order
    slots : the factor's slots (linear, element or data)
    flat_params : the parameter graphs ``[mu, sigma]``
    compile_function : ``compile_function(inputs, outputs)``, PyTensor's compiler as the
        builder uses it
    """
    if len(flat_params) != 2 or not slots:
        return None
    latent = [i for i, s in enumerate(slots) if not isinstance(s, DataSlot)]
    gaussian = [i for i in latent if isinstance(slots[i], LinearSlot)]
    if len(latent) < 3 or not gaussian:
        return None
    fn = compile_function(inputs, list(flat_params))
    B = slots[0].size
    rng = np.random.default_rng(20331)  # a structural probe: the verdict does not depend on the values
    probes = [[probe_values(s, B, rng) for s in slots] for _ in range(_PROBES)]
    directions = [rng.normal(0.0, 2.0, (len(slots), B)) for _ in range(_PROBES)]

    def evaluate(ins):
        with np.errstate(all="ignore"):
            return [np.broadcast_to(np.asarray(v, dtype=float), (B,)) for v in fn(*ins)]

    def affine_in(subset) -> bool:
        # along a random line through the subset's inputs (the others fixed), an affine mean
        # is linear: its midpoint and its extrapolation agree with its ends; a product of
        # two inputs on the line is quadratic in the step and fails both. The standard
        # deviation must not move at all.
        for probe, d in zip(probes, directions):
            points = []
            for t in (0.0, 1.0, 0.5, 2.0):
                ins = [p + t * d[i] if i in subset else p for i, p in enumerate(probe)]
                points.append(evaluate(ins))
            (m0, s0), (m1, s1), (mh, sh), (m2, s2) = points
            values = np.stack([m0, m1, mh, m2, s0, s1, sh, s2])
            if not (np.all(np.isfinite(values)) and np.all(s0 > 0)):
                return False
            tol = _RTOL * (np.abs(m0) + np.abs(m1) + 1.0)  # round-off of each entry's mean
            if not (np.all(np.abs(mh - 0.5 * (m0 + m1)) <= tol) and np.all(np.abs(m2 - (2.0 * m1 - m0)) <= 2 * tol)
                    and all(np.allclose(s, s0, rtol=_RTOL, atol=0.0) for s in (s1, sh, s2))):
                return False
        return True

    # many Gaussian inputs (an HSGP's basis coefficients, :mod:`pmkjit.graph.expansion`):
    # all of them or none, not the 2 ** k subsets
    sizes = range(len(gaussian), 0, -1) if len(gaussian) <= _MAX_GAUSSIAN else [len(gaussian)]
    for k in sizes:
        for subset in itertools.combinations(gaussian, k):
            rest = tuple(i for i in latent if i not in subset)
            if not (1 <= len(rest) <= _MAX_REST and all(slots[i].family in (Gaussian, Gamma, Beta) for i in rest)):
                continue
            if affine_in(set(subset)):
                return LinearNormalSpec(fn, tuple(subset), rest, _gradients(inputs, flat_params, subset, compile_function))
    return None


def _gradients(inputs, flat_params, linear, compile_function) -> Callable | None:
    """``f(*inputs) -> [mu, sigma, d mu / d inputs[i] for i in linear]``, or None where the
    mean has no symbolic gradient. Each entry's mean reads its own entries of the inputs
    only, so the gradient of the summed mean is the vector of the entries' slopes."""
    mu, sigma = flat_params
    try:
        grads = pytensor.grad(mu.sum(), [inputs[i] for i in linear], disconnected_inputs="ignore",
                              return_disconnected="zero")
        return compile_function(inputs, [mu, sigma, *grads])
    except Exception:  # noqa: BLE001  (an operation with no gradient: finite steps instead)
        return None
