"""Measured profiles: JSON round trip, their effect on predictions, clean errors."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costmodel import CostModel
from costmodel.measured import MeasuredProfile
from costmodel.roofline import roofline_time
from tfpart.core.cluster import cluster_of_devices
from tfpart.core.device_kinds import load_device_kinds
from tfpart.core.errors import ProfileError
from tfpart.core.graph import OpGraph

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


def test_a_profile_of_a_kind_the_cluster_declares_is_read_with_that_cluster(tmp_path):
    """A cluster file may declare its own device kinds; profiles measured on them are
    read with that cluster, and refused, naming the kind, without it."""
    from costmodel.measured import FORMAT
    from profiles import DEVICE_KINDS_FILE
    from tfpart.core.cluster import cluster_from_dict
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
    from tfpart.core.device_kinds import load_device_kinds

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
