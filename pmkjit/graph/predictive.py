"""Latent variables that no factor reads: drawn from their predictive, not fitted by EP.

A free variable whose value no other variable's distribution reads carries no information
about the rest of the model: its prior is a normalised density of it, so its factor
integrates to one over it and sends EP nothing. Two common cases are

* the missing entries of an observed variable, which PyMC imputes as a latent
  ``y_unobserved`` with the likelihood's distribution (``observed=`` with NaN);
* a group level without data, or a new group's effect added for prediction
  (``u_new = pm.Normal("u_new", mu, tau)``).

EP cannot fit such a variable through its factor: the cavity of its only site is flat,
and the tilted law of a Gamma or a black-box output under a flat cavity is exactly the
predictive that the factor's own forward sampler draws. :func:`predictive_only` finds them
(repeatedly, so a chain of such variables goes too), :func:`pmkjit.graph.build_factor_graph`
leaves them out of the factor graph, and :func:`pmkjit.fit` draws them after EP by forward
sampling from the model given each posterior draw of the other latents
(``pm.sample_posterior_predictive``), as NUTS's joint draws would have them, heavy tails,
discreteness and all.

This assumes that each latent's distribution is normalised for every value of its
parents, as PyMC's distributions are. A ``pm.CustomDist`` whose ``logp=`` leaves out a
normalising term that depends on its parents does tell NUTS about them; here it would not.
"""

from __future__ import annotations

import pymc as pm
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import ancestors

__all__ = ["predictive_only"]


def predictive_only(model: pm.Model) -> list[Variable]:
    """Free variables of ``model`` that no other variable or potential reads, in model order.

    Parameters
    ----------
    model : pymc.Model
        With observed variables read as their data (:func:`pmkjit.graph.observed.observed_as_data`):
        an observed variable's reader is not one of its parents.

    Returns
    -------
    list of TensorVariable
        The free variables whose posterior is their predictive given the others. A
        variable read only by such variables is one too. Deterministics are not readers:
        they are computed from the draws.
    """
    free = list(model.free_RVs)
    free_set = set(free)
    rvs = list(model.basic_RVs)
    # direct parents only: stop at other random variables, so that v ~ N(w, 1) with
    # w ~ N(z, 1) reads w, not z
    parents = {
        rv: {a for a in ancestors(list(rv.owner.inputs), blockers=rvs) if a in free_set and a is not rv}
        for rv in rvs
    }
    potential_reads = set(ancestors(list(model.potentials), blockers=rvs)) if model.potentials else set()
    unread: set[Variable] = set()
    changed = True
    while changed:
        changed = False
        for rv in free:
            if rv in unread or rv in potential_reads:
                continue
            if not any(rv in parents[other] for other in rvs if other not in unread):
                unread.add(rv)
                changed = True
    return [rv for rv in free if rv in unread]
