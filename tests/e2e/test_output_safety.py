"""tfpart deletes only what it wrote, never modifies an input, and leaves the old
output or the new one whole, whatever happens while it writes: a user's folder given
as ``-o``, inputs inside the output, symbolic links, read-only and full file systems,
two compiles racing for one output, a folder created by someone else meanwhile, and
signals sent at any moment (Hypothesis picks it)."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR
from tfpart.core.output_folders import MARKER

ROOT = Path(__file__).resolve().parents[2]
# a plain greedy placement: the fastest compile of the example (about 6 s, most of it
# TensorFlow's start-up), so that many runs fit in CI's time
FAST = ["--strategy", "placement"]
OUTPUT_FILES = {MARKER, "saved_model.pb", "fingerprint.pb", "plan.json", "report.html",
                "variables/variables.index"}


def tfpart(*argv, wait=True, timeout=300):
    command = [sys.executable, "-m", "tfpart.cli", *map(str, argv)]
    if not wait:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def digest(path):
    """A checksum of a file, or of every file name and content under a folder."""
    path = Path(path)
    sha = hashlib.sha256()
    for item in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if item.is_file():
            sha.update(str(item.relative_to(path) if path.is_dir() else "").encode())
            sha.update(item.read_bytes())
    return sha.hexdigest()


def one_line_error(result, *words):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("tfpart: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def temporaries(folder):
    return sorted(p.name for p in Path(folder).iterdir() if "tfpart-tmp-" in p.name)


def complete_batch(out):
    """The batch size of the whole output ``out`` (an AssertionError if it is half
    written)."""
    present = {str(p.relative_to(out)) for p in Path(out).rglob("*") if p.is_file()}
    assert OUTPUT_FILES <= present, sorted(OUTPUT_FILES - present)
    return json.loads((Path(out) / "plan.json").read_text())["context"]["batch_size"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A copy of the example model and cluster, with their checksums."""
    folder = tmp_path_factory.mktemp("inputs")
    model = folder / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    cluster = folder / "cluster.json"
    shutil.copy(DEFAULT_CLUSTER_FILE, cluster)
    return model, cluster, (digest(model), digest(cluster))


def unchanged(inputs):
    model, cluster, before = inputs
    return (digest(model), digest(cluster)) == before


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_folder_tfpart_did_not_write_is_never_replaced(inputs, tmp_path):
    model, cluster, _ = inputs
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    before = digest(mine)
    result = tfpart("compile", model, "--cluster", cluster, "-o", mine, "--force", *FAST)
    one_line_error(result, str(mine), "not written by tfpart")
    assert digest(mine) == before and unchanged(inputs)
    assert temporaries(tmp_path) == []


@pytest.mark.slow
@pytest.mark.any_onednn
def test_an_output_holding_or_inside_an_input_is_refused(inputs, tmp_path):
    model, cluster, _ = inputs
    for out, word in [(cluster.parent, "holds the input"), (model, "holds the input"),
                      (model / "compiled", "inside the input")]:
        result = tfpart("compile", model, "--cluster", cluster, "-o", out, "--force", *FAST)
        one_line_error(result, word)
        assert unchanged(inputs)
    assert not (model / "compiled").exists()


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_symbolic_link_is_refused_and_its_target_kept(inputs, tmp_path):
    model, cluster, _ = inputs
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    (tmp_path / "link").symlink_to(target)
    result = tfpart("compile", model, "--cluster", cluster, "-o", tmp_path / "link",
                    "--force", *FAST)
    one_line_error(result, "symbolic link")
    assert (target / "keep.txt").read_text() == "x" and (tmp_path / "link").is_symlink()


@pytest.fixture
def small_file_system(tmp_path):
    """Mount a tmpfs of a given size (and read-only or not) under ``tmp_path``."""
    mounted = []

    def mount(name, size, read_only=False):
        point = tmp_path / name
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_read_only_and_full_file_systems_are_one_line(inputs, small_file_system):
    model, cluster, _ = inputs
    read_only = small_file_system("ro", "8m", read_only=True)
    result = tfpart("compile", model, "--cluster", cluster, "-o", read_only / "out", *FAST)
    one_line_error(result, "Read-only file system")
    full = small_file_system("full", "600k")
    result = tfpart("compile", model, "--cluster", cluster, "-o", full / "out", *FAST)
    one_line_error(result, "MB free")
    assert os.listdir(full) == [] and unchanged(inputs)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_two_compiles_racing_for_one_output(inputs, tmp_path):
    """Without --force exactly one wins and the loser deletes nothing; with --force
    both succeed and the output is one whole compile."""
    model, cluster, _ = inputs
    out = tmp_path / "out"
    runs = [tfpart("compile", model, "--cluster", cluster, "-o", out, "--batch-size", batch,
                   *FAST, wait=False) for batch in (2, 4)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "already exists" in loser or "another process" in loser, loser
    assert complete_batch(out) in (2, 4)
    runs = [tfpart("compile", model, "--cluster", cluster, "-o", out, "--batch-size", batch,
                   "--force", *FAST, wait=False) for batch in (8, 16)]
    assert [run.wait(timeout=300) for run in runs] == [0, 0], [r.stderr.read() for r in runs]
    assert complete_batch(out) in (8, 16)
    assert temporaries(tmp_path) == [] and unchanged(inputs)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_folder_created_meanwhile_is_kept(inputs, tmp_path):
    """A user who creates the output folder while the compile runs keeps it."""
    model, cluster, _ = inputs
    out = tmp_path / "out"
    run = tfpart("compile", model, "--cluster", cluster, "-o", out, *FAST, wait=False)
    time.sleep(1.0)  # the compile is past its first check, importing TensorFlow
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert run.wait(timeout=300) == 2
    assert "already exists" in run.stderr.read()
    assert sorted(os.listdir(out)) == ["notes.txt"] and temporaries(tmp_path) == []


@pytest.fixture(scope="module")
def old_output(inputs, tmp_path_factory):
    """A compiled output at batch 2, and how long an uninterrupted --force compile
    over it takes."""
    model, cluster, _ = inputs
    folder = tmp_path_factory.mktemp("signals")
    out = folder / "out"
    assert tfpart("compile", model, "--cluster", cluster, "-o", out, "--batch-size", 2,
                  *FAST).returncode == 0
    began = time.monotonic()
    assert tfpart("compile", model, "--cluster", cluster, "-o", folder / "timing",
                  "--batch-size", 4, *FAST).returncode == 0
    return out, time.monotonic() - began


@pytest.mark.slow
@pytest.mark.any_onednn
@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moment=st.floats(0.0, 1.2),
       signum=st.sampled_from([signal.SIGINT, signal.SIGTERM, signal.SIGKILL]))
def test_a_signal_at_any_moment_leaves_the_old_output_or_the_new(inputs, old_output, moment,
                                                                 signum):
    """``compile --force`` over an existing output, stopped at a moment drawn over its
    whole run: the output is the old one, untouched, or the whole new one; a signal
    that can be caught leaves no temporary folder, and the next run removes those of
    a killed one."""
    model, cluster, _ = inputs
    out, duration = old_output
    before = digest(out)
    run = tfpart("compile", model, "--cluster", cluster, "-o", out, "--batch-size", 4,
                 "--force", *FAST, wait=False)
    time.sleep(moment * duration)
    run.send_signal(signum)
    code = run.wait(timeout=300)
    err = run.stderr.read()
    batch = complete_batch(out)
    if batch == 2:
        assert digest(out) == before
    # Ctrl-C while Python starts or imports the CLI, before ``entry`` runs, is Python's
    # KeyboardInterrupt with its traceback (nothing of tfpart's has run, nothing is
    # written); from ``entry`` on it is tfpart's one line.
    before_entry = signum == signal.SIGINT and ", in entry" not in err and code in (1, -signum)
    assert before_entry or "Traceback" not in err, err
    # -signum: stopped by the signal's default action, before tfpart set its handlers
    # and so before it wrote anything
    assert code in (0, -signum, 128 + signum) or before_entry, (code, err)
    if signum != signal.SIGKILL:
        assert temporaries(out.parent) == [], err
    else:  # the next writer beside it clears what the killed one left
        assert tfpart("compile", model, "--cluster", cluster, "-o", out, "--batch-size", 2,
                      "--force", *FAST).returncode == 0
        assert temporaries(out.parent) == []
    assert unchanged(inputs)
