"""Compile real TensorFlow/Keras SavedModels onto several logical CPU devices and check
that the compiled model computes the same outputs, with ops where the plan says."""
import json
import subprocess
import sys

import pytest

from tests.conftest import local_cluster
from tfpart.compile import compile_model
from tfpart.core.errors import PlacementError
from tfpart.verification import verify

pytestmark = pytest.mark.slow


def compile_and_verify(model, cluster_file, out, batch_size=None, algorithm="greedy"):
    result = compile_model(model, cluster_file, out, batch_size=batch_size,
                           algorithm=algorithm)
    report = verify(model, out)
    return result, report


def devices_doing_work(result, report):
    """Devices on which TensorFlow ran ops that compute something (FLOPs > 0)."""
    flops = {op: attrs["flops"] for op, attrs in result.graph.ops.items()}
    return {device for op, device in report.placement.items() if flops.get(op, 0) > 0}


# The greedy keeps these small models on one device (their copies would cost more than
# running branches side by side gains); placements that spread them still check that their
# rewrite runs across devices.
SPLIT_BY_HAND = {"mlp_module": "round_robin", "transformer_encoder": "topo_split"}


# in both oneDNN modes: the models Grappler fuses differently (convolutions, batch
# norms, matmuls); the others once
@pytest.mark.parametrize("name,batch", [
    pytest.param("mlp_module", 8, marks=pytest.mark.any_onednn), ("residual_cnn", 4),
    ("transformer_encoder", 4), pytest.param("while_module", 2, marks=pytest.mark.any_onednn),
    pytest.param("cond_module", 4, marks=pytest.mark.any_onednn),
    pytest.param("stacked_lstm", 4, marks=pytest.mark.any_onednn),
    pytest.param("parallel_dense", 8, marks=pytest.mark.any_onednn), ("conv_batchnorm", 4)])
def test_compiled_model_matches_original_on_three_devices(name, batch, exported, local_cpus,
                                                          write_cluster, tmp_path):
    model = exported(name)
    result, report = compile_and_verify(model, write_cluster(local_cluster(3)),
                                        tmp_path / "out", batch_size=batch,
                                        algorithm=SPLIT_BY_HAND.get(name, "greedy"))
    assert report.outputs_equal, report.max_abs_diff
    assert report.ops_checked >= 2  # the signature's own return ops run in the caller
    assert report.op_mismatches == []
    assert report.variable_mismatches == []
    if name == "cond_module":  # the conditional stays one op, placed as a unit
        assert {"If", "StatelessIf"} & {a["op_type"] for a in result.graph.ops.values()}
    if name not in ("while_module", "cond_module", "stacked_lstm"):  # little in parallel
        assert len(devices_doing_work(result, report)) >= 2
    # Ops Grappler fuses share a device in the plan; the fused kernel ran there.
    for members in result.plan.context["fusion_groups"]:
        assert len({result.plan.assignment[m] for m in members}) == 1
    fused_ran = [op for op in report.placement if any(op in m for m in
                                                      result.plan.context["fusion_groups"])]
    assert len(fused_ran) >= len(result.plan.context["fusion_groups"]) > 0 or \
        name in ("mlp_module", "while_module", "cond_module")


def test_while_loop_body_runs_on_the_loop_device(exported, local_cpus, write_cluster,
                                                 tmp_path):
    model = exported("while_module")
    result, report = compile_and_verify(model, write_cluster(local_cluster(3)),
                                        tmp_path / "out", batch_size=2)
    loop = next(op for op, a in result.graph.ops.items() if a["op_type"] == "While")
    planned = report.device_map[result.plan.assignment[loop]]
    # The body's own ops (not the Switch/Merge/Send plumbing TensorFlow adds when it
    # lowers the loop, whose names end in /_N) ran where the loop was placed.
    body = {op: d for op, d in report.placement.items()
            if op.startswith(f"{loop}/body/") and not op.rsplit("/", 1)[1].startswith("_")}
    assert report.outputs_equal
    assert any(op.endswith("/MatMul") for op in body)
    assert set(body.values()) == {planned}


def test_resnet50_compiles_splits_and_matches(exported, local_cpus, write_cluster, tmp_path):
    model = exported("resnet50")
    result, report = compile_and_verify(model, write_cluster(local_cluster(3)),
                                        tmp_path / "out", batch_size=2)
    assert len(result.graph) > 1000
    assert report.outputs_equal, report.max_abs_diff
    assert report.op_mismatches == [] and report.variable_mismatches == []
    assert len(devices_doing_work(result, report)) >= 2
    assert report.ops_checked > 500


def test_devices_each_too_small_still_get_a_valid_split(exported, local_cpus, write_cluster,
                                                         tmp_path):
    model = exported("mlp_module")
    # The MLP holds 368 KB of variables; no device can hold them all.
    cluster = write_cluster(local_cluster(4, memory="320KB"))
    result, report = compile_and_verify(model, cluster, tmp_path / "out", batch_size=2)
    devices = result.plan.predicted.devices
    assert all(d.peak_memory_bytes <= d.memory_bytes for d in devices.values())
    assert sum(1 for d in devices.values() if d.param_bytes > 0) >= 2
    assert report.outputs_equal and report.variable_mismatches == []


def test_saved_model_cli_reads_the_output(exported, write_cluster, tmp_path):
    model = exported("residual_cnn")
    out = tmp_path / "out"
    compile_model(model, write_cluster(local_cluster(3)), out)
    shown = subprocess.run([sys.executable, "-m", "tensorflow.python.tools.saved_model_cli",
                            "show", "--dir", str(out), "--all"],
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "serving_default" in shown.stdout
    import tensorflow as tf

    fingerprint = tf.saved_model.experimental.read_fingerprint(str(out))
    assert fingerprint.saved_model_checksum != \
        tf.saved_model.experimental.read_fingerprint(str(model)).saved_model_checksum
    plan = json.loads((out / "plan.json").read_text())
    assert set(plan["assignment"].values()) <= {
        f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)}


def test_every_node_and_variable_has_its_device(exported, write_cluster, tmp_path):
    from rewriters.savedmodel_io import read_saved_model

    model = exported("transformer_encoder")
    out = tmp_path / "out"
    result = compile_model(model, write_cluster(local_cluster(3)), out)
    meta = read_saved_model(out).meta_graphs[0]
    source = read_saved_model(model).meta_graphs[0]

    def devices_by_node(m):
        found = {("", n.name): n.device for n in m.graph_def.node}
        for f in m.graph_def.library.function:
            found.update({(f.signature.name, n.name): n.device for n in f.node_def})
        return found
    before, after = devices_by_node(source), devices_by_node(meta)
    devices = set(result.cluster.device_names)
    # Every node gets a cluster device, except host ops (the savers') that keep theirs
    # and the signatures' own call and return ops, which run in the caller.
    callers = {(f.signature.name, n.name) for f in meta.graph_def.library.function
               if f.signature.name.startswith("__inference_signature_wrapper")
               for n in f.node_def}
    assert callers and all(after[k] == "" for k in callers)
    assert all(d in devices or (d and d == before.get(k))
               for k, d in after.items() if k not in callers)
    kept = {d for k, d in after.items() if d not in devices and k not in callers}
    assert all("CPU" in d for d in kept)
    variables = [o.variable for o in meta.object_graph_def.nodes if o.HasField("variable")]
    assert variables and all(v.device in devices for v in variables)


def test_unread_variable_copies_are_counted_where_they_are_kept(local_cpus, tmp_path,
                                                                write_cluster):
    """Keras 3 exports every variable twice; only the captured copy is read. The unread
    copy is kept on the first device's host, which on a CPU cluster is that device: it
    counts there (a worker's allocator holds it, tests/e2e/test_memory_fit.py). The read
    variables (27.7 KB) would fit two 24 KB devices; with the copy they do not."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((32,), name="x")
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    hidden = keras.layers.Dense(64, activation="relu")(hidden)
    model = tmp_path / "m"
    keras.Model(inputs, keras.layers.Dense(10)(hidden)).export(str(model), verbose=False)
    with pytest.raises(PlacementError, match="27.7 KB of the 6 variables the signature "
                                             "never reads"):
        compile_and_verify(model, write_cluster(local_cluster(2, memory="24KB")),
                           tmp_path / "small", batch_size=1)
    result, report = compile_and_verify(model, write_cluster(local_cluster(2, memory="48KB")),
                                        tmp_path / "out", batch_size=1)
    unread = result.plan.context["unread_variables"]
    assert unread["count"] == 6 and unread["bytes"] == 27_688
    assert result.graph.total_param_bytes() == 27_688
    assert report.ok, (report.op_mismatches, report.variable_mismatches)
    devices = result.plan.predicted.devices
    assert sum(d.param_bytes for d in devices.values()) == 2 * 27_688
    first = devices[result.cluster.device_names[0]]
    assert first.param_bytes >= 27_688 and first.peak_memory_bytes <= first.memory_bytes
