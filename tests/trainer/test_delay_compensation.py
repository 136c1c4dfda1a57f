"""The parameter servers' update rules (tfpart.trainer.delay_compensation) on hand-computed
tensors, in numpy and in TensorFlow."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tfpart.trainer.delay_compensation import ASYNC_MODES, Hyper, freshness, update

W = np.array([1.0, -2.0, 0.5])
W_BAK = np.array([0.5, -1.0, 0.5])
G = np.array([2.0, 1.0, -4.0])
MS = np.array([1.0, 4.0, 0.0])
V = np.array([0.1, 0.0, -0.2])
HYPER = Hyper(learning_rate=0.1, momentum=0.5, lambda0=2.0, ms_decay=0.75, epsilon=0.0)


def by_hand(mode, tau, mean_freshness, step):
    """The rules written out element by element, as the module doc states them."""
    out_w, out_ms, out_v = [], [], []
    unbias = 1 - 0.75 ** step
    mean = 0.75 * mean_freshness + 0.25 / (1 + tau)
    r = (1 / (1 + tau)) / (mean / unbias) if mode == "ddc-asgd" else 1.0
    for w, w_bak, g, ms, v in zip(W, W_BAK, G, MS, V):
        if mode == "async":
            corrected, ms_new = g, ms
        else:
            ms_new = 0.75 * ms + 0.25 * g * g
            lam = 2.0 / (ms_new / unbias) ** 0.5
            corrected = g + lam * r * g * g * (w - w_bak)
        v_new = 0.5 * v + r * corrected
        out_w.append(w - 0.1 * v_new)
        out_ms.append(ms_new)
        out_v.append(v_new)
    return np.array(out_w), np.array(out_ms), np.array(out_v), \
        (mean if mode == "ddc-asgd" else mean_freshness)


@pytest.mark.parametrize("mode", ASYNC_MODES)
def test_update_equals_the_formula_in_numpy_and_tensorflow(mode):
    """In numpy, in TensorFlow, and compiled by XLA as the parameter servers run it;
    compiled, an update beyond the run's total changes nothing."""
    import tensorflow as tf

    from tfpart.trainer.asynchronous import fused_update

    expected = by_hand(mode, 3, 1.0, step=4)
    got = update(mode, W, G, W_BAK, MS, V, 3, 1.0, HYPER, np.sqrt, 4)
    arguments = [*(tf.constant(a) for a in (W, G, W_BAK, MS, V)),
                 *(tf.constant(x, tf.float64) for x in (3.0, 1.0, 4.0))]
    tensors = update(mode, *arguments[:7], HYPER, tf.sqrt, arguments[7])
    fused = fused_update(mode, HYPER)(*arguments, True)
    skipped = fused_update(mode, HYPER)(*arguments, False)  # an update beyond the total
    for value, tensor, compiled, unchanged, before, want in zip(
            got, tensors, fused, skipped, (W, MS, V, 1.0), expected):
        np.testing.assert_allclose(value, want, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(tensor), want, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(compiled), want, rtol=1e-12)
        np.testing.assert_array_equal(np.asarray(unchanged), before)


def test_the_modes_differ_where_the_weights_moved():
    """Sanity of the hand values: compensation changes the step only where w != w_bak,
    and DDC-ASGD's stale update (tau 3 > mean) counts less than DC-ASGD's."""
    asgd, dc, ddc = (update(m, W, G, W_BAK, MS, V, 3, 1.0, HYPER, np.sqrt, 4).w
                     for m in ASYNC_MODES)
    assert asgd[2] == dc[2] and asgd[0] != dc[0]
    assert abs(ddc - W).sum() < abs(dc - W).sum()


finite = arrays(np.float64, 4, elements=st.floats(-10, 10))


@settings(max_examples=60, deadline=None)
@given(w=finite, g=finite, v=finite, mode=st.sampled_from(ASYNC_MODES),
       lr=st.floats(1e-4, 1.0), mu=st.floats(0, 0.99), lambda0=st.floats(0, 5))
def test_a_fresh_update_is_sgd_with_momentum(w, g, v, mode, lr, mu, lambda0):
    """Zero delay (w_bak = w, one worker): every mode is SGD with momentum."""
    hyper = Hyper(learning_rate=lr, momentum=mu, lambda0=lambda0)
    new = update(mode, w, g, w.copy(), np.ones(4), v, 0, 0.0, hyper, np.sqrt, 1)
    np.testing.assert_allclose(new.velocity, mu * v + g, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(new.w, w - lr * (mu * v + g), rtol=1e-12, atol=1e-12)


@given(tau=st.integers(0, 100), mean=st.floats(0.01, 1))
def test_freshness_falls_with_delay_and_is_one_at_the_mean(tau, mean):
    assert freshness(tau + 1, mean) < freshness(tau, mean)
    assert freshness(1 / mean - 1, mean) == pytest.approx(1.0)


def ddc_weights(delays, ms_decay):
    """The weight ``r`` DDC-ASGD gives each of a run's updates (the velocity it adds
    for a gradient of 1 with no compensation)."""
    hyper, mean, weights = Hyper(ms_decay=ms_decay), 0.0, []
    for step, tau in enumerate(delays, 1):
        new = update("ddc-asgd", np.ones(1), np.ones(1), np.ones(1), np.ones(1),
                     np.zeros(1), tau, mean, hyper, np.sqrt, step)
        mean = new.mean_freshness
        weights.append(float(new.velocity[0]))
    return np.array(weights)


@settings(max_examples=60, deadline=None)
@given(delays=st.lists(st.integers(0, 30), min_size=1, max_size=300))
def test_ddc_weight_is_freshness_over_its_running_mean(delays):
    """With a decay near 1 the running mean is the plain mean so far."""
    fresh = 1 / (1 + np.array(delays))
    expected = fresh / (np.cumsum(fresh) / np.arange(1, len(fresh) + 1))
    np.testing.assert_allclose(ddc_weights(delays, 1 - 1e-9), expected, rtol=1e-5)


def test_ddc_weights_average_one_when_delays_vary():
    """Delays like the digits benchmark's (fast workers 0–2, a slow one 3–6): the
    weights average 1 (the mean step stays DC-ASGD's), where ``(1 + mean delay) /
    (1 + tau)`` averages about 1.5 (1.3 on a measured run's delays)."""
    delays = np.random.default_rng(0).choice([0, 1, 1, 2, 0, 1, 3, 6], size=4000)
    assert ddc_weights(delays, 0.95)[100:].mean() == pytest.approx(1.0, abs=0.03)
    assert ((1 + delays.mean()) / (1 + delays)).mean() > 1.25


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown asynchronous mode"):
        update("hogwild", W, G, W_BAK, MS, V, 0, 0.0, HYPER, np.sqrt, 1)
