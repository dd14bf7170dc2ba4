"""EP's posterior as ArviZ InferenceData: draws, deterministics, log-likelihood and the ``ep`` group.

Also :func:`ep_posterior`, which reads EP's closed-form marginals back from that group.
"""

from __future__ import annotations

import logging
import warnings

import arviz as az
import numpy as np
import pymc as pm
import xarray as xr
from scipy.linalg import solve_triangular
from pymc.model.transform.optimization import freeze_dims_and_data
from pymc.backends.arviz import coords_and_dims_for_inferencedata, find_constants, find_observations

from pmkjit.ep.collapsed import draw_jointly
from pmkjit.ep.conditional import ConditionalDraws, conditional_draws
from pmkjit.families import Gaussian, family_by_name
from pmkjit.families.base import ExponentialFamily
from pmkjit.graph.centre import HIDDEN_PREFIX
from pmkjit.graph.interval import UNIT_PREFIX
from pmkjit.graph.simplex import STICK_PREFIX


def assemble_inference_data(model, graph, state, draws, chains, rng, with_loglik,
                            collapsed: dict | None = None) -> tuple[az.InferenceData, ConditionalDraws | None, set[int]]:
    """Posterior draws from EP's approximation, their deterministics and log-likelihood.

    ``collapsed`` maps factor indices to one-site methods
    (:class:`~pmkjit.ep.collapsed.CollapsedLikelihood`,
    :class:`~pmkjit.ep.hierarchy.CollapsedPrior`), whose latents are drawn jointly where
    that is coherent (:func:`~pmkjit.ep.collapsed.draw_jointly`); returns the
    InferenceData, the conditional draws (or None) and the indices of the factors drawn
    jointly.
    """
    posterior = {}
    n = draws * chains
    z = rng.standard_normal((n, graph.n_theta)) if graph.n_theta else None
    elements = {v.name: v.family.from_natural(state.element_natural[v.name]).sample(rng, n).reshape(n, v.size)
                for v in graph.variables.values() if not v.in_gaussian_block}
    # the real latents given each draw of the scales they are Normal under (the funnel of
    # a hierarchy), else EP's joint Gaussian (pmkjit.ep.conditional)
    given = conditional_draws(graph, state, elements, n, rng)
    if given is not None:
        theta = given.theta
        elements.update(given.scales)
    elif graph.n_theta:
        theta = state.mu + solve_triangular(state.chol, z.T, lower=True, trans="T").T
    jointly = set()
    if collapsed:
        # its own generator, so that models without such factors keep their draws
        sub = np.random.default_rng(rng.integers(2**63 - 1))
        fixed = frozenset(given.scales) | {"theta"} if given is not None else frozenset()
        jointly = draw_jointly(graph, state, collapsed, elements, theta if graph.n_theta else None, sub,
                               fixed=fixed)
    for v in graph.variables.values():
        if v.in_gaussian_block:
            x = theta[:, v.offset : v.offset + v.size]
            if v.name in graph.zero_sum:  # EP holds the sums near 0 (sd 1e-4); the model at 0
                x = x.reshape((n,) + v.shape)
                for axis in range(-graph.zero_sum[v.name], 0):
                    x = x - x.mean(axis=axis, keepdims=True)
        else:
            x = elements[v.name]
        posterior[v.name] = x.reshape((chains, draws) + v.shape)
    for name in graph.ordered:
        # EP's Gaussian for an ordered vector has tails past its order: say how many draws
        # fell there rather than alter them
        unordered = float(np.mean(np.any(np.diff(posterior[name], axis=-1) <= 0, axis=-1)))
        if unordered > 0:
            warnings.warn(
                f"{name}: {unordered:.1%} of the posterior draws of this ordered vector are out of order (EP's "
                "Gaussian approximation puts that mass past their order, which its order factors impose on the "
                "moments only); entries whose order the data leave uncertain, such as the cutpoints around a class "
                "with few observations, make it larger",
                UserWarning, stacklevel=3,
            )
    coords, dims = coords_and_dims_for_inferencedata(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.from_dict(
            posterior=posterior,
            observed_data={k: np.asarray(v) for k, v in find_observations(model).items()},
            constant_data={k: np.asarray(v) for k, v in find_constants(model).items()},
            coords=coords,
            dims=dims,
        )
        if graph.predictive:
            drawn = _predictive_draws(idata.get("posterior"), model, graph.predictive, rng, (chains, draws))
            if "posterior" in idata:
                idata.posterior = drawn
            else:
                idata.add_groups(posterior=drawn)
        # ``model`` reads observed variables as their data (observed_as_data, in fit):
        # pm.compute_deterministics evaluates the graph with only the free variables given,
        # so a deterministic reading an observed x (a + b * x) would otherwise get a fresh
        # random draw of x per posterior draw, not its data as in pm.sample
        det = pm.compute_deterministics(idata.posterior, model=model, merge_dataset=True, progressbar=False)
        idata.posterior = det
        if with_loglik and model.observed_RVs:
            pm.compute_log_likelihood(idata, model=model, progressbar=False)
    return idata, given, jointly


def _predictive_draws(posterior: xr.Dataset | None, model: pm.Model, names: list[str],
                      rng: np.random.Generator, shape: tuple[int, int]) -> xr.Dataset:
    """``posterior`` with the latents no factor reads drawn given each draw of the others.

    Their factors integrate to one over them, so the posterior of these variables given the
    data is their predictive: one forward draw per posterior draw of their parents, as
    ``pm.sample_posterior_predictive`` makes for observed variables (see
    :mod:`pmkjit.graph.predictive`).
    """
    seed = int(rng.integers(2**31 - 1))
    # PyMC announces which variables it draws ("Sampling: [...]"): captured, not printed,
    # and checked, since a variable drawn beside ours would replace its EP posterior draws
    log = logging.getLogger("pymc.sampling.forward")
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    saved = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    try:
        pp = _forward(posterior, model, names, seed, shape)
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
    for message in messages:
        if message.startswith("Sampling: [") and message.endswith("]"):
            drawn = {v.strip() for v in message[len("Sampling: ["):-1].split(",") if v.strip()}
            if not drawn <= set(names):
                raise RuntimeError(f"PyMC would redraw {sorted(drawn - set(names))} from their priors beside "
                                   f"{names}; please report this model to pmkjit")
    if posterior is None:
        posterior = xr.Dataset(coords={"chain": np.arange(shape[0]), "draw": np.arange(shape[1])})
    out = posterior.copy()
    for name in names:
        draws = np.asarray(pp[name])
        dims = ("chain", "draw") + tuple(model.named_vars_to_dims.get(name) or
                                         (f"{name}_dim_{i}" for i in range(draws.ndim - 2)))
        out[name] = (dims, draws)
        # the model's coordinates, or 0, 1, ... for a dimension without them, as ArviZ gives
        # pm.sample's y_unobserved_dim_0 (without, .sel(y_unobserved_dim_0=2) failed)
        out = out.assign_coords({d: np.asarray(model.coords[d]) if model.coords.get(d) is not None
                                 else np.arange(n) for d, n in zip(dims[2:], draws.shape[2:])
                                 if d not in out.coords})
    return out


def _forward(posterior: xr.Dataset | None, model: pm.Model, names: list[str], seed: int,
             shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Forward draws of ``names`` given each posterior draw (or from the prior, without one).

    The model's data are frozen into constants first: given a bare posterior, PyMC takes
    every ``pm.Data`` as possibly changed and redraws each free variable downstream of one
    from its prior (a latent whose prior sd was ``pm.Data(10.0)`` came back with the prior's
    sd, 9.9, instead of the posterior's 0.1), and the predictive-only ones with it.
    """
    model = freeze_dims_and_data(model)
    if posterior is None:  # every latent is unread: the posterior is the prior
        pp = pm.sample_prior_predictive(draws=int(np.prod(shape)), model=model, var_names=list(names),
                                        random_seed=seed, return_inferencedata=False)
        return {k: np.asarray(v).reshape(shape + np.shape(v)[1:]) for k, v in pp.items()}
    return pm.sample_posterior_predictive(posterior, model=model, var_names=list(names), random_seed=seed,
                                          progressbar=False, return_inferencedata=False)


class NoOracle:
    """Stands in the per-factor oracle list for (semi-)analytic factors (never called)."""

    n_calls = 0

    def __init__(self, label: str):
        self.label = label


def method_label(kjit, oracle) -> str:
    if isinstance(oracle, NoOracle):
        return oracle.label
    return f"kjit ({oracle.kind} oracle)" if kjit is not None else oracle.kind


def ep_group(graph, state, trace, events, sweeps, converged, kjits, oracles, timings, method,
              damping, finished: frozenset[int] = frozenset()) -> xr.Dataset:
    names = [f.description for f in graph.factors]
    data = {
        # the EP posterior in closed form: the joint Gaussian of the real-valued latents,
        # and the natural parameters of every other latent's element-wise message
        "gaussian_mean": (("theta",), np.asarray(state.mu, dtype=float)),
        "gaussian_cov": (("theta", "theta_"), _covariance(state.chol)),
        "convergence": (("sweep",), np.asarray(trace, dtype=float)),
        "oracle_calls": (("factor",), np.asarray([o.n_calls for o in oracles], dtype=int)),
        # entries quadrature or the grid refused and importance sampling answered instead
        "oracle_fallbacks": (("factor",), np.asarray([getattr(o, "n_fallback", 0) for o in oracles], dtype=int)),
        "kjit_predictions": (("factor",), np.asarray(
            [k.operator.n_predictions if k is not None else 0 for k in kjits], dtype=int)),
        # calls in which the oracle's spot checks found the operator's trusted predictions
        # wrong, and the oracle answered the whole batch (KJITMethod._spot_check)
        "kjit_distrusted": (("factor",), np.asarray(
            [k.n_distrusted if k is not None else 0 for k in kjits], dtype=int)),
        "factor_size": (("factor",), np.asarray([f.size for f in graph.factors], dtype=int)),
    }
    attrs = {
        "sweeps": int(sweeps),
        "converged": int(converged),
        "method": method,
        "damping_final": float(damping),
        **{k: int(v) for k, v in events.items()},
        **{f"seconds_{k}": float(v) for k, v in timings.items()},
        "factor_graph": graph.summary(),
        "weights": "; ".join(f"{f.name}: {f.density_source}" for f in graph.factors),
        # how each factor's messages were computed, e.g. "y: quadrature" for a factor whose
        # instances share a latent under method="kjit"
        "factor_methods": "; ".join(
            f"{f.name}: {method_label(k, o)}{', finished by its oracle' if fi in finished else ''}"
            for fi, (f, k, o) in enumerate(zip(graph.factors, kjits, oracles))),
    }
    for v in graph.element_variables:
        data[f"natural__{v.name}"] = ((f"{v.name}__element", "natural_param"),
                                      np.asarray(state.element_natural[v.name], dtype=float))
    attrs["latent_families"] = "; ".join(f"{v.name}: {v.family.name}" for v in graph.variables.values())
    attrs["latent_shapes"] = "; ".join(f"{v.name}: {','.join(map(str, v.shape))}" for v in graph.variables.values())
    attrs["gaussian_offsets"] = "; ".join(f"{v.name}: {v.offset}" for v in graph.gaussian_variables)
    return xr.Dataset(data, coords={"sweep": np.arange(1, len(trace) + 1), "factor": names}, attrs=attrs)


def _covariance(chol: np.ndarray) -> np.ndarray:
    """Covariance from the Cholesky factor L of the posterior *precision* (P = L L^T)."""
    if chol.size == 0:
        return np.zeros((0, 0))
    from scipy.linalg import cho_solve

    return cho_solve((chol, True), np.eye(chol.shape[0]))


def _attr_map(text: str) -> dict[str, str]:
    return dict(item.split(": ", 1) for item in text.split("; ")) if text else {}


def ep_posterior(idata: az.InferenceData) -> dict[str, ExponentialFamily]:
    """The EP posterior marginals of every latent variable, as message batches.

    Parameters
    ----------
    idata : arviz.InferenceData
        Returned by :func:`fit`.

    Returns
    -------
    dict of str to ExponentialFamily
        Per latent variable, a batch of its (flattened) elements' marginals: Gaussian
        for real-valued latents (the joint Gaussian is ``idata.ep.gaussian_mean`` and
        ``idata.ep.gaussian_cov``), Gamma or Beta for positive or unit-interval ones.
        Exact, unlike moments estimated from the posterior draws.

    Notes
    -----
    The keys are the latents of the model EP ran, which :func:`fit` may have rewritten:
    a centred non-centred effect is its centred latent (``a``, not ``z``; an effect
    without a name is ``__pmkjit_centred_<z>``); a latent on another constant interval,
    ``r = lower + (upper - lower) * u``, is its hidden unit or positive latent
    ``__pmkjit_unit_<r>``; a ``pm.Dirichlet`` ``d`` is its stick-breaking Betas
    ``__pmkjit_stick_<d>_<k>``; variables drawn from their predictive after EP are
    absent. ``idata.ep.attrs["latent_families"]`` lists the keys.

    Raises
    ------
    ValueError
        If ``idata`` has no ``ep`` group with the posterior (not made by ``pmkjit.fit``).
    """
    ep = getattr(idata, "ep", None)
    if ep is None or "gaussian_mean" not in ep or "latent_families" not in ep.attrs:
        raise ValueError("idata has no EP posterior: pass the InferenceData returned by pmkjit.fit")
    families = _attr_map(ep.attrs["latent_families"])
    shapes = {k: tuple(int(n) for n in v.split(",") if n) for k, v in _attr_map(ep.attrs["latent_shapes"]).items()}
    offsets = {k: int(v) for k, v in _attr_map(ep.attrs["gaussian_offsets"]).items()}
    mean, cov = ep["gaussian_mean"].values, ep["gaussian_cov"].values
    out = {}
    for name, fam in families.items():
        if name in offsets:
            size = int(np.prod(shapes[name], dtype=int))
            sl = slice(offsets[name], offsets[name] + size)
            out[name] = Gaussian(mean[sl], np.diag(cov)[sl])
        else:
            out[name] = family_by_name(fam).from_natural(ep[f"natural__{name}"].values)
    return out


def as_original(idata: az.InferenceData, original: pm.Model) -> az.InferenceData:
    """The posterior of a rewritten model with the original model's variables in its order."""
    post = idata.posterior
    order = [n for n in sample_order(original) if n in post]
    # (the centred latent of an effect the user did not name, a Dirichlet's stick-breaking
    # Betas and a rescaled Uniform's unit latent are not the model's)
    hidden = (HIDDEN_PREFIX, STICK_PREFIX, UNIT_PREFIX)
    idata.posterior = post[order + [v for v in post.data_vars if v not in order and not v.startswith(hidden)]]
    return idata


def sample_order(model: pm.Model) -> list[str]:
    """Variable names in the order of ``pm.sample``'s posterior.

    ``pm.sample`` records ``model.unobserved_value_vars``: the free variables without a
    transform first, then those with one, then the deterministics, so a Normal ``b``
    declared after a ``HalfNormal`` ``tau`` comes before it. The free variables'
    declaration order put ``az.summary`` rows of an EP fit and a NUTS trace of the same
    model in different orders.
    """
    plain = [rv.name for rv in model.free_RVs if model.rvs_to_transforms.get(rv) is None]
    transformed = [rv.name for rv in model.free_RVs if model.rvs_to_transforms.get(rv) is not None]
    return plain + transformed + [d.name for d in model.deterministics]
