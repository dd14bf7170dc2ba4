"""Likelihoods for :class:`pmkjit.models.GeneralizedLinearModel`, vectorised over ``f``.

Each takes the latent ``f = phi(x)^T w`` through its canonical inverse link (identity,
logistic, logistic, exp), so ``d log p / df`` is ``y - E[y | f]`` up to a scale, and
provides what the GLM needs: log density, its gradient in ``f`` and in the likelihood's
own parameters, the conditional mean and variance, and the CDF (for quantiles).
Arrays ``y`` of shape ``(n,)`` broadcast against ``f`` of shape ``(n, S)``.
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

from pmkjit.bases.base import Hyperparameter

__all__ = ["Likelihood", "Gaussian", "Bernoulli", "Binomial", "Poisson", "get_likelihood"]


class Likelihood:
    """Base class; subclasses are small immutable value objects."""

    name = "likelihood"
    discrete = False

    def specs(self) -> dict[str, Hyperparameter]:
        """Learnable likelihood parameters (natural units) with bounds."""
        return {}

    def logpdf(self, y, f, params) -> np.ndarray:  # pragma: no cover - abstract
        """Log density of ``y`` (shape ``(n,)``) given latents ``f`` (``(n, S)``): ``(n, S)``."""
        raise NotImplementedError

    def dlogpdf_df(self, y, f, params) -> np.ndarray:  # pragma: no cover
        """Derivative of :meth:`logpdf` in ``f``, elementwise: ``(n, S)``."""
        raise NotImplementedError

    def dlogpdf_dparams(self, y, f, params) -> dict[str, np.ndarray]:
        """Gradients of ``sum logpdf`` in the learnable parameters."""
        return {}

    def mean(self, f, params) -> np.ndarray:  # pragma: no cover
        """Conditional mean ``E[y | f]`` (the inverse link of ``f``, times ``n_trials`` for a Binomial)."""
        raise NotImplementedError

    def var(self, f, params) -> np.ndarray:  # pragma: no cover
        """Conditional variance ``Var[y | f]``."""
        raise NotImplementedError

    def cdf(self, y, f, params) -> np.ndarray:  # pragma: no cover
        """Conditional CDF ``P(Y <= y | f)`` (for predictive quantiles)."""
        raise NotImplementedError

    def check_y(self, y: np.ndarray) -> None:
        """Raise ``ValueError`` for targets outside the support."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


class Gaussian(Likelihood):
    """``y ~ N(f, noise_var)``; ``noise_var`` is learned.

    Parameters
    ----------
    noise_var : float, default 1.0
        Starting value.
    bounds : (float, float), default (1e-6, 1e6)
    """

    name = "gaussian"

    def __init__(self, noise_var: float = 1.0, bounds=(1e-6, 1e6)) -> None:
        self.noise_var = noise_var
        self.bounds = tuple(bounds)

    def specs(self):
        return {"noise_var": Hyperparameter(np.array(float(self.noise_var)), self.bounds)}

    def logpdf(self, y, f, params):
        v = params["noise_var"]
        return -0.5 * (np.log(2 * np.pi * v) + (y[:, None] - f) ** 2 / v)

    def dlogpdf_df(self, y, f, params):
        return (y[:, None] - f) / params["noise_var"]

    def dlogpdf_dparams(self, y, f, params):
        v = params["noise_var"]
        return {"noise_var": np.sum(-0.5 / v + 0.5 * (y[:, None] - f) ** 2 / v**2)}

    def mean(self, f, params):
        return f

    def var(self, f, params):
        return np.full_like(f, float(params["noise_var"]))

    def cdf(self, y, f, params):
        return stats.norm.cdf(y[:, None], f, np.sqrt(params["noise_var"]))


class Bernoulli(Likelihood):
    """``y ~ Bernoulli(sigmoid(f))``, ``y`` in {0, 1}."""

    name = "bernoulli"
    discrete = True

    def logpdf(self, y, f, params):
        return y[:, None] * f - np.logaddexp(0.0, f)

    def dlogpdf_df(self, y, f, params):
        return y[:, None] - special.expit(f)

    def mean(self, f, params):
        return special.expit(f)

    def var(self, f, params):
        p = special.expit(f)
        return p * (1 - p)

    def cdf(self, y, f, params):
        y = np.floor(y)[:, None]
        return np.where(y < 0, 0.0, np.where(y >= 1, 1.0, 1.0 - special.expit(f)))

    def check_y(self, y):
        if not np.all((y == 0) | (y == 1)):
            raise ValueError("Bernoulli targets must be 0 or 1")


class Binomial(Likelihood):
    """``y ~ Binomial(n_trials, sigmoid(f))``, ``y`` counts of successes.

    Parameters
    ----------
    n_trials : int, default 1
    """

    name = "binomial"
    discrete = True

    def __init__(self, n_trials: int = 1) -> None:
        self.n_trials = n_trials

    def logpdf(self, y, f, params):
        n = self.n_trials
        logc = special.gammaln(n + 1) - special.gammaln(y + 1) - special.gammaln(n - y + 1)
        return logc[:, None] + y[:, None] * f - n * np.logaddexp(0.0, f)

    def dlogpdf_df(self, y, f, params):
        return y[:, None] - self.n_trials * special.expit(f)

    def mean(self, f, params):
        return self.n_trials * special.expit(f)

    def var(self, f, params):
        p = special.expit(f)
        return self.n_trials * p * (1 - p)

    def cdf(self, y, f, params):
        return stats.binom.cdf(np.floor(y)[:, None], self.n_trials, special.expit(f))

    def check_y(self, y):
        if not np.all((y >= 0) & (y <= self.n_trials) & (y == np.round(y))):
            raise ValueError(f"Binomial targets must be integers in [0, {self.n_trials}]")


class Poisson(Likelihood):
    """``y ~ Poisson(exp(f))``, ``y`` non-negative counts."""

    name = "poisson"
    discrete = True

    def logpdf(self, y, f, params):
        return y[:, None] * f - np.exp(f) - special.gammaln(y + 1)[:, None]

    def dlogpdf_df(self, y, f, params):
        return y[:, None] - np.exp(f)

    def mean(self, f, params):
        return np.exp(f)

    def var(self, f, params):
        return np.exp(f)

    def cdf(self, y, f, params):
        return stats.poisson.cdf(np.floor(y)[:, None], np.exp(f))

    def check_y(self, y):
        if not np.all((y >= 0) & (y == np.round(y))):
            raise ValueError("Poisson targets must be non-negative integers")


_BY_NAME = {"gaussian": Gaussian, "bernoulli": Bernoulli, "binomial": Binomial, "poisson": Poisson}


def get_likelihood(likelihood) -> Likelihood:
    """A :class:`Likelihood` from an instance or one of the names in ``_BY_NAME``."""
    if isinstance(likelihood, Likelihood):
        return likelihood
    if isinstance(likelihood, str) and likelihood in _BY_NAME:
        return _BY_NAME[likelihood]()
    raise ValueError(f"likelihood must be a Likelihood or one of {sorted(_BY_NAME)}, got {likelihood!r}")
