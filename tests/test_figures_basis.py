"""Each device's figures say what they came from (issue 56, "say how sure"): a measured
profile, a calibrated kind or a datasheet, with the links' and the host dispatch's
basis, in plan.json, the summary ``tfpart compile`` prints and the report."""
import json

import jsonschema
import pytest

from costmodel import CostModel
from costmodel.figures_basis import (cluster_links, figures_basis, figures_line,
                                     links_basis)
from costmodel.measured import MeasuredProfile
from tfpart.core.cluster import cluster_from_dict, load_cluster
from tfpart.core.device_kinds import load_device_kinds
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph
from tfpart.core.plan import SCHEMA_FILE, Plan

CPU = load_device_kinds()["cpu"]
MIXED = [("/device:CPU:0", "cpu"), ("/device:GPU:0", "H100"), ("/device:GPU:1", "H100"),
         ("/device:GPU:2", "MyGPU"), ("/device:GPU:3", "L4")]
# a kind a user defines from its datasheet, with the efficiencies of a calibrated one
MY_GPU = {"peak_flops": {"fp32": 2e13}, "memory_bandwidth": 1e12, "memory": 2e10,
          "host_link_bandwidth": 3e10, "peer_link_bandwidth": 3e10, "source": "datasheet",
          "efficiency_from": "H100"}


def _matmuls(sizes=(64, 128, 256)):
    """One matmul of each size, fed by a constant (which costs nothing)."""
    graph = OpGraph()
    graph.add_op("w", op_type="Const", outputs=[((64, 64), "float32")])
    for n in sizes:
        graph.add_op(f"mm{n}", op_type="MatMul", input_shapes=((n, 64), (64, 64)),
                     flops=2.0 * n * 64 * 64, bytes_accessed=4.0 * (2 * n * 64 + 64 * 64),
                     outputs=[((n, 64), "float32")])
        graph.add_edge("w", f"mm{n}", bytes=4.0 * 64 * 64)
    return graph


def _profile(step_time_s=None):
    """A cpu profile that measured the 64-row matmul only."""
    ops = [{"op_type": "MatMul", "input_shapes": [[64, 64], [64, 64]], "time_s": 3e-4,
            "count": 1, "flops": 2.0 * 64**3, "bytes_accessed": 4.0 * 3 * 64**2}]
    return MeasuredProfile.from_measurements("cpu", ops, CPU, step_time_s=step_time_s)


def _cluster(devices=MIXED, links=None):
    data = {"name": "mixed", "kinds": {"MyGPU": MY_GPU}, "devices": [
        {"name": n, "kind": k, "memory": "4GB"} for n, k in devices]}
    return cluster_from_dict(dict(data, links=links) if links else data)


def test_datasheet_calibrated_and_measured_devices_say_so():
    graph, cluster = _matmuls(), _cluster()
    cost = CostModel(graph, cluster, measured=[_profile(step_time_s=2e-3)])
    devices = figures_basis(cost)["devices"]
    cpu, h100, _, mine, l4 = (devices[d.name] for d in cluster.devices)
    # the profile times one of the three priced matmuls, and the cost model uses it
    assert (cpu["basis"], cpu["measured_ops"], cpu["priced_ops"]) == ("measured", 1, 3)
    assert cpu["kind_basis"] == "datasheet" and cpu["dispatch"] == "measured"
    timed = cost.compute[cost.index["mm64"], 0]
    assert timed == pytest.approx(3e-4 + _profile(2e-3).fitted["dispatch_overhead_s"])
    assert h100["basis"] == "calibrated" and h100["kernels"] > 100
    assert mine == {"kind": "MyGPU", "basis": "datasheet", "efficiency_from": "H100",
                    "dispatch": "kind", "dispatch_source": mine["dispatch_source"]}
    assert l4["basis"] == "datasheet" and l4["efficiency_from"] == "H100"  # shipped, derived
    # a kernel table (no step measured) leaves the host dispatch to the kind
    assert figures_basis(CostModel(graph, cluster, measured=[_profile()]))["devices"][
        cluster.devices[0].name]["dispatch"] == "kind"


def test_the_summary_line_groups_devices_and_says_what_to_measure():
    cost = CostModel(_matmuls(), _cluster(), measured=[_profile()])
    line = figures_line(figures_basis(cost, links={}))
    assert line.startswith("Figures: CPU:0 measured cpu (1 of 3 ops timed by its profile")
    assert "; GPU:0, GPU:1 calibrated H100 (fit to " in line
    assert "; GPU:2 datasheet MyGPU (efficiencies of calibrated H100); GPU:3 datasheet L4 " \
        "(efficiencies of calibrated H100);" in line
    assert line.endswith("; links default; host dispatch from the kinds file. To measure them: "
                         "time MyGPU and L4 (`tfpart profile` on a CPU, `tfpart "
                         "calibrate` from a GPU's kernel times), probe the links "
                         "(`tfpart cluster probe`)")


def test_links_probed_written_and_default_are_counted_by_pairs(write_cluster):
    names = [f"/job:worker/task:{t}/device:CPU:{i}" for t in (0, 1) for i in (0, 1)]
    probed = {"between": names[:2], "bandwidth": "2GB/s", "latency": "20us",
              "measured": {"bandwidth": [2e9, 2e9, 2e9]}}
    written = {"between": [names[0], names[2]], "bandwidth": "1GB/s"}
    path = write_cluster({"devices": [{"name": n, "kind": "cpu"} for n in names],
                          "links": {"cross_host": {"bandwidth": "1Gbit/s"},
                                    "pairs": [probed, written]}})
    cluster = load_cluster(path)
    links = cluster_links(cluster)
    # 6 pairs: one probed, one written, 3 more between hosts (cross_host is written),
    # the other pair on one host left to the default
    assert links_basis(cluster, links) == {"probed": 1, "written": 4, "default": 1}
    assert cluster_links(_cluster()) is None  # not read from a file: not known
    assert links_basis(_cluster([(n, "cpu") for n in names]), {}) == {"probed": 0, "written": 0, "default": 6}


def test_plan_json_keeps_the_basis_and_its_schema_checks_it(tmp_path):
    cluster = _cluster()
    plan = Plan(assignment={"w": cluster.device_names[0]}, context={
        "figures": figures_basis(CostModel(_matmuls(), cluster, measured=[_profile()]),
                                 links={})})
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json").figures == plan.figures
    schema = json.loads(SCHEMA_FILE.read_text())
    bad = json.loads(plan.to_json())
    next(iter(bad["context"]["figures"]["devices"].values()))["basis"] = "guessed"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlacementError, match="basis"):
        Plan.load(tmp_path / "bad.json")


@pytest.mark.slow
@pytest.mark.any_onednn  # what the figures came from, not what they are
def test_compile_records_prints_and_reports_it(tmp_path, capsys, monkeypatch):
    from profiles import CLUSTERS_DIR
    from tfpart import cli_output
    from tfpart.cli import main

    monkeypatch.setattr(cli_output.console, "width", 10_000)
    out = tmp_path / "out"
    assert main(["compile", "--cluster", str(CLUSTERS_DIR / "h100_a100_l4_one_host.json"),
                 "--batch-size", "4", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(text for text in printed.splitlines() if text.startswith("Figures:"))
    assert "GPU:0 calibrated H100" in line and \
        "GPU:2, GPU:3 datasheet L4 (efficiencies of calibrated H100);" in line
    assert "CPU:0 datasheet cpu" in line and "links default" in line
    assert "time A100-40GB, L4 and cpu (`tfpart profile` on a CPU" in line
    plan = Plan.load(out / "plan.json")  # validated against its schema
    assert set(plan.figures["devices"]) == set(plan.predicted.devices)
    assert {d["basis"] for d in plan.figures["devices"].values()} == {"calibrated",
                                                                       "datasheet"}
    assert plan.figures["links"] == {"probed": 0, "written": 0, "default": 10}
    page = (out / "report.html").read_text()
    assert "Where these figures come from" in page and "datasheet A100-40GB" in page
