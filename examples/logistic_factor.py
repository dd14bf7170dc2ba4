"""A KJIT operator learns the logistic factor just in time.

The factor p = sigmoid(z) receives a Gaussian message on z and a Beta message on p.
Batches of incoming messages stream in (drifting, as in EP); the operator answers
from its regression when it is confident and asks the importance-sampling oracle
otherwise. Its answers are checked against quadrature.

Run: ``python examples/logistic_factor.py``
"""

from __future__ import annotations

import numpy as np
from scipy import special

from pmkjit.families import Beta, Gaussian
from pmkjit.features import GaussianJointEmbeddingFeatures
from pmkjit.operators import ImportanceSamplingOracle, KJITOperator, QuadratureOracle


def incoming(rng: np.random.Generator, n: int, drift: float):
    """Random cavity messages on z and Bernoulli-observation messages on p."""
    mean = rng.normal(drift, 3.0, n)
    var = np.exp(rng.uniform(-2.0, 4.0, n))
    y = rng.integers(0, 2, n).astype(float)
    return Gaussian(mean, var), Beta(1.0 + y, 2.0 - y)


def main(seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    oracle = ImportanceSamplingOracle(
        lambda inputs, rng: special.expit(inputs[0]), (Gaussian, Beta), n_samples=20_000, random_state=seed
    )
    reference = QuadratureOracle(special.expit, (Gaussian, Beta), unconstrained_function=lambda z: z)
    operator = KJITOperator(
        (Gaussian, Beta), targets=(0,), features=GaussianJointEmbeddingFeatures(300, 500), random_state=seed
    )
    print(f"{'batch':>5} {'drift':>6} {'oracle calls':>13} {'median log KL':>14}")
    for batch in range(12):
        drift = 0.0 if batch < 6 else 4.0  # the inputs move halfway through
        messages = incoming(rng, 500, drift)
        before = operator.n_oracle_calls
        result = operator(messages, oracle)
        truth = reference(messages).beliefs[0]
        ok = result.accepted
        log_kl = np.log(truth[ok].kl(result.beliefs[0][ok]))
        print(f"{batch:5d} {drift:6.1f} {operator.n_oracle_calls - before:13d} {np.median(log_kl):14.2f}")
    print(operator)


if __name__ == "__main__":
    main()
