"""The cost model's inputs given to ``tfpart compile`` and ``tfpart profile`` (device
kinds, kernel tables, TF32): these read and run a real model, so they need TensorFlow;
the cost model's own tests (tests/costmodel/) run on numpy alone."""
import json
import os
import subprocess
import sys

import pytest

from costmodel.measured import MeasuredProfile, shape_key
from profiles import DEFAULT_MODEL_DIR
from tests.test_cli_errors import assert_clean_failure, run_cli


def test_a_kind_inheriting_from_an_unknown_kind_is_a_one_line_error(capsys, tmp_path):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "kinds": {"X": {"peak_flops": {"fp32": 1e13}, "memory_bandwidth": 1e12, "memory": 1e10,
                        "host_link_bandwidth": 1e10, "peer_link_bandwidth": 1e10,
                        "efficiency_from": "Nope", "source": "a test"}},
        "devices": [{"name": "/device:GPU:0", "kind": "X"}]}))
    code, err = run_cli(capsys, "compile", "--cluster", str(cluster), "-o",
                        str(tmp_path / "out"))
    assert_clean_failure(code, err, str(cluster), "kinds", "unknown kind 'Nope'",
                         out=tmp_path / "out")


def test_cli_rejects_a_corrupt_profile_in_one_line(tmp_path, capsys):
    from tfpart.cli import main

    path = tmp_path / "bad.json"
    path.write_text("{}")
    assert main(["compile", "--profile", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err
    assert not (tmp_path / "out").exists()


def test_compile_without_tf32_predicts_a_slower_step_and_says_so(tmp_path, write_cluster):
    from profiles import DEFAULT_MODEL_DIR
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster

    cluster = load_cluster(write_cluster({"devices": [
        {"name": "/device:GPU:0", "kind": "A100"}, {"name": "/device:GPU:1", "kind": "L4"}]}))
    plans = {tf32: plan_model(DEFAULT_MODEL_DIR, cluster, batch_size=64, tf32=tf32).plan
             for tf32 in (None, False)}
    assert plans[None].context["tf32"] is True and plans[False].context["tf32"] is False
    assert plans[False].step_time > plans[None].step_time


@pytest.fixture(scope="module")
def example_profile(tmp_path_factory):
    """``tfpart profile`` of the shipped example at batch 2, in a fresh process
    (profiling sets TensorFlow's threads); the file it wrote."""
    out = tmp_path_factory.mktemp("profile") / "profile.json"
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", "profile", str(DEFAULT_MODEL_DIR),
                           "--batch-size", "2", "--repeats", "3", "--warmup", "1", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


# one xdist worker profiles the example for both tests that read the profile
@pytest.mark.slow
@pytest.mark.xdist_group("example_profile")
def test_tfpart_profile_measures_every_op_of_the_example(example_profile):
    profile = MeasuredProfile.load(example_profile)
    conv = [op for op in profile.ops if op["op_type"] == "Conv2D"]
    assert conv and all(op["time_s"] > 0 and op["input_shapes"][0][0] == 2 for op in conv)
    # Timed as TensorFlow runs it (fused kernels), yet no compute op of a group at zero.
    compute = [op for op in profile.ops if op["op_type"] in ("Conv2D", "MatMul", "BiasAdd")]
    assert {op["op_type"] for op in compute} == {"Conv2D", "MatMul", "BiasAdd"}
    assert all(op["time_s"] > 0 for op in compute), compute
    hardware = profile.meta["hardware"]
    forced = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    assert hardware["onednn"] == (forced == "1") if forced in ("0", "1") else \
        isinstance(hardware["onednn"], bool)
    assert "avx" in hardware["cpu_flags"] or "asimd" in hardware["cpu_flags"]
    assert profile.meta["tensorflow"] and profile.meta["hardware"]["intra_op_threads"] == 1
    assert profile.meta["step_time_s"] > 0
    assert shape_key(conv[0]["op_type"], conv[0]["input_shapes"]) in profile._table


@pytest.mark.slow
@pytest.mark.xdist_group("example_profile")
def test_compile_names_a_profile_measured_with_the_other_onednn_mode(example_profile,
                                                                     tmp_path, capsys):
    """(The compiles run in this process: what is tested is what they print.)"""
    from tfpart.cli import main

    data = json.loads(example_profile.read_text())
    capsys.readouterr()
    same = main(["compile", "--profile", str(example_profile), "-o", str(tmp_path / "a")])
    assert same == 0 and "Note:" not in capsys.readouterr().out
    data["hardware"]["onednn"] = not data["hardware"]["onednn"]
    (tmp_path / "other.json").write_text(json.dumps(data))
    other = main(["compile", "--profile", str(tmp_path / "other.json"), "-o",
                  str(tmp_path / "b")])
    printed = capsys.readouterr()
    assert other == 0, printed.err
    notes = [line for line in printed.out.splitlines() if line.startswith("Note:")]
    assert len(notes) == 1 and "oneDNN" in notes[0] and "other.json" in notes[0]


@pytest.mark.slow
@pytest.mark.any_onednn  # a copy's time, not a kernel's
def test_a_read_tensorflow_copies_is_not_spread_over_every_op(tmp_path):
    """Once a sparse op has updated a variable, TensorFlow copies the whole variable on
    every dense read of it (copy-on-read): an SGD step of a 256 MB table spends about
    25 ms in one ReadVariableOp (this one's table is half as big). The profile keeps the
    median time of each op type and shapes (the reads of small variables), and takes
    the executor's time between ops from the trace, so that copy is not charged to
    every op as dispatch overhead (it was: 0.6 ms per op at 512 MB)."""
    from examples.models import export_table_training

    model = export_table_training(tmp_path / "model", 500_000, 64, "sgd")
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", "profile", str(model),
                           "--signature", "train_step", "--batch-size", "256", "--repeats",
                           "3", "--warmup", "2", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    profile = MeasuredProfile.load(out)
    own = sum(op["count"] * op["time_s"] for op in profile.ops)
    ran = sum(op["count"] for op in profile.ops if op["time_s"] > 0)
    untraced_gap = (profile.meta["step_time_s"] - own) / ran
    dispatch = profile.fitted["dispatch_overhead_s"]
    assert untraced_gap > 20 * dispatch, (untraced_gap, dispatch)  # the copy: in the step
    assert 0 <= dispatch < 50e-6
