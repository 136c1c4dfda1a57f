"""Training steps compiled for placement or pipelined train like the original: same
losses at every step, same final weights, every op and variable where the plan says.
Each case runs in a process of its own (tests/train_compare.py)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfpart.core.splits import part_of

ROOT = Path(__file__).resolve().parents[2]


def compare(tmp_path, training_step, model, optimizer, microbatches=None, schedule=None,
            workers=None, replicas=None, split=False, hybrid=None, reduce=None):
    """Run ``tests.train_compare`` on the test run's one export of ``model``'s
    training step with ``optimizer`` (the ``training_step`` fixture)."""
    options = [f"--{key}={value}" for key, value in [
        ("microbatches", microbatches), ("schedule", schedule), ("workers", workers),
        ("replicas", replicas), ("reduce", reduce), ("hybrid", hybrid)] if value is not None] \
        + (["--split"] if split else [])
    done = subprocess.run([sys.executable, "-m", "tests.train_compare", str(tmp_path), model,
                           optimizer, "--source", str(training_step(model, optimizer)),
                           *options], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer", [
    # Adam, whose updates magnify rounding, in both oneDNN modes for the models whose
    # layers Grappler fuses differently in each (batch norm, layer norm, attention). (A
    # plain CNN is placed by the tests below, momentum's slots by the first pipeline.)
    ("cnn_bn", "adam"), ("transformer", "adam")])
def test_a_placed_training_step_trains_like_the_original(tmp_path, training_step, model,
                                                         optimizer):
    run = compare(tmp_path, training_step, model, optimizer)
    assert run["devices_used"] > 1  # really split
    assert run["slots"] > 0 and run["slots_apart"] == []  # each variable with its slots
    assert run["outputs_equal"] and run["ops_checked"] > 50
    assert run["op_mismatches"] == [] and run["variables_misplaced"] == []
    np.testing.assert_allclose(run["losses"], run["expected_losses"], rtol=1e-5, atol=1e-7)
    assert run["weights_trained"]
    for got, want in zip(run["weights"], run["expected_weights"], strict=True):
        want = np.asarray(want)
        # Adam divides by the root of the squared gradients: a weight whose gradient is
        # zero but for rounding (an attention key bias) moves by lr x noise / epsilon,
        # a few 1e-6 over these steps, in either direction. Such a weight stays near
        # zero (it started there); only its size is compared.
        noise_only = optimizer == "adam" and np.abs(want).max() < 1e-4
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 if noise_only else 1e-6)


def assert_weights_close(got_weights, want_weights, rtol, bulk_rtol=None):
    """Each weight tensor within ``rtol`` of the original's, measured against the
    tensor's largest entry: Adam divides by the root of the squared gradients, so an
    entry whose gradient is small moves by its rounding noise magnified. A tensor whose
    gradient is zero but for rounding (an attention key bias) stays near zero, where
    it started: only its size is compared, as for placement. With ``bulk_rtol``, 99% of
    each tensor's entries are held to that tighter bound too (the magnified few aside,
    a systematic difference would show)."""
    for got, want in zip(got_weights, want_weights, strict=True):
        got, want = np.asarray(got), np.asarray(want)
        scale = np.abs(want).max()
        allowed = 1e-4 if scale < 1e-4 else rtol * scale
        assert np.abs(got - want).max() <= allowed, (np.abs(got - want).max(), scale)
        if bulk_rtol is not None and scale >= 1e-4:
            bulk = np.quantile(np.abs(got - want), 0.99)
            assert bulk <= bulk_rtol * scale, (bulk, scale)


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer, microbatches, schedule, workers", [
    # 1 micro-batch through stages; a batch of 6 in 4 micro-batches of 2, 2, 2 and none
    # (the GRU's and the MLP's)
    pytest.param("cnn", "sgd_momentum", 1, "gpipe", None, marks=pytest.mark.any_onednn),
    # the transformer's fusions in the other oneDNN mode: its placed training step
    pytest.param("transformer", "adam", 2, "1f1b", None, marks=pytest.mark.any_onednn),
    # a recurrent layer: its loop unstacks a time-major tensor, and so does its gradient
    pytest.param("gru", "adam", 4, "1f1b", None, marks=pytest.mark.any_onednn),
    # across three tfpart worker processes (TensorFlow's distributed runtime)
    pytest.param("mlp", "adam", 4, "1f1b", 3, marks=pytest.mark.any_onednn)])
def test_a_pipelined_training_step_trains_like_the_original(
        tmp_path, training_step, model, optimizer, microbatches, schedule, workers):
    run = compare(tmp_path, training_step, model, optimizer, microbatches, schedule, workers)
    assert run["stages"] > 1 and run["devices_used"] > 1
    assert (run["microbatches"], run["schedule"]) == (microbatches, schedule)
    assert_split_batches_train_like_the_original(run)


def assert_split_batches_train_like_the_original(run):
    """Every op and variable (with its optimizer slots) where the plan says, and the
    original's losses and weights: within 1e-4, since micro-batches or replicas sum
    each reduction in another order; but a few weights within 1e-3, since Adam
    magnifies that rounding on entries whose gradient is nearly zero (the hybrid
    residual CNN's placement, oneDNN off: 118 of a kernel's 36,864 entries off by up to
    6.7e-4 of its largest, the others within 1e-5)."""
    assert run["slots"] > 0 and run["slots_apart"] == []
    assert run["outputs_equal"] and run["ops_checked"] > 50
    assert run["op_mismatches"] == [] and run["variables_misplaced"] == []
    np.testing.assert_allclose(run["losses"], run["expected_losses"], rtol=1e-4, atol=1e-7)
    assert run["weights_trained"]
    assert_weights_close(run["weights"], run["expected_weights"], rtol=1e-3, bulk_rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer, replicas, workers, reduce", [
    # batch 6 on CPUs of relative speed 1, 1 and 1/3: shares 3, 2 and 1.
    # Once: the placed and pipelined steps hold the fused layers to both oneDNN modes.
    pytest.param("cnn", "adam", 3, None, "one_device", marks=pytest.mark.any_onednn),
    # three tfpart worker processes, equal shares
    pytest.param("mlp", "adam", 3, 3, "all_reduce", marks=pytest.mark.any_onednn)])
def test_data_parallel_replicas_train_like_the_original(tmp_path, training_step, model,
                                                       optimizer, replicas, workers, reduce):
    """Either reduction: one copy of the variables, or a copy per replica with the
    gradients all-reduced by collective ops on every replica's device, after which
    the copies are equal."""
    run = compare(tmp_path, training_step, model, optimizer, replicas=replicas,
                  workers=workers, reduce=reduce)
    assert len(run["replicas"]["devices"]) == replicas == run["devices_used"]
    assert run["replicas"]["reduce"] == reduce
    if reduce == "all_reduce":
        assert run["all_reduced_on"] == sorted(run["replicas"]["devices"])
        assert run["copies_apart"] == 0.0
    batch = 6
    shares = [round(f * batch) for f in run["replicas"]["fractions"]]
    assert sum(shares) == batch and shares == sorted(shares, reverse=True)
    if replicas == 3 and workers is None:
        assert shares == [3, 2, 1]  # the slow CPU's share
    assert_split_batches_train_like_the_original(run)


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer, workers, form, reduce", [
    # once (see above)
    pytest.param("cnn", "adam", None, "pipeline", "all_reduce", marks=pytest.mark.any_onednn),
    pytest.param("mlp", "adam", 4, "pipeline", "one_device", marks=pytest.mark.any_onednn)])
def test_replicas_of_a_placement_or_pipeline_train_like_the_original(
        tmp_path, training_step, model, optimizer, workers, form, reduce):
    """Hybrid: two replicas on four CPUs, each replica's ops placed across its group
    of two or pipelined over it, the gradients reduced on the first replica's devices
    or all-reduced among copies of the variables: logical CPUs with fast links (the
    fourth a third as fast), or four ``tfpart worker`` processes."""
    run = compare(tmp_path, training_step, model, optimizer, workers=workers, hybrid=form,
                  reduce=reduce)
    replicas = run["replicas"]
    groups = [set(placement.values()) for placement in replicas["placements"]]
    assert len(groups) == 2 and not groups[0] & groups[1]
    if workers is None:
        assert any(len(group) == 2 for group in groups)  # a replica spread over its group
    if form == "pipeline":
        assert run["stages"] == 2 and all(len(group) == 2 for group in groups)
        assert run["microbatches"] == 2 * replicas["microbatches"]
        assert len(run["ran_on"]) >= 4  # every replica on its own devices (and the client)
        assert replicas["reduce"] == reduce
    if reduce == "all_reduce":  # on every device, each stage's gradients among its pair
        assert len(run["all_reduced_on"]) == 4 and run["copies_apart"] == 0.0
    shares = [round(f * 6) for f in replicas["fractions"]]
    assert sum(shares) == 6
    assert_split_batches_train_like_the_original(run)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_1f1b_is_predicted_and_measured_to_hold_less_memory_than_fill_drain(tmp_path,
                                                                           training_step):
    """At 8 micro-batches, fill-drain keeps every micro-batch's activations until the
    backward passes start; 1F1B keeps at most (stages - stage) of them. The measured
    peak (TensorFlow's CPU allocator during a step, in a fresh process:
    tests/memory_peak.py) must follow the predicted order."""
    from tests.conftest import local_cluster
    from tfpart.compile import compile_model

    model = training_step("conv_tower", "sgd_momentum")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(2)))
    predicted, measured = {}, {}
    for schedule in ("gpipe", "1f1b"):
        out = tmp_path / schedule
        plan = compile_model(model, cluster, out, batch_size=128,
                             signature="train_step", microbatches=8,
                             options={"schedule": schedule}).plan
        predicted[schedule] = sum(d.peak_memory_bytes for d in plan.predicted.devices.values())
        done = subprocess.run([sys.executable, "-m", "tests.memory_peak", str(out), "3"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        measured[schedule] = json.loads(done.stdout.strip().splitlines()[-1])["growth_bytes"]
    assert predicted["1f1b"] < predicted["gpipe"]
    assert measured["1f1b"] < measured["gpipe"], measured


@pytest.mark.slow
@pytest.mark.any_onednn
def test_micro_batches_of_a_batch_norm_training_step_are_refused_in_one_line(
        tmp_path, training_step, capsys):
    """Batch-norm statistics in training mode make every sample depend on the whole
    batch: micro-batches would change the step, so they are refused with the op."""
    from tests.conftest import local_cluster
    from tfpart.cli import main

    model = training_step("cnn_bn", "adam")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(3)))
    out = tmp_path / "out"
    code = main(["compile", str(model), "--signature", "train_step",
                 "--batch-size", "8", "--cluster", str(cluster), "--microbatches", "4",
                 "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "mixes the samples of a batch" in err and "batch_normalization" in err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer, workers, types", [
    ("cnn", "adam", None, {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul"}),
    pytest.param("mlp", "adam", 3, {"MatMul"}, marks=pytest.mark.any_onednn)])
def test_filter_split_training_trains_like_the_original(tmp_path, training_step, model,
                                                        optimizer, workers, types):
    """Every convolution and matmul of the step split, forward and backward: on three
    logical CPUs (the third a third as fast, so the CNN's slices are uneven) or on three
    ``tfpart worker`` processes."""
    run = compare(tmp_path, training_step, model, optimizer, workers=workers, split=True)
    assert set(run["split_types"]) == types
    if model == "cnn":
        assert any(len(set(s["sizes"])) > 1 for s in run["splits"].values())
    ran_on = {}
    for name, device in run["parts_ran_on"]:
        ran_on.setdefault(part_of(name)[0], set()).add(device)
    # every split op whose result is read ran in slices (TensorFlow prunes the rest:
    # the gradient with respect to the input image)
    assert set(ran_on) == set(run["splits_read"])
    assert all(len(devices) >= 2 for devices in ran_on.values())
    assert run["outputs_equal"] and run["op_mismatches"] == []
    assert run["variables_misplaced"] == []
    np.testing.assert_allclose(run["losses"], run["expected_losses"], rtol=1e-5, atol=1e-7)
    assert_weights_close(run["weights"], run["expected_weights"], rtol=1e-5)
