"""Models users bring that an earlier reader refused (issue 35), compiled with
verification: a Keras application whose ``Normalization`` layer is a captured constant
(ConvNeXtTiny, whose grouped convolutions Keras compiles with XLA; all 40 applications
are compiled and verified by ``benchmarks/model_zoo.py``),
Keras preprocessing layers (hash tables, an asset, ragged splits, strings), a
``tf.Module`` with a captured ``tf.constant``, and TF1 SavedModels with resource and
with legacy ref variables. Each compiles with ``--strategy auto`` on the default
cluster and on a GPU cluster mapped onto logical CPUs (its CPU takes the host ops):
outputs equal, every op where the plan put it. A cluster without a CPU is refused in
one line naming the op.

Their outcome does not hang on oneDNN (the convolution networks' fusions are tested
with ResNet50 in both modes), so CI runs them once.
"""
import pytest

from profiles import CLUSTERS_DIR, DEFAULT_CLUSTER_FILE
from tfpart.compile import compile_model
from tfpart.errors import PlacementError

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
    assert result.plan.context["strategy"]["chosen"] == "greedy"
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


@pytest.mark.parametrize("name, cluster", [("convnext_tiny", "gpu")])
def test_keras_application(name, cluster, exported, tmp_path):
    result = compiled(exported(name), cluster, tmp_path / "out", batch_size=2)
    assert any(op.startswith("constants/") for op in result.graph.ops)  # Normalization
    assert len(result.graph) > 1000


def test_a_cluster_without_a_cpu_names_the_op_that_needs_the_host(exported, tmp_path):
    with pytest.raises(PlacementError, match=r"no device can run .*StringSplitV2|"
                                             r"no device can run .*\(.*\): it has a kernel "
                                             r"only on cpu devices.*host") as caught:
        compile_model(exported("text_vectorization"), CLUSTERS_DIR / "4xT4_one_host.json",
                      tmp_path / "out", strategy="auto")
    assert "\n" not in str(caught.value)
