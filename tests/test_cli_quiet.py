"""Every error path of the ``tfpart`` command, run as a user runs it (a fresh process):
exit code 2, exactly one line on stderr, nothing on stdout, no TensorFlow log line;
errors in arguments and input paths come before TensorFlow is imported."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from profiles import DEFAULT_MODEL_DIR
from tests.conftest import local_cluster

# Runs the console entry point, then says whether TensorFlow was imported.
PROBE = ("import sys; from tfpart.cli import entry; code = entry(sys.argv[1:]); "
         "print('TF' if 'tensorflow' in sys.modules else 'no TF'); sys.exit(code)")


def tfpart(*argv, env=None):
    return subprocess.run([sys.executable, "-c", PROBE, *map(str, argv)],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "small.json").write_text(json.dumps(local_cluster(2, memory="100KB")))
    (tmp_path / "tight.json").write_text(json.dumps(local_cluster(2, memory="500KB")))
    truncated = tmp_path / "truncated"
    shutil.copytree(DEFAULT_MODEL_DIR, truncated)
    pb = truncated / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[:1000])
    return tmp_path


BEFORE_TENSORFLOW = [
    (["compile", "{tmp}/nope", "-o", "{tmp}/out"], "no such directory"),
    (["compile", "{tmp}/empty", "-o", "{tmp}/out"], "saved_model.pb is missing"),
    (["compile", "--cluster", "{tmp}/bad.json", "-o", "{tmp}/out"], "not valid JSON"),
    (["compile", "--cluster", "{tmp}/none.json", "-o", "{tmp}/out"], "no such file"),
    (["compile", "-o", "{tmp}/taken"], "already exists"),
    (["compile", "--algorithm", "best", "-o", "{tmp}/out"], "no algorithm 'best'"),
    (["compile", "--batch-size", "0", "-o", "{tmp}/out"], "must be positive"),
    (["compile"], "required: -o/--output"),
    (["compile", "--no-such-flag", "-o", "{tmp}/out"], "unrecognized arguments"),
    (["verify", str(DEFAULT_MODEL_DIR), str(DEFAULT_MODEL_DIR)], "plan.json: no such file"),
    (["run", "{tmp}/nope"], "no such directory"),
    (["simulate", str(DEFAULT_MODEL_DIR), "{tmp}/plan.json"], "no such file"),
    (["profile", "{tmp}/nope", "-o", "{tmp}/p.json"], "no such directory"),
    (["worker"], "TF_CONFIG"),
]


@pytest.mark.parametrize("argv,words", BEFORE_TENSORFLOW,
                         ids=[" ".join(a[:2]) + f" ({w})" for a, w in BEFORE_TENSORFLOW])
def test_input_errors_come_before_tensorflow_in_one_line(paths, argv, words):
    done = tfpart(*[a.format(tmp=paths) for a in argv])
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines() == ["no TF"]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfpart: error: "), done.stderr
    assert words in lines[0]
    assert not (paths / "out").exists()


AFTER_TENSORFLOW = [
    (["compile", "{tmp}/truncated", "-o", "{tmp}/out"], "truncated"),
    (["compile", "--cluster", "{tmp}/small.json", "-o", "{tmp}/out"], "whole cluster"),
    (["compile", "--cluster", "{tmp}/tight.json", "--pipeline", "-o", "{tmp}/out"],
     "no split into pipeline stages fits"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv,words", AFTER_TENSORFLOW,
                         ids=[w for _, w in AFTER_TENSORFLOW])
def test_errors_found_by_tensorflow_are_one_quiet_line(paths, argv, words):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}  # TF at its loudest
    done = tfpart(*[a.format(tmp=paths) for a in argv], env=env)
    assert done.returncode == 2, done.stderr
    assert done.stdout.splitlines()[-1] in ("TF", "no TF")
    assert len(done.stdout.splitlines()) == 1, done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfpart: error: "), done.stderr
    assert words in lines[0]
    assert not (paths / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--microbatches", "2", "--batch-size", "2"]],
                         ids=["placed", "pipelined"])
def test_successful_compile_prints_no_tensorflow_log(tmp_path, mode):
    """Also: a pipelined compile can verify in its own process (the pipeline pass
    starts TensorFlow, so the devices to verify on must exist before it)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    done = tfpart("compile", "-o", tmp_path / "out", "--verify", *mode, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    noise = [line for line in done.stdout.splitlines()
             if line[:1] in ("I", "W", "E") and line[1:5].isdigit()
             or "oneDNN" in line or "absl" in line]
    assert noise == []
    assert "Outputs equal" in done.stdout
    times = " ".join(done.stdout.split("Time: ")[1].split("Wrote ")[0].split())
    assert [part.split()[0] for part in times.split(", ")] == [
        "read", "analyse", "cost", "partition", "rewrite", "write", "verify", "picture",
        "report"]


def test_a_first_run_knows_it_compiles_the_kernels(tmp_path):
    """With an empty numba cache (a fresh install) the kernels are still to compile,
    which the CLI says while it partitions."""
    probe = "from tfpart.compile import kernels_to_compile as k; print(len(k()))"
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}, timeout=300)
    assert int(fresh.stdout) >= 20, fresh.stderr
