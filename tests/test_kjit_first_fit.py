"""KJITMethod before its operator is fitted: one oracle call per distinct input, answers carried between fits."""

from types import SimpleNamespace

import numpy as np

from pmkjit.ep.methods import Answer, KJITMethod
from pmkjit.families import Gaussian, PointMass


class ConjugateOracle:
    """Exact tilted belief of a Gaussian cavity times N(y; z, 1)."""

    n_calls = 0

    def __call__(self, messages):
        cav, y = messages[0], messages[1].value
        self.n_calls += len(y)
        prec = 1.0 / cav.var() + 1.0
        return Answer((Gaussian((cav.mean() / cav.var() + y) / prec, 1.0 / prec),), np.ones(len(y), bool))

    def as_operator_oracle(self):
        return lambda messages: Answer((self(messages).beliefs[0], messages[1]), np.ones(len(messages[0]), bool))


def inputs(rng, n):
    return Gaussian(rng.normal(0.0, 2.0, n), np.exp(rng.uniform(-1.0, 1.0, n))), PointMass(rng.normal(0.0, 2.0, n))


FACTOR = SimpleNamespace(families=(Gaussian, PointMass), targets=(0,), size=1)


def test_repeated_inputs_are_asked_once_and_do_not_count_towards_the_first_fit():
    rng = np.random.default_rng(0)
    oracle = ConjugateOracle()
    method = KJITMethod(FACTOR, oracle, None, rng=np.random.default_rng(1), min_fit=20)
    one = inputs(rng, 1)
    answers = [method(one) for _ in range(30)]  # a single instance whose cavity never moves
    assert oracle.n_calls == 1 and not method.fitted  # 30 copies of one input are one input
    assert answers[0].asked.tolist() == [True] and answers[1].asked.tolist() == [False]
    for a in answers[1:]:
        np.testing.assert_array_equal(a.beliefs[0].natural, answers[0].beliefs[0].natural)
    # a batch of 10 distinct inputs, each three times: 10 questions
    ten = inputs(rng, 10)
    idx = np.tile(np.arange(10), 3)
    batch = tuple(m[idx] for m in ten)
    ans = method(batch)
    assert oracle.n_calls == 11 and ans.asked.sum() == 10 and ans.accepted.all()
    np.testing.assert_allclose(ans.beliefs[0].natural, oracle(batch).beliefs[0].natural, rtol=1e-12)


def test_pending_answers_carry_over_to_the_next_method_and_fit_it():
    rng = np.random.default_rng(2)
    oracle = ConjugateOracle()
    first = KJITMethod(FACTOR, oracle, None, rng=np.random.default_rng(3), min_fit=20)
    first(inputs(rng, 12))
    msgs, bels = first.pending_answers()
    assert len(msgs[0]) == len(bels[0]) == 12 and not first.fitted
    second = KJITMethod(FACTOR, oracle, None, rng=np.random.default_rng(4), min_fit=20, pending=(msgs, bels))
    calls = oracle.n_calls
    second(tuple(m[:5] for m in msgs))  # answered before: no question
    assert oracle.n_calls == calls and not second.fitted
    second(inputs(rng, 8))  # 12 + 8 distinct answers: fitted
    assert second.fitted and second.pending_answers() is None
    assert oracle.n_calls == calls + 8
