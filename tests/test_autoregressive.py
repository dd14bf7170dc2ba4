"""Latent pm.AR series: Normal terms on their initial values and innovations."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pmkjit
from pmkjit.errors import UnsupportedModelError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.mark.parametrize("constant", [pytest.param(False, marks=pytest.mark.slow), True])  # without a constant: 18 s (the other runs)
def test_a_latent_ar_with_a_gaussian_likelihood_is_exact_against_pymcs_own_density(constant):
    # The whole model is Gaussian, so its posterior is N(m, H^-1) with m the maximiser of
    # PyMC's log-density and H its negative Hessian: an independent reference (PyMC's AR
    # logp, differentiated by PyTensor) for the rows pmkjit writes, lags and constant included.
    rng = np.random.default_rng(0)
    T = 12
    y = rng.normal(np.sin(np.arange(T) / 2.0), 0.4)
    rho = [0.2, 0.6, -0.25] if constant else [0.6, -0.25]
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0, 1)
        z = pm.AR("z", rho=rho, sigma=0.5, constant=constant, init_dist=pm.Normal.dist(0.1, 0.7), steps=T - 2)
        pm.Normal("y", b0 + z, 0.4, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=100)
    assert "prior of z (innovations)" in idata.ep.attrs["factor_graph"]
    mean, cov = idata.ep["gaussian_mean"].values, idata.ep["gaussian_cov"].values
    point = {"b0": np.array(mean[0]), "z": mean[1:]}
    np.testing.assert_allclose(model.compile_dlogp(vars=[b0, z])(point), 0.0, atol=1e-6)
    H = np.asarray(model.compile_d2logp(vars=[b0, z])(point))  # the negative Hessian
    np.testing.assert_allclose(cov @ H, np.eye(T + 1), atol=1e-6)


def test_a_batch_of_series_with_their_own_coefficients_is_exact_against_pymcs_own_density():
    # shape (3, T) with rho (3, 2): each series its own AR(2) coefficients (refused before, with
    # a message that called the constant rho latent), and a per-series init mean
    rng = np.random.default_rng(2)
    T = 9
    y = rng.normal(0.0, 1.0, (3, T))
    rho = np.array([[0.5, 0.1], [0.3, -0.2], [-0.4, 0.2]])
    with pm.Model() as model:
        z = pm.AR("z", rho=rho, sigma=np.array([0.5, 0.8, 1.1]), init_dist=pm.Normal.dist([[0.0], [0.5], [-0.5]], 0.7),
                  ar_order=2, shape=(3, T))
        pm.Normal("y", z, 0.4, observed=y)
    idata = pmkjit.fit(model=model, random_seed=1, progressbar=False, draws=50, compute_log_likelihood=False)
    mean, cov = idata.ep["gaussian_mean"].values, idata.ep["gaussian_cov"].values
    point = {"z": mean.reshape(3, T)}
    np.testing.assert_allclose(model.compile_dlogp(vars=[z])(point), 0.0, atol=1e-6)
    np.testing.assert_allclose(cov @ np.asarray(model.compile_d2logp(vars=[z])(point)), np.eye(3 * T), atol=1e-6)


def test_a_latent_ar_with_a_latent_scale_is_semi_analytic_and_a_latent_rho_is_refused():
    y = np.random.default_rng(1).poisson(3.0, 20)
    with pm.Model() as scale:
        s = pm.HalfNormal("s", 1)
        z = pm.AR("z", rho=[0.7], sigma=s, init_dist=pm.Normal.dist(0, 1), steps=19)
        pm.Normal("y", z, 1.0, observed=y)
    with pytest.warns(UserWarning, match=r"z: an autoregression with a latent scale \(s\) on its innovations"):
        idata = pmkjit.fit(model=scale, random_seed=1, progressbar=False, draws=50)
    assert "z (innovations): semi-analytic" in idata.ep.attrs["factor_methods"]
    with pm.Model() as latent_rho:
        r = pm.Uniform("r", -1, 1)
        z = pm.AR("z", rho=r, sigma=0.5, init_dist=pm.Normal.dist(0, 1), steps=19)
        pm.Poisson("y", pm.math.exp(z), observed=y)
    with pytest.raises(UnsupportedModelError, match="z: a pm.AR needs constant coefficients rho"):
        pmkjit.fit(model=latent_rho, random_seed=1, progressbar=False)
