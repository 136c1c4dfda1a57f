"""The delayed-gradient replay of benchmarks/delayed_gradients.py: its numpy gradient
and Fisher diagonal against TensorFlow's, its delay schedule, and one worker's runs."""
import argparse

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.delayed_gradients import (delay_schedule, glorot_weights, gradient,
                                          replay)


def batch(seed=0, samples=6, sizes=(5, 7, 4, 3)):
    rng = np.random.default_rng(seed)
    weights = glorot_weights(rng, list(sizes))
    weights = [w + rng.normal(0, 0.1, w.shape).astype(np.float32) for w in weights]
    x = rng.normal(size=(samples, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], samples)
    return weights, x, y


def tensorflow_loss(variables, x, y):
    a = tf.constant(x)
    for index in range(0, len(variables) - 2, 2):
        a = tf.nn.relu(a @ variables[index] + variables[index + 1])
    z = a @ variables[-2] + variables[-1]
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, z))


def test_the_gradient_and_fisher_diagonal_are_tensorflows():
    weights, x, y = batch()
    grads, fisher = gradient(weights, x, y, fisher=True)
    variables = [tf.Variable(w) for w in weights]
    with tf.GradientTape() as tape:
        loss = tensorflow_loss(variables, x, y)
    for ours, theirs in zip(grads, tape.gradient(loss, variables)):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-4, atol=1e-6)
    per_sample = []
    for i in range(len(y)):
        with tf.GradientTape() as tape:
            loss = tensorflow_loss(variables, x[i:i + 1], y[i:i + 1])
        per_sample.append([g.numpy() for g in tape.gradient(loss, variables)])
    for index, ours in enumerate(fisher):
        expected = np.mean([sample[index] ** 2 for sample in per_sample], axis=0)
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_delays_are_the_updates_applied_between_read_and_update(workers):
    schedule = delay_schedule(workers, 200, np.random.default_rng(1))
    delays = [position - read for position, (_, read) in enumerate(schedule)]
    assert min(delays) >= 0
    if workers == 1:
        assert set(delays) == {0}
    else:  # the other workers' updates in between, more from the slowed worker's view
        assert workers - 2 <= np.mean(delays) <= 3 * workers
        slowed = [d for d, (k, _) in zip(delays, schedule) if k == workers - 1]
        fast = [d for d, (k, _) in zip(delays, schedule) if k == 0]
        assert np.mean(slowed) > np.mean(fast)
    for position, (worker, read) in enumerate(schedule):
        # a worker reads right after its previous update
        previous = [p for p, (k, _) in enumerate(schedule[:position]) if k == worker]
        assert read == (previous[-1] + 1 if previous else 0)


def test_with_one_worker_every_mode_is_the_same_sgd():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    args = argparse.Namespace(hidden=8, steps=30, batch_size=16, lr=0.1, momentum=0.9,
                              lambda0=2.0, every=10)
    data = ((x[:240], y[:240]), (x[240:], y[240:]))
    curves = [replay(mode, 1, 0, args, data)["curve"]
              for mode in ("async", "dc-asgd", "ddc-asgd")]
    assert curves[0] == curves[1] == curves[2]
    assert curves[0][-1][1] > curves[0][0][1]  # it learns
