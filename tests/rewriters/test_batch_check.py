"""The batch-mixing analysis (rewriters/batch_check.py) on real SavedModels: models
that mix samples where no shape shows it are refused micro-batches and replicas with
the op named, and random models from a grammar of per-sample and mixing elements are
judged right: every model it accepts gives the same rows when cut into micro-batches,
and every op it names belongs to an element that mixes."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriters.batch_check import batch_mixing_ops
from rewriters.savedmodel_io import read_saved_model
from tfpart.compile import compile_model
from tfpart.core.errors import ModelError, PlacementError

MIXING = {"loop_then_mean": "Mean", "batch_size_loop": "while", "position": "Cast"}
# what a compile names: a branch the batch steers, from the graph (rewriters/batch_flow.py)
REFUSED = {**MIXING, "loop_then_mean": "cond"}


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.parametrize("kind", sorted(MIXING))
def test_mixing_where_no_shape_shows_it_is_refused(kind, exported, tmp_path):
    """The cases an analysis of shapes alone accepted (issue 36): refused for 2
    micro-batches and for data parallel, naming the op; placed as a whole batch."""
    from profiles import DEFAULT_CLUSTER_FILE

    model = exported(kind)
    found = batch_mixing_ops(read_saved_model(model), model)
    assert found and found[0][0].endswith(MIXING[kind]), found
    with pytest.raises(ModelError, match=rf"op \S*{REFUSED[kind]} mixes the samples"):
        compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "m", batch_size=4,
                      pipeline=True, microbatches=2)
    with pytest.raises(PlacementError, match=rf"op \S*{REFUSED[kind]} mixes .* replicas"):
        compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "r", batch_size=4,
                      algorithm="data_parallel")
    result = compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "auto", batch_size=4,
                           strategy="auto", verify=True)
    refused = result.plan.context["strategy"]["refused"]
    assert "mixes the samples" in refused["data_parallel"]
    assert result.verification.outputs_equal and result.plan.microbatches in (None, 1)


# The grammar: each element maps h (batch, 8) to h (batch, 8) in its own name scope.
PER_SAMPLE = ("dense", "tanh", "row_sum", "weight_cond", "fixed_loop")
MIXES = ("batch_mean", "mean_cond", "batch_size_loop", "position", "batch_max_loop")


def _element(tf, kind, h, w):
    if kind == "dense":
        return tf.matmul(h, w)
    if kind == "tanh":
        return tf.tanh(h)
    if kind == "row_sum":
        return h + tf.reduce_sum(h, axis=1, keepdims=True)
    if kind == "weight_cond":
        return tf.cond(tf.reduce_sum(w) > 0, lambda: h * 2.0, lambda: h - 1.0)
    if kind == "fixed_loop":
        return tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, tf.tanh(v)),
                             [tf.constant(0), h])[1]
    if kind == "batch_mean":
        return h - tf.reduce_mean(h, axis=0)
    if kind == "mean_cond":
        return tf.cond(tf.reduce_mean(h) > 0, lambda: h * 2.0, lambda: h - 1.0)
    if kind == "batch_size_loop":
        return tf.while_loop(lambda i, v: i < tf.shape(h)[0],
                             lambda i, v: (i + 1, tf.tanh(v) + 0.5), [tf.constant(0), h])[1]
    if kind == "position":
        return h + tf.cast(tf.range(tf.shape(h)[0]), tf.float32)[:, None]
    if kind == "batch_max_loop":  # a loop whose values depend on the whole batch
        return tf.while_loop(lambda i, v: i < 2,
                             lambda i, v: (i + 1, v - tf.reduce_max(v, axis=0)),
                             [tf.constant(0), h])[1]
    raise AssertionError(kind)


def _export(program, path):
    import tensorflow as tf

    class Drawn(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([8, 8], seed=[5, 6]) * 0.4)

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            h = x
            for k, kind in enumerate(program):
                with tf.name_scope(f"e{k}_{kind}"):
                    h = _element(tf, kind, h, self.w)
            return {"y": h}

    module = Drawn()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return tf.saved_model.load(str(path)).signatures["serving_default"]


@pytest.mark.slow
@pytest.mark.any_onednn
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(st.sampled_from(PER_SAMPLE + MIXES), min_size=1, max_size=4))
def test_random_models_are_judged_right(program, tmp_path_factory):
    import tensorflow as tf

    path = tmp_path_factory.mktemp("drawn") / "m"
    model = _export(program, path)
    found = batch_mixing_ops(read_saved_model(path), path)
    mixing = [k for k, kind in enumerate(program) if kind in MIXES]
    if not found:
        assert not mixing, f"{program}: mixing element {program[mixing[0]]} not found"
        x = np.random.default_rng(len(program)).standard_normal((7, 8)).astype(np.float32)
        whole = model(x=tf.constant(x))["y"].numpy()
        for cut in (1, 3, 6):
            parts = [model(x=tf.constant(x[:cut]))["y"].numpy(),
                     model(x=tf.constant(x[cut:]))["y"].numpy()]
            np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-5, atol=1e-5)
        return
    op = found[0][0]
    element = next(k for k, kind in enumerate(program) if f"/e{k}_{kind}/" in f"/{op}/")
    assert program[element] in MIXES, (program, found[0])
    assert element == mixing[0], (program, found[0])  # the first one that mixes
