import json

import pytest

from profiles import CLUSTERS_DIR
from tfpart.cluster import load_cluster, load_device_kinds
from tfpart.errors import ProfileError
from tfpart.graph import OpGraph
from tfpart.plan import Plan


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
                algorithm="greedy", predicted={"step_time": 1.5}, lower_bound=1.0)
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again == plan and again.gap == pytest.approx(0.5)
