"""Measured profiles: JSON round trip, their effect on predictions, clean errors."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costmodel import CostModel
from costmodel.measured import MeasuredProfile, shape_key
from costmodel.roofline import roofline_time
from profiles import DEFAULT_MODEL_DIR
from tfpart.cluster import cluster_of_devices, load_device_kinds
from tfpart.errors import ProfileError
from tfpart.graph import OpGraph

CPU = load_device_kinds()["cpu"]


def matmul_graph():
    graph = OpGraph()
    graph.add_op("small", op_type="MatMul", input_shapes=((64, 64), (64, 64)),
                 flops=2 * 64**3, bytes_accessed=3 * 4 * 64**2)
    graph.add_op("large", op_type="MatMul", input_shapes=((512, 512), (512, 512)),
                 flops=2 * 512**3, bytes_accessed=3 * 4 * 512**2)
    return graph


def one_op_profile(time_s=1e-3):
    ops = [{"op_type": "MatMul", "input_shapes": [[64, 64], [64, 64]], "time_s": time_s,
            "count": 1, "flops": 2 * 64**3, "bytes_accessed": 3 * 4 * 64**2}]
    return MeasuredProfile.from_measurements("cpu", ops, CPU, step_time_s=time_s)


def test_round_trip(tmp_path):
    profile = one_op_profile()
    profile.save(tmp_path / "p.json")
    again = MeasuredProfile.load(tmp_path / "p.json")
    assert again.to_dict() == profile.to_dict()


def test_a_measured_profile_changes_the_prediction_of_the_measured_op():
    graph = matmul_graph()
    cluster = cluster_of_devices(["cpu"])
    datasheet = CostModel(graph, cluster)
    measured = CostModel(graph, cluster, measured=[one_op_profile(1e-3)])
    small = datasheet.index["small"]
    assert measured.compute[small, 0] == pytest.approx(1e-3)
    assert datasheet.compute[small, 0] != pytest.approx(1e-3)
    # the large op was not measured: it is predicted from the fitted efficiency, which
    # the slow measurement made lower than the datasheet's
    large = datasheet.index["large"]
    assert measured.compute[large, 0] > datasheet.compute[large, 0]


def test_profiles_apply_only_to_their_kind():
    graph = matmul_graph()
    cluster = cluster_of_devices(["cpu", "T4"])
    with_profile = CostModel(graph, cluster, measured=[one_op_profile(1e-3)])
    without = CostModel(graph, cluster)
    assert with_profile.compute[:, 1].tolist() == without.compute[:, 1].tolist()


@given(st.floats(0, 1e13), st.floats(0, 1e13), st.floats(1, 1e12), st.floats(1, 1e12))
def test_roofline_is_monotone_in_flops_and_bytes(flops, nbytes, more_flops, more_bytes):
    for op_type in ("MatMul", "Relu", "Mean", "Transpose"):
        base = roofline_time(op_type, flops, nbytes, CPU)
        assert roofline_time(op_type, flops + more_flops, nbytes, CPU) >= base
        assert roofline_time(op_type, flops, nbytes + more_bytes, CPU) >= base


@pytest.mark.parametrize("mutate,words", [
    (lambda d: "{broken", "not a readable JSON"),
    (lambda d: {**d, "format": "other"}, "format"),
    (lambda d: {**d, "device_kind": "Z80"}, "Z80"),
    (lambda d: {**d, "ops": [{**d["ops"][0], "time_s": -1}]}, "ops[0].time_s"),
    (lambda d: {**d, "ops": [{"op_type": "MatMul"}]}, "ops[0]: lacks"),
    (lambda d: {**d, "fitted": {"efficiency": {"matmul": 0}, "op_overhead_s": 0}},
     "fitted.efficiency"),
])
def test_corrupt_profiles_are_clean_errors(tmp_path, mutate, words):
    data = mutate(one_op_profile().to_dict())
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(ProfileError) as error:
        MeasuredProfile.load(path)
    assert str(path) in str(error.value) and words in str(error.value)


def test_cli_rejects_a_corrupt_profile_in_one_line(tmp_path, capsys):
    from tfpart.cli import main

    path = tmp_path / "bad.json"
    path.write_text("{}")
    assert main(["compile", "--profile", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tfpart_profile_measures_every_op_of_the_example(tmp_path):
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", "profile", str(DEFAULT_MODEL_DIR),
                           "--batch-size", "2", "--repeats", "3", "--warmup", "1", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    profile = MeasuredProfile.load(out)
    conv = [op for op in profile.ops if op["op_type"] == "Conv2D"]
    assert conv and all(op["time_s"] > 0 and op["input_shapes"][0][0] == 2 for op in conv)
    # Timed as TensorFlow runs it (fused kernels), yet no compute op of a group at zero.
    compute = [op for op in profile.ops if op["op_type"] in ("Conv2D", "MatMul", "BiasAdd")]
    assert {op["op_type"] for op in compute} == {"Conv2D", "MatMul", "BiasAdd"}
    assert all(op["time_s"] > 0 for op in compute), compute
    hardware = profile.meta["hardware"]
    forced = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    assert hardware["onednn"] == (forced == "1") if forced in ("0", "1") else \
        isinstance(hardware["onednn"], bool)
    assert "avx" in hardware["cpu_flags"] or "asimd" in hardware["cpu_flags"]
    assert profile.meta["tensorflow"] and profile.meta["hardware"]["intra_op_threads"] == 1
    assert profile.meta["step_time_s"] > 0
    assert shape_key(conv[0]["op_type"], conv[0]["input_shapes"]) in profile._table


@pytest.mark.slow
def test_compile_names_a_profile_measured_with_the_other_onednn_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", "profile", str(DEFAULT_MODEL_DIR),
                           "--batch-size", "2", "--repeats", "2", "--warmup", "1",
                           "-o", str(tmp_path / "p.json")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "p.json").read_text())
    same = subprocess.run([sys.executable, "-m", "tfpart.cli", "compile", "--profile",
                           str(tmp_path / "p.json"), "-o", str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=600)
    assert same.returncode == 0 and "Note:" not in same.stdout
    data["hardware"]["onednn"] = not data["hardware"]["onednn"]
    (tmp_path / "other.json").write_text(json.dumps(data))
    other = subprocess.run([sys.executable, "-m", "tfpart.cli", "compile", "--profile",
                            str(tmp_path / "other.json"), "-o", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=600)
    assert other.returncode == 0, other.stderr
    notes = [line for line in other.stdout.splitlines() if line.startswith("Note:")]
    assert len(notes) == 1 and "oneDNN" in notes[0] and "other.json" in notes[0]


def test_a_profile_of_a_kind_the_cluster_declares_is_read_with_that_cluster(tmp_path):
    """A cluster file may declare its own device kinds; profiles measured on them are
    read with that cluster, and refused, naming the kind, without it."""
    from costmodel.measured import FORMAT
    from profiles import DEVICE_KINDS_FILE
    from tfpart.cluster import cluster_from_dict
    from tfpart.compile import load_profiles

    slow = dict(json.loads(DEVICE_KINDS_FILE.read_text())["kinds"]["cpu"])
    cluster = cluster_from_dict({"kinds": {"cpu_shared_core": slow}, "devices": [
        {"name": "/device:CPU:0", "kind": "cpu"},
        {"name": "/device:CPU:1", "kind": "cpu_shared_core"}]})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "format": FORMAT, "device_kind": "cpu_shared_core", "ops": [{
            "op_type": "MatMul", "input_shapes": [[8, 8], [8, 8]], "time_s": 2e-5,
            "count": 1, "flops": 1024, "bytes_accessed": 768}],
        "fitted": {"efficiency": {"matmul": 0.5}, "op_overhead_s": 0.0}}))
    assert "cpu_shared_core" not in load_device_kinds()
    [profile] = load_profiles([path], cluster)
    assert profile.device_kind == "cpu_shared_core"
    with pytest.raises(ProfileError, match="unknown kind 'cpu_shared_core'"):
        load_profiles([path])


def test_tiny_ops_do_not_set_their_class_throughput():
    """A class's efficiency comes from its ops that do more work than an op's overhead:
    a 4 MB BroadcastTo at 90% of the bandwidth, beside gathers of a few bytes that take
    microseconds, gives about 0.9, not the gathers' 1e-4."""
    from costmodel.measured import fit_efficiency
    from tfpart.cluster import load_device_kinds

    cpu = load_device_kinds()["cpu"]
    overhead = 6.5e-6  # the median time of the ops doing almost no work
    ops = [{"op_type": "Relu", "input_shapes": [[4]], "flops": 0.0, "bytes_accessed": 32.0,
            "time_s": 2e-6, "count": 5},
           {"op_type": "GatherV2", "input_shapes": [[4], [2], []], "flops": 0.0,
            "bytes_accessed": 36.0, "time_s": 1.1e-5, "count": 3},
           {"op_type": "BroadcastTo", "input_shapes": [[64, 1, 1, 256], [4]], "flops": 0.0,
            "bytes_accessed": 4.26e6, "time_s": overhead + 4.26e6 / cpu.memory_bandwidth / 0.9,
            "count": 1}]
    fitted = fit_efficiency(ops, cpu)
    assert fitted["op_overhead_s"] == pytest.approx(overhead)
    assert fitted["efficiency"]["data_movement"] == pytest.approx(0.9)
