"""A rewritten TF2 model stays loadable by TensorFlow's TF1/C++ loader (the one TF
Serving uses): ``tf.compat.v1.saved_model.loader.load`` restores its variables by
running the MetaGraph's ``saver_def``, which the pipeline pass writes as graph nodes
(:mod:`rewriters.graph_saver`) instead of letting ``tf.saved_model.save`` trace it."""
import numpy as np
import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR
from tfpart.compile import compile_model

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]


def test_a_replicated_keras_model_restores_and_saves_through_its_saver_def(tmp_path):
    """Data parallel over 2 replicas: the signature's variables, their replicas' copies
    and the original's (the Keras export names many of them twice) are restored from the
    checkpoint by key, the signatures give the original's outputs in a TF1 session, and
    the saver's save writes the same checkpoint back."""
    import tensorflow as tf

    out = tmp_path / "out"
    compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, out, batch_size=4,
                  algorithm="data_parallel", options={"replicas": 2})
    x = np.random.default_rng(4).standard_normal((5, 32, 32, 3)).astype(np.float32)
    original = tf.saved_model.load(str(DEFAULT_MODEL_DIR))
    want = {name: original.signatures[name](image=tf.constant(x))
            for name in ("serve", "serving_default")}
    checkpoint = tf.train.load_checkpoint(str(out / "variables" / "variables"))
    with tf.compat.v1.Session(graph=tf.Graph(), config=tf.compat.v1.ConfigProto(
            device_count={"CPU": 3})) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(out))
        saver = meta.saver_def
        assert saver.restore_op_name == "tfpart_saver/restore_all"
        graph = session.graph
        restore = graph.get_operation_by_name("tfpart_saver/restore/RestoreV2")
        keys = [key.decode() for key in session.run(restore.inputs[1])]
        assert len(keys) > 10 and any("replica" in key for key in keys)
        values = session.run([f"tfpart_saver/save/read_{i}:0" for i in range(len(keys))])
        for key, value in zip(keys, values):
            np.testing.assert_array_equal(value, checkpoint.get_tensor(key))
        for name, outputs in want.items():
            signature = meta.signature_def[name]
            got = session.run({k: t.name for k, t in signature.outputs.items()},
                              {signature.inputs["image"].name: x})
            for key, value in outputs.items():
                np.testing.assert_allclose(got[key], value.numpy(), rtol=1e-5, atol=1e-6)
        prefix = str(tmp_path / "saved" / "ckpt")
        assert session.run(saver.save_tensor_name,
                           {saver.filename_tensor_name: prefix}).decode() == prefix
    saved = tf.train.load_checkpoint(prefix)
    assert saved.get_variable_to_dtype_map() == checkpoint.get_variable_to_dtype_map()
    for key in keys:
        np.testing.assert_array_equal(saved.get_tensor(key), checkpoint.get_tensor(key))
