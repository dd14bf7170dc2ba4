"""Warnings about a fitted EP posterior: checks of EP's answer against cheap independent laws.

EP's own convergence says nothing about the correlations its factorised messages drop,
nor about a poor mode; these checks compare EP's marginals with a 2-D grid of the law a
joint site would give, look for mixture components on top of each other, and look for
posterior draws that make observations impossible.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import arviz as az
import numpy as np
import pymc as pm
from scipy import linalg
from pytensor.graph.traversal import ancestors

from pmkjit.ep import engine
from pmkjit.ep.conditional import ConditionalDraws
from pmkjit.ep.mixture import overlapping_components
from pmkjit.graph.factor_graph import ElementSlot, LinearSlot
from pmkjit.graph.simplex import STICK_PREFIX


def warn_one_site_refused(graph, methods: Sequence) -> None:
    """Warn where a factor chosen for one site ended EP instance by instance.

    A likelihood of shared or per-group scalars or a hierarchical prior gets one site for
    the whole factor (:mod:`pmkjit.ep.collapsed`, :mod:`pmkjit.ep.grouped`,
    :mod:`pmkjit.ep.hierarchy`) because its instances' separate sites leave out the
    correlation of the latents they share; where the law is not held by its grid (a tail
    beyond it, an improper cavity), a sweep falls back to those sites, and after two such
    sweeps in a row the factor stays there. EP then converges to the fallback's answer,
    silently: the rats' tumour prior on 20 mostly empty experiments (robustness round 30)
    put ``kappa`` at 5,600 where NUTS has 42 and ``theta``'s sds at 2-2.5 times NUTS's; a
    zero-inflated regression (round 29, before its grid was mended) its sds at 0.63-0.75.
    """
    for f, m in zip(graph.factors, methods):
        if not getattr(m, "collapsed", False) or not m.ended_refused:
            continue
        warnings.warn(
            f"{f.name}: EP fits this {'prior' if f.kind == 'prior' else 'likelihood'} with one site: {m.kind}; "
            "but its law was not held by its grid in the last sweeps, so its sites are its instances' own, "
            "which leave out the correlation of the latents they share: posterior means and sds may be far off (a hierarchical "
            "Beta prior with a heavy-tailed concentration: 60 times NUTS's mean). A posterior with a tail no "
            "Gamma or Beta holds (a Pareto prior's) is one cause; compare with pm.sample",
            UserWarning,
            stacklevel=3,
        )


def warn_one_site_dropped_correlation(graph, methods: Sequence) -> frozenset[int]:
    """Warn where a Normal likelihood fitted as one site with its Gaussian scalars integrated
    out (:mod:`pmkjit.ep.collapsed_linear`) correlates them strongly, and so does another
    factor: EP's site on each scalar alone cannot carry the likelihood's correlation, and
    with the other factor's its marginals are no longer its law's projections. A decay with a
    trend, ``a + b * exp(-k * t) + c * t``, whose entry at ``t = 0`` reads ``a + b`` alone (a
    factor of its own), stopped 0.14 NUTS sd off with ``a``'s sd 0.77 of NUTS's (robustness
    round 34). Returns the indices of the factors warned about."""
    warned = set()
    for fi, (f, m) in enumerate(zip(graph.factors, methods)):
        if not getattr(m, "drops_correlation", False) or not m.current:
            continue
        warned.add(fi)
        names = _joined([_latent_name(graph, f.inputs[f.latent_inputs[k]]) for k in m._gaussian])
        warnings.warn(
            f"{f.name}: EP fits this likelihood with one site, {names} integrated out in closed form; the "
            f"likelihood correlates them (up to {m.tilted_correlation:.2f}) and so does another factor (up to "
            f"{m.cavity_correlation:.2f} without this one), but EP's site on each alone cannot carry that "
            "correlation, so their posterior means and sds may be off (a decay with a trend whose entry at t = 0 "
            "reads a + b alone: 0.14 NUTS sd, sds 0.77 of NUTS's), and their posterior draws are independent. "
            "Compare with pm.sample",
            UserWarning,
            stacklevel=3,
        )
    return frozenset(warned)


_NESTED_GROUP_CORRELATION = 0.2  # contrasts' sds off by 1 / sqrt(1 - 0.2) = 1.12 times or more


def warn_nested_groups_correlated(graph, methods: Sequence) -> None:
    """Warn where a likelihood fitted with its groups nested in shared scalars
    (:mod:`pmkjit.ep.nested`) correlates groups whose own scalars read common coefficients.

    ``pm.ExGaussian(mu=mu0 + d * cond, sigma, nu)`` with a 0/1 condition: each group's own
    scalar (``mu0``, ``mu0 + d``) gets its own site, exact given the shared ``sigma`` and
    ``nu``, but both groups' locations move with ``nu`` (a larger exponential part, a smaller
    location), a correlation ``r`` of the law that no site of one group carries. A contrast
    of two groups of equal variance then has an sd ``1 / sqrt(1 - r)`` times the exact one
    (too wide for ``r > 0``, too narrow for ``r < 0``):
    the law's ``r`` of 0.37 predicted 1.26 where NUTS said 1.27 for ``d``, and 0.28 with three
    conditions predicted 1.18 (NUTS: 1.15-1.23), unwarned (robustness round 42). With a mean
    and a dispersion (``NegativeBinomial(mu=exp(a + b * trt), alpha)``, a Gamma with a shared
    shape) ``r`` was 4e-5 and the sds right."""
    for f, m in zip(graph.factors, methods):
        r = getattr(m, "group_correlation", 0.0)
        if abs(r) <= _NESTED_GROUP_CORRELATION or not m.current:
            continue
        slot = f.inputs[f.latent_inputs[m._own]]
        factor = 1.0 / np.sqrt(1.0 - r)  # EP's var(u - v) = 2 s^2 against the law's 2 s^2 (1 - r)
        warnings.warn(
            f"{f.name}: EP fits this likelihood with one site, its groups nested in shared scalars, and the groups' "
            f"own projections of {_latent_name(graph, slot).replace(' + ', ', ')} read common coefficients; the "
            f"likelihood correlates them at up to {r:.2f} through the shared scalars, which each group's own site "
            f"leaves out, so a contrast between two groups (a treatment effect) may have an sd about "
            f"{factor:.2f} times the exact one. Compare with pm.sample",
            UserWarning,
            stacklevel=3,
        )


def warn_correlated_pairs(graph, state, threshold: float = 0.6, sd_ratio: float = 0.8,
                          collapsed: frozenset[int] = frozenset(), jointly: frozenset[int] = frozenset(),
                          warned: frozenset[int] = frozenset()) -> None:
    """Warn where a likelihood of two shared latents correlates them strongly.

    EP gives each latent its own message, so the posterior correlation of two latents read
    together is left out, and each marginal is about as narrow as the other's conditional:
    sds about ``sqrt(1 - rho**2)`` of the exact ones. Two parametrisations users write
    for counts came out so, converged and silently (robustness round 16):
    ``pm.NegativeBinomial(n=n, p=p)`` with latent ``n`` and ``p`` (0.32 of NUTS's sds) and
    ``pm.BetaBinomial(alpha=a, beta=b)`` with latent ``a`` and ``b`` (0.46). Where every
    instance reads the same two scalars (ElementSlots of one element, or LinearSlots of one
    projection), the likelihood summed over its instances is their joint log-likelihood;
    times the factor's cavity (EP's posterior without this factor's sites) it is the law a
    joint site would give, computed on a 2-D grid in the latents' unconstrained coordinates
    (:func:`_joint_law`), whose correlation and marginal sds are compared with EP's. Where
    the grid cannot be made (an improper cavity, too many instances) ``rho`` is read from
    the curvature of the summed likelihood at EP's posterior means instead, by central
    differences. The curvature at one point alone missed a banana-shaped likelihood:
    ``pm.Rice(nu, sigma)`` with both latent (N = 80, robustness round 17) gave -0.50 there,
    no warning, and EP's sds were 0.45 and 0.56 of NUTS's (the joint law: correlation -0.8).

    Factors in ``collapsed`` (indices into ``graph.factors``) had one site for the whole
    likelihood (:mod:`pmkjit.ep.collapsed`), so EP's marginals are that law's projections
    onto the latents' families. Those in ``jointly`` had their posterior draws made from
    the law itself and are not warned about; the others are, where the law's correlation
    or a marginal the family cannot hold (sd ratio below ``sd_ratio``) makes independent
    draws from EP's marginals wrong. Those in ``warned`` were warned about already
    (:func:`warn_one_site_dropped_correlation`).
    """
    h = 1e-3
    steps = np.array([(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)], dtype=float) * h
    drawn = {r for fi in jointly for i in graph.factors[fi].latent_inputs for r in _reads(graph.factors[fi].inputs[i])}
    for fi, f in enumerate(graph.factors):
        # a joint site on all of the inputs (class predictors) carries their correlation, but
        # one on some of a one-site law's scalars leaves the others' draws independent of them
        joint_all = f.pair_slots and (fi not in collapsed or all(isinstance(f.inputs[i], LinearSlot)
                                                                  for i in f.latent_inputs))
        if f.kind != "likelihood" or f.analytic is not None or f.logp is None or joint_all \
                or len(f.latent_inputs) < 2 or f.observed is None or fi in warned:
            continue
        values, moves, names, points = [], [], [], []
        varying = None  # (A, position among the two latents) of a regression's linear predictor
        per_group = None  # the element each instance reads, of an element latent that differs between them
        for i, slot in enumerate(f.inputs):
            if i not in f.latent_inputs:
                values.append(np.asarray(slot.values, dtype=float))
                continue
            if isinstance(slot, ElementSlot):
                if not np.all(slot.index == slot.index[0]):
                    # an element per group (an item's discrimination a[item] in a 2PL model)
                    # beside a regression's predictor: its curvature, group by group, below
                    idx = np.asarray(slot.index).reshape(slot.size, -1)
                    if idx.shape[1] != 1:
                        break
                    fam = slot.family
                    x = fam.from_natural(state.element_natural[slot.variable][idx[:, 0]]).mean()
                    u = np.asarray(fam.to_unconstrained(np.asarray(x)), dtype=float)
                    values.append(None)
                    moves.append(lambda d, _u=u, _fam=fam: _fam.from_unconstrained(_u[None, :] + d[:, None]))
                    points.append(None)
                    names.append(slot.variable)
                    per_group = idx[:, 0]
                    continue
                fam = slot.family
                x = fam.from_natural(state.element_natural[slot.variable][slot.index[0]]).mean()
                u = float(fam.to_unconstrained(np.asarray(x)))
                values.append(None)
                moves.append(lambda d, _u=u, _fam=fam, _n=slot.size: np.broadcast_to(
                    _fam.from_unconstrained(_u + d)[:, None], (d.size, _n)))
                points.append(lambda xs, _n=slot.size: np.broadcast_to(xs[:, None], (xs.size, _n)))
                names.append(slot.variable)
            elif isinstance(slot, LinearSlot):
                A = np.asarray(slot.A)
                if not np.any(A[0]):
                    break
                if not np.allclose(A, A[:1]):
                    # a regression's predictor beside a shared scalar (round 20): checked below by
                    # the curvature of the instances, not on a grid of two scalars
                    if varying is not None:
                        break
                    varying = (A, len(names))
                eta = A @ np.asarray(state.mu) + slot.c
                values.append(None)
                moves.append(lambda d, _eta=eta: _eta[None, :] + d[:, None])
                points.append(lambda xs, _c=eta - eta[0]: xs[:, None] + _c[None, :])
                names.append(_latent_name(graph, slot))
            else:
                break
        else:
            if fi in jointly:
                # EP's marginals are the collapsed law's projections (pmkjit.ep.collapsed), and
                # its draws the law's own
                continue
            if per_group is not None:
                if fi in collapsed:
                    # one site per group (pmkjit.ep.grouped) whose groups' draws could not be
                    # made from their laws (a group's Gaussian coordinate, drawn with the
                    # Gaussian block; elements another factor's law drew)
                    warnings.warn(
                        f"{f.name}: EP's marginals of {_joined(names)} are the projections of each group's joint "
                        "law under this likelihood onto their families, but its posterior draws of them are "
                        "independent (they could not be drawn from those laws), so a function of several of them "
                        "(a group's mean, a ratio) may have the wrong spread; compare with pm.sample",
                        UserWarning,
                        stacklevel=3,
                    )
                elif varying is not None and len(names) == 2 and fi not in collapsed:
                    _warn_correlated_per_group(graph, state, fi, f, values, moves, names, varying, per_group, steps, h,
                                               sd_ratio)
                continue
            if fi in collapsed and (len(names) > 2 or varying is not None):
                if {r for i in f.latent_inputs for r in _reads(f.inputs[i])} <= drawn:
                    # every latent it reads was drawn jointly from a larger factor's law (a
                    # decay's entry at t = 0, which reads no rate, beside the other entries)
                    continue
                if f.pair_slots:
                    # one joint site on the Gaussian scalars (pmkjit.ep.collapsed): their draws
                    # carry their correlation, but not the elements'
                    linear = [n for n, i in zip(names, f.latent_inputs) if isinstance(f.inputs[i], LinearSlot)]
                    others = [n for n, i in zip(names, f.latent_inputs) if not isinstance(f.inputs[i], LinearSlot)]
                    what = (f"{_joined(linear)} jointly and {_joined(others)}",
                            f"{_joined(others)} are independent of those of {_joined(linear)}")
                else:
                    what = (_joined(names), "them are independent")
                warnings.warn(
                    f"{f.name}: EP's marginals of {what[0]} are the projections of their joint law under "
                    f"this likelihood onto their families, but its posterior draws of {what[1]} (the "
                    "law could not be drawn from on a grid), so a function of several of them may have the "
                    "wrong spread; compare with pm.sample",
                    UserWarning,
                    stacklevel=3,
                )
                continue
            if len(names) > 2:
                # not a mixture's components and weights (their posterior is multimodal, and
                # pmkjit.ep.mixture fits them by its own rules)
                if varying is None and getattr(f, "mixture", None) is None \
                        and not any(n.startswith(STICK_PREFIX) for n in names):
                    _warn_correlated_many(graph, f, state, values, moves, h, sd_ratio)
                elif varying is not None and f.linear_normal is not None:
                    _warn_correlated_beside_own(graph, f, state, h, sd_ratio)
                    _warn_correlated_beside_group(graph, f, state, h, sd_ratio)
                continue
            if varying is not None:
                _warn_correlated_predictor(graph, f, state, values, moves, names, varying, steps, h, sd_ratio)
                continue
            joint = _joint_law(graph, state, fi, f, values, points)
            if joint is not None:
                rho, ratios = joint
                if fi in collapsed:
                    # EP's marginals are this law's projections; the draws are the law's own
                    # where they could be made from it (pmkjit.ep.collapsed.draw_jointly)
                    if fi not in jointly and (abs(rho) > threshold or min(ratios) < sd_ratio):
                        warnings.warn(
                            f"{f.name}: EP's marginals of {names[0]} and {names[1]} are the projections of their "
                            "joint law under this likelihood (on a grid) onto their families, with sds "
                            f"{ratios[0]:.2f} and {ratios[1]:.2f} of the law's, but its posterior draws of them are "
                            f"independent where the law correlates them at about {rho:.2f}, so a function of both "
                            "(a ratio, a product, a predictive distribution) may have the wrong spread. A "
                            "parametrisation with less correlated parameters (NegativeBinomial(mu, alpha), "
                            "BetaBinomial(mu * kappa, (1 - mu) * kappa)) avoids it; or compare with pm.sample",
                            UserWarning,
                            stacklevel=3,
                        )
                    continue
                if abs(rho) > threshold or min(ratios) < sd_ratio:
                    warnings.warn(
                        f"{f.name}: the likelihood correlates {names[0]} and {names[1]} at about {rho:.2f} (their "
                        "joint law under this likelihood, on a grid), which EP's separate messages for them leave "
                        f"out: EP's posterior sds of {names[0]} and {names[1]} are {ratios[0]:.2f} and "
                        f"{ratios[1]:.2f} of that law's (NegativeBinomial(n=n, p=p) with latent n and p: 0.32 of "
                        "NUTS's). A parametrisation with less correlated parameters (a mean and a dispersion: "
                        "NegativeBinomial(mu, alpha), BetaBinomial(mu * kappa, (1 - mu) * kappa)) fits better; or "
                        "compare with pm.sample",
                        UserWarning,
                        stacklevel=3,
                    )
                continue
            try:
                ll = _log_likelihood_at_steps(f, values, moves, steps).sum(axis=-1)
            except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
                continue
            h11, h22, h12 = _curvatures(ll, h)
            if not (np.isfinite([h11, h22, h12]).all() and h11 < 0 and h22 < 0):
                continue
            rho = h12 / np.sqrt(h11 * h22)  # the correlation of the inverse of the precision -H
            if fi in collapsed:
                if abs(rho) > threshold:
                    warnings.warn(
                        f"{f.name}: the likelihood correlates {names[0]} and {names[1]} at about {rho:.2f} (its "
                        "curvature at EP's posterior means). EP's marginals of the two are the projections of "
                        "their joint law under it, but its posterior draws of them are independent (not drawn from "
                        "the law on a grid: too many distinct observations, or another factor of theirs drew them "
                        "first), so a function of both (a ratio, "
                        "a product, a predictive distribution) has the wrong spread. A parametrisation with less "
                        "correlated parameters (NegativeBinomial(mu, alpha), BetaBinomial(mu * kappa, (1 - mu) * "
                        "kappa)) avoids it; or compare with pm.sample",
                        UserWarning,
                        stacklevel=3,
                    )
                continue
            if abs(rho) > threshold:
                warnings.warn(
                    f"{f.name}: the likelihood correlates {names[0]} and {names[1]} at about {rho:.2f} (its "
                    "curvature at EP's posterior means), which EP's separate messages for them leave out: their "
                    f"posterior sds may be about {np.sqrt(max(0.0, 1 - rho**2)):.2f} of the exact ones "
                    "(NegativeBinomial(n=n, p=p) with latent n and p: 0.32 of NUTS's). A parametrisation with less "
                    "correlated parameters (a mean and a dispersion: NegativeBinomial(mu, alpha), "
                    "BetaBinomial(mu * kappa, (1 - mu) * kappa)) fits better; or compare with pm.sample",
                    UserWarning,
                    stacklevel=3,
                )


def warn_correlated_hyperparameters(graph, state, rng, threshold: float = 0.6, sd_ratio: float = 0.8,
                                     n_draws: int = 32, n_grid: int = 61, max_evaluations: float = 2e7,
                                     jointly: frozenset[int] = frozenset()) -> None:
    """Warn where a prior's two shared latent parameters are strongly correlated a posteriori.

    The hyperparameters of a prior read by many latents (``theta_i ~ Gamma(alpha, beta)``,
    the BUGS pumps model) are inputs of every instance of the prior factor, whose sites
    drop their posterior correlation, as a likelihood's do (see
    :func:`warn_correlated_pairs`): EP's sds of ``alpha`` and ``beta`` were 0.70 and 0.72 of
    NUTS's, converged and without a warning (robustness round 18). The law checked is
    their cavity (EP's marginals without this factor's sites) times the prior's log-density
    averaged over ``n_draws`` draws of each instance's latent from its EP marginal (the
    mean-field law of the two given the latents), on a grid in their unconstrained
    coordinates as in :func:`_joint_law`; its correlation and marginal sds are compared
    with EP's. Instances beyond ``max_evaluations / (n_grid**2 * n_draws)`` are subsampled
    and their sum scaled up.

    Priors in ``jointly`` (indices into ``graph.factors``) had one site for the whole prior
    and their posterior draws from its law (:mod:`pmkjit.ep.hierarchy`), which keeps the
    correlation; they are not checked.
    """
    for fi, f in enumerate(graph.factors):
        if fi in jointly:
            continue
        if f.kind != "prior" or f.logp is None or f.analytic is not None or len(f.latent_inputs) != 2 \
                or len(f.inputs) != 2 or f.size < 2 or not isinstance(f.output, (ElementSlot, LinearSlot)):
            continue
        if not all(isinstance(s, ElementSlot) and np.all(s.index == s.index[0]) for s in f.inputs):
            continue
        pair = _pair_cavities(graph, state, fi, f)
        if pair is None:
            continue
        cavities, ep_sd, centre, half = pair
        out = engine._marginals(graph, None, state, f)[2]
        rows = np.arange(f.size)
        keep = int(max(1, min(f.size, max_evaluations // (n_grid * n_grid * n_draws))))
        if keep < f.size:
            rows = np.sort(rng.choice(f.size, keep, replace=False))
        with np.errstate(all="ignore"):
            draws = np.asarray(out[rows].sample(rng, n_draws), dtype=float).T.reshape(-1)  # (rows * draws,)
        scale = f.size / rows.size / n_draws

        def loglik(x0, x1s):
            ins = (np.full((x1s.size, draws.size), x0), np.repeat(x1s[:, None], draws.size, axis=1))
            val = np.ascontiguousarray(np.broadcast_to(draws, (x1s.size, draws.size)))
            return scale * np.sum(np.asarray(f.logp(val, ins), dtype=float), axis=1)

        law = _law_on_grid(loglik, cavities, centre, half, n_grid, max_nodes=301)
        if law is None:
            continue
        rho, (s0, s1) = law
        ratios = (ep_sd[0] / s0, ep_sd[1] / s1)
        names = [_latent_name(graph, s) for s in f.inputs]  # ab[0] and ab[1], not "ab and ab"
        if abs(rho) > threshold or min(ratios) < sd_ratio:
            warnings.warn(
                f"{f.name}: its prior's parameters {names[0]} and {names[1]} are correlated at about {rho:.2f} "
                f"a posteriori (their law given EP's draws of {f.name}, on a grid), which EP's separate messages "
                f"for them leave out: EP's posterior sds of {names[0]} and {names[1]} are {ratios[0]:.2f} and "
                f"{ratios[1]:.2f} of that law's (the BUGS pumps model, Gamma(alpha, beta) with both latent: 0.70 "
                "of NUTS's). A mean-dispersion parametrisation (Gamma(alpha, alpha / mu), Beta(mu * kappa, "
                "(1 - mu) * kappa)) fits better; or compare with pm.sample",
                UserWarning,
                stacklevel=3,
            )


def _warn_correlated_many(graph, f, state, values, moves, h, sd_ratio) -> None:
    """Warn where a likelihood of three or more shared scalar latents correlates them strongly.

    Nonlinear regressions users write, ``A * exp(-k * t)`` (N = 40), ``K / (1 + exp(-r * (t -
    t0)))`` (N = 50), converged silently with sds of ``A`` and ``k``, ``K`` 0.72-0.73 of NUTS's
    (robustness round 20): each instance reads every latent, and EP's separate messages drop
    their posterior correlation, where :func:`warn_correlated_pairs` looked at two latents
    only. The summed likelihood's Hessian ``H`` at EP's posterior means (central differences
    in each latent's unconstrained coordinate), plus the rest of each latent's EP precision
    (``1 / v_j - (-H_jj)``, about its cavity's) on the diagonal, is the joint precision ``Q``
    of a Laplace approximation; a latent's sd under separate messages is then about
    ``1 / sqrt(Q_jj (Q^-1)_jj)`` of its joint one (``sqrt(1 - rho**2)`` for two).
    """
    names = [_latent_name(graph, f.inputs[i]) for i in f.latent_inputs]
    m = len(names)
    uv = []
    for i in f.latent_inputs:
        slot = f.inputs[i]
        if isinstance(slot, ElementSlot):
            marg = slot.family.from_natural(state.element_natural[slot.variable][slot.index[:1]])
            uv.append(float(np.asarray(marg.unconstrained_moments()[1], dtype=float).ravel()[0]))
        else:  # a LinearSlot whose rows are all alike: eta's variance under EP's Gaussian block
            z = linalg.solve_triangular(state.chol, np.asarray(slot.A, dtype=float)[0], lower=True, check_finite=False)
            uv.append(float(z @ z))
    uv = np.asarray(uv)
    pts = [np.zeros(m)]
    for j in range(m):
        for sj in (1, -1):
            pts.append(np.eye(m)[j] * sj * h)
    pairs = [(i, j) for i in range(m) for j in range(i + 1, m)]
    for i, j in pairs:
        for si in (1, -1):
            for sj in (1, -1):
                pts.append((np.eye(m)[i] * si + np.eye(m)[j] * sj) * h)
    pts = np.asarray(pts)
    try:
        with np.errstate(all="ignore"):
            k = iter(range(m))
            ins = tuple(mv(pts[:, next(k)]) if v is None else np.broadcast_to(v, (len(pts), v.size))
                        for v, mv in _zip_moves(values, moves))
            y = np.broadcast_to(np.asarray(f.observed, dtype=float), (len(pts), f.observed.size))
            ll = np.sum(np.asarray(f.logp(np.ascontiguousarray(y), tuple(np.ascontiguousarray(a) for a in ins)),
                               dtype=float), axis=1)
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return
    H = np.empty((m, m))
    for j in range(m):
        H[j, j] = (ll[1 + 2 * j] - 2 * ll[0] + ll[2 + 2 * j]) / h**2
    for n, (i, j) in enumerate(pairs):
        pp, pm_, mp, mm = ll[1 + 2 * m + 4 * n: 5 + 2 * m + 4 * n]
        H[i, j] = H[j, i] = (pp - pm_ - mp + mm) / (4 * h**2)
    if not (np.isfinite(H).all() and np.isfinite(uv).all() and np.all(uv > 0)):
        return
    ratios = _separate_sd_ratios(-H, 1.0 / uv)
    if ratios is None:
        return
    if ratios.min() < sd_ratio:
        low = ", ".join(f"{names[j]} {ratios[j]:.2f}" for j in np.argsort(ratios) if ratios[j] < sd_ratio)
        warnings.warn(
            f"{f.name}: the likelihood correlates {', '.join(names)} (its curvature at EP's posterior means), "
            "which EP's separate messages for them leave out: their posterior sds may be about "
            f"{low} of the exact ones (A * exp(-k * t) with A and k latent: 0.72 of NUTS's). A parametrisation "
            "with less correlated parameters (centred covariates, the value at a typical t instead of at t = 0) "
            "fits better; or compare with pm.sample",
            UserWarning,
            stacklevel=4,
        )


def _warn_correlated_beside_own(graph, f, state, h, sd_ratio) -> None:
    """Warn where a Normal likelihood correlates its shared Gaussian inputs beside a latent of
    each observation's own.

    A regression on a covariate measured with error, ``y ~ Normal(a + b * x_true, s)`` with
    ``x_true ~ Normal(mx, sx)`` centred away from 0 (2, sd 1.5; 40 points, robustness round 33),
    reads ``a`` and ``b`` as separate inputs beside each ``x_true[n]``: EP's separate messages
    drop their correlation, as for a regression on an uncentred covariate, and it converged
    with sds of ``a`` and ``b`` 0.53 of NUTS's, silently (:func:`_warn_correlated_many` takes
    shared latents only). The Gauss-Newton curvature of the likelihood in the shared inputs
    (the mean's gradients ``g_n`` at EP's posterior means, ``sum w_n g_n g_n^T / sigma_n^2``),
    each observation's own latent integrated out (``w_n``: the share of that latent's precision
    its observation does not supply, a Schur complement), plus the rest of each shared input's
    EP precision, is a joint precision ``Q``; a shared input's sd under separate messages is
    then about ``1 / sqrt(Q_jj (Q^-1)_jj)`` of its joint one. Centred (mean 0) the same model is
    within 0.1 NUTS sd and this says nothing. The full Hessian at EP's means instead of the
    Gauss-Newton one warned there too (its residual terms).
    """
    spec = f.linear_normal
    latent = f.latent_inputs
    own, shared = None, []
    for i in latent:
        slot = f.inputs[i]
        if not isinstance(slot, LinearSlot):
            continue
        A = np.asarray(slot.A, dtype=float).reshape(slot.size, -1)
        if np.allclose(A, A[:1]):
            shared.append(i)
        elif own is None and np.all(np.count_nonzero(A, axis=1) == 1) and \
                np.unique(np.argmax(A != 0, axis=1)).size == slot.size:
            own = i
        else:
            return  # a regression's predictor, or a second latent per observation
    if own is None or len(shared) < 2:
        return
    N = f.size
    if any(isinstance(f.inputs[i], ElementSlot) and np.asarray(f.inputs[i].index).size != N for i in latent):
        return  # an element slot of several indices per observation
    values, variances = _inputs_at_means(f, state)

    def mean_at(i=None, step=0.0):
        return _parameters_at(spec, values, i, step)

    try:
        with np.errstate(all="ignore"):
            _, sigma = mean_at()
            grads = {i: (mean_at(i, h)[0] - mean_at(i, -h)[0]) / (2 * h) for i in shared + [own]}
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return
    G = np.stack([grads[i] for i in shared], axis=1)  # (N, p)
    info_own = grads[own] ** 2 / sigma**2
    rest_own = np.maximum(1.0 / variances[own] - info_own, 0.0)
    with np.errstate(all="ignore"):
        w = np.where(rest_own > 0, rest_own / (info_own + rest_own), 0.0)
    M = np.einsum("n,np,nq->pq", w / sigma**2, G, G)
    ep_precision = np.array([1.0 / variances[i][0] for i in shared])
    ratios = _separate_sd_ratios(M, ep_precision)
    if ratios is None:
        return
    if ratios.min() < sd_ratio:
        names = [_latent_name(graph, f.inputs[i]) for i in shared]
        low = ", ".join(f"{names[j]} {ratios[j]:.2f}" for j in np.argsort(ratios) if ratios[j] < sd_ratio)
        warnings.warn(
            f"{f.name}: the likelihood correlates {', '.join(names)} beside each observation's own "
            f"{_latent_name(graph, f.inputs[own])} (as a regression on an uncentred covariate does), which EP's "
            f"separate messages for them leave out: their posterior sds may be about {low} of the exact ones "
            "(a covariate measured with error, centred at 2: 0.53 of NUTS's). Centring the latent covariate "
            "(b * (x_true - c), c a constant near its mean) fits better; or compare with pm.sample",
            UserWarning,
            stacklevel=4,
        )


def _warn_correlated_beside_group(graph, f, state, h, sd_ratio) -> None:
    """Warn where a Normal likelihood correlates a group's effect with shared scalars.

    ``y ~ Normal(A[g] * exp(-k * t), s)`` reads one Gaussian input per group and the shared
    rate ``k``. Up to twelve groups it is one site (:mod:`pmkjit.ep.collapsed_linear`); with
    more, each observation's site is its own, which drops the correlation of each ``A[g]``
    with ``k``: with three groups instance by instance (60 points, robustness round 34) EP
    converged with ``k``'s sd 0.69 of NUTS's, silently. As
    :func:`_warn_correlated_beside_own`: the Gauss-Newton curvature of the mean in the
    groups' effects and the shared scalars at EP's posterior means, plus the rest of each
    one's EP precision, is a joint precision ``Q``, and a coordinate's sd under separate
    messages is about ``1 / sqrt(Q_jj (Q^-1)_jj)`` of its joint one.
    """
    spec = f.linear_normal
    latent = f.latent_inputs
    N = f.size
    group, shared = None, []
    for i in latent:
        slot = f.inputs[i]
        if isinstance(slot, ElementSlot):
            idx = np.asarray(slot.index)
            if idx.size != N or not np.all(idx == idx.flat[0]):
                return
            shared.append(i)
            continue
        A = np.asarray(slot.A, dtype=float).reshape(N, -1)
        if np.allclose(A, A[:1]):
            shared.append(i)
        elif group is None and i in spec.linear and np.all(np.count_nonzero(A, axis=1) == 1) and \
                1 < np.unique(np.argmax(A != 0, axis=1)).size < N:
            group = i
        else:
            return
    if group is None or not shared:
        return
    values, variances = _inputs_at_means(f, state)
    steps = {i: h * np.sqrt(v) for i, v in variances.items()}
    precisions = {i: 1.0 / v for i, v in variances.items()}

    def mean_at(i=None, step=0.0):
        return _parameters_at(spec, values, i, step)

    try:
        with np.errstate(all="ignore"):
            _, sigma = mean_at()
            grads = {i: (mean_at(i, steps[i])[0] - mean_at(i, -steps[i])[0]) / (2 * steps[i]) for i in [group] + shared}
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return
    # the groups' effects as coordinates: each observation's gradient in its own group's
    A = np.asarray(f.inputs[group].A, dtype=float).reshape(N, -1)
    which = np.argmax(A != 0, axis=1)
    columns, member = np.unique(which, return_inverse=True)
    G = np.zeros((N, columns.size + len(shared)))
    G[np.arange(N), member] = grads[group]
    for j, i in enumerate(shared):
        G[:, columns.size + j] = grads[i]
    M = np.einsum("n,np,nq->pq", 1.0 / sigma**2, G, G)
    first = np.array([np.flatnonzero(member == c)[0] for c in range(columns.size)])
    ep_precision = np.concatenate([precisions[group][first], [precisions[i][0] for i in shared]])
    ratios = _separate_sd_ratios(M, ep_precision)
    if ratios is None:
        return
    ratios = ratios[columns.size:]
    if ratios.min() < sd_ratio:
        names = [_latent_name(graph, f.inputs[i]) for i in shared]
        below = [j for j in np.argsort(ratios) if ratios[j] < sd_ratio]
        low = ", ".join(f"{names[j]} {ratios[j]:.2f}" for j in below)
        warnings.warn(
            f"{f.name}: the likelihood correlates each group's {_latent_name(graph, f.inputs[group])} "
            f"({columns.size} groups) with {', '.join(names[j] for j in below)} (its curvature at EP's posterior "
            "means), which EP's "
            f"separate messages for them leave out: their posterior sds may be about {low} of the exact ones "
            "(a decay A[g] exp(-k t) with three groups, fitted so: k 0.69 of NUTS's). Compare with pm.sample",
            UserWarning,
            stacklevel=4,
        )


def _separate_sd_ratios(M: np.ndarray, precision: np.ndarray) -> np.ndarray | None:
    """Each coordinate's sd under separate messages relative to its joint one,
    ``1 / sqrt(Q_jj (Q^-1)_jj)``, for the joint precision ``Q``: the likelihood's curvature
    ``M`` plus the rest of each coordinate's EP ``precision`` (what ``M`` does not supply);
    None where ``Q`` is not finite and positive definite."""
    Q = M + np.diag(np.maximum(precision - np.diag(M), 0.0))
    if not (np.isfinite(Q).all() and np.linalg.eigvalsh(Q).min() > 0):
        return None
    return 1.0 / np.sqrt(np.diag(Q) * np.diag(np.linalg.inv(Q)))


def _inputs_at_means(f, state) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
    """Every input of likelihood ``f`` at EP's posterior means, ``(N,)`` each, and each latent
    input's EP marginal variance per instance."""
    N = f.size
    values, variances = [], {}
    for i, slot in enumerate(f.inputs):
        if i not in f.latent_inputs:
            values.append(np.broadcast_to(np.asarray(slot.values, dtype=float), (N,)))
        elif isinstance(slot, ElementSlot):
            marg = slot.family.from_natural(state.element_natural[slot.variable][np.asarray(slot.index).reshape(N)])
            values.append(np.asarray(marg.mean(), dtype=float))
            variances[i] = np.asarray(marg.var(), dtype=float)
        else:
            A = np.asarray(slot.A, dtype=float).reshape(N, -1)
            values.append(A @ np.asarray(state.mu) + slot.c)
            Z = linalg.solve_triangular(state.chol, A.T, lower=True, check_finite=False)
            variances[i] = np.sum(Z**2, axis=0)
    return values, variances


def _parameters_at(spec, values: list[np.ndarray], i: int | None = None, step=0.0) -> list[np.ndarray]:
    """A Normal likelihood's ``[mu, sigma]`` at its inputs ``values``, input ``i`` moved by ``step``."""
    N = values[0].shape[0]
    ins = [v + step if j == i else v for j, v in enumerate(values)]
    return [np.broadcast_to(np.asarray(a, dtype=float), (N,)) for a in spec.params(*ins)]


def _reads(slot) -> set[tuple]:
    """What a latent slot reads: ``("element", variable, index)`` of each instance's element,
    or ``("gaussian", column)`` of the Gaussian block's columns."""
    if isinstance(slot, ElementSlot):
        return {("element", slot.variable, int(i)) for i in np.unique(np.asarray(slot.index))}
    return {("gaussian", int(c)) for c in np.flatnonzero(np.any(np.asarray(slot.A) != 0, axis=0))}


def _latent_name(graph, slot) -> str:
    """The latents a slot reads, by name: a LinearSlot's own label is its op's ("DimShuffle")."""
    if isinstance(slot, ElementSlot):
        var = graph.variables.get(slot.variable)
        return slot.variable if var is None or var.size == 1 else f"{slot.variable}[{int(slot.index[0])}]"
    A = np.asarray(slot.A)
    read = np.flatnonzero(np.any(A != 0, axis=0))
    if read.size == 1:  # one coordinate: of a vector, by its index (an HSGP's coefficient)
        var = next((v for v in graph.gaussian_variables if v.offset <= read[0] < v.offset + v.size), None)
        if var is not None and var.size > 1:
            return f"{var.name}[{int(read[0]) - var.offset}]"
    scalars = {v.offset: v.name for v in graph.gaussian_variables if v.size == 1}
    if 1 < read.size <= 3 and np.allclose(A, A[:1]) and all(j in scalars for j in read):
        # one combination of scalars for every instance, as written (b - a, not "a + b")
        terms = [(A[0, j], scalars[j]) for j in sorted(read, key=lambda j: A[0, j] < 0)]
        text = ""
        for coef, name in terms:
            size = "" if np.isclose(abs(coef), 1.0) else f"{abs(coef):g} "
            text += (("-" if coef < 0 else "") if not text else (" - " if coef < 0 else " + ")) + size + name
        return text
    return " + ".join(v.name for v in graph.gaussian_variables
                      if np.any((read >= v.offset) & (read < v.offset + v.size))) or slot.label


def _joined(names) -> str:
    """``names`` joined, the entries of one vector (``f[0]``, ``f[1]``, ...) as one item."""
    bases = [n.split("[")[0] for n in names]
    counts = {b: bases.count(b) for b in bases}
    items = [f"{b} ({counts[b]} entries)" if counts[b] > 1 else n for n, b in zip(names, bases)]
    return ", ".join(dict.fromkeys(items))


def _warn_correlated_predictor(graph, f, state, values, moves, names, varying, steps, h, sd_ratio) -> None:
    """Warn where a likelihood correlates a regression's coefficients with a shared scalar latent.

    ``pm.Gamma("y", mu=pm.math.exp(a + b * x), sigma=s)`` (N = 80, robustness round 20) converged
    silently with sds of ``a`` and ``s`` 0.78 and 0.74 of NUTS's: the shape ``mu**2 / s**2``
    ties ``s`` to the predictor, and EP's site on each instance's ``eta_n`` and on ``s`` drop
    that. :func:`warn_correlated_pairs` checks two scalars read by every instance; here
    ``eta_n = A[n] @ theta + c[n]`` differs per instance. The likelihood's curvature at EP's
    posterior means, per instance by central differences in ``(eta_n, u)`` (``u`` the
    scalar's unconstrained coordinate), gives the cross precision ``g = sum_n A[n] d2l_n /
    deta_n du``; with EP's precision ``P`` of the Gaussian block and EP's variance ``v`` of
    ``u``, the joint precision's Schur complement leaves ``u`` a variance ``v / (1 - v g' P^-1 g)``,
    so EP's sd of ``u`` is ``sqrt(1 - v g' P^-1 g)`` of it.
    """
    A, pos = varying
    other = 1 - pos
    slot = [s for s in (f.inputs[i] for i in f.latent_inputs) if isinstance(s, ElementSlot)]
    if len(slot) != 1:  # two Gaussian projections: their correlation is EP's joint Gaussian's
        return
    slot = slot[0]
    fam = slot.family
    m = fam.from_natural(state.element_natural[slot.variable][slot.index[:1]])
    _, uv = m.unconstrained_moments()
    uv = float(np.asarray(uv, dtype=float).ravel()[0])
    try:
        ll = _log_likelihood_at_steps(f, values, moves, steps)
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return
    if pos == 1:  # the stencil's first axis moves the first latent: put the predictor first
        ll = ll.transpose(1, 0, 2)
    h12 = _curvatures(ll, h)[2]
    g = A.T @ h12
    if not (np.isfinite(g).all() and np.isfinite(uv) and uv > 0):
        return
    z = linalg.solve_triangular(state.chol, g, lower=True, check_finite=False)
    loss = uv * float(z @ z)
    ratio = np.sqrt(max(0.0, 1.0 - loss))
    # the predictor's own label is its op's ("Elemwise"): name the Gaussian latents it reads
    coefs = _latent_name(graph, f.inputs[f.latent_inputs[pos]]).replace(" + ", ", ")
    if ratio < sd_ratio:
        warnings.warn(
            f"{f.name}: the likelihood correlates {names[other]} with the coefficients of its predictor ({coefs}) "
            "(its curvature at EP's posterior means), which EP's separate messages for them leave out: "
            f"the posterior sd of {names[other]} may be about {ratio:.2f} of the exact one, and the "
            f"coefficients' too (pm.Gamma(mu=exp(a + b * x), sigma=s): 0.74-0.78 of NUTS's). A "
            "parametrisation with less correlated parameters (a mean and a dispersion: Gamma(alpha=k, "
            "beta=k / mu), NegativeBinomial(mu, alpha)) fits better; or compare with pm.sample",
            UserWarning,
            stacklevel=4,
        )


def _warn_correlated_per_group(graph, state, fi, f, values, moves, names, varying, element, steps, h,
                               sd_ratio) -> None:
    """Warn where a likelihood correlates an element latent read per group with the Gaussian
    coordinates that group's instances all read.

    ``pm.Bernoulli(logit_p=a[item] * (theta[person] - b[item]))`` (a 2PL item-response model,
    robustness round 29) converged silently with sds of ``a`` and ``b`` 0.51-0.94 of NUTS's,
    the least for the items of extreme difficulty, where NUTS correlates ``log a[item]`` and
    ``b[item]`` at up to 0.81: each instance's site on ``a[item]`` and on its own predictor
    ``theta - b`` drops that. Per element ``e``, the likelihood's curvature at EP's posterior
    means (central differences per instance in the element's unconstrained coordinate ``u``
    and the predictor ``eta_n``) summed over its instances, in ``u`` and the coordinates ``S``
    of the Gaussian block that all its instances read (``b[item]``, not each person's
    ``theta``), with the precision of the element's cavity in ``u`` (its prior, where nothing
    else reads it) and of ``S``'s exact Gaussian prior added (a coefficient its prior pins down
    is not counted as free), gives the squared multiple correlation ``H_uS H_SS^-1 H_Su /
    H_uu`` of ``u`` with them; ``sqrt(1 - that)`` is what an sd that ignores it keeps (a bound:
    ``S``'s information from other factors is left out).
    """
    A, pos = varying
    other = 1 - pos
    try:
        ll = _log_likelihood_at_steps(f, values, moves, steps)
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return
    if pos == 0:  # the stencil's first axis moves the first latent: put the element first
        ll = ll.transpose(1, 0, 2)
    h_uu, h_ee, h_ue = _curvatures(ll, h)
    elements, group = np.unique(element, return_inverse=True)
    # each element's cavity: its marginal less this factor's sites on it, as a precision in u
    slot = f.inputs[f.latent_inputs[other]]
    site = np.asarray(state.sites[fi][other], dtype=float)
    summed = np.stack([np.bincount(group, weights=site[:, j], minlength=elements.size) for j in range(2)], axis=1)
    try:
        cavity = slot.family.from_natural(np.asarray(state.element_natural[slot.variable][elements], dtype=float)
                                          - summed)
        with np.errstate(all="ignore"):
            prec_u = np.where(cavity.is_proper(), 1.0 / np.asarray(cavity.unconstrained_moments()[1], dtype=float),
                              0.0)
    except Exception:  # noqa: BLE001 - a cavity its family cannot describe: count no prior (a bound still)
        prec_u = np.zeros(elements.size)
    prec_u = np.where(np.isfinite(prec_u), prec_u, 0.0)
    ratios = np.ones(elements.size)
    for e in range(elements.size):  # per element (an item): a few small solves, not per instance
        rows = group == e
        Ae = A[rows]
        shared = np.flatnonzero(np.all(Ae != 0, axis=0))
        if shared.size == 0:
            continue
        As = Ae[:, shared]
        H_uu = h_uu[rows].sum() - prec_u[e]
        H_us = As.T @ h_ue[rows]
        # S's own prior: the exact Gaussian factors' precision of those coordinates (given the
        # others). Not EP's cavity: a 2PL item's b[item] is read only with each person's theta,
        # so its marginal precision less its sites' is not positive, and where the element's
        # loss is real EP's marginal of S is as much too narrow as the element's
        prec_s = np.zeros((shared.size, shared.size))
        for t in graph.gaussian_terms:
            Rs = np.asarray(t.R, dtype=float)[:, shared]
            prec_s += Rs.T @ (Rs * np.asarray(t.precision, dtype=float)[:, None])
        H_ss = (As * h_ee[rows, None]).T @ As - prec_s
        try:
            c = linalg.cho_factor(-H_ss)
        except linalg.LinAlgError:
            continue
        if not (np.isfinite(H_uu) and H_uu < 0 and np.all(np.isfinite(H_us))):
            continue
        r2 = float(H_us @ linalg.cho_solve(c, H_us)) / -H_uu
        ratios[e] = np.sqrt(max(0.0, 1.0 - min(r2, 1.0)))
    worst = int(np.argmin(ratios))
    if ratios[worst] < sd_ratio:
        coefs = _latent_name(graph, f.inputs[f.latent_inputs[pos]]).replace(" + ", ", ")
        warnings.warn(
            f"{f.name}: the likelihood correlates each {names[other]} with the coefficients of its predictor "
            f"({coefs}) that its observations share (its curvature at EP's posterior means, group by group), "
            "which EP's separate messages for them leave out: the posterior sds of "
            f"{int(np.sum(ratios < sd_ratio))} of the {elements.size} elements of {names[other]} may be as low as "
            f"{'0.1' if ratios[worst] < 0.1 else f'{ratios[worst]:.2f}'} of the exact ones (element "
            f"{int(elements[worst])}{', or less' if ratios[worst] < 0.1 else ''}), and those coefficients' too "
            "(a 2PL item model's a[item] * (theta[person] - b[item]): 0.51-0.94 of NUTS's); compare with pm.sample",
            UserWarning,
            stacklevel=4,
        )


def _joint_law(graph, state, fi, f, values, points, n_grid: int = 81, max_evaluations: float = 2e7):
    """Correlation of a factor's two shared latents in the law a joint site would give, and
    EP's marginal sds over that law's: ``(rho, (ratio_0, ratio_1))``, or None.

    The law is the factor's cavity (each latent's EP marginal divided by the factor's summed
    sites on it) times the likelihood summed over its instances, on a grid in the latents'
    unconstrained coordinates (:func:`_law_on_grid`), first over 12 of EP's marginal sds each
    way (EP's sds may be a third of the law's), last with up to 501 nodes an axis. None
    where a cavity is improper, the last grid would take more than ``max_evaluations``
    density evaluations, the density cannot be evaluated, or ten passes do not contain the law.
    """
    if f.size * n_grid * n_grid * 4 > max_evaluations:
        return None
    pair = _pair_cavities(graph, state, fi, f)
    if pair is None:
        return None
    cavities, ep_sd, centre, half = pair
    y = np.asarray(f.observed, dtype=float).ravel()

    def loglik(x0, x1s):
        first = np.full(x1s.size, x0)
        ins, j = [], 0
        for v in values:
            if v is None:
                ins.append(np.ascontiguousarray(points[j](first if j == 0 else x1s)))
                j += 1
            else:
                ins.append(np.ascontiguousarray(np.broadcast_to(v, (x1s.size, v.size))))
        yy = np.ascontiguousarray(np.broadcast_to(y, (x1s.size, y.size)))
        return np.sum(np.asarray(f.logp(yy, tuple(ins)), dtype=float), axis=1)

    law = _law_on_grid(loglik, cavities, centre, half, n_grid, max_nodes=501,
                       max_evaluations=max_evaluations, cost_per_node=f.size)
    if law is None:
        return None
    rho, (s0, s1) = law
    return rho, (ep_sd[0] / s0, ep_sd[1] / s1)


def _pair_cavities(graph, state, fi, f):
    """A factor's two latent inputs' cavities (EP's marginal over the factor's summed sites),
    EP's marginal sds, and each one's unconstrained mean and 12 unconstrained sds:
    ``(cavities, ep_sds, centres, halves)``, or None where a cavity is improper."""
    marg = engine._marginals(graph, None, state, f)
    cavities, ep_sd, centre, half = [], [], [], []
    for k, i in enumerate(f.latent_inputs):
        m = marg[i][:1]
        site = np.asarray(state.sites[fi][k], dtype=float)
        if isinstance(f.inputs[i], LinearSlot):
            # instance n's site is on eta_n = eta_0 + d_n: the same Gaussian in eta_0, shifted
            d = np.broadcast_to(np.asarray(f.inputs[i].c, dtype=float), (f.size,))
            d = d - d[0]
            site = np.stack([site[:, 0] + 2.0 * site[:, 1] * d, site[:, 1]], axis=1)
        c = type(m).from_natural(m.natural - np.sum(site, axis=0))
        if not np.all(c.is_proper()):
            return None
        um, uv = m.unconstrained_moments()
        if not (np.isfinite(um).all() and np.isfinite(uv).all() and uv[0] > 0):
            return None
        cavities.append(c)
        ep_sd.append(float(np.sqrt(m.var()[0])))
        centre.append(float(um[0]))
        half.append(12.0 * float(np.sqrt(uv[0])))
    return cavities, ep_sd, centre, half


def _law_on_grid(loglik, cavities, centre, half, n_grid: int, max_nodes: int, max_evaluations: float = np.inf,
                 cost_per_node: int = 1):
    """Correlation and sds of ``cavity_0(x0) cavity_1(x1) exp(loglik(x0, x1))``: ``(rho, (sd_0, sd_1))``, or None.

    ``loglik(x0, x1s)`` is the log-likelihood at one ``x0`` and a vector of ``x1``. On a
    ``n_grid`` x ``n_grid`` grid in the unconstrained coordinates, first over ``centre +- half``,
    then over 8 of that pass's sds around its mean (EP's sds may be far off), widened by
    half on every side whose edge holds more than 1e-8 of the mass, and last at a fifth of
    the law's sd per node (up to ``max_nodes`` an axis). None where the last grid would cost
    more than ``max_evaluations`` (``cost_per_node`` each), the density cannot be evaluated,
    or ten passes do not contain the law.
    """
    def law(lo, hi, n):
        us = [np.linspace(lo[k], hi[k], n[k]) for k in range(2)]
        xs = [type(cavities[k]).from_unconstrained(us[k]) for k in range(2)]
        logd = np.empty((n[0], n[1]))
        with np.errstate(all="ignore"):
            for a in range(n[0]):
                logd[a] = loglik(xs[0][a], xs[1])
            logd += cavities[0].logpdf_unconstrained(us[0][None, :])[0][:, None]
            logd += cavities[1].logpdf_unconstrained(us[1][None, :])[0][None, :]
        logd = np.where(np.isfinite(logd), logd, -np.inf)
        if not np.isfinite(logd.max()):
            raise FloatingPointError
        w = np.exp(logd - logd.max())
        w /= w.sum()
        mu_u = [float(np.sum(w.sum(axis=1 - k) * us[k])) for k in range(2)]
        sd_u = [float(np.sqrt(np.sum(w.sum(axis=1 - k) * (us[k] - mu_u[k]) ** 2))) for k in range(2)]
        return xs, w, mu_u, sd_u

    lo = [centre[k] - half[k] for k in range(2)]
    hi = [centre[k] + half[k] for k in range(2)]
    try:
        for attempt in range(10):
            xs, w, mu_u, sd_u = law(lo, hi, (n_grid, n_grid))
            if attempt == 0 and min(sd_u) > 0:  # zoom to the law's own extent
                lo = [mu_u[k] - 8.0 * sd_u[k] for k in range(2)]
                hi = [mu_u[k] + 8.0 * sd_u[k] for k in range(2)]
                continue
            # a banana's tail (Rice(nu, sigma): small nu with a larger sigma) reaches far to one
            # side: widen each side whose edge still holds mass
            edges = [(w[0].sum(), w[-1].sum()), (w[:, 0].sum(), w[:, -1].sum())]
            wide = False
            for k in range(2):
                width = hi[k] - lo[k]
                if edges[k][0] > 1e-8:
                    lo[k], wide = lo[k] - 0.5 * width, True
                if edges[k][1] > 1e-8:
                    hi[k], wide = hi[k] + 0.5 * width, True
            if not wide:
                break
        else:
            return None
        if min(sd_u) <= 0:
            return None
        n = [int(min(max(n_grid, np.ceil(5.0 * (hi[k] - lo[k]) / sd_u[k]) + 1), max_nodes)) for k in range(2)]
        if n[0] * n[1] * cost_per_node > max_evaluations:
            return None
        xs, w, _, _ = law(lo, hi, n)
    except Exception:  # noqa: BLE001 - a diagnostic: a factor it cannot evaluate so is not warned about
        return None
    X0, X1 = xs[0][:, None], xs[1][None, :]
    m0, m1 = np.sum(w * X0), np.sum(w * X1)
    s0, s1 = np.sqrt(np.sum(w * (X0 - m0) ** 2)), np.sqrt(np.sum(w * (X1 - m1) ** 2))
    if not (s0 > 0 and s1 > 0):
        return None
    return float(np.sum(w * (X0 - m0) * (X1 - m1)) / (s0 * s1)), (float(s0), float(s1))


def _curvatures(ll: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The second derivatives ``(d11, d22, d12)`` by central differences of step ``h`` from
    log-likelihoods ``ll[i, j, ...]`` on the 3 x 3 stencil (``i``, ``j``: -h, 0, +h in each
    of the two coordinates)."""
    d11 = (ll[2, 1] - 2 * ll[1, 1] + ll[0, 1]) / h**2
    d22 = (ll[1, 2] - 2 * ll[1, 1] + ll[1, 0]) / h**2
    d12 = (ll[2, 2] - ll[2, 0] - ll[0, 2] + ll[0, 0]) / (4 * h**2)
    return d11, d22, d12


def _log_likelihood_at_steps(f, values, moves, steps) -> np.ndarray:
    """Each instance's log-likelihood on the 3 x 3 stencil ``steps`` of two latents' moves: ``(3, 3, N)``."""
    with np.errstate(all="ignore"):
        k = iter(range(2))
        ins = tuple(mv(steps[:, next(k)]) if v is None else np.broadcast_to(v, (len(steps), v.size))
                    for v, mv in _zip_moves(values, moves))
        y = np.broadcast_to(np.asarray(f.observed, dtype=float), (len(steps), f.observed.size))
        return np.asarray(f.logp(np.ascontiguousarray(y), tuple(np.ascontiguousarray(a) for a in ins)),
                          dtype=float).reshape(3, 3, -1)


def _zip_moves(values, moves):
    """``(value, move)`` per input: data have a value, latent inputs a move (in order)."""
    it = iter(moves)
    return [(v, None if v is not None else next(it)) for v in values]


def warn_overlapping_components(graph, state) -> None:
    """Warn where a fitted mixture of Normals has two components on top of each other.

    The symptom of a poor mode of the posterior (:func:`pmkjit.ep.mixture.overlapping_components`),
    which EP reaches from its priors without any sign in its own convergence.
    """
    for f in graph.factors:
        for j, k, m_j, m_k, s_j, s_k in overlapping_components(f, state):
            warnings.warn(
                f"{f.name}: mixture components {j} and {k} overlap after EP (means {m_j:.3g} and {m_k:.3g}, "
                f"sds {s_j:.3g} and {s_k:.3g}): EP may have settled in a poor mode of the mixture's posterior "
                "(two components on one cluster, a broad one covering another); compare with pm.sample",
                UserWarning,
                stacklevel=3,
            )


def warn_impossible_observations(idata: az.InferenceData, model: pm.Model, ordered: Sequence[str] = ()) -> None:
    """Warn where posterior draws give observations zero density.

    The posterior of the model is zero there, so EP's approximation puts mass where the
    data are impossible. That happens where a likelihood's support moves with a latent (a
    shifted distribution ``loc + Exponential``, ``Uniform(0, theta)``), whose bound EP's
    Gaussian and Gamma messages do not hold: a shifted exponential with ``loc ~ Normal(0, 1)``
    (N = 80, every observation above 2.007) came out with ``loc`` at 61 (NUTS: 1.99 +- 0.016),
    every observation impossible at every draw, "converged" with only a warning about
    unanswered entries (robustness round 15); ``Uniform(0, theta)`` put 15% of the draws of
    ``theta`` below the largest observation. Read from the ``log_likelihood`` group, or,
    without one, from the log-likelihood of at most 100 draws. Draws whose ``ordered``
    vectors are out of order are left out: ``inference_data`` has said how many there are,
    and PyMC's ordinal densities are zero at every observation there.
    """
    if not model.observed_RVs:
        return
    posterior = idata.posterior
    if "log_likelihood" not in idata:
        n = posterior.sizes["draw"] * posterior.sizes["chain"]
        posterior = posterior.isel(draw=slice(None, None, max(1, n // 100)))
        try:
            loglik = pm.compute_log_likelihood(az.InferenceData(posterior=posterior), model=model,
                                               extend_inferencedata=False, progressbar=False)
        except Exception:  # noqa: BLE001 - a check must not fail the fit
            # PyMC's elementwise log-likelihood fails on some models EP fits (a mixture with a
            # data column (N, 1) in a component's scale: a runtime broadcasting error), which
            # is why compute_log_likelihood=False is there
            return
    else:
        loglik = idata.log_likelihood
    n_draws = posterior.sizes["chain"] * posterior.sizes["draw"]
    unordered = np.zeros(n_draws, bool)
    for name in ordered:
        x = np.asarray(posterior[name]).reshape(n_draws, -1)
        unordered |= np.any(np.diff(x, axis=-1) <= 0, axis=-1)
    for name, values in loglik.data_vars.items():
        ll = np.asarray(values).reshape(n_draws, -1)
        # zero density, or parameters outside their domain
        per_draw = (np.isneginf(ll) | np.isnan(ll)) & ~unordered[:, None]
        if not per_draw.any():
            continue
        share = per_draw.any(axis=1).mean()
        entries = int(per_draw.any(axis=0).sum())
        percent = f"{share:.0%}" if share >= 0.01 else f"{share:.2%}"  # one draw in 2,000 is not "0%"
        warnings.warn(
            f"{name}: {entries} of {per_draw.shape[1]} observation{'s' if per_draw.shape[1] > 1 else ''} "
            f"{'have' if entries > 1 else 'has'} zero density at {percent} of the posterior draws, where the "
            "model's posterior is zero: "
            + ("EP's posterior is nowhere near the data (EP failed). " if share == 1.0 else
               "EP's posterior puts mass where the data are impossible. ")
            + "This happens where the likelihood's support moves with a latent parameter (a shifted "
            "distribution, a Uniform bound, a parameter used as a probability without a link), a bound EP's "
            "Gaussian and Gamma messages do not hold; " + ("use pm.sample for this model" if share == 1.0 else
                                                          "compare with pm.sample"),
            UserWarning,
            stacklevel=3,
        )


def warn_unconditional_centred_draws(model, graph, centred: list[str], given: ConditionalDraws | None) -> None:
    """Warn where a centred ``z = (a - loc) / scale`` was computed from independent draws of ``a`` and ``scale``.

    That is the case when the draws given the scales were not made (beyond their work
    budget or their number of scale elements, or a conditional precision not positive
    definite), or when ``a``'s centred prior is no semi-analytic Normal factor (``z`` with a
    prior mean other than 0): ``z``'s draws are then a ratio of EP's factorised marginals,
    several times too wide where the scale is uncertain (radon with varying intercepts and
    slopes written non-centred, 85 counties, D = 172: the slopes' ``z`` sds 4-10 times
    NUTS's, the effects and scales themselves within 0.1 sd; robustness round 12), silently.
    """
    if not centred:
        return
    semi = {f.name for f in graph.factors if f.analytic is not None and f.from_prior}
    loose = []
    for z in centred:
        # the latents z is a deterministic of: its centred latent, loc's and scale's
        latent = [v.name for v in model.free_RVs if v in ancestors([model[z]])]
        if given is None or not any(name in semi for name in latent):
            loose.append(z)
    if not loose:
        return
    why = ("the draws given the scales were not made (ep.attrs['draws_given_scales'] == 'no': "
           f"{graph.n_theta} real latents or their scale elements beyond the work budget, or a conditional "
           "precision not positive definite)" if given is None else
           "its centred prior is not a semi-analytic Normal factor (z has a prior mean other than 0)")
    warnings.warn(
        f"{', '.join(loose)}: the non-centred effect was fitted centred, but {why}, so each draw of "
        f"{', '.join(loose)} is (effect - loc) / scale of independent draws of the effect and its scale, "
        "whose spread can be several times the posterior's (the effects and scales themselves are not affected; "
        "see docs/ep.md, \"Posterior draws given the scales\")",
        UserWarning,
        stacklevel=3,
    )
