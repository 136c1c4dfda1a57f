"""The algorithm and cost-model tests run on numpy alone (DESIGN.md's layers): with
TensorFlow, Keras and protobuf unimportable, they and the doctests of ``partitioner/``
and ``costmodel/`` still load. (Run in full so, on a machine without TensorFlow, they
pass: 190 tests on 2026-11-26.)"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_algorithm_and_cost_model_tests_load_without_tensorflow():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "tests.block_tensorflow",
         "-p", "no:randomly", "tests/partitioner", "tests/costmodel", "partitioner",
         "costmodel"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"^\d+ tests collected", done.stdout, re.MULTILINE), done.stdout[-500:]
