"""The Python API reads as one (issue 58): ``compile_model`` and ``plan_model`` take a
Keras model or a ``tf.Module`` as well as a SavedModel folder, give result objects with
named fields, and the shipped clusters and example models are found by name."""
import tempfile

import numpy as np
import pytest

import tfpart
from tfpart.core.errors import ClusterError, ModelError

CLUSTER = "local_3cpu"


def tiny_keras_model():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,), name="x")
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4)(hidden), name="tiny")


def tiny_module():
    import tensorflow as tf

    class Tiny(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([16, 32], seed=[1, 2]))
            self.head = tf.Variable(tf.random.stateless_normal([32, 4], seed=[3, 4]))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w)), self.head)}

    return Tiny()


@pytest.fixture
def temporary_folders(tmp_path, monkeypatch):
    """The folder Python's ``tempfile`` creates in, during the test."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_keras_model_compiles_from_the_object(tmp_path, temporary_folders):
    model = tiny_keras_model()
    result = tfpart.compile_model(model, tfpart.clusters.load(CLUSTER), tmp_path / "out",
                                  batch_size=8, verify=True)
    assert isinstance(result, tfpart.CompileResult) and result.verification.ok
    assert result.out == tmp_path / "out" and (result.out / "plan.json").is_file()
    assert result.strategy == result.plan.algorithm == "greedy"
    assert result.compared == {"greedy": result.step_time} and result.refused == {}
    assert result.step_time == result.plan.step_time > 0
    assert result.cluster.name == "local-3cpu" and result.info.batch_size == 8
    assert "model" not in result.plan.context  # the export is gone: plan.json names none
    assert not list(temporary_folders.glob("tfpart-*"))  # the export and local copy removed
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    with tfpart.runnable(result.out) as here:
        (got,) = tfpart.load(here.directory).signatures["serving_default"](x=x).values()
    np.testing.assert_allclose(got.numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_tf_module_compiles_from_the_object_choosing_a_strategy(tmp_path):
    result = tfpart.compile_model(tiny_module(), tfpart.clusters.path(CLUSTER),
                                  tmp_path / "out", batch_size=8, verify=True,
                                  strategy="auto")
    assert result.verification.ok
    assert {"greedy", "data_parallel"} <= set(result.compared)
    assert result.strategy == min(result.compared, key=result.compared.get)
    assert result.step_time == result.compared[result.strategy] == result.plan.step_time
    assert set(result.compared).isdisjoint(result.refused)
    assert result.plan.context["strategy"]["chosen"] == result.strategy
    assert "strategy='" in repr(result) and "assignment" not in repr(result)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_objects_without_a_signature_to_export_are_refused_in_one_line():
    import keras
    import tensorflow as tf

    class Unsigned(tf.Module):
        @tf.function
        def __call__(self, x):
            return x

    cluster = tfpart.clusters.load(CLUSTER)
    for model, problem in [(keras.Sequential([keras.layers.Dense(3)]), "has no inputs yet"),
                           (Unsigned(), "Unsigned has no signature to export"),
                           (42, "from an object of type int")]:
        with pytest.raises(ModelError, match=problem) as caught:
            tfpart.plan_model(model, cluster)
        assert "\n" not in str(caught.value)


def test_shipped_clusters_and_example_models_by_name():
    cluster = tfpart.clusters.load("a100_l4_one_host")
    assert cluster.source == str(tfpart.clusters.path("a100_l4_one_host"))
    assert "A100-40GB" in {device.kind.name for device in cluster.devices}
    with pytest.raises(ClusterError, match="no shipped cluster named 'a100'; the shipped "
                                           "ones: .*a100_l4_one_host, .*local_3cpu"):
        tfpart.clusters.load("a100")
    with pytest.raises(ClusterError):
        tfpart.clusters.load("../clusters/local_3cpu")  # a name, never a path
    assert tfpart.examples.saved_model("residual_cnn") == tfpart.DEFAULT_MODEL_DIR
    with pytest.raises(ModelError, match="the shipped ones: residual_cnn"):
        tfpart.examples.saved_model("resnet")
