"""Recognising a mixture of Normals whose tilted moments are semi-analytic.

A likelihood ``y ~ sum_k w_k Normal(mu_k, sigma_k)`` is EP's classic clutter problem
(Minka, 2001). Given Gaussian cavities on the component means, the means integrate out
of each component in closed form, and a weight that is a product of powers of Beta
latents and their complements (``w``, ``1 - w``, or a Dirichlet's stick-breaking
``v_1``, ``(1 - v_1) v_2``, ...) integrates out of a Beta cavity in closed form too. What
is left is one integral over each component's latent scale (none where the scales are
constant): see :class:`pmkjit.ep.mixture.NormalMixtureMethod`.

The structure is read by probing the factor's parameters as functions of its inputs
(the flat parameter graphs the factor is built from), not by matching graph patterns:
``pm.NormalMixture(w=w, mu=mu, sigma=s)``, ``pm.Mixture(w=pt.stack([p, 1 - p]),
comp_dists=pm.Normal.dist(mu, s, shape=2))`` and a list of ``pm.Normal.dist`` with
``tau=`` all reduce to the same checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pmkjit.families import Beta, Gamma
from pmkjit.graph.factor_graph import DataSlot, ElementSlot, LinearSlot

__all__ = ["NormalMixtureSpec", "normal_mixture_spec"]

# Value a stick (Beta) input takes when the weights' constant factors are read off.
REFERENCE_STICK = 0.5
_PROBES = 8  # probe sets, more than the 1 + 2 n_sticks unknowns of a weight's fit for n_sticks <= 3
_PROBE_ENTRIES = 64  # entries the weights' exponents are fitted on (all entries are checked)
_RTOL = 1e-9


@dataclass
class NormalMixtureSpec:
    """Which factor inputs are each Normal component's mean, scale and weight.

    Attributes
    ----------
    params : callable
        ``params(*inputs) -> [w_1..w_K, mu_1, sigma_1, ..., mu_K, sigma_K]`` on the
        factor's inputs as flat arrays (the factor's own parameter graphs, compiled).
    mean_input : tuple of int or None
        Per component, the factor input that *is* its mean (a linear slot), or None
        where the mean does not depend on a latent (its value then comes from ``params``).
    scale_input : tuple of int or None
        Per component, the Gamma input its standard deviation is proportional to (by a
        per-entry constant, 1 or data), or None where it reads no latent.
    scale_link : tuple of str
        Per component: ``"scale"`` (``sigma = c s``) or ``"precision"`` (``sigma = c s ** -0.5``);
        ``c`` is read from ``params`` with the scale input at 1.
    stick_inputs : tuple of int
        The Beta inputs the weights read.
    exponents : ndarray (K, n_sticks, 2)
        ``w_k = c_k prod_j v_j ** e[k, j, 0] (1 - v_j) ** e[k, j, 1]``, ``c_k`` read from
        ``params`` with every stick at ``REFERENCE_STICK``.
    """

    params: Callable
    mean_input: tuple
    scale_input: tuple
    scale_link: tuple
    stick_inputs: tuple
    exponents: np.ndarray

    @property
    def n_components(self) -> int:
        return len(self.mean_input)


def normal_mixture_spec(inputs: Sequence, slots: Sequence, flat_params: Sequence, n_components: int,
                        compile_function: Callable) -> NormalMixtureSpec | None:
    """The spec of a mixture of ``n_components`` Normals, or None where it is not of that form.

    Parameters
    ----------
    inputs : the factor's input variables (flat vectors), in slot order
    slots : the factor's slots (linear, element or data)
    flat_params : the parameter graphs ``[w_1..w_K, mu_1, sigma_1, ..., mu_K, sigma_K]``
    n_components : K
    compile_function : ``compile_function(inputs, outputs)``, PyTensor's compiler as the
        builder uses it
    """
    K = n_components
    if len(flat_params) != 3 * K or not slots:
        return None
    B = slots[0].size
    fn = compile_function(inputs, list(flat_params))
    rng = np.random.default_rng(20011)  # a structural probe: the verdict does not depend on the values
    probes, values = [], []
    for _ in range(_PROBES):
        probe = [probe_values(s, B, rng) for s in slots]
        with np.errstate(all="ignore"):
            out = [np.broadcast_to(np.asarray(v, dtype=float), (B,)) for v in fn(*probe)]
        probes.append(probe)
        values.append(out)

    def column(j):  # parameter j at every probe, (P, B)
        return np.stack([v[j] for v in values])

    def constant(x):
        return bool(np.all(np.isfinite(x)) and np.allclose(x, x[0], rtol=_RTOL, atol=0.0))

    def identical_input(x, kind, transform=None):
        # the input x is; with a transform, the input whose transform x is a per-entry
        # multiple of (a scale times data, sigma = s * w_b)
        for i, s in enumerate(slots):
            if isinstance(s, kind) and (kind is LinearSlot or s.family is Gamma):
                target = np.stack([np.asarray(p[i], dtype=float) for p in probes])
                if transform is None:
                    if np.allclose(x, target, rtol=_RTOL, atol=1e-12):
                        return i
                elif constant(x / transform(target)) and np.all(x > 0):
                    return i
        return None

    mean_input, scale_input, scale_link = [], [], []
    for k in range(K):
        mu, sigma = column(K + 2 * k), column(K + 2 * k + 1)
        if constant(mu):
            mean_input.append(None)
        else:
            i = identical_input(mu, LinearSlot)
            if i is None:
                return None
            mean_input.append(i)
        if constant(sigma):
            if not np.all(sigma > 0):
                return None
            scale_input.append(None)
            scale_link.append("scale")
            continue
        i = identical_input(sigma, ElementSlot, lambda a: a)
        link = "scale"
        if i is None:
            i = identical_input(sigma, ElementSlot, lambda a: a**-0.5)
            link = "precision"
        if i is None:
            return None
        scale_input.append(i)
        scale_link.append(link)

    sticks = [i for i, s in enumerate(slots) if isinstance(s, ElementSlot) and s.family is Beta]
    exponents = np.zeros((K, len(sticks), 2))
    n = min(B, _PROBE_ENTRIES)
    for k in range(K):
        w = column(k)
        if constant(w):
            if not np.all(w[0] >= 0):
                return None
            continue
        if not sticks or not np.all(np.isfinite(w) & (w > 0)):
            return None
        # log w_k - its value at the first probe, against the sticks' log v and log(1 - v)
        # there: linear with the exponents as coefficients exactly when w_k is a product of
        # their powers times a constant (data) factor, whatever the other inputs do
        logs = np.stack([np.stack([np.log(p[i]) for i in sticks] + [np.log1p(-p[i]) for i in sticks], axis=-1)
                         for p in probes])  # (P, B, 2 n_sticks): all log v, then all log(1 - v)
        X = (logs[1:, :n] - logs[0, :n]).reshape(-1, logs.shape[-1])
        Y = (np.log(w[1:, :n]) - np.log(w[0, :n])).ravel()
        coef = np.linalg.lstsq(X, Y, rcond=None)[0]
        coef = np.where(np.abs(coef - np.round(coef)) < 1e-6, np.round(coef), coef)
        predicted = np.log(w[0]) + (logs - logs[0]) @ coef
        if np.any(coef < 0) or not np.allclose(np.log(w), predicted, rtol=0.0, atol=1e-8):
            return None
        exponents[k] = coef.reshape(2, len(sticks)).T

    used = {i for i in mean_input + scale_input if i is not None}
    used |= {sticks[j] for j in range(len(sticks)) if np.any(exponents[:, j] > 0)}
    latent = {i for i, s in enumerate(slots) if not isinstance(s, DataSlot)}
    if used != latent:
        return None  # a latent input read some other way (a mean through a link, a weight's regression)
    return NormalMixtureSpec(fn, tuple(mean_input), tuple(scale_input), tuple(scale_link), tuple(sticks), exponents)


def probe_values(slot, B: int, rng: np.random.Generator) -> np.ndarray:
    """Values of one input at ``B`` entries for a structural probe: its data, or random
    values in its family's support (real, positive, or in (0, 1))."""
    if isinstance(slot, DataSlot):
        return np.asarray(slot.values, dtype=float)
    if isinstance(slot, LinearSlot):
        return rng.normal(0.0, 2.0, B)
    if slot.family is Gamma:
        return np.exp(rng.normal(0.0, 0.7, B))
    return rng.uniform(0.05, 0.95, B)
