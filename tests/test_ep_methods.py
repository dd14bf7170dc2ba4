"""KJITMethod (the operator as EP uses it): site targets, memory and refitting, against a conjugate factor."""

from types import SimpleNamespace

import numpy as np
import pytest

from pmkjit.ep.methods import Answer, KJITMethod
from pmkjit.families import Beta, Gaussian, PointMass
from pmkjit.operators import KJITOperator
from pmkjit.operators.kjit import pack_answers


class ConjugateOracle:
    """Exact tilted belief of a Gaussian cavity times the likelihood N(y; z, s^2): a closed form."""

    def __init__(self, s2: float = 1.0):
        self.s2 = s2
        self.n_calls = 0

    def __call__(self, messages):
        cav, y = messages[0], messages[1].value
        self.n_calls += len(y)
        prec = 1.0 / cav.var() + 1.0 / self.s2
        mean = (cav.mean() / cav.var() + y / self.s2) / prec
        return Answer((Gaussian(mean, 1.0 / prec),), np.ones(len(y), bool))

    def as_operator_oracle(self):
        return lambda messages: Answer((self(messages).beliefs[0], messages[1]), np.ones(len(messages[0]), bool))


def cavities(rng, n, log_var):
    return Gaussian(rng.normal(0.0, 2.0, n), np.exp(rng.uniform(*log_var, n))), PointMass(rng.normal(0.0, 2.0, n))


def site_precision(belief, cavity):
    return 1.0 / belief.var() - 1.0 / cavity.var()


@pytest.mark.parametrize("form", ["relative", "site", "absolute"])
def test_target_forms_round_trip(form):
    rng = np.random.default_rng(0)
    msgs = (Gaussian(rng.normal(size=50), np.exp(rng.uniform(-6, 4, 50))), Beta(np.full(50, 2.0), np.full(50, 3.0)))
    belief = Gaussian(msgs[0].mean() + 0.1 * rng.normal(size=50), msgs[0].var() * rng.uniform(0.2, 1.0, 50))
    op = KJITOperator((Gaussian, Beta), targets=(0,), target_form=form)
    (back,) = op._decode(op._encode((belief,), msgs), msgs)
    np.testing.assert_allclose(back.natural, belief.natural, rtol=1e-9)


def test_target_form_is_checked():
    with pytest.raises(ValueError, match="target_form"):
        KJITOperator((Gaussian, Beta), target_form="natural")


def test_feature_map_follows_the_factor_size():
    from pmkjit.operators.kjit import default_feature_sizes

    for size in (600, 40_000):
        factor = SimpleNamespace(families=(Gaussian, PointMass), targets=(0,), size=size)
        op = KJITMethod(factor, ConjugateOracle(), None, rng=np.random.default_rng(0)).operator
        sizes = default_feature_sizes((Gaussian, PointMass), size)
        assert (op.features.n_inner, op.features.n_outer) == sizes
    assert sizes == (150, 300)  # 40,000 instances: 1000 * sqrt(1000 / 40000) = 158 -> floor 300 for p = 3


def test_site_targets_keep_narrow_cavities_accurate_and_stale_operator_is_refitted():
    """First minibatch from wide cavities, then narrow ones (EP on a large data set).

    The noise variance re-estimated online jumps, the method refits on its memory, and
    the predicted sites (precision exactly 1 here) are then accurate to 2% on narrow
    cavities, with no further oracle calls for inputs like those it has learned.
    """
    rng = np.random.default_rng(1)
    factor = SimpleNamespace(families=(Gaussian, PointMass), targets=(0,), size=600)
    oracle = ConjugateOracle()
    method = KJITMethod(factor, oracle, None, rng=np.random.default_rng(2), memory=1500)
    assert method.operator.target_form == "site"
    method(cavities(rng, 600, (1.0, 3.0)))  # wide: fitted on these
    assert method.fitted and method.n_refits == 0
    for _ in range(3):
        method(cavities(rng, 600, (-5.0, -3.0)))  # narrow: new ground
    assert method.n_refits >= 1
    assert method.operator.memory_.shape[0] == min(oracle.n_calls, 1500)  # every answer, bounded
    calls = oracle.n_calls
    test = cavities(rng, 400, (-5.0, -3.0))
    answer = method(test)
    assert oracle.n_calls - calls < 40
    np.testing.assert_allclose(site_precision(answer.beliefs[0], test[0]), 1.0, rtol=0.02)


def test_reservoir_keeps_a_uniform_sample_and_survives_save_load(tmp_path):
    op = KJITOperator((Gaussian, PointMass), targets=(0,), memory=200, random_state=0)
    rng = np.random.default_rng(3)
    op.fit(*_pairs(rng, 50))
    for k in range(20):
        values = np.arange(100 * k, 100 * (k + 1), dtype=float)
        op._remember(pack_answers((Gaussian(values, 1.0), PointMass(values)), (Gaussian(values, 1.0),)))
    kept = op._unpack(op.memory_)[0][1].value
    assert kept.size == 200 and np.unique(kept).size == 200
    # a uniform sample of the 50 + 2000 answers offered: each tenth of 0..1999 holds ~19.5 (sd ~4)
    counts = np.bincount((kept[kept >= 0] // 200).astype(int), minlength=10)
    assert counts.min() >= 6 and counts.max() <= 36
    messages, beliefs = op._unpack(op.memory_)
    synthetic = messages[1].value == np.round(messages[1].value)
    assert synthetic.sum() > 150
    np.testing.assert_array_equal(messages[0].mean()[synthetic], beliefs[0].mean()[synthetic])  # pairs aligned
    loaded = KJITOperator.load(op.save(tmp_path / "op.npz"))
    np.testing.assert_array_equal(loaded.memory_, op.memory_)
    more = pack_answers((Gaussian(np.arange(50.0), 1.0), PointMass(np.arange(50.0))), (Gaussian(np.arange(50.0), 1.0),))
    op._remember(more)
    loaded._remember(more)  # the reloaded reservoir continues the same stream
    np.testing.assert_array_equal(loaded.memory_, op.memory_)


def _pairs(rng, n):
    cav, y = cavities(rng, n, (1.0, 3.0))
    return (cav, y), ConjugateOracle()((cav, y)).beliefs


def test_loaded_operator_refits_on_its_memory(tmp_path):
    """A stored operator keeps its memory: after loading, narrow cavities trigger a refit."""
    rng = np.random.default_rng(4)
    op = KJITOperator((Gaussian, PointMass), targets=(0,), target_form="site", memory=1000, random_state=1)
    op.fit(*_pairs(rng, 400))
    loaded = KJITOperator.load(op.save(tmp_path / "op.npz"))
    assert loaded.n_refits == 0
    oracle = ConjugateOracle().as_operator_oracle()
    for _ in range(3):
        loaded(cavities(rng, 400, (-5.0, -3.0)), oracle)
    assert loaded.n_refits >= 1
    test = cavities(rng, 300, (-5.0, -3.0))
    result = loaded(test, oracle)
    assert result.uncertain.mean() < 0.15
    np.testing.assert_allclose(site_precision(result.beliefs[0], test[0]), 1.0, rtol=0.02)


def test_quadrature_oracle_integrates_each_distinct_input_once():
    import pymc as pm

    from pmkjit.ep.methods import FactorOracle
    from pmkjit.graph import build_factor_graph

    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=w * x, observed=np.array([0, 1, 1, 0, 1, 1]))
    (f,) = build_factor_graph(model).factors
    rng = np.random.default_rng(3)
    cav = Gaussian(rng.normal(size=4), np.exp(rng.normal(size=4)))
    y = np.array([0.0, 1.0, 1.0, 0.0])
    obs = Beta(1.0 + y, 2.0 - y)  # the Bernoulli's conjugate message to p = sigmoid(w x)
    idx = np.array([0, 1, 0, 2, 3, 1, 1, 0])  # repeated tuples
    msgs = (cav[idx], obs[idx])
    oracle = FactorOracle(f, "quadrature", rng=np.random.default_rng(0))
    calls = []
    answer_distinct = oracle._answer
    oracle._answer = lambda m: calls.append(len(m[0])) or answer_distinct(m)
    got = oracle(msgs)
    assert calls == [4] and oracle.n_calls == 8  # four integrals; eight messages answered
    expect = answer_distinct((cav, obs))
    np.testing.assert_array_equal(got.beliefs[0].natural, expect.beliefs[0].natural[idx])
    np.testing.assert_array_equal(got.accepted, expect.accepted[idx])


def test_quadrature_takes_many_distinct_per_instance_data_as_covariates():
    # StudentT(5, a + b x, s (x + 0.5)): 100 distinct data values. Quadrature used to integrate
    # one group of equal data at a time and refused more than 64 groups (the factor then
    # fell back to importance sampling); the data now ride along as per-entry covariates.
    # (A Normal of that scale is semi-analytic since robustness round 18: y / (x + 0.5).)
    import pymc as pm

    from pmkjit.ep.methods import FactorOracle, quadrature_possible
    from pmkjit.families import Gamma
    from pmkjit.graph import build_factor_graph
    from pmkjit.operators import QuadratureOracle

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 2, 100)
    y = 1 + 0.5 * x + 0.7 * (x + 0.5) * rng.normal(size=100)
    with pm.Model() as model:
        a, b, s = pm.Normal("a", 0, 5), pm.Normal("b", 0, 5), pm.HalfNormal("s", 2)
        pm.StudentT("y", nu=5, mu=a + b * x, sigma=s * (x + 0.5), observed=y)
    (f,) = [f for f in build_factor_graph(model).factors if f.kind == "likelihood"]
    assert quadrature_possible(f)
    (data,) = [slot.values for slot in f.inputs if not hasattr(slot, "family")]
    B = 100
    msgs = (Gaussian(1 + 0.5 * x + 0.1 * rng.normal(size=B), np.full(B, 0.05)),
            Gamma(np.full(B, 30.0), np.full(B, 40.0)), PointMass(data), PointMass(y))
    got = FactorOracle(f, "quadrature", rng=np.random.default_rng(0))(msgs)
    assert got.accepted.all()
    # reference: each entry on its own, its datum a constant of the density
    for i in (0, 17, 99):
        def density(obs, ins, _d=data[i]):
            return f.logp(obs, (ins[0], ins[1], np.full(np.shape(obs), _d)))

        ref = QuadratureOracle(density, (Gaussian, Gamma), kind="density", observed=y[i:i + 1])(
            (msgs[0][i:i + 1], msgs[1][i:i + 1]))
        for k in range(2):
            np.testing.assert_allclose(got.beliefs[k].natural[i], ref.beliefs[k].natural[0], rtol=1e-12)


def test_quadrature_of_a_transform_with_per_instance_data_matches_the_offset_form():
    # exposure * exp(eta) and exp(eta + log(exposure)) are one model; the first is a
    # deterministic factor with a data input (80 distinct exposures), which quadrature
    # used to refuse beyond 64 distinct values (KJIT then sat behind importance sampling)
    import pymc as pm

    import pmkjit

    rng = np.random.default_rng(5)
    x, expo = rng.normal(size=80), rng.uniform(0.5, 3.0, 80)
    y = rng.poisson(expo * np.exp(0.3 + 0.5 * x))
    means = []
    for offset in (False, True):
        with pm.Model() as model:
            a, b = pm.Normal("a", 0, 2), pm.Normal("b", 0, 2)
            rate = pm.math.exp(a + b * x + np.log(expo)) if offset else expo * pm.math.exp(a + b * x)
            pm.Poisson("y", rate, observed=y)
        idata = pmkjit.fit(model=model, method="quadrature", random_seed=0, progressbar=False, draws=10,
                           compute_log_likelihood=False)
        mu = idata.ep["gaussian_mean"].values
        sd = np.sqrt(np.diag(idata.ep["gaussian_cov"].values))
        means.append((mu, sd))
    np.testing.assert_allclose(means[0][0], means[1][0], atol=1e-3 * means[1][1].min())
    np.testing.assert_allclose(means[0][1], means[1][1], rtol=1e-3)


class CheckingOracle(ConjugateOracle):
    """Counts separately the entries asked directly (the spot checks) and through the operator."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.direct = 0

    def __call__(self, messages, direct=True):
        self.direct += len(messages[0]) if direct else 0
        return super().__call__(messages)

    def as_operator_oracle(self):
        return lambda messages: Answer((self(messages, direct=False).beliefs[0], messages[1]),
                                       np.ones(len(messages[0]), bool))


@pytest.mark.parametrize("kind", ["importance", "quadrature"])
def test_spot_checks_behind_importance_sampling_only_where_messages_leave_the_remembered_scales(kind):
    """A fitted operator's trusted predictions are checked by the oracle on 16 fixed entries
    every sweep behind a cheap oracle (quadrature), but behind importance sampling only for
    messages more than twice as wide or narrow (in sd) as any the operator has answers for:
    within that range a check every sweep is the oracle calls the operator exists to save."""
    rng = np.random.default_rng(3)
    factor = SimpleNamespace(families=(Gaussian, PointMass), targets=(0,), size=300)
    oracle = CheckingOracle(kind)
    method = KJITMethod(factor, oracle, None, rng=np.random.default_rng(4))
    method(cavities(rng, 300, (0.0, 2.0)))  # the first fit (direct: its first minibatch)
    method(cavities(rng, 300, (0.0, 2.0)))
    inside = cavities(rng, 300, (0.2, 1.8))
    assert not method._beyond_memory_scales(inside).any()  # log sds within the memory's [0, 1]
    before = oracle.direct
    answer = method(inside)
    assert np.sum(answer.accepted & ~answer.asked) > 200  # mostly trusted predictions
    assert oracle.direct - before == (0 if kind == "importance" else 16)
    # sds of e^-3 against remembered ones of at least e^0, or e^1.75 against at most e^1
    # (twice is e^1.69): beyond the range, so checked behind importance sampling too. (An
    # operator that trusts itself everywhere, as one fitted on vague-prior cavities did:
    # where it asks about some of a batch, their scales join its memory's range.)
    method.operator.tolerance = 1e6
    for log_var in ((-6.0, -5.0), (3.5, 4.0)):
        far = cavities(rng, 300, log_var)
        assert method._beyond_memory_scales(far).all()
        before = oracle.direct
        answer = method(far)
        assert int(answer.asked.sum()) == 16 and oracle.direct - before == 16


def test_behind_importance_sampling_a_distrusted_operator_is_checked_again_until_a_check_passes():
    """Once a spot check has found the operator wrong (and the oracle answered the batch), the
    next batch is checked whatever its scales: those answers widen the remembered range, and
    the operator that was wrong there may still be. A logistic regression with Normal(0, 100)
    priors behind importance sampling (N = 60) ended 0.27 and 0.81 exact sds off without this,
    0.03 and 0.21 with it. Checks stop at the first one that passes."""
    rng = np.random.default_rng(3)
    factor = SimpleNamespace(families=(Gaussian, PointMass), targets=(0,), size=300)
    oracle = CheckingOracle("importance")
    method = KJITMethod(factor, oracle, None, rng=np.random.default_rng(4))
    method(cavities(rng, 300, (0.0, 2.0)))
    method(cavities(rng, 300, (0.0, 2.0)))
    method.operator.tolerance = 1e6  # trusts every prediction: only the checks ask the oracle
    method.distrust = -1.0  # every check finds it wrong
    far = cavities(rng, 300, (-6.0, -5.0))
    before = oracle.direct
    answer = method(far)
    assert method.n_distrusted == 1 and answer.asked.all() and oracle.direct - before == 300
    inside = cavities(rng, 300, (0.2, 1.8))
    assert not method._beyond_memory_scales(inside).any()
    method.distrust = 4.0  # now the check passes
    before = oracle.direct
    method(inside)
    assert oracle.direct - before == 16 and method.n_distrusted == 1
    before = oracle.direct
    method(inside)  # passed last time, inside the range: not checked
    assert oracle.direct == before
