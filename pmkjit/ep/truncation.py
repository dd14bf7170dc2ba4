"""Exact tilted moments of an order constraint ``1[d > 0]`` on a linear predictor.

An ordered vector (``transform=pm.distributions.transforms.ordered``, the cutpoints of an
ordinal outcome) has its distribution's density on the ordered vectors only: the prior
times ``prod_k 1[c_{k+1} - c_k > 0]``. Each indicator is a factor on the linear slot
``d_k = c_{k+1} - c_k`` whose tilted law under a Gaussian cavity is a truncated normal,
with moments in closed form. Leaving the order to the ordinal observations alone failed
where one observation is all that orders two cutpoints: the other classes pushed them
19 cavity sds out of order, no quadrature node of that observation had any likelihood,
its site never moved again and EP reported convergence 36 sds from NUTS.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import special

from pmkjit.ep.methods import Answer
from pmkjit.families import ExponentialFamily, Gaussian

__all__ = ["PositiveMethod", "truncated_moments"]

_ASYMPTOTIC = 30.0  # standardised truncation point beyond which the series is used


def truncated_moments(mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``N(mean, var)`` truncated to ``(0, inf)``, stable far in either tail.

    With ``a = -mean / sd`` and the inverse Mills ratio ``l = phi(a) / (1 - Phi(a))``
    (through ``erfcx``, finite for any ``a``), the mean is ``mean + sd * l`` and the
    variance ``var * (1 - l * (l - a))``; beyond ``a = 30`` the bracket, a difference of
    nearly equal numbers, is its asymptotic series ``1/a^2 - 6/a^4 + 50/a^6``.
    """
    sd = np.sqrt(var)
    a = -mean / sd
    lam = np.sqrt(2.0 / np.pi) / special.erfcx(a / np.sqrt(2.0))
    bracket = 1.0 - lam * (lam - a)
    far = a > _ASYMPTOTIC
    if np.any(far):
        inv = 1.0 / np.where(far, a, 1.0) ** 2
        bracket = np.where(far, inv - 6.0 * inv**2 + 50.0 * inv**3, bracket)
    return mean + sd * lam, var * bracket


class PositiveMethod:
    """Tilted beliefs of a factor ``1[d > 0]`` on one linear slot (messages ``(d, observed)``)."""

    def __init__(self) -> None:
        self.n_calls = 0

    def __call__(self, messages: Sequence[ExponentialFamily]) -> Answer:
        d = messages[0]
        self.n_calls += len(d)
        with np.errstate(all="ignore"):
            m, v = truncated_moments(d.mean(), d.var())
        ok = np.isfinite(m) & np.isfinite(v) & (v > 0)
        return Answer((Gaussian(np.where(ok, m, 0.0), np.where(ok, v, 1.0)),), ok)
