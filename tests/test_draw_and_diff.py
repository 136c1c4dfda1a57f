"""The placement picture (``compile --draw``, ``tfpart.draw``) and ``tfpart diff``."""
import json
import re
import shutil

import pytest

from tfpart.cli import main
from tfpart.picture import draw, placement_picture
from tfpart.core.plan import Plan


def compile_example(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["compile", "--batch-size", "4", "-o", str(out), *extra]) == 0
    return out


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed "
                    "(CI installs it; without it the DOT file is kept, tested below)")
def test_compile_draws_an_svg_of_every_device_it_uses(tmp_path, capsys):
    picture = tmp_path / "placement.svg"
    out = compile_example(tmp_path, "out", "--algorithm", "round_robin",
                          "--draw", str(picture))
    svg = picture.read_text()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    plan = json.loads((out / "plan.json").read_text())
    for device in set(plan["assignment"].values()):
        short = device.replace("/replica:0", "").replace("device:", "").lstrip("/")
        assert short in svg
    assert f"placement picture: {picture}" in capsys.readouterr().out


def test_without_dot_the_dot_file_is_kept_with_how_to_render_it(tmp_path, monkeypatch):
    plan = Plan(assignment={"x": "gpu:0", "y": "gpu:1"})
    from tfpart.core.graph import OpGraph

    graph = OpGraph()
    graph.add_op("x")
    graph.add_op("y")
    graph.add_edge("x", "y", bytes=3e6)
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    written, note, _ = draw(plan, graph, tmp_path / "picture.svg")
    assert written == tmp_path / "picture.dot" and not (tmp_path / "picture.svg").exists()
    assert "3.0 MB" in written.read_text()
    assert "dot -Tsvg" in note and str(written) in note and "\n" not in note


@pytest.mark.slow
@pytest.mark.any_onednn
def test_resnet50_picture_is_readable_and_shows_every_device_and_crossing(exported):
    from profiles import CLUSTERS_DIR
    from tfpart.core.cluster import load_cluster
    from tfpart.compile import plan_model

    cluster = load_cluster(CLUSTERS_DIR / "hetero_2v100_2t4.json")
    planned = plan_model(exported("resnet50"), cluster, batch_size=32)
    plan, graph = planned.plan, planned.graph
    picture = placement_picture(plan, graph)
    used = set(plan.assignment.values())
    assert picture.nodes <= 60 and set(picture.devices) == used
    crossings = sum(plan.assignment[u] != plan.assignment[v] and not e["control"]
                    for u, v, e in graph.edges())
    assert (picture.crossing > 0) == (crossings > 0)
    red = [line for line in picture.dot.source.splitlines() if 'color="#d62728"' in line]
    assert len(red) == picture.crossing
    assert all(re.search(r'label="[\d.]+ [KMG]?B"', line) for line in red)
    alone = Plan(assignment=dict.fromkeys(plan.assignment, sorted(used)[0]))
    one = placement_picture(alone, graph)
    assert one.crossing == 0 and "one device, nothing crosses" in one.dot.source


def test_diff_of_a_plan_with_itself_reports_no_change(tmp_path, capsys):
    out = compile_example(tmp_path, "out")
    capsys.readouterr()
    plan = str(out / "plan.json")
    assert main(["diff", plan, plan]) == 0
    assert "no change" in capsys.readouterr().out


def test_diff_reports_moved_ops_and_both_step_times(tmp_path, capsys):
    greedy = compile_example(tmp_path, "greedy", "--algorithm", "greedy") / "plan.json"
    spread = compile_example(tmp_path, "spread", "--algorithm", "round_robin") / "plan.json"
    capsys.readouterr()
    assert main(["diff", str(greedy), str(spread)]) == 0
    text = capsys.readouterr().out
    before, after = (Plan.load(p) for p in (greedy, spread))
    moved = sum(before.assignment[op] != after.assignment[op] for op in before.assignment)
    assert moved > 0 and f"{moved} ops moved" in text
    assert f"{before.predicted.step_time * 1e3:.3f} ms -> " \
           f"{after.predicted.step_time * 1e3:.3f} ms" in text
    assert "algorithm: greedy -> round_robin" in text


def test_diff_of_a_file_that_is_not_a_plan_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "plan.json"
    bad.write_text("{\"assignment\": 3}")
    code = main(["diff", str(bad), str(bad)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and str(bad) in err and len(err.splitlines()) == 1



def test_a_data_parallel_picture_says_every_replica_runs_every_op():
    from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR
    from tfpart.core.cluster import load_cluster
    from tfpart.compile import plan_model
    from tfpart.picture import placement_picture

    planned = plan_model(DEFAULT_MODEL_DIR, load_cluster(DEFAULT_CLUSTER_FILE),
                         batch_size=8, algorithm="data_parallel", options={"replicas": 3})
    plan, graph = planned.plan, planned.graph
    title = placement_picture(plan, graph).dot.graph_attr["label"]
    assert title.startswith(f"data parallel: all {len(graph)} ops on each of 3 replicas")
    assert "nothing crosses" not in title


def test_a_dense_tangle_draws_only_its_heaviest_edges_and_says_so():
    """Every scope feeding every later one on alternating devices: 780 edges between
    40 boxes; the picture keeps the 150 heaviest (crossing ones first) and its title
    counts the rest, so Graphviz lays it out in well under a second."""
    from tfpart.core.graph import OpGraph

    graph = OpGraph()
    names = [f"net/layer{k}/op" for k in range(40)]
    for name in names:
        graph.add_op(name)
    for i, u in enumerate(names):
        for j in range(i + 1, len(names)):
            graph.add_edge(u, names[j], bytes=float(1000 * (i + j)))
    plan = Plan(assignment={name: f"/device:CPU:{k % 2}" for k, name in enumerate(names)})
    picture = placement_picture(plan, graph)
    edges = [line for line in picture.dot.source.splitlines() if "->" in line]
    assert len(edges) == 150 and picture.crossing == 150
    assert picture.left_out == 780 - 150
    assert f"the {780 - 150} lightest edges between boxes are not drawn" in \
        picture.dot.graph_attr["label"]
