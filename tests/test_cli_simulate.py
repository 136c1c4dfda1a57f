"""tfpart simulate and tfpart worker from the command line."""

import pytest

from profiles import DEFAULT_MODEL_DIR
from tests.conftest import local_cluster
from tfpart.cli import main
from tfpart.compile import compile_model
from tfpart.core.plan import Plan, Predicted


def test_simulate_prints_figures_and_draws_a_gantt_chart(tmp_path, capsys, write_cluster):
    out = tmp_path / "out"
    result = compile_model(DEFAULT_MODEL_DIR, write_cluster(local_cluster(3)), out,
                           batch_size=4)
    gantt = tmp_path / "gantt.png"
    assert main(["simulate", str(DEFAULT_MODEL_DIR), str(out / "plan.json"),
                 "--gantt", str(gantt)]) == 0
    printed = capsys.readouterr().out
    step_ms = result.plan.step_time * 1e3
    assert f"Predicted step time {step_ms:.3f} ms" in printed
    assert "Bytes moved per link" in printed or len(result.plan.devices_used()) == 1
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_replays_a_pipelined_plan(tmp_path, capsys, write_cluster):
    out = tmp_path / "out"
    cluster = dict(local_cluster(3), links={"same_host": {"bandwidth": "50GB/s",
                                                          "latency": "1us"}})
    result = compile_model(DEFAULT_MODEL_DIR, write_cluster(cluster), out, batch_size=16,
                           microbatches=4)
    assert main(["simulate", str(DEFAULT_MODEL_DIR), str(out / "plan.json")]) == 0
    printed = capsys.readouterr().out
    predicted = result.plan.predicted
    assert f"Predicted batch time {predicted.step_time * 1e3:.3f} ms" in printed
    assert f"{predicted.pipeline.throughput:.1f} samples/s" in printed
    assert predicted.pipeline.first_result < predicted.step_time


@pytest.mark.parametrize("strategy, devices", [("data_parallel", 3), ("hybrid", 4)])
def test_simulate_replays_replicas_on_every_replicas_devices(strategy, devices, tmp_path,
                                                             capsys, write_cluster):
    out = tmp_path / "out"
    result = compile_model(DEFAULT_MODEL_DIR, write_cluster(local_cluster(devices)), out,
                           batch_size=8, strategy=strategy)
    assert main(["simulate", str(DEFAULT_MODEL_DIR), str(out / "plan.json")]) == 0
    printed = capsys.readouterr().out
    assert f"time {result.plan.step_time * 1e3:.3f} ms" in printed  # a step's or batch's
    busy = [name for name, figures in result.plan.predicted.devices.items()
            if figures.busy_s > 0]
    assert len(busy) == devices, busy  # every replica's device works


def test_simulate_rejects_a_plan_of_another_model(tmp_path, capsys, write_cluster):
    plan = tmp_path / "plan.json"
    Plan(assignment={"x": "/job:localhost/replica:0/task:0/device:CPU:0"},
         predicted=Predicted(step_time=1.0, devices={}),
         context={"cluster_file": str(write_cluster(local_cluster(1))), "batch_size": 1}
         ).save(plan)
    assert main(["simulate", str(DEFAULT_MODEL_DIR), str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plan.json" in err and "does not place" in err


def test_worker_needs_a_cluster_block(tmp_path, capsys, write_cluster):
    path = write_cluster(local_cluster(2))
    assert main(["worker", "--cluster", str(path), "--task", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(path) in err and "cluster" in err
