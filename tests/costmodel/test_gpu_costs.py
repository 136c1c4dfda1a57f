"""The GPU cost model: precision-aware peaks, fitted kernel efficiencies (a plateau
roofline, waves of tiles over the multiprocessors, a launch floor), calibration from
kernel tables, and kinds described outside the shipped file."""
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel
from costmodel.calibration import KernelRow, fit_kernel_efficiency, kernel_rows, kernel_time
from costmodel.measured import recount_flops
from tests.test_cli_errors import assert_clean_failure, run_cli
from tfpart.core.cluster import cluster_from_dict, cluster_of_devices
from tfpart.core.device_kinds import KernelEfficiency, kinds_from_dict, load_device_kinds
from tfpart.core.graph import OpGraph

GPU = Path(__file__).resolve().parents[3] / "shared" / "gpu"
KERNEL_TIMES = GPU / "h100_kernel_times.json"  # the GPU's own kernel times
needs_gpu_tables = pytest.mark.skipif(not KERNEL_TIMES.is_file(),
                                      reason="../shared/gpu is not checked out beside the repo")
BIG = 2 * 8192 ** 3  # FLOPs of an 8192^3 matmul: compute-bound on every kind
BIG_BYTES = 3 * 4 * 8192 ** 2  # its three float32 matrices: many waves, the plateau


def one_op_graph(op_type, flops, nbytes, dtype="float32"):
    graph = OpGraph()
    graph.add_op("op", op_type=op_type, flops=flops, bytes_accessed=nbytes,
                 outputs=[((8192, 8192), dtype)])
    return graph


def op_seconds(graph, cluster, **kwargs):
    return float(CostModel(graph, cluster, **kwargs).compute[0, 0])


# -- the fit ---------------------------------------------------------------------------
efficiencies = st.builds(
    lambda launch, memory, tf32, fp32: KernelEfficiency(
        compute={"tf32": tf32, "fp32": fp32}, memory=memory, launch_s=launch),
    st.floats(2e-6, 5e-5), st.floats(0.1, 1.0), st.floats(0.1, 1.0), st.floats(0.1, 1.0))


@settings(max_examples=30, deadline=None)
@given(efficiencies, st.sampled_from(["Conv2D", "MatMul"]))
def test_the_fit_recovers_the_parameters_of_a_synthetic_table(truth, op_type):
    # the plain roofline alone (no multiprocessors: no tile sizes tried); the waves'
    # tile size is recovered below and in costmodel.calibration's example
    kind = dataclasses.replace(load_device_kinds()["H100"], multiprocessors=None)
    rows = []
    for precision in ("tf32", "fp32"):
        for scale in (1e3, 1e6, 1e8, 1e10, 1e12):  # floor-, memory- and compute-bound
            for intensity in (0.5, 20.0, 1e5):  # FLOPs per byte, memory- to compute-bound
                rows.append(KernelRow(op_type, scale, scale / intensity, precision, 0.0, 1,
                                      precision))
    table = {"matmul": truth}
    rows = [row._replace(time_s=kernel_time(row, kind, table)) for row in rows]
    fitted = fit_kernel_efficiency(rows, kind)["matmul"]
    assert fitted.launch_s == pytest.approx(truth.launch_s, rel=0.02)
    assert fitted.memory == pytest.approx(truth.memory, rel=0.02)
    for precision in ("tf32", "fp32"):
        assert fitted.compute[precision] == pytest.approx(truth.compute[precision], rel=0.02)


def test_the_fit_recovers_a_tile_size_and_keeps_the_plain_roofline_without_waves():
    kind = load_device_kinds()["H100"]
    truth = KernelEfficiency({"tf32": 0.6, "bf16": 0.4}, memory=0.8, launch_s=4e-6,
                             tile_elements=3e4)
    sizes = [(2 * n ** 3, 12 * n ** 2) for n in (64, 256, 512, 1024, 2048, 4096)]
    rows = [KernelRow("MatMul", flops, nbytes * (0.5 if p == "bf16" else 1), p, 0.0, 1, p)
            for flops, nbytes in sizes for p in ("tf32", "bf16")]
    waves = [row._replace(time_s=kernel_time(row, kind, {"gemm": truth})) for row in rows]
    fitted = fit_kernel_efficiency(waves, kind)["gemm"]
    assert fitted.tile_elements == pytest.approx(3e4, rel=0.01)
    assert fitted.compute == pytest.approx(truth.compute, rel=0.01)
    plain = dataclasses.replace(truth, tile_elements=0.0)
    flat = [row._replace(time_s=kernel_time(row, kind, {"gemm": plain})) for row in rows]
    assert fit_kernel_efficiency(flat, kind)["gemm"].tile_elements == 0.0


def test_a_class_without_enough_rows_falls_back_to_its_coarse_class():
    kind = load_device_kinds()["H100"]
    rows = [KernelRow("Conv2D", f, f / 50, "tf32", 1e-5 + f / 2e14, 1, "tf32")
            for f in (1e6, 1e9, 1e11, 1e12)]
    rows.append(KernelRow("Conv2DBackpropInput", 1e11, 2e9, "tf32", 3e-3, 1, "tf32"))
    fitted = fit_kernel_efficiency(rows, kind)
    assert "conv" in fitted and "matmul" in fitted
    assert "conv_backprop_input" not in fitted  # one row is not a fit
    lone = kind.kernel_efficiency("Conv2DBackpropInput", fitted)
    assert lone == fitted["matmul"]


# -- precisions ----------------------------------------------------------------------
@pytest.mark.parametrize("op_type", ["MatMul", "Conv2D"])
def test_tf32_off_slows_float32_matmuls_and_convolutions_by_the_peaks_ratio(op_type):
    h100 = load_device_kinds()["H100"]
    cluster = cluster_of_devices(["H100"])
    graph = one_op_graph(op_type, BIG, BIG_BYTES)
    on, off = op_seconds(graph, cluster), op_seconds(graph, cluster, tf32=False)
    fraction = h100.kernel_efficiency(op_type)
    expected = (h100.peak("tf32") * fraction.compute_at("tf32")) / (
        h100.peak("fp32") * fraction.compute_at("fp32"))
    assert off > on
    assert off / on == pytest.approx(expected, rel=0.01)
    peaks = h100.peak("tf32") / h100.peak("fp32")
    assert 0.5 * peaks < off / on < 2 * peaks  # about the datasheet's ratio


def test_tf32_false_in_cluster_json_is_the_same_as_the_option():
    graph = one_op_graph("MatMul", BIG, BIG_BYTES)
    off = cluster_from_dict({"tf32": False, "devices": [{"name": "/device:GPU:0",
                                                           "kind": "H100"}]})
    assert op_seconds(graph, off) == op_seconds(graph, cluster_of_devices(["H100"]),
                                                tf32=False)


def test_tf32_changes_nothing_off_the_matrix_units_or_on_kinds_without_it():
    relu = one_op_graph("Relu", 1e9, 8e9)
    h100 = cluster_of_devices(["H100"])
    assert op_seconds(relu, h100) == op_seconds(relu, h100, tf32=False)
    matmul = one_op_graph("MatMul", BIG, BIG_BYTES)
    v100 = cluster_of_devices(["V100"])  # Volta has no TF32
    assert op_seconds(matmul, v100) == op_seconds(matmul, v100, tf32=False)


@pytest.mark.parametrize("kind_name, dtype, precision", [
    ("H100", "bfloat16", "bf16"), ("V100", "float16", "fp16")])  # Volta has no bf16
def test_a_half_precision_graph_runs_matmuls_at_the_half_precision_peak(kind_name, dtype,
                                                                        precision):
    kind = load_device_kinds()[kind_name]
    cluster = cluster_of_devices([kind_name])
    single = op_seconds(one_op_graph("MatMul", BIG, BIG_BYTES), cluster, tf32=False)
    half = op_seconds(one_op_graph("MatMul", BIG, BIG_BYTES / 2, dtype=dtype), cluster)
    fraction = kind.kernel_efficiency("MatMul")
    expected = (kind.peak(precision) * fraction.compute_at(precision)) / (
        kind.peak_flops * fraction.compute_at("fp32"))
    assert single / half == pytest.approx(expected, rel=0.01)
    assert single / half > 2


# -- kinds the project does not ship ---------------------------------------------------
def test_a_new_kind_inherits_a_calibrated_table_and_follows_its_own_datasheet():
    h100 = load_device_kinds()["H100"]
    faster_memory = {
        "description": "an H100 with 1.4x the bandwidth",
        "peak_flops": {k: v for k, v in h100.peaks.items()},
        "memory_bandwidth": 1.4 * h100.memory_bandwidth, "memory": h100.memory,
        "host_link_bandwidth": h100.host_link_bandwidth,
        "peer_link_bandwidth": h100.peer_link_bandwidth,
        "efficiency_from": "H100", "source": "a test"}
    cluster = cluster_from_dict({"kinds": {"H100-fast-memory": faster_memory}, "devices": [
        {"name": "/device:GPU:0", "kind": "H100"},
        {"name": "/device:GPU:1", "kind": "H100-fast-memory"}]})
    graph = OpGraph()
    graph.add_op("memory_bound", op_type="AddV2", flops=1e9, bytes_accessed=1.2e10,
                 outputs=[((10 ** 9,), "float32")])
    graph.add_op("compute_bound", op_type="MatMul", flops=BIG, bytes_accessed=BIG_BYTES,
                 outputs=[((8192, 8192), "float32")])
    cost = CostModel(graph, cluster)
    memory_bound = cost.compute[cost.index["memory_bound"]]
    compute_bound = cost.compute[cost.index["compute_bound"]]
    overhead = h100.op_overhead_s
    assert (memory_bound[0] - overhead) / (memory_bound[1] - overhead) == \
        pytest.approx(1.4, rel=1e-6)
    assert compute_bound[0] == pytest.approx(compute_bound[1], rel=1e-9)


def test_a_kinds_file_beside_the_cluster_file(tmp_path):
    (tmp_path / "kinds.json").write_text(json.dumps({"kinds": {"MyGPU": {
        "peak_flops": {"fp32": 2e13, "tf32": 1.5e14}, "memory_bandwidth": 1e12,
        "memory": 4.8e10, "host_link_bandwidth": 3.2e10, "peer_link_bandwidth": 3.2e10,
        "efficiency_from": "H100", "source": "a test"}}}))
    (tmp_path / "cluster.json").write_text(json.dumps({
        "kinds_file": "kinds.json", "devices": [{"name": "/device:GPU:0", "kind": "MyGPU"}]}))
    from tfpart.core.cluster import load_cluster

    cluster = load_cluster(tmp_path / "cluster.json")
    assert cluster.devices[0].kind.efficiency == load_device_kinds()["H100"].efficiency
    assert cluster.devices[0].memory == 4.8e10


# -- kernel tables and tfpart calibrate ------------------------------------------------
def kernel_table(ops):
    return {"format": "tfpart-measured-profile/1", "device_kind": "H100", "model": "t",
            "ops": ops}


def kernel(op_type="Relu", flops=1e6, nbytes=8e6, time_s=2e-5, **extra):
    return dict({"op_type": op_type, "input_shapes": [[1000, 1000]],
                 "output_shapes": [[1000, 1000]], "flops": flops, "bytes_accessed": nbytes,
                 "time_s": time_s, "count": 1}, **extra)


@pytest.mark.parametrize("corrupt, field", [
    (lambda ops: ops[1].update(time_s="fast"), "ops[1].time_s"),
    (lambda ops: ops[2].update(time_s_bf16=-1), "ops[2].time_s_bf16"),
    (lambda ops: ops[0].pop("flops"), "ops[0]: lacks flops"),
    (lambda ops: ops[3].update(input_shapes=[[2, "x"]]), "ops[3].input_shapes"),
])
def test_a_malformed_kernel_table_is_one_line_naming_the_field(capsys, tmp_path, corrupt,
                                                               field):
    ops = [kernel(nbytes=n) for n in (1e5, 1e6, 1e7, 1e8)]
    corrupt(ops)
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(kernel_table(ops)))
    out = tmp_path / "kinds.json"
    code, err = run_cli(capsys, "calibrate", str(path), "-o", str(out))
    assert_clean_failure(code, err, str(path), field)
    assert not out.exists()


def test_calibrate_writes_a_kind_that_loads_and_predicts_its_own_kernels(capsys, tmp_path):
    ops = [kernel(nbytes=n, time_s=max(1e-5, n / 2e12), count=2)
           for n in (1e4, 1e6, 1e8, 1e9, 4e9)]
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(kernel_table(ops)))
    out = tmp_path / "kinds.json"
    assert main_ok(capsys, "calibrate", str(path), "-o", str(out))
    h100 = load_device_kinds(out)["H100"]
    fitted = h100.kernel_efficiency("Relu")
    assert fitted.launch_s == pytest.approx(1e-5, rel=0.02)
    assert fitted.memory == pytest.approx(2e12 / h100.memory_bandwidth, rel=0.02)
    assert "calibrated" in h100.source
    assert set(load_device_kinds(out)) == {"H100"}  # a new file holds the one kind


def main_ok(capsys, *argv):
    from tfpart.cli import main

    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 0, err
    return True


def test_a_kernel_table_profile_uses_the_exact_shape_and_the_precision_column():
    ops = [kernel(nbytes=n, time_s=max(1e-5, n / 2e12)) for n in (1e4, 1e6, 1e8, 1e9)]
    ops.append(kernel("MatMul", flops=2e9, nbytes=1.2e7, time_s=3e-5, time_s_fp32=9e-5,
                      input_shapes=[[1000, 1000], [1000, 1000]]))
    h100 = load_device_kinds()["H100"]
    from costmodel.measured import kernel_table_profile

    profile = kernel_table_profile("H100", ops, h100)
    attrs = {"op_type": "MatMul", "input_shapes": ((1000, 1000), (1000, 1000)),
             "flops": 2e9, "bytes_accessed": 1.2e7}
    overhead = h100.op_overhead_s  # kernels exclude TensorFlow's own per-op cost
    assert profile.op_time(attrs, h100, "tf32") == pytest.approx(3e-5 + overhead)
    assert profile.op_time(attrs, h100, "fp32") == pytest.approx(9e-5 + overhead)
    other = dict(attrs, input_shapes=((999, 1000), (1000, 1000)))  # not measured: fitted
    assert profile.op_time(other, h100, "tf32") != pytest.approx(3e-5 + overhead)


@needs_gpu_tables
def test_the_shipped_h100_is_the_fit_of_the_gpus_own_kernel_times():
    from tfpart.calibrate import calibrate

    name, entry, fitted = calibrate(KERNEL_TIMES, GPU / "h100_links.json")
    shipped = load_device_kinds()["H100"]
    assert name == "H100" and set(fitted) == set(shipped.efficiency)
    for cls, value in fitted.items():  # as the kinds file holds it: 4 significant digits
        assert shipped.efficiency[cls] == KernelEfficiency.parse(value.to_json()), cls
    assert "calibrated: " in shipped.source and shipped.source == entry["source"]
    assert "h100_kernel_times.json (461 kernels)" in shipped.source
    assert "h100_kernels.json" not in shipped.source  # the host-dispatch table is gone
    # the GPU's own floor: a tiny kernel replayed from a CUDA graph takes about 1.3 us
    assert 1e-6 < shipped.efficiency["elementwise"].launch_s < 2e-6
    assert max(value.launch_s for value in shipped.efficiency.values()) < 25e-6
    assert shipped.host_link_bandwidth == entry["host_link_bandwidth"]
    assert 40e9 < shipped.host_link_bandwidth < 64e9  # pinned PCIe Gen5, measured ~54 GB/s
    assert 15e-6 < shipped.host_link_latency < 30e-6


# Per kernel, the shipped H100 against its measurement: the classifier of ResNet50 at
# batch 1 (4 MFLOP, a GEMV reading 8 MB, faster than the waves of a matmul's tiles
# say) within a factor of 2.2, BERT's 4096x768x3072 projection (19 GFLOP) within 25%.
@needs_gpu_tables
@pytest.mark.parametrize("shapes, tolerance", [
    ([[1, 2048], [2048, 1000]], 2.2), ([[4096, 768], [768, 3072]], 1.25)])
def test_a_tiny_and_a_huge_matmul_are_predicted_near_their_kernel_times(shapes, tolerance):
    h100 = load_device_kinds()["H100"]
    op = next(op for op in json.loads(KERNEL_TIMES.read_text())["ops"]
              if op["op_type"] == "MatMul" and op["input_shapes"] == shapes)
    rows = kernel_rows([recount_flops(op)], h100)
    assert {row.setting for row in rows} == {"tf32", "fp32", "bf16"}
    for row in rows:
        ratio = kernel_time(row, h100, None) / row.time_s
        assert 1 / tolerance < ratio < tolerance, (row.setting, ratio)


def test_small_kernels_fill_a_device_of_fewer_multiprocessors_sooner():
    h100 = load_device_kinds()["H100"]
    entry = {"peak_flops": dict(h100.peaks), "memory_bandwidth": h100.memory_bandwidth,
             "memory": h100.memory, "host_link_bandwidth": h100.host_link_bandwidth,
             "peer_link_bandwidth": h100.peer_link_bandwidth, "efficiency_from": "H100",
             "source": "a test"}
    kinds = kinds_from_dict({"same": entry, "half": dict(entry, multiprocessors=66)},
                            "kinds.json", known=load_device_kinds())
    assert kinds["same"].multiprocessors == 132  # inherited with the efficiencies
    small, large = (KernelRow("MatMul", 2 * n ** 3, 12 * n ** 2, "tf32", 0.0, 1, "tf32")
                    for n in (512, 8192))
    assert kernel_time(small, kinds["half"], None) < 0.8 * kernel_time(small, kinds["same"], None)
    assert kernel_time(large, kinds["half"], None) == pytest.approx(
        kernel_time(large, kinds["same"], None), rel=0.02)
    assert kernel_time(small, kinds["same"], None) == kernel_time(small, h100, None)


def test_a_kinds_file_without_the_new_figures_keeps_the_old_formula():
    old = {"peak_flops": {"fp32": 1e13}, "memory_bandwidth": 1e12, "memory": 1e10,
           "host_link_bandwidth": 1e10, "peer_link_bandwidth": 1e10, "op_overhead_s": 5e-6,
           "source": "x", "efficiency": {"matmul": {"compute": {"fp32": 0.5}, "memory": 0.5,
                                                    "launch_s": 2e-5}, "elementwise": 0.8}}
    kind = kinds_from_dict({"Old": old}, "kinds.json")["Old"]
    assert kind.multiprocessors is None and kind.op_overhead_source is None
    for flops, nbytes in ((1e3, 1e3), (1e9, 1e6), (1e6, 1e9)):
        row = KernelRow("MatMul", flops, nbytes, "fp32", 0.0, 1, "fp32")
        assert kernel_time(row, kind, None) == max(2e-5, flops / 5e12, nbytes / 5e11)


def test_every_shipped_kind_says_where_its_dispatch_cost_comes_from():
    kinds = load_device_kinds()
    for name, kind in kinds.items():
        assert kind.op_overhead_source and kind.op_overhead_s > 0, name
        if name != "cpu":
            assert kind.multiprocessors, name
            assert kind.efficiency == kinds["H100"].efficiency, name  # derived from the fit
    assert "host" in kinds["H100"].op_overhead_source


@pytest.mark.parametrize("field, value, words", [
    ("multiprocessors", 0, "multiprocessors must be a positive whole number"),
    ("multiprocessors", 13.5, "multiprocessors must be a positive whole number"),
    ("op_overhead_source", 5, "op_overhead_source must be a non-empty string"),
    ("efficiency", {"gemm": {"compute": {"any": 1}, "memory": 1, "tile_elements": -1}},
     "tile_elements"),
])
def test_a_kinds_file_with_a_bad_new_figure_is_one_line_naming_it(capsys, tmp_path, field,
                                                                   value, words):
    h100 = json.loads((Path(__file__).resolve().parents[2] / "profiles" /
                       "device_kinds.json").read_text())["kinds"]["H100"]
    kinds = tmp_path / "kinds.json"
    kinds.write_text(json.dumps({"kinds": {"H100": dict(h100, **{field: value})}}))
    table = tmp_path / "kernels.json"
    table.write_text(json.dumps(kernel_table([kernel(nbytes=n) for n in (1e5, 1e6, 1e7)])))
    code, err = run_cli(capsys, "calibrate", str(table), "--kinds", str(kinds))
    assert_clean_failure(code, err, str(kinds), "'H100'", words)
