"""A new strategy is one module: installed as a plug-in (an entry point of the
``tfpart.algorithms`` group), it compiles, verifies, reports and simulates end to end
through the ``tfpart`` command with no file of tfpart changed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiles import DEFAULT_MODEL_DIR

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
