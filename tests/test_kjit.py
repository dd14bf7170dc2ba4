"""KJITOperator: accuracy against quadrature, uncertainty, oracle use and file I/O."""

import numpy as np
import pytest
from scipy import special

from pmkjit.errors import OperatorFileError
from pmkjit.families import Beta, Gamma, Gaussian
from pmkjit.features import GaussianJointEmbeddingFeatures
from pmkjit.operators import KJITOperator, QuadratureOracle
from pmkjit.operators.kjit import FILE_VERSION, calibrated_thresholds


class CountingOracle:
    """Quadrature oracle that records how many message tuples it answered."""

    def __init__(self):
        self.inner = QuadratureOracle(special.expit, (Gaussian, Beta), unconstrained_function=lambda z: z)
        self.calls = 0

    def __call__(self, messages):
        self.calls += len(messages[0])
        return self.inner(messages)


def incoming(rng, n, centre=0.0, spread=2.0):
    y = rng.integers(0, 2, n).astype(float)
    return (Gaussian(rng.normal(centre, spread, n), np.exp(rng.uniform(-2, 2, n))), Beta(1 + y, 2 - y))


def small_operator(seed=0, **kw):
    return KJITOperator((Gaussian, Beta), targets=(0,), features=GaussianJointEmbeddingFeatures(100, 300),
                        search={"inner_scale": (0.5, 1.0), "outer_scale": (1.0, 2.0)}, random_state=seed, **kw)


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    oracle = CountingOracle()
    op = small_operator()
    train = incoming(rng, 600)
    op(train, oracle)
    return op, oracle


def test_first_call_fits_and_predictions_are_accurate(fitted):
    op, oracle = fitted
    assert oracle.calls == 600 and op.n_oracle_calls == 600
    assert np.all(op.thresholds_ > 0) and op.thresholds_.shape == (2,)
    assert op.hyperparameters_["inner_scale"] in (0.5, 1.0)
    rng = np.random.default_rng(1)
    test = incoming(rng, 300)
    (pred,), var = op.predict(test)
    truth = oracle.inner(test).beliefs[0]
    log_kl = np.log(truth.kl(pred))
    assert np.median(log_kl) < -5  # predicted beliefs are close to quadrature's
    # a trivial predictor (the incoming message itself) is far worse
    assert np.median(np.log(truth.kl(test[0]))) > np.median(log_kl) + 3


def test_default_feature_map_shrinks_only_for_factors_with_many_instances():
    from pmkjit.families import PointMass
    from pmkjit.operators.kjit import default_feature_sizes

    full = (500, 1000)
    assert default_feature_sizes((Gaussian, Beta)) == full  # stand-alone operator
    assert default_feature_sizes((Gaussian, Beta), 1000) == full
    # above 1,000 instances: n_outer ~ 1/sqrt(n), so n * n_outer^2 stays at the full map's cost
    inner, outer = default_feature_sizes((Gaussian, Beta), 4000)
    assert (inner, outer) == (250, 500)
    # ... floored at 100 outer features per message parameter (a point mass has one)
    assert default_feature_sizes((Gaussian, Beta), 10**6) == (200, 400)
    assert default_feature_sizes((Gaussian, PointMass), 10**6) == (150, 300)
    rng = np.random.default_rng(3)
    op = KJITOperator((Gaussian, Beta), targets=(0,), search={}, random_state=0)
    op(incoming(rng, 200), CountingOracle())
    assert (op.features_.n_inner, op.features_.n_outer) == full


def test_uncertainty_grows_away_from_training_messages(fitted):
    op, _ = fitted
    rng = np.random.default_rng(2)
    near = incoming(rng, 200)
    far = incoming(rng, 200, centre=25.0, spread=1.0)
    _, v_near = op.predict(near)
    _, v_far = op.predict(far)
    assert np.median(v_far[:, 0]) > 10 * np.median(v_near[:, 0])
    assert np.mean(np.any(v_far > op.thresholds_, axis=1)) > 0.9
    assert np.mean(np.any(v_near > op.thresholds_, axis=1)) < 0.35


def test_call_asks_oracle_only_when_unsure_and_learns():
    rng = np.random.default_rng(3)
    oracle = CountingOracle()
    op = small_operator(seed=1)
    op(incoming(rng, 600), oracle)
    oracle.calls = 0
    res = op(incoming(rng, 400), oracle)
    assert oracle.calls == res.uncertain.sum() < 0.4 * 400
    far = incoming(rng, 300, centre=15.0, spread=1.0)
    thresholds = op.current_thresholds()
    res_far = op(far, oracle)
    flagged = np.any(res_far.variance > thresholds, axis=1)
    assert flagged.mean() > 0.8
    # asked in rounds, most uncertain first: the answers teach the operator about the rest
    assert 0.1 * flagged.sum() < res_far.uncertain.sum() < flagged.sum()
    assert not np.any(res_far.uncertain & ~flagged)
    # answers for uncertain inputs are the oracle's, exactly
    truth = oracle.inner(far).beliefs[0]
    idx = np.flatnonzero(res_far.uncertain)
    np.testing.assert_allclose(res_far.beliefs[0].natural[idx], truth.natural[idx])
    # after learning, the region's variance collapses and fewer and fewer inputs need the oracle
    again = op(incoming(rng, 300, centre=15.0, spread=1.0), oracle)
    third = op(incoming(rng, 300, centre=15.0, spread=1.0), oracle)
    assert np.median(again.variance[:, 0]) < 1e-3 * np.median(res_far.variance[:, 0])
    assert third.uncertain.mean() < again.uncertain.mean() < res_far.uncertain.mean()


def test_noise_floor_trusts_only_predictions_as_accurate_as_an_oracle_answer():
    rng = np.random.default_rng(11)
    train, test = incoming(rng, 600), incoming(rng, 400)
    ops = {}
    for floor in (0.0, 1.0):
        ops[floor] = small_operator(seed=3, noise_floor=floor)
        ops[floor](train, CountingOracle())
    paper, floored = ops[0.0], ops[1.0]
    np.testing.assert_array_equal(paper.current_thresholds(), paper.thresholds_)
    assert np.all(floored.current_thresholds() >= floored.regression_.noise_var_)
    oracle = CountingOracle()
    truth = oracle.inner(test).beliefs[0]
    Y = floored._encode((truth,), test)
    (pred,), var = floored.predict(test)
    err2 = (floored._encode((pred,), test) - Y) ** 2
    trusted = ~np.any(var > floored.current_thresholds(), axis=1)
    assert trusted.mean() > 0.5
    # trusted predictions err about as much as the answers scatter about the fit
    assert np.all(err2[trusted].mean(axis=0) < 3 * floored.regression_.noise_var_)
    res = floored(test, oracle)
    assert oracle.calls == res.uncertain.sum() <= (~trusted).sum()
    assert not np.any(res.uncertain & trusted)
    with pytest.raises(ValueError, match="noise_floor"):
        small_operator(noise_floor=-1.0)


class NoisyOracle(CountingOracle):
    """Quadrature answers with a random error in the mean, as an importance sampler's."""

    def __init__(self, rng, rel_sd=0.05):
        super().__init__()
        self.rng, self.rel_sd = rng, rel_sd

    def __call__(self, messages):
        out = super().__call__(messages)
        q = out.beliefs[0]
        noisy = Gaussian(q.mean() + self.rel_sd * np.sqrt(q.var()) * self.rng.standard_normal(len(q)), q.var())
        return out._replace(beliefs=(noisy, *out.beliefs[1:]))


def test_noise_floor_skips_queries_an_oracle_cannot_improve():
    rng = np.random.default_rng(12)
    train, stream = incoming(rng, 600), [incoming(rng, 300) for _ in range(3)]
    calls = {}
    for floor in (0.0, 1.0):
        op, oracle = small_operator(seed=4, noise_floor=floor), NoisyOracle(np.random.default_rng(0))
        op(train, oracle)
        oracle.calls = 0
        for batch in stream:
            op(batch, oracle)
        calls[floor] = oracle.calls
    # the paper's rule keeps asking about ordinary inputs at a fixed quantile rate
    assert calls[0.0] > 0.05 * 900
    assert calls[1.0] < 0.6 * calls[0.0]


def test_calibrated_thresholds_ignore_held_out_predictions_that_were_not_accurate():
    var = np.array([[1e-6], [2e-6], [3e-6], [0.05]])
    err2 = np.array([[1e-6], [4e-6], [1e-6], [0.01]])  # the last: 1e4 noise variances off
    t = calibrated_thresholds(var, err2, np.array([1e-6]), 1.0)
    assert t[0] == 3e-6  # the largest variance among the accurate ones, not 0.05
    assert calibrated_thresholds(var, np.full_like(err2, 1.0), np.array([1e-6]), 0.9)[0] == 0.0


def test_a_far_out_message_in_the_first_minibatch_does_not_blind_the_operator():
    # A first minibatch from a heavy-tailed stream: a fifth of its messages lie far from
    # the rest. Held out, such a message has a large variance and a large error; when it
    # set the 90% quantile, the operator trusted every later prediction below that
    # variance (here: most messages just beyond the bulk, with KL errors up to 0.6).
    rng = np.random.default_rng(3)
    bulk, far = incoming(rng, 40, spread=1.0), incoming(rng, 10, centre=30.0, spread=3.0)
    first = tuple(type(a).concatenate([a, b]) for a, b in zip(bulk, far))
    oracle = CountingOracle()
    op = small_operator(seed=4)
    op(first, oracle)
    for centre in (3.0, 5.0):
        shoulder = incoming(np.random.default_rng(7), 200, centre=centre, spread=1.0)
        (pred,), var = op.predict(shoulder)
        trusted = ~np.any(var > op.current_thresholds(), axis=1)
        kl = oracle.inner(shoulder).beliefs[0].kl(pred)
        assert np.all(kl[trusted] < 1e-3), (centre, kl[trusted].max())


def test_query_fraction_one_asks_about_every_uncertain_input_at_once():
    rng = np.random.default_rng(13)
    op = small_operator(seed=1, query_fraction=1.0)
    op(incoming(rng, 600), CountingOracle())
    oracle = CountingOracle()
    thresholds = op.current_thresholds()
    res = op(incoming(rng, 300, centre=15.0, spread=1.0), oracle)
    np.testing.assert_array_equal(res.uncertain, np.any(res.variance > thresholds, axis=1))
    assert oracle.calls == res.uncertain.sum()
    with pytest.raises(ValueError, match="query_fraction"):
        small_operator(query_fraction=0.0)


def test_seed_reproducibility():
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    a, b = small_operator(seed=7), small_operator(seed=7)
    a(incoming(rng1, 200), CountingOracle())
    b(incoming(rng2, 200), CountingOracle())
    msgs = incoming(np.random.default_rng(6), 50)
    np.testing.assert_array_equal(a.predict(msgs)[1], b.predict(msgs)[1])


def test_save_load_roundtrip(fitted, tmp_path):
    op, _ = fitted
    path = op.save(tmp_path / "logistic.npz")
    loaded = KJITOperator.load(path, families=(Gaussian, Beta))
    msgs = incoming(np.random.default_rng(8), 100)
    (p1,), v1 = op.predict(msgs)
    (p2,), v2 = loaded.predict(msgs)
    np.testing.assert_allclose(p2.natural, p1.natural, rtol=1e-8)  # roundoff: BLAS threads differ
    np.testing.assert_allclose(v2, v1, rtol=1e-8)
    np.testing.assert_array_equal(loaded.thresholds_, op.thresholds_)
    assert loaded.noise_floor == op.noise_floor
    with open(path, "rb") as fh:  # the file loads without pickle
        np.load(fh, allow_pickle=False).files


def test_corrupt_and_mismatched_files(fitted, tmp_path):
    op, _ = fitted
    path = op.save(tmp_path / "op.npz")
    with pytest.raises(OperatorFileError, match="Gamma"):
        KJITOperator.load(path, families=(Gamma, Beta))
    broken = tmp_path / "broken.npz"
    broken.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(OperatorFileError, match="broken.npz"):
        KJITOperator.load(broken)
    with pytest.raises(OperatorFileError, match="does not exist"):
        KJITOperator.load(tmp_path / "missing.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["meta/version"] = np.asarray(99)
    other = tmp_path / "future.npz"
    np.savez(other, **arrays)
    with pytest.raises(OperatorFileError, match="version 99"):
        KJITOperator.load(other)
    arrays["meta/version"] = np.asarray(FILE_VERSION)
    good_memory = arrays["memory"]
    arrays["memory"] = good_memory[:, :3]  # answers of another factor's width
    np.savez(other, **arrays)
    with pytest.raises(OperatorFileError, match="memory"):
        KJITOperator.load(other)
    arrays["memory"] = good_memory
    del arrays["thresholds"]
    np.savez(other, **arrays)
    with pytest.raises(OperatorFileError, match="thresholds"):
        KJITOperator.load(other)


def test_input_validation(fitted):
    op, _ = fitted
    msgs = incoming(np.random.default_rng(9), 10)
    with pytest.raises(ValueError, match="2 variables"):
        op.predict(msgs[:1])
    with pytest.raises(TypeError, match="should be Beta"):
        op.predict((msgs[0], msgs[0]))
    with pytest.raises(ValueError, match="target 3"):
        KJITOperator((Gaussian, Beta), targets=(3,))


def _compound_gamma_logp(tau, inputs):
    (r,) = inputs
    return np.log(r) - r * tau  # Gamma(tau; shape 1, rate r)


def _compound_gamma_stream(rng, n):
    """The factor's incoming messages in the compound-gamma stream: r's prior, tau's likelihood."""
    log_tau = rng.logistic(0.0, 1.0, n)  # tau ~ Gamma(1, rate r), r ~ Gamma(1, 1): log tau is logistic
    N = rng.integers(10, 101, n)
    sum_x2 = rng.chisquare(N) * np.exp(-log_tau)
    return (Gamma(np.ones(n), np.ones(n)), Gamma(1 + N / 2, sum_x2 / 2))


# (slow: 20-30 s; CI on a clean clone took 20.6 min with it, over its 20-minute budget)
@pytest.mark.slow
def test_log_space_gamma_embedding_predicts_a_heavy_tailed_stream_accurately():
    # Same answers, same regression: only the embedding of the Gamma messages differs. In x,
    # messages of the heavy upper tail of tau look alike and are predicted badly; in log x
    # they are shifts of the bulk's.
    oracle = QuadratureOracle(_compound_gamma_logp, (Gamma, Gamma), kind="density")
    rng = np.random.default_rng(0)
    train, test = _compound_gamma_stream(rng, 200), _compound_gamma_stream(rng, 300)
    answers, truth = oracle(train).beliefs, oracle(test).beliefs
    result = {}
    for space in ("log", "linear"):
        op = KJITOperator((Gamma, Gamma), features=GaussianJointEmbeddingFeatures(200, 400, gamma_space=space),
                          random_state=1).fit(train, answers)
        pred, var = op.predict(test)
        kl = truth[0].kl(pred[0]) + truth[1].kl(pred[1])
        trusted = np.all(var <= op.current_thresholds(), axis=1)
        result[space] = (np.median(kl), kl[trusted].max(), trusted.mean())
    (med_log, worst_log, share_log), (med_lin, worst_lin, share_lin) = result["log"], result["linear"]
    assert med_log < 0.01 * med_lin  # measured: 3.8e-8 against 1.8e-5
    assert worst_log < 1e-4 < worst_lin  # the predictions each operator trusts: 4e-6 against 1e-3
    assert share_log >= share_lin - 0.05  # and it trusts no fewer of them (0.84 against 0.80)
