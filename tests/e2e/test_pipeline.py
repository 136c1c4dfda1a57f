"""Pipelined compiled models (stages over micro-batches) compute the original's outputs
on several logical CPU devices, for several micro-batch counts and batch sizes that
the micro-batch count does not divide, with every copy of every op where the plan
says."""
import json

import pytest

from tests.conftest import local_cluster
from tfpart.compile import compile_model
from tfpart.core.splits import part_of
from tfpart.verification import verify

pytestmark = pytest.mark.slow

# Links fast enough that splitting these small models into stages pays off.
FAST_LINKS = {"same_host": {"bandwidth": "50GB/s", "latency": "1us"}}


# oneDNN changes a model's fusions, not how its micro-batches are cut: the run with
# oneDNN off (CI's second pass) repeats one micro-batch count per model
@pytest.mark.parametrize("microbatches", [pytest.param(1, marks=pytest.mark.any_onednn),
                                          pytest.param(2, marks=pytest.mark.any_onednn), 4,
                                          pytest.param(8, marks=pytest.mark.any_onednn)])
@pytest.mark.parametrize("name,devices", [("mlp_module", 2), ("residual_cnn", 3),
                                          ("transformer_encoder", 4)])
def test_pipelined_model_matches_original(name, devices, microbatches, exported, local_cpus,
                                          write_cluster, tmp_path):
    model = exported(name)
    cluster = dict(local_cluster(devices), links=FAST_LINKS)
    out = tmp_path / "out"
    result = compile_model(model, write_cluster(cluster), out, batch_size=16,
                           microbatches=microbatches)
    plan = result.plan
    assert plan.microbatches == microbatches
    assert len(set(plan.stages.values())) >= 2  # really split into stages
    for batch in (7, 16):  # 7 is not divisible by 2, 4 or 8: a smaller last micro-batch
        report = verify(model, out, batch_size=batch)
        assert report.outputs_equal, (batch, report.max_abs_diff)
        assert report.op_mismatches == []
        assert report.variable_mismatches == []
        # each micro-batch runs its own copy of the planned ops
        assert report.ops_checked >= microbatches * len(set(plan.stages.values()))
    stage_devices = {plan.assignment[op] for op in plan.stages}
    assert len(stage_devices) == len(set(plan.stages.values()))


@pytest.mark.parametrize("name", ["gru", "stacked_lstm"])
def test_recurrent_layers_micro_batch_like_any_other(name, exported, local_cpus,
                                                     write_cluster, tmp_path):
    """Their loops unstack a time-major tensor into a TensorList, which carries the
    batch inside a handle: no sample is mixed, so micro-batches are allowed."""
    model = exported(name)
    cluster = dict(local_cluster(2), links=FAST_LINKS)
    result = compile_model(model, write_cluster(cluster), tmp_path / "out", batch_size=16,
                           microbatches=2)
    assert result.plan.microbatches == 2
    assert "samples_mixed_by" not in result.plan.context
    for batch in (7, 16):
        report = verify(model, tmp_path / "out", batch_size=batch)
        assert report.outputs_equal, (batch, report.max_abs_diff)
        assert report.op_mismatches == [] and report.variable_mismatches == []


def test_batch_smaller_than_the_microbatch_count_still_matches(exported, local_cpus,
                                                               write_cluster, tmp_path):
    model = exported("mlp_module")
    out = tmp_path / "out"
    compile_model(model, write_cluster(dict(local_cluster(2), links=FAST_LINKS)), out,
                  batch_size=16, microbatches=8)
    report = verify(model, out, batch_size=3)  # five of the eight micro-batches are empty
    assert report.outputs_equal, report.max_abs_diff


def test_cli_chooses_microbatches_and_reports_throughput(exported, local_cpus, write_cluster,
                                                         tmp_path, capsys):
    """(The commands run in this process: what is tested is what they print.)"""
    from tfpart.cli import main

    model = exported("residual_cnn")
    out = tmp_path / "out"
    cluster = write_cluster(dict(local_cluster(3), links=FAST_LINKS))
    capsys.readouterr()
    code = main(["compile", str(model), "--cluster", str(cluster), "--pipeline",
                 "--batch-size", "32", "-o", str(out)])
    done = capsys.readouterr()
    assert code == 0, done.err[-2000:]
    assert "Pipeline:" in done.out and "samples/s" in done.out
    plan = json.loads((out / "plan.json").read_text())
    choices = plan["predicted"]["pipeline"]["microbatch_choices"]
    assert set(choices) == {"1", "2", "4", "8", "16", "32"}
    best = min(choices, key=lambda m: (choices[m]["batch_time"], int(m)))
    assert plan["stages"]["microbatches"] == int(best)
    assert plan["predicted"]["pipeline"]["throughput"] == pytest.approx(
        32 / plan["predicted"]["step_time"])
    code = main(["run", str(out), "--repeats", "3", "--json"])
    run = capsys.readouterr()
    assert code == 0, run.err[-2000:]
    figures = json.loads(run.out.strip().splitlines()[-1])
    assert figures["samples_per_s"] > 0 and figures["microbatches"] == int(best)


def test_a_model_that_mixes_samples_is_not_micro_batched(exported, local_cpus, write_cluster,
                                                         tmp_path, capsys):
    from tfpart.cli import main

    model = exported("cond_module")  # branches on the sum of the whole batch
    cluster = write_cluster(dict(local_cluster(3), links=FAST_LINKS))
    refused = tmp_path / "refused"
    assert main(["compile", str(model), "--cluster", str(cluster), "--microbatches", "4",
                 "--batch-size", "8", "-o", str(refused)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mixes the samples of a batch" in err
    assert not refused.exists()
    out = tmp_path / "out"
    result = compile_model(model, cluster, out, batch_size=8, pipeline=True)
    assert result.plan.microbatches == 1
    assert result.plan.context["samples_mixed_by"]
    report = verify(model, out, batch_size=7)
    assert report.outputs_equal and report.op_mismatches == []


def test_a_failed_verification_exits_2_and_writes_nothing(exported, local_cpus, write_cluster,
                                                          tmp_path, capsys, monkeypatch):
    """A planted mismatch: the batch-mixing check patched to find nothing in a model that
    branches on its batch's sum, so 4 micro-batches change its outputs. ``compile
    --verify`` and ``verify`` each say so in one line, exit 2, and no output is left."""
    import tfpart.compile
    from tfpart.cli import main

    monkeypatch.setattr(tfpart.compile, "_samples_mixed_by", lambda *args: [])
    model = exported("cond_module")
    cluster = write_cluster(dict(local_cluster(3), links=FAST_LINKS))
    out = tmp_path / "out"
    command = ["compile", str(model), "--cluster", str(cluster), "--microbatches", "4",
               "--batch-size", "8", "-o", str(out)]
    assert main([*command, "--verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "not written" in err
    assert "outputs differ from the original's at batch size" in err
    assert not out.exists() and not list(tmp_path.glob(".*out*"))
    assert main(command) == 0
    assert main(["verify", str(model), str(out)]) == 2
    captured = capsys.readouterr()
    assert "Outputs DIFFER" in captured.out
    assert len(captured.err.strip().splitlines()) == 1 and "outputs differ" in captured.err


def test_resnet50_pipelined_on_a_heterogeneous_cluster(exported, local_cpus, tmp_path):
    from profiles import CLUSTERS_DIR

    model, out = exported("resnet50"), tmp_path / "out"
    result = compile_model(model, CLUSTERS_DIR / "a100_l4_one_host.json", out, batch_size=32,
                           pipeline=True)
    plan = result.plan
    kinds = {result.cluster.devices[result.cluster.device_names.index(plan.assignment[op])]
             .kind.name for op in plan.stages}
    assert len(set(plan.stages.values())) >= 2 and {"A100-40GB", "L4"} <= kinds
    assert plan.predicted.pipeline.exact
    report = verify(model, out, batch_size=10)
    assert report.outputs_equal, report.max_abs_diff
    assert report.op_mismatches == [] and report.variable_mismatches == []


@pytest.mark.parametrize("name, reduce", [("residual_cnn", "one_device"),
                                          ("transformer_encoder", "one_device"),
                                          ("residual_cnn", "all_reduce")])
def test_data_parallel_replicas_match_the_original(name, reduce, exported, local_cpus,
                                                   write_cluster, tmp_path):
    """Three replicas, the last on a CPU kind a third as fast: uneven shares of the
    batch (also of batches the compile did not plan for), each replica's ops on its
    device, the variables read where they live (one copy) or each replica's copy
    read on its device."""
    from tests.train_compare import uneven

    model, out = exported(name), tmp_path / "out"
    result = compile_model(model, write_cluster(uneven(local_cluster(3))), out,
                           batch_size=12, algorithm="data_parallel",
                           options={"replicas": 3, "reduce": reduce})
    replicas = result.plan.replicas
    assert result.plan.microbatches == 3 and len(set(replicas.devices)) == 3
    assert [round(f * 12) for f in replicas.fractions] == [5, 5, 2]
    assert bool(replicas.pinned) == (reduce == "one_device")
    for batch in (2, 7, 12):  # 2: one replica gets no row
        report = verify(model, out, batch_size=batch)
        assert report.outputs_equal, (batch, report.max_abs_diff)
        assert report.op_mismatches == [] and report.variable_mismatches == []
        used = {device for device in report.placement.values()}
        assert len(used) >= 3 if batch >= 3 else True


@pytest.mark.parametrize("name", ["residual_cnn", "conv_batchnorm", "parallel_dense"])
def test_filter_split_models_match_the_original(name, exported, local_cpus, write_cluster,
                                                tmp_path):
    """Every convolution and matmul split across CPUs, the third a third as fast (the
    least slice where it takes part): the same outputs at any batch size, each slice where the plan
    puts it, the split ops (now the concatenations) on their own devices."""
    from tests.train_compare import uneven

    model, out = exported(name), tmp_path / "out"
    result = compile_model(model, write_cluster(uneven(local_cluster(3))), out,
                           batch_size=8, algorithm="filter_split",
                           options={"min_gain": -1e9, "candidates": 10 ** 6})
    splits = result.plan.splits
    splittable = [op for op, attrs in result.graph.ops.items() if attrs.get("sliced")]
    assert splittable and set(splits) == set(splittable)
    slow = result.cluster.device_names[2]
    for split in splits.values():  # the slow CPU's slice, where it has one, is the least
        if slow in split.devices:
            assert split.sizes[split.devices.index(slow)] == min(split.sizes)
    for batch in (1, 8, 13):
        report = verify(model, out, batch_size=batch)
        assert report.outputs_equal, (batch, report.max_abs_diff)
        assert report.op_mismatches == [] and report.variable_mismatches == []
        slices = {(part_of(copy.origin)[0], report.placement[name])
                  for name, copy in report.copies.items() if part_of(copy.origin)}
        assert {op for op, _ in slices} == set(splits)
        for op, split in splits.items():
            assert len({device for o, device in slices if o == op}) == len(split.devices)


@pytest.mark.parametrize("name, form, reduce", [  # (a dense model's: test_training.py)
    ("residual_cnn", "placement", None),
    ("residual_cnn", "pipeline", "one_device"), ("residual_cnn", "pipeline", "all_reduce")])
def test_replicas_of_a_placement_or_pipeline_match_the_original(
        name, form, reduce, exported, local_cpus, write_cluster, tmp_path):
    """Hybrid: two replicas on four CPUs, each placed across its own two or pipelined
    over them (the last CPU a third as fast), reading the first replica's weights or
    its own copy: the same outputs, each replica's ops where its placement says."""
    from tests.train_compare import FAST_LINKS as links
    from tests.train_compare import uneven

    model, out = exported(name), tmp_path / "out"
    cluster = dict(uneven(local_cluster(4)), links=links)
    result = compile_model(model, write_cluster(cluster), out, batch_size=16,
                           algorithm="hybrid", options={"groups": 2, "form": form,
                                                        "reduce": reduce})
    replicas = result.plan.replicas
    groups = [set(placement.values()) for placement in replicas.placements]
    assert len(groups) == 2 and not groups[0] & groups[1]
    if form == "pipeline":
        assert len(set(result.plan.stages.values())) == 2
        assert all(len(group) == 2 for group in groups)
        assert result.plan.microbatches == 2 * replicas.microbatches > 2
        assert replicas.reduce == reduce
    for batch in (3, 7, 16):
        report = verify(model, out, batch_size=batch)
        assert report.outputs_equal, (batch, report.max_abs_diff)
        assert report.op_mismatches == [] and report.variable_mismatches == []
        assert len(set(report.placement.values())) >= len(groups[0] | groups[1])
