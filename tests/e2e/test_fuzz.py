"""A seeded fuzz of bad input: hundreds of random corruptions of the example model's
saved_model.pb, variables index and data, and of cluster.json, each compiled with
--verify. Every run exits 0 or 2 with one line, never a traceback or a hang, writes
nothing on failure and leaves its inputs alone (see tests/fuzz_cli.py)."""
import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.fuzz_cli import TARGETS

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]  # fails before any kernel runs


def test_random_corruptions_fail_cleanly(tmp_path):
    cases = 40  # 10 per target
    done = subprocess.run([sys.executable, "-m", "tests.fuzz_cli", "--seed", "7", "--cases",
                           str(cases), "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])["results"]
    assert len(results) == cases
    assert Counter(r["target"] for r in results) == {t: cases // len(TARGETS) for t in TARGETS}
    broken = [r for r in results if r["problem"]]
    assert broken == [], broken[:5]
    assert {r["code"] for r in results} <= {0, 2}
    # Each kind of corruption is caught where it belongs, naming the file.
    messages = {target: [r["message"] for r in results if r["target"] == target]
                for target in TARGETS}
    assert any("saved_model.pb" in m for m in messages["saved_model.pb"])
    assert any("variables.index" in m for m in messages["variables/variables.index"])
    assert any("cannot load and run it" in m or "cannot read the variables" in m
               for m in messages["variables/variables.data-00000-of-00001"])
    assert all("cluster" in m for m in messages["cluster.json"] if m)
