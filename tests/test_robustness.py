"""Robustness of the model walk and of EP on models written the way PyMC users write them."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pmkjit.ep import engine
from pmkjit.families import Beta
from pmkjit.graph import build_factor_graph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::RuntimeWarning")


def test_black_box_logp_is_minus_inf_only_where_parameters_are_invalid():
    # importance samples of a Gamma message can underflow to 0 and exp(eta) can overflow:
    # PyMC's parameter check raised ParameterValueError for the whole batch
    y = np.array([0, 3, 1, 7])
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        alpha = pm.Exponential("alpha", 1.0)
        pm.NegativeBinomial("y", mu=pm.math.exp(a), alpha=alpha, observed=y)
    (f,) = [f for f in build_factor_graph(model).factors if f.name == "y"]
    eta = np.array([[0.5, 0.5, 800.0, 0.2]])
    alpha = np.array([[2.0, 0.0, 1.0, 0.7]])
    ins = tuple(alpha if s.family.name == "Gamma" else eta for s in f.inputs)
    logp = f.logp(y[None, :].astype(float), ins)
    assert np.isneginf(logp[0, 1])
    assert not np.isfinite(logp[0, 2]) or logp[0, 2] < -100
    for j in (0, 3):
        mu = np.exp(eta[0, j])
        expect = stats.nbinom.logpmf(y[j], alpha[0, j], alpha[0, j] / (alpha[0, j] + mu))
        assert logp[0, j] == pytest.approx(expect, rel=1e-8)


def test_prior_site_starts_from_forward_samples_at_the_ends_of_the_support():
    # Beta(phi * kappa, (1 - phi) * kappa) with a small kappa: forward samples round to 0
    # and 1, whose log statistics are infinite; EP must still start from a proper site
    with pm.Model() as model:
        phi = pm.Beta("phi", 1.0, 1.0)
        kappa = pm.Exponential("kappa", 10.0)
        theta = pm.Beta("theta", alpha=phi * kappa, beta=(1 - phi) * kappa, shape=3)
        pm.Binomial("k", n=10, p=theta, observed=np.array([2, 5, 9]))
    graph = build_factor_graph(model)
    state, _ = engine.init(graph, np.random.default_rng(0))
    q = Beta.from_natural(state.element_natural["theta"])
    assert q.is_proper().all()
    assert np.all(np.isfinite(q.mean()))

