"""Models users bring that an earlier reader refused (issue 35), compiled with
verification (the Keras applications, ConvNeXtTiny's ``Normalization`` constant and
its grouped convolutions that Keras compiles with XLA among them, by
``benchmarks/model_zoo.py``; XLA-compiled signatures by tests/e2e/test_drop_in.py):
Keras preprocessing layers (hash tables, an asset, ragged splits, strings), a
``tf.Module`` with a captured ``tf.constant``, and TF1 SavedModels with resource and
with legacy ref variables (placed, pipelined over micro-batches and replicated, their
training steps placed only). Each compiles with ``--strategy auto`` on the default
cluster and on a GPU cluster mapped onto logical CPUs (its CPU takes the host ops):
outputs equal, every op where the plan put it. A cluster without a CPU is refused in
one line naming the op.

Their outcome does not hang on oneDNN (the convolution networks' fusions are tested
with ResNet50 in both modes), so CI runs them once.
"""
import pytest

from profiles import CLUSTERS_DIR, DEFAULT_CLUSTER_FILE
from tfpart.compile import compile_model
from tfpart.core.errors import PlacementError

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]

CLUSTERS = {"default": DEFAULT_CLUSTER_FILE,
            "gpu": CLUSTERS_DIR / "a100_l4_one_host.json"}  # A100, 2 L4, a host CPU


def compiled(model, cluster, out, batch_size=4):
    result = compile_model(model, CLUSTERS[cluster], out, batch_size=batch_size,
                           strategy="auto", verify=True)
    report = result.verification
    assert report.outputs_equal, report.max_abs_diff
    assert report.op_mismatches == [] and report.variable_mismatches == []
    assert report.ops_checked > 0
    return result


def host_ops_on_the_host(result):
    """Every op with a kernel only on the host runs on a CPU device of the plan."""
    kinds = {d.name: d.kind.name for d in result.cluster.devices}
    host_only = [op for op, attrs in result.graph.ops.items()
                 if attrs["allowed_kinds"] == frozenset({"cpu"})]
    assert host_only
    assert {kinds[result.plan.assignment[op]] for op in host_only} == {"cpu"}


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_text_vectorization(cluster, exported, tmp_path):
    result = compiled(exported("text_vectorization"), cluster, tmp_path / "out")
    types = {attrs["op_type"] for attrs in result.graph.ops.values()}
    assert {"HashTableV2", "LookupTableFindV2", "StringSplitV2",
            "RaggedTensorToTensor"} <= types
    host_ops_on_the_host(result)


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_preprocessing_layers(cluster, exported, tmp_path):
    """StringLookup (vocabulary from an asset file), IntegerLookup, Hashing,
    CategoryEncoding, Discretization, Normalization, Rescaling."""
    out = tmp_path / "out"
    result = compiled(exported("preprocessing"), cluster, out)
    assert (out / "assets" / "vocabulary.txt").read_text() == "red\ngreen\nblue\n"
    tables = [op for op, a in result.graph.ops.items() if a["op_type"] == "HashTableV2"]
    assert len(tables) == 2 and all(result.graph.ops[t]["param_bytes"] > 0 for t in tables)
    host_ops_on_the_host(result)


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_module_with_a_captured_constant(cluster, exported, tmp_path):
    result = compiled(exported("captured_constant"), cluster, tmp_path / "out")
    assert any(op.startswith("constants/") for op in result.graph.ops)


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize("variables", ["resource", "ref"])
def test_tf1_saved_model(variables, cluster, exported, tmp_path):
    """Resource variables with control flow v2, or ref variables with v1's
    Switch/Merge/Enter loop; written back as a TF1 SavedModel."""
    from rewriters.savedmodel_io import read_saved_model

    out = tmp_path / "out"
    result = compiled(exported(f"tf1_{variables}"), cluster, out)
    assert result.plan.context["format"] == "tf1"
    meta = read_saved_model(out).meta_graphs[0]
    assert not meta.object_graph_def.nodes and meta.saver_def.restore_op_name
    devices = {node.name: node.device for node in meta.graph_def.node}
    assert all(devices[op] == device for op, device in result.plan.assignment.items())
    kinds = {attrs["op_type"] for attrs in result.graph.ops.values()}
    assert ("VariableV2" in kinds and "Enter" in kinds) if variables == "ref" else \
        "VarHandleOp" in kinds


def test_tf1_output_runs_under_both_loaders(exported, tmp_path):
    import numpy as np
    import tensorflow as tf

    model, out = exported("tf1_ref"), tmp_path / "out"
    compile_model(model, DEFAULT_CLUSTER_FILE, out, batch_size=2, algorithm="round_robin")
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    expected = tf.saved_model.load(str(model)).signatures["serving_default"](
        x=tf.constant(x))["y"].numpy()
    loaded = tf.saved_model.load(str(out)).signatures["serving_default"]
    np.testing.assert_allclose(loaded(x=tf.constant(x))["y"].numpy(), expected, rtol=1e-6)
    with tf.compat.v1.Session(graph=tf.Graph(), config=tf.compat.v1.ConfigProto(
            device_count={"CPU": 3})) as session:
        meta = tf.compat.v1.saved_model.load(session, ["serve"], str(out))
        signature = meta.signature_def["serving_default"]
        y = session.run(signature.outputs["y"].name, {signature.inputs["x"].name: x})
    np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_tf1_pipeline_over_microbatches_keeps_the_model_tf1(exported, tmp_path):
    """Ref variables, a v1 loop (one frame per micro-batch) and a lookup table that
    every micro-batch shares: stages over 2 micro-batches, equal at several batch sizes
    under both loaders; the checkpoint, the saver, the inputs and the state ops are the
    original's."""
    import numpy as np
    import tensorflow as tf

    from rewriters.savedmodel_io import read_saved_model

    model, out = exported("tf1_per_sample"), tmp_path / "out"
    result = compile_model(model, DEFAULT_CLUSTER_FILE, out, batch_size=4, pipeline=True,
                           microbatches=2, verify=True)
    assert result.verification.outputs_equal and result.verification.op_mismatches == []
    assert result.plan.microbatches == 2 and len(set(result.plan.stages.values())) > 1
    before, after = (read_saved_model(path).meta_graphs[0] for path in (model, out))
    assert not after.object_graph_def.nodes and after.saver_def == before.saver_def
    for name in ("variables.index", "variables.data-00000-of-00001"):
        assert (out / "variables" / name).read_bytes() == \
            (model / "variables" / name).read_bytes()
    signature = after.signature_def["serving_default"]
    assert {k: v.name for k, v in signature.inputs.items()} == \
        {k: v.name for k, v in before.signature_def["serving_default"].inputs.items()}
    nodes = {n.name for n in after.graph_def.node}
    for key, output in signature.outputs.items():
        assert output.name != before.signature_def["serving_default"].outputs[key].name
        assert output.name.split(":")[0] in nodes
    state = [(n.op, n.name) for n in after.graph_def.node if n.op in ("VariableV2", "HashTableV2")]
    assert sorted(state) == sorted((n.op, n.name) for n in before.graph_def.node
                                   if n.op in ("VariableV2", "HashTableV2"))
    frames = {n.attr["frame_name"].s for n in after.graph_def.node
              if n.op == "Enter" and n.name.startswith("tfpart_mb")}
    assert len(frames) == 2
    original = tf.saved_model.load(str(model)).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    for rows in (1, 3, 5):
        x = np.linspace(-1, 1, 8 * rows, dtype=np.float32).reshape(rows, 8)
        ids = np.arange(rows, dtype=np.int64) % 4  # 3 is not in the table
        expected = original(x=tf.constant(x), ids=tf.constant(ids))
        got = compiled(x=tf.constant(x), ids=tf.constant(ids))
        # micro-batches change a matmul's rows, and Eigen's summation order with them
        for key in ("gated", "y"):
            np.testing.assert_allclose(got[key].numpy(), expected[key].numpy(), rtol=1e-5,
                                       atol=1e-6)
        with tf.compat.v1.Session(graph=tf.Graph(), config=tf.compat.v1.ConfigProto(
                device_count={"CPU": 4})) as session:
            tf.compat.v1.saved_model.load(session, ["serve"], str(out))
            y = session.run(signature.outputs["y"].name, {signature.inputs["x"].name: x,
                                                          signature.inputs["ids"].name: ids})
        np.testing.assert_allclose(y, expected["y"].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["data_parallel", "hybrid"])
def test_tf1_replicas(strategy, exported, tmp_path):
    result = compile_model(exported("tf1_per_sample"), CLUSTERS["gpu"], tmp_path / "out",
                           batch_size=6, algorithm=strategy, verify=True)
    assert result.plan.replicas and result.verification.outputs_equal
    assert result.verification.op_mismatches == [] and result.verification.ops_checked > 0


def test_a_tf1_training_step_is_placed_but_not_pipelined(tmp_path):
    """A TF1 signature that runs its optimizer: the stages, replicas and splits are
    refused with the op that writes a variable; ``auto`` keeps the op placement."""
    import tensorflow as tf

    model = tmp_path / "train"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 1], use_resource=False)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        with tf.control_dependencies([tf.compat.v1.train.GradientDescentOptimizer(0.1)
                                      .minimize(loss)]):
            step_loss = tf.identity(loss)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(model))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "train": tf.compat.v1.saved_model.predict_signature_def(
                    {"x": x}, {"loss": step_loss})})
            builder.save()
    with pytest.raises(PlacementError, match=r"op .*ApplyGradientDescent writes a variable "
                                             r"or a table: the stages.* inference"):
        compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "out", pipeline=True,
                      batch_size=4)
    result = compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "auto", batch_size=4,
                           strategy="auto")
    strategy = result.plan.context["strategy"]
    assert strategy["chosen"] == "greedy"
    assert "writes a variable" in strategy["refused"]["pipeline"]


def test_a_cluster_without_a_cpu_names_the_op_that_needs_the_host(exported, tmp_path):
    with pytest.raises(PlacementError, match=r"no device can run .*StringSplitV2|"
                                             r"no device can run .*\(.*\): it has a kernel "
                                             r"only on cpu devices.*host") as caught:
        compile_model(exported("text_vectorization"), CLUSTERS_DIR / "4xT4_one_host.json",
                      tmp_path / "out", strategy="auto")
    assert "\n" not in str(caught.value)
