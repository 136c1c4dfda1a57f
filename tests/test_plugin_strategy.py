"""A new strategy is one module: installed as a plug-in (an entry point of the
``tfpart.algorithms`` group), it compiles, verifies, reports and simulates end to end
through the ``tfpart`` command with no file of tfpart changed; one that runs micro-batches
declares so, is held to what it declares, describes its plans in the summary and the
report, and is tried by ``--strategy auto``."""
import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[1]


def install_plugin(folder):
    """What ``pip install`` of a package offering tests/second_fastest.py writes: its
    metadata with the entry point (the module itself is importable from the project)."""
    info = folder / "tfpart_second_fastest-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tfpart-second-fastest\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tfpart.algorithms]\nsecond_fastest = tests.second_fastest:ALGORITHM\n")


def tfpart(*argv, path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "tfpart.cli", *map(str, argv)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_strategy_in_one_module_runs_end_to_end(tmp_path):
    missing = tfpart("compile", "--algorithm", "second_fastest", "-o", tmp_path / "none",
                     path=tmp_path)
    assert missing.returncode == 2 and "no algorithm 'second_fastest'" in missing.stderr
    install_plugin(tmp_path)
    out = tmp_path / "out"
    done = tfpart("compile", "--algorithm", "second_fastest", "--batch-size", 4, "--verify",
                  "-o", out, path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["algorithm"] == "second_fastest"
    assert set(plan["assignment"].values()) == {"/job:localhost/replica:0/task:0/device:CPU:1"}
    assert "report.html" in os.listdir(out) and "Outputs equal" in done.stdout
    simulated = tfpart("simulate", DEFAULT_MODEL_DIR, out / "plan.json", path=tmp_path)
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    assert "CPU:1" in simulated.stdout


@pytest.fixture
def microbatched_installed(tmp_path, monkeypatch):
    """tests/microbatched.py installed in this process as ``pip install`` of a package
    offering it would, beside a plug-in whose module is missing: its metadata with the
    entry points on the path, the registry's
    reading of the installed plug-ins renewed before and after."""
    from partitioner import registry

    info = tmp_path / "site" / "tfpart_microbatched-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tfpart-microbatched\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tfpart.algorithms]\nmicrobatched = tests.microbatched:ALGORITHM\n"
        "broken = tests.no_such_module:ALGORITHM\n")  # a package installed half-way
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(info.parent))
    registry._installed_plugins.cache_clear()
    yield
    registry._installed_plugins.cache_clear()


@pytest.mark.slow
def test_a_strategy_over_microbatches_in_one_module_is_compiled_described_and_tried_by_auto(
        tmp_path, capsys, monkeypatch, microbatched_installed):
    from tests.microbatched import describe
    from tfpart import cli_output
    from tfpart.cli import main
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster
    from tfpart.core.plan import Plan

    monkeypatch.setattr(cli_output.console, "width", 10_000)  # its lines unwrapped
    # held to what it declares: it takes micro-batches, and no schedule but fill-drain
    assert main(["compile", "--algorithm", "microbatched", "--schedule", "1f1b", "-o",
                 str(tmp_path / "none")]) == 2
    refused = capsys.readouterr().err.strip()
    assert "--schedule 1f1b: microbatched takes its options" in refused and \
        "the schedule gpipe" in refused and len(refused.splitlines()) == 1

    out = tmp_path / "out"
    assert main(["compile", "--algorithm", "microbatched", "--microbatches", "2",
                 "--batch-size", "4", "--verify", "--draw", str(tmp_path / "plan.dot"),
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    plan = Plan.load(out / "plan.json")
    assert plan.algorithm == "microbatched" and plan.microbatches == 2
    assert set(plan.stages.values()) == {0} and len(set(plan.assignment.values())) == 1
    line = describe(plan)
    assert line in printed.splitlines() and "Outputs equal" in printed
    assert html.escape(line) in (out / "report.html").read_text()
    assert line in (tmp_path / "plan.dot").read_text()  # the picture's title

    auto = plan_model(DEFAULT_MODEL_DIR, load_cluster(DEFAULT_CLUSTER_FILE), batch_size=4,
                      strategy="auto")
    assert {"greedy", "pipeline", "microbatched"} <= set(auto.compared)
    assert "microbatched " in cli_output.strategy_line(auto.plan.context["strategy"])
    # the plug-in that cannot be loaded is listed among those auto refused, with why
    assert "tests.no_such_module" in auto.refused["broken"] and "broken" not in auto.compared
    assert "broken" in auto.plan.context["strategy"]["refused"]
