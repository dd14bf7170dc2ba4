"""Warnings about a model before EP runs: parts its factorised messages are known to get wrong.

Each check reads the PyMC model or its factor graph only (no EP state), and names the
variable at fault with what to write instead; the numbers in each docstring come from
the robustness rounds recorded in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
from pytensor.graph.traversal import ancestors

from pmkjit.graph.interval import UNIT_PREFIX
from pmkjit.graph.sharing import distinct_rows
from pmkjit.graph.factor_graph import ElementSlot, LinearSlot
from pmkjit.graph.pytensor_tools import evaluate_constant


def warn_latent_degrees_of_freedom(model: pm.Model, whole: frozenset[str] = frozenset()) -> None:
    """Warn where a Student-t likelihood's degrees of freedom ``nu`` depend on a latent.

    Not for the likelihoods named in ``whole``, fitted as one site (:mod:`pmkjit.ep.collapsed`:
    a regression with latent ``nu`` and scale, N = 100, sds 0.97-1.04 of NUTS's, where
    instance-by-instance sites gave ``nu`` 0.39-0.67 and the scale 0.76, on two data sets).

    EP's marginal of ``nu`` comes out too narrow, with no sign of it in the run: its
    posterior has a long right tail, and is correlated with the likelihood's scale, which
    the factor's independent messages drop. Reviewed against NUTS or a grid, sds of ``nu``
    0.42 and 0.52 of NUTS's on robust regressions with a latent scale (N = 150 and 120, both
    converged; the scale's 0.66-0.72) and 0.20 on a location model (robustness rounds 14 and
    15), 0.79-0.83 on the gallery's N = 60 regression, and 0.63-0.90 of the exact sd with a
    known scale (N = 30-60, four data sets); the locations were within 0.2 sd.
    """
    for rv, names in _latent_parameter(model, "StudentTRV", 0):
        if rv.name in whole:
            continue
        warnings.warn(
            f"{rv.name}: the Student-t's degrees of freedom depend on the latent {', '.join(names)}, whose EP "
            "posterior comes out too narrow (sd 0.2-0.9 of the exact one on reviewed models: its long right tail "
            "and its correlation with the scale are lost; the scale's sd may be too small too, the locations "
            "are accurate): compare with pm.sample for the uncertainty of nu, or fix nu",
            UserWarning,
            stacklevel=3,
        )


def warn_latent_skewness(model: pm.Model) -> None:
    """Warn where a ``pm.SkewNormal`` likelihood's skewness ``alpha`` depends on a latent.

    The skewness trades off against the location and the scale (a larger ``alpha`` moves
    the mode for the same mean), a correlation the factor's independent messages drop, and
    EP drifts rather than settles: robustness round 14, a location-scale model (N = 80):
    not converged in 50 sweeps, sds 0.14-0.41 of NUTS's; round 19, a regression
    ``SkewNormal(a + b * x, s, alpha)`` (N = 80): not converged in 50 sweeps (83 s, NUTS
    18 s), the intercept 8.0 NUTS sd off, ``alpha``'s sd 0.09 of NUTS's and the scale's
    0.50. Its only sign was the non-convergence warning, whose advice (raise ``max_sweeps``)
    does not help here.
    """
    for rv, names in _latent_parameter(model, "SkewNormalRV", 2):
        warnings.warn(
            f"{rv.name}: the SkewNormal's skewness alpha depends on the latent {', '.join(names)}, which is "
            "strongly correlated with the location and the scale a posteriori; EP's factorised messages drop "
            "that and are unreliable here (reviewed models: not converged, sds 0.09-0.5 of NUTS's, the "
            "location up to 8 NUTS sd off): use pm.sample for this model, or fix alpha at a constant",
            UserWarning,
            stacklevel=3,
        )


def _latent_parameter(model: pm.Model, op_name: str, index: int) -> list[tuple]:
    """``(rv, names)`` for each likelihood of ``op_name`` whose parameter ``index`` reads the latents ``names``."""
    latents = set(model.free_RVs)
    found = []
    for rv in model.observed_RVs:
        if type(rv.owner.op).__name__ != op_name:
            continue
        param = rv.owner.op.dist_params(rv.owner)[index]
        names = [v.name for v in ancestors([param], blockers=model.free_RVs) if v in latents]
        if names:
            found.append((rv, names))
    return found


def warn_latent_conditions(model: pm.Model) -> None:
    """Warn where a likelihood switches on a condition of a latent (an unknown changepoint).

    ``pm.math.switch(switchpoint >= years, early, late)`` with a continuous latent
    ``switchpoint`` makes each observation's density a step function of it, and the
    posterior of a changepoint is a staircase EP's Gaussian, Beta or Gamma message cannot
    follow: the coal-mining disasters model with ``switchpoint ~ pm.Uniform(1851, 1962)``
    (111 years) came out 4.8-8.1 NUTS sds off, with sds 0.43-1.19 of NUTS's, and only a
    warning that EP had not converged (robustness round 16). A switch on data is split
    into its branches by the factor graph and is not warned about.
    """
    import pytensor.scalar as ps
    from pytensor.tensor.elemwise import Elemwise

    free = set(model.free_RVs)
    for rv in model.observed_RVs:
        params = list(rv.owner.inputs)
        for var in ancestors(params, blockers=list(free)):
            node = var.owner
            if node is None or var is not node.outputs[0] or not isinstance(node.op, Elemwise):
                continue
            if not isinstance(node.op.scalar_op, (ps.GE, ps.GT, ps.LE, ps.LT)) or len(node.inputs) != 2:
                continue
            # a latent against data that vary by entry (switchpoint >= years, x > threshold):
            # PyMC's numerically stable functions (normal_lcdf in pm.OrderedProbit) compare a
            # latent expression with a constant, and are continuous
            sides = [sorted({v.name for v in ancestors([i], blockers=list(free)) if v in free}) for i in node.inputs]
            if bool(sides[0]) == bool(sides[1]):
                continue
            try:
                data = evaluate_constant(node.inputs[0 if not sides[0] else 1])
            except Exception:  # noqa: BLE001 - not a constant: not data
                continue
            latents = sides[0] or sides[1]
            if data.size > 1 and np.unique(data).size > 1:
                warnings.warn(
                    f"{rv.name}: its parameters switch on a condition of the latent {', '.join(latents)} (an unknown "
                    "changepoint or threshold), so each observation's density is a step function of it, whose "
                    "posterior EP's Gaussian, Beta or Gamma messages cannot follow: the fit may be far off (a "
                    "Poisson changepoint over 111 years: 5-8 NUTS sds). Use pm.sample, or marginalise the "
                    "changepoint over its possible values (pm.Mixture with one component per value)",
                    UserWarning,
                    stacklevel=3,
                )
                break


def warn_bounded_beside_linear(graph, signed: set[str], one_site: frozenset[int] = frozenset()) -> None:
    """Warn where a signed latent rewritten from a bounded interval is read beside another signed latent.

    ``rho ~ pm.Uniform(-1, 1)`` is fitted as ``-1 + 2 u`` with a Beta latent ``u``
    (:mod:`pmkjit.graph.interval`), outside the joint Gaussian of the real latents: in
    ``pm.Normal("y", c + rho * y[:-1], s)`` the factor's inputs ``c`` and ``u`` get
    independent messages, and their posterior correlation is lost (robustness round 16, an
    AR(1) with an intercept, T = 100: ``c`` and ``rho`` with 0.73 of NUTS's sds, converged,
    silently; a logistic regression with ``Uniform(-10, 10)`` priors on both coefficients,
    an importance-sampled factor of two Beta latents, 1.4 NUTS sds off). Beside a scale
    (``sigma ~ pm.Uniform(0, 10)``, itself rescaled or not) it was fine (sd ratios
    1.00-1.01), so only real latents and other signed rescaled ones count.

    Not for the likelihoods in ``one_site`` (indices into ``graph.factors``), fitted as one site (:mod:`pmkjit.ep.collapsed`),
    whose law keeps the correlation: a sinusoid ``mu + A sin(w t + phi)`` with ``phi ~
    pm.Uniform(-pi, pi)``, within 0.03 NUTS sd and sds 0.99-1.06 of NUTS's (robustness round 34).
    """
    if not signed:
        return
    hidden = {f"{UNIT_PREFIX}{name}": name for name in signed}
    for fi, f in enumerate(graph.factors):
        # (a deterministic factor is a likelihood's link, exp(a + b * x) of a Poisson)
        if f.kind not in ("likelihood", "deterministic") or f.analytic is not None or fi in one_site:
            continue
        ins = [f.inputs[i] for i in f.latent_inputs]
        mine = sorted({hidden[s.variable] for s in ins if isinstance(s, ElementSlot) and s.variable in hidden})
        others = sum(isinstance(s, LinearSlot) for s in ins) + len(mine)
        if mine and others >= 2:
            warnings.warn(
                f"{f.name}: the likelihood reads {', '.join(mine)} (a latent on a bounded interval, fitted as a "
                "rescaled Beta or Gamma latent) beside "
                + ("a linear predictor of the real-valued latents" if len(mine) == 1 else "each other")
                + "; EP's factorised messages ignore their posterior correlation, so posterior sds may be too "
                "small and means off (0.73 of NUTS's sds for an AR(1) coefficient rho ~ Uniform(-1, 1) beside an "
                "intercept). A Normal prior keeps a coefficient in the joint Gaussian of the real latents; or "
                "compare with pm.sample",
                UserWarning,
                stacklevel=3,
            )


def warn_non_centred(graph, one_site: frozenset[int] = frozenset()) -> None:
    """Warn about a likelihood reading a repeated projection and other latents in a product.

    A factor of two or more linear slots and a positive latent is how a non-centred group
    effect ``mu + tau * z[g]`` arrives (an affine mean would be one slot). Where each
    ``z[g]`` is read by several instances, EP's factorised messages ignore the strong
    posterior correlation of ``mu``, ``z`` and ``tau`` once per instance: with 20
    observations per group (N = 120, 6 groups) the posterior sds of ``mu`` and ``tau``
    came out 0.07 and 0.04 for exact 0.44 and 0.41, silently. The centred form is exact
    to 0.04 sd there. One observation per ``z[j]`` (eight schools) is fine, so no warning.
    Nor for the likelihoods in ``one_site`` (indices into ``graph.factors``), fitted as one
    site (:mod:`pmkjit.ep.collapsed_linear`: ``a[g] + b * exp(-x / l)``, four groups, within
    0.05 NUTS sd and sds 1.00-1.06 of NUTS's; robustness round 34).
    """
    for fi, f in enumerate(graph.factors):
        if f.kind != "likelihood" or f.analytic is not None or fi in one_site:
            continue
        linear = [f.inputs[i] for i in f.latent_inputs if isinstance(f.inputs[i], LinearSlot)]
        scales = [f.inputs[i] for i in f.latent_inputs
                  if isinstance(f.inputs[i], ElementSlot) and f.inputs[i].family.name == "Gamma"]
        if len(linear) < 2 or not scales:
            continue
        for slot in linear:
            d = distinct_rows(slot)
            if 1 < d and slot.size >= 2 * d:
                used = np.any(np.asarray(slot.A).reshape(slot.size, -1) != 0, axis=0)
                names = [v.name for v in graph.gaussian_variables if used[v.offset:v.offset + v.size].any()]
                warnings.warn(
                    f"{f.name}: the likelihood reads {', '.join(names)} ({d} distinct values repeated over "
                    f"{slot.size} observations) in a product with {', '.join(sorted({s.variable for s in scales}))}"
                    " and another linear predictor, as in a non-centred group effect mu + tau * z[group]. EP's "
                    "factorised messages can then underestimate posterior sds several-fold (see docs/ep.md, "
                    "Known limitations); the centred form a = pm.Normal('a', mu, tau), a[group], is "
                    "semi-analytic and accurate",
                    UserWarning,
                    stacklevel=3,
                )
                break


def warn_scales_traded_through_latents(graph) -> None:
    """Warn where two likelihoods with their own latent scales read the same per-observation latents.

    A covariate measured with a latent error scale (errors in variables),
    ``x_obs ~ Normal(x_true, tau)`` and ``y ~ Normal(a + b * x_true, s)`` with ``tau`` and ``s``
    latent: the two scales trade off through ``x_true`` (the more of the scatter is
    measurement error, the less is left for the outcome's noise), a posterior correlation
    that EP's separate messages for ``tau``, ``s`` and each ``x_true[n]`` leave out. On 40
    points (robustness round 33) EP converged with ``tau`` 0.67 exact sds off and 0.57 of its
    exact sd, ``s`` 0.39 sds off, silently (the exact posterior integrates ``x_true`` out in
    closed form on a grid of ``(a, b, tau, s)``). With one of the scales known it is fine
    (within 0.1 sd). Counted: latents of the joint Gaussian each read by one observation of
    each of two likelihoods whose scales are latent scalars of their own.
    """
    owned = []
    for f in graph.factors:
        if f.kind != "likelihood" or f.from_prior:
            continue
        # (a scale on an interval, pm.Uniform(0, 1), is a rescaled Beta latent: named as written)
        scales = {f.inputs[i].variable.removeprefix(UNIT_PREFIX) for i in f.latent_inputs
                  if isinstance(f.inputs[i], ElementSlot) and f.inputs[i].family.name in ("Gamma", "Beta")
                  and np.unique(f.inputs[i].index).size == 1}
        if not scales:
            continue
        # the joint Gaussian's coordinates each read by exactly one of the factor's observations
        own: set[int] = set()
        for i in f.latent_inputs:
            slot = f.inputs[i]
            if isinstance(slot, LinearSlot):
                readers = np.count_nonzero(np.asarray(slot.A).reshape(slot.size, -1), axis=0)
                own |= set(np.flatnonzero(readers == 1).tolist())
        if len(own) >= 2:
            owned.append((f, scales, own))
    for k, (f1, s1, own1) in enumerate(owned):
        for f2, s2, own2 in owned[k + 1:]:
            common = own1 & own2
            if len(common) < 2 or s1 & s2:
                continue
            names = [v.name for v in graph.gaussian_variables
                     if any(v.offset <= c < v.offset + v.size for c in common)]
            warnings.warn(
                f"{f1.name} and {f2.name}: both likelihoods read {', '.join(names)} ({len(common)} latents, one per "
                f"observation), each with a latent scale of its own ({', '.join(sorted(s1))}; "
                f"{', '.join(sorted(s2))}), as a covariate measured with a latent error does; the scales trade off "
                "through those latents, a posterior correlation EP's separate messages leave out, so their means "
                "and sds may be off (0.67 sds and 0.57 of the sd for a latent measurement error's scale, "
                "robustness round 33). Fixing one scale (a known measurement error) avoids it; or compare with "
                "pm.sample",
                UserWarning,
                stacklevel=3,
            )
