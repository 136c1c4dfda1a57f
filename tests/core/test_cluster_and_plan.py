import json

import pytest

from profiles import CLUSTERS_DIR
from tfpart.core.cluster import load_cluster
from tfpart.core.device_kinds import load_device_kinds
from tfpart.core.errors import PlacementError, ProfileError
from tfpart.core.graph import OpGraph
from tfpart.core.plan import DeviceFigures, Plan, Predicted, Stages


@pytest.mark.parametrize("path", sorted(CLUSTERS_DIR.glob("*.json")), ids=lambda p: p.name)
def test_shipped_clusters_load(path):
    cluster = load_cluster(path)
    assert len(cluster) >= 3
    assert all(link.bandwidth > 0 for link in cluster.links.values())


def test_heterogeneous_example_spans_two_hosts_with_slower_cross_host_links():
    cluster = load_cluster(CLUSTERS_DIR / "hetero_2v100_2t4.json")
    kinds = {d.kind.name for d in cluster.devices}
    assert {"V100", "T4"} <= kinds and len({d.host for d in cluster.devices}) == 2
    assert cluster.link(0, 1).bandwidth > cluster.link(0, 2).bandwidth  # NVLink vs network


def test_device_kinds_have_sources_and_required_kinds():
    kinds = load_device_kinds()
    for name in ("cpu", "V100", "T4", "A100", "H100", "L4"):
        assert kinds[name].source and kinds[name].peak_flops > 0


def test_corrupt_device_kind_profile_is_a_clean_error(tmp_path):
    path = tmp_path / "kinds.json"
    path.write_text(json.dumps({"kinds": {"X": {"peak_flops": {"fp32": -1}}}}))
    with pytest.raises(ProfileError, match="lacks"):
        load_device_kinds(path)


def test_plan_json_round_trip(tmp_path):
    graph = OpGraph()
    graph.add_op("a")
    plan = Plan(assignment={"a": "/job:localhost/replica:0/task:0/device:CPU:0"},
                algorithm="greedy", predicted=Predicted(step_time=1.5, devices={}), lower_bound=1.0)
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again == plan and again.gap == pytest.approx(0.5)


def test_plan_json_is_checked_against_its_schema(tmp_path):
    path = tmp_path / "plan.json"
    plan = Plan(assignment={"a": "/device:CPU:0"}, predicted=Predicted(
        step_time=1.0, devices={"/device:CPU:0": DeviceFigures(
            kind="cpu", busy_s=1.0, peak_memory_bytes=8.0, memory_bytes=64.0)}))
    plan.save(path)
    assert Plan.load(path).predicted.devices["/device:CPU:0"].busy_s == 1.0
    data = json.loads(path.read_text())
    data["predicted"]["devices"]["/device:CPU:0"]["busy_s"] = "fast"
    path.write_text(json.dumps(data))
    with pytest.raises(PlacementError, match="predicted.devices./device:CPU:0.busy_s"):
        Plan.load(path)
    data["format_version"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(PlacementError, match="format_version"):
        Plan.load(path)


def test_a_plan_written_before_live_ranges_still_loads(tmp_path):
    """Plans of earlier versions carry the all-alive ``memory_bound_bytes`` and, for an
    inference pipeline, no peak: the bound stands in for the missing peak."""
    path = tmp_path / "plan.json"
    Plan(assignment={"a": "/device:CPU:0"}, predicted=Predicted(
        step_time=1.0, devices={"/device:CPU:0": DeviceFigures(
            kind="cpu", busy_s=1.0, peak_memory_bytes=8.0, memory_bytes=64.0)})).save(path)
    data = json.loads(path.read_text())
    figures = data["predicted"]["devices"]["/device:CPU:0"]
    figures["memory_bound_bytes"], figures["peak_memory_bytes"] = 32.0, None
    path.write_text(json.dumps(data))
    assert Plan.load(path).predicted.devices["/device:CPU:0"].peak_memory_bytes == 32.0


def test_a_pipeline_plan_of_format_2_loads_as_one_stages_object(tmp_path):
    """Format 2 kept a pipeline's stages, micro-batches and schedule as three top-level
    fields; it still loads, into the one ``Stages`` format 3 writes. Format 3 refuses
    the top-level fields, which would silently disagree with its stages."""
    path = tmp_path / "plan.json"
    plan = Plan(assignment={"a": "A", "b": "B"},
                stages=Stages({"a": 0, "b": 1}, microbatches=4, schedule="1f1b"))
    plan.save(path)
    written = json.loads(path.read_text())
    assert written["format_version"] == 3 and "microbatches" not in written
    assert written["stages"] == {"of": {"a": 0, "b": 1}, "microbatches": 4, "schedule": "1f1b"}
    assert Plan.load(path) == plan
    old = {**written, "format_version": 2, "stages": {"a": 0, "b": 1},
           "microbatches": 4, "schedule": "1f1b"}
    path.write_text(json.dumps(old))
    loaded = Plan.load(path)
    assert loaded == plan and (loaded.microbatches, loaded.schedule) == (4, "1f1b")
    path.write_text(json.dumps({**written, "microbatches": 4}))
    with pytest.raises(PlacementError, match="format 3 or 2"):
        Plan.load(path)
    path.write_text(json.dumps({**old, "stages": written["stages"]}))
    with pytest.raises(PlacementError, match="stages"):
        Plan.load(path)
