"""EP against NUTS on mixtures whose component means (or log-rates) are an ordered vector.

Two-component mixtures written as PyMC users write them, with
``transform=pm.distributions.transforms.ordered`` on the means and a weight that is no
semi-analytic mixture's (``invlogit(a)``, ``invprobit(a)``, fixed weights, or a Beta weight
of Poisson components): every observation reads the same few scalars, and pmkjit gives the
likelihood one site whose law holds the means' order (``pmkjit.ep.collapsed.order_constraints``,
robustness round 41). Then a mixture with a scale per component (five scalars, kept instance
by instance) and a ``pm.NormalMixture`` with Dirichlet weights and three ordered means (the
semi-analytic mixture). ``--variants instance-by-instance`` gives no such likelihood one site
(the ablation; the code before round 41 also kept the four-scalar ones instance by instance,
but gave the Poisson ones a site without their order).

The same model object goes to ``pm.sample`` (4 chains x 1,000 tuning and 2,000 draws,
``target_accept`` 0.95: the empty-component tail of these posteriors is hard for NUTS) and
to ``pmkjit.fit`` (2 x 1,000 draws). Reported per model as in ``shared_scalars_vs_nuts.py``.

Run: ``python benchmarks/ordered_mixtures_vs_nuts.py`` (about 25 minutes with both variants;
``--variants collapsed`` about 12); ``--models invlogit_normal poisson_fixed`` for a subset.
Output: ``benchmarks/results/ordered_mixtures_vs_nuts.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_scalars_vs_nuts import run_variants  # noqa: E402

ORDERED = pm.distributions.transforms.ordered


def _two_bumps(rng, n=40):
    k = int(0.6 * n)
    return np.concatenate([rng.normal(-2.0, 1.0, k), rng.normal(2.0, 1.0, n - k)])


def _linked_normal(y, components: str = "batched", mean=lambda mu: mu, prior_sd: float = 5.0):
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        mu = pm.Normal("mu", [-1.0, 1.0], prior_sd, shape=2, transform=ORDERED, initval=[-1.0, 1.0])
        s = pm.HalfNormal("s", 2.0)
        p = pm.math.invlogit(a)
        w = pm.math.stack([p, 1.0 - p])
        m = mean(mu)
        comp = (pm.Normal.dist(m, s) if components == "batched"
                else [pm.Normal.dist(m[0], s), pm.Normal.dist(m[1], s)])
        pm.Mixture("y", w=w, comp_dists=comp, observed=y)
    return model


def invlogit_normal(rng):
    return _linked_normal(_two_bumps(rng))


def invlogit_normal_list(rng):
    return _linked_normal(_two_bumps(rng), components="list")


def invlogit_normal_shifted(rng):
    # the means as 10 + 2 z of an ordered z: the order read through an affine map
    return _linked_normal(_two_bumps(rng) + 10.0, mean=lambda z: 10.0 + 2.0 * z, prior_sd=2.0)


def _counts(rng):
    return np.concatenate([rng.poisson(2.0, 30), rng.poisson(9.0, 20)])


def poisson_fixed(rng):
    y = _counts(rng)
    with pm.Model() as model:
        lr = pm.Normal("lr", [0.5, 2.0], 2.0, shape=2, transform=ORDERED, initval=[0.5, 2.0])
        pm.Mixture("y", w=[0.6, 0.4], comp_dists=pm.Poisson.dist(pm.math.exp(lr)), observed=y)
    return model


def poisson_beta(rng):
    y = _counts(rng)
    with pm.Model() as model:
        p = pm.Beta("p", 2.0, 2.0)
        lr = pm.Normal("lr", [0.5, 2.0], 2.0, shape=2, transform=ORDERED, initval=[0.5, 2.0])
        pm.Mixture("y", w=pm.math.stack([p, 1.0 - p]), comp_dists=pm.Poisson.dist(pm.math.exp(lr)), observed=y)
    return model


def _separated(rng):
    return np.concatenate([rng.normal(-2.0, 1.0, 25), rng.normal(2.0, 0.6, 25)])


def studentt_invlogit(rng):
    y = _separated(rng)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.5)
        mu = pm.Normal("mu", [-1.0, 1.0], 5.0, shape=2, transform=ORDERED, initval=[-1.0, 1.0])
        s = pm.HalfNormal("s", 2.0)
        p = pm.math.invlogit(a)
        pm.Mixture("y", w=pm.math.stack([p, 1.0 - p]), comp_dists=pm.StudentT.dist(nu=4, mu=mu, sigma=s),
                   observed=y)
    return model


def invprobit_lognormal(rng):
    # overlapping components: mass against the order's cut, refused by the grid (warned)
    y = np.exp(_two_bumps(rng) / 2.0)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        mu = pm.Normal("mu", [-0.5, 0.5], 3.0, shape=2, transform=ORDERED, initval=[-0.5, 0.5])
        s = pm.HalfNormal("s", 1.0)
        p = pm.math.invprobit(a)
        pm.Mixture("y", w=pm.math.stack([p, 1.0 - p]), comp_dists=pm.LogNormal.dist(mu, s), observed=y)
    return model


def scale_per_component(rng):
    # five scalars with an order: kept instance by instance
    y = _separated(rng)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.5)
        mu = pm.Normal("mu", [-1.0, 1.0], 5.0, shape=2, transform=ORDERED, initval=[-1.0, 1.0])
        s = pm.HalfNormal("s", 2.0, shape=2)
        p = pm.math.invlogit(a)
        pm.Mixture("y", w=pm.math.stack([p, 1.0 - p]), comp_dists=pm.Normal.dist(mu, s), observed=y)
    return model


def dirichlet_three(rng):
    y = np.concatenate([rng.normal(-3.0, 0.7, 20), rng.normal(0.0, 0.7, 20), rng.normal(3.0, 0.7, 20)])
    with pm.Model() as model:
        w = pm.Dirichlet("w", np.ones(3))
        mu = pm.Normal("mu", [-2.0, 0.0, 2.0], 5.0, shape=3, transform=ORDERED, initval=[-2.0, 0.0, 2.0])
        s = pm.HalfNormal("s", 2.0)
        pm.NormalMixture("y", w=w, mu=mu, sigma=s, observed=y)
    return model


MODELS = {f.__name__: f for f in (invlogit_normal, invlogit_normal_list, invlogit_normal_shifted, poisson_fixed,
                                  poisson_beta, studentt_invlogit, invprobit_lognormal, scale_per_component,
                                  dirichlet_three)}


def main() -> None:
    def build(name, rng):
        model = MODELS[name](rng)
        names = [v.name for v in model.free_RVs]
        pair = names[:2] if len(names) > 1 else names * 2  # one ordered vector alone: its first entry twice
        return model, pair

    run_variants(MODELS, build, "order_constraints", "ordered_mixtures_vs_nuts.py",
                 ROOT / "benchmarks" / "results" / "ordered_mixtures_vs_nuts.json", target_accept=0.95,
                 description=__doc__.splitlines()[0], nuts=(4, 2000), ablated=lambda *args: None)


if __name__ == "__main__":
    main()
