"""Every size a user controls is checked before the work it sizes: an input past a
limit ends the command with exit code 2 and one line, ``tfpart: error: <file>:
<problem>`` naming the limit, within bounded time and memory (each case runs the CLI
in a subprocess with a timeout and an address-space limit), never a traceback, a
crash or a hang."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR
from tests.conftest import local_cluster
from tfpart.core.limits import (MAX_COMPILED_OPS, MAX_GRAPH_OPS, MAX_MICROBATCHES,
                                MAX_PLANNED_DEVICES, MAX_TF_CONFIG_BYTES, max_threads)
from tfpart.core.plan import Stages

ROOT = Path(__file__).resolve().parents[1]
NO_TF_MEMORY = 2 * 2**30  # address space of a command that fails before TensorFlow
TF_MEMORY = 6 * 2**30  # one that imports TensorFlow (its import maps about 2 GB)


def tfpart(*argv, timeout=60, memory=NO_TF_MEMORY, env=None):
    """Run ``python -m tfpart.cli argv`` with a timeout and an address-space limit (and
    the variables ``env`` added to the environment); (exit code, stderr lines,
    seconds)."""
    # The limit is set by the child itself before it execs the CLI: a ``preexec_fn`` runs
    # Python between fork and exec, where gRPC's fork handlers (this process has loaded
    # it) restart a poller thread whose epoll descriptor ``close_fds`` then closes, and
    # the child aborts.
    limited = ("import os, resource, sys; m = int(sys.argv[1]); "
               "resource.setrlimit(resource.RLIMIT_AS, (m, m)); "
               "os.execv(sys.executable, [sys.executable, '-m', 'tfpart.cli', *sys.argv[2:]])")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", limited, str(memory), *map(str, argv)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    return done.returncode, done.stderr.splitlines(), time.monotonic() - start


def assert_refused(result, *words):
    code, lines, _ = result
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("tfpart: error: "), lines
    for word in words:
        assert word in lines[0], lines[0]


def write(path, text):
    Path(path).write_text(text)
    return path


# -- JSON: depth, number size, NaN and Infinity -------------------------------------------
CLUSTER = '{"devices": [{"name": "/device:CPU:0", "kind": "cpu", "memory": %s}]}'
BAD_JSON = {
    "nested 200k deep": ("[" * 200_000 + "]" * 200_000, "nested 200000 levels deep"),
    "5001-digit integer": (CLUSTER % ("4" * 5001), "an integer of 5001 digits"),
    "NaN": (CLUSTER % "NaN", "NaN is not a JSON number"),
    "Infinity": (CLUSTER % "Infinity", "Infinity is not a JSON number"),
    "-Infinity": (CLUSTER % "-Infinity", "-Infinity is not a JSON number"),
    "1e999": (CLUSTER % "1e999", "1e999 is too large"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_in_a_cluster_file(case, tmp_path):
    text, words = BAD_JSON[case]
    cluster = write(tmp_path / "c.json", text)
    assert_refused(tfpart("compile", "--cluster", cluster, "-o", tmp_path / "out"),
                   str(cluster), words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["NaN", "5001-digit integer", "nested 200k deep"])
def test_bad_json_in_a_kinds_file_a_profile_and_a_plan(case, tmp_path):
    text, words = BAD_JSON[case]
    kinds = write(tmp_path / "kinds.json", text)
    cluster = write(tmp_path / "c.json", json.dumps(dict(local_cluster(1),
                                                         kinds_file="kinds.json")))
    assert_refused(tfpart("compile", "--cluster", cluster, "-o", tmp_path / "out"),
                   str(kinds), words)
    profile = write(tmp_path / "profile.json", text)
    assert_refused(tfpart("compile", "--profile", profile, "-o", tmp_path / "out"),
                   str(profile), words)
    plan = write(tmp_path / "plan.json", text)
    assert_refused(tfpart("simulate", DEFAULT_MODEL_DIR, plan), str(plan), words)
    assert_refused(tfpart("diff", plan, plan), str(plan), words)


def test_nan_in_a_kind_given_through_the_api_is_refused():
    from tfpart.core.cluster import cluster_from_dict
    from tfpart.core.errors import ClusterError

    entry = {"peak_flops": {"fp32": float("nan")}, "memory_bandwidth": 1e12,
             "memory": 1e10, "host_link_bandwidth": 1e10, "peer_link_bandwidth": 1e10,
             "efficiency_from": "H100", "source": "test"}
    with pytest.raises(ClusterError, match="peak_flops must map precisions to positive"):
        cluster_from_dict({"kinds": {"X": entry},
                           "devices": [{"name": "/device:GPU:0", "kind": "X"}]})
    with pytest.raises(ClusterError, match="positive finite number"):
        cluster_from_dict({"devices": [{"name": "/device:CPU:0", "kind": "cpu",
                                        "memory": float("inf")}]})


def test_a_plan_with_a_non_finite_figure_is_not_written(tmp_path):
    from tfpart.core.errors import OutputError
    from tfpart.core.plan import Plan, Predicted

    plan = Plan(assignment={"a": "/device:CPU:0"},
                predicted=Predicted(step_time=float("nan"), devices={}))
    with pytest.raises(OutputError, match="predicted.step_time is nan"):
        plan.save(tmp_path / "plan.json")
    assert not (tmp_path / "plan.json").exists()


# -- files that are not regular, or too large ---------------------------------------------
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


def test_a_fifo_as_cluster_kinds_file_profile_or_plan(fifo, tmp_path):
    words = (str(fifo), "not a regular file (a FIFO)")
    assert_refused(tfpart("compile", "--cluster", fifo, "-o", tmp_path / "out",
                          timeout=30), *words)
    cluster = write(tmp_path / "c.json", json.dumps(dict(local_cluster(1),
                                                         kinds_file=fifo.name)))
    assert_refused(tfpart("compile", "--cluster", cluster, "-o", tmp_path / "out",
                          timeout=30), *words)
    assert_refused(tfpart("compile", "--profile", fifo, "-o", tmp_path / "out",
                          timeout=30), *words)
    assert_refused(tfpart("simulate", DEFAULT_MODEL_DIR, fifo, timeout=30), *words)


def test_a_fifo_inside_the_saved_model(tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    index = model / "variables" / "variables.index"
    index.unlink()
    os.mkfifo(index)
    assert_refused(tfpart("compile", model, "-o", tmp_path / "out", timeout=30),
                   str(index), "not a regular file (a FIFO)")


def test_dev_zero_and_a_huge_file(tmp_path):
    assert_refused(tfpart("compile", "--cluster", "/dev/zero", "-o", tmp_path / "out"),
                   "/dev/zero", "not a regular file (a character device)")
    cluster = write(tmp_path / "c.json", json.dumps(dict(local_cluster(1),
                                                         kinds_file="/dev/zero")))
    assert_refused(tfpart("compile", "--cluster", cluster, "-o", tmp_path / "out"),
                   "/dev/zero", "not a regular file")
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as file:
        file.truncate(3 * 2**30)  # sparse: takes no disk, but 3 GiB to read
    assert_refused(tfpart("compile", "--cluster", huge, "-o", tmp_path / "out"),
                   str(huge), "3072.0 MiB, more than the 64 MiB an input file may have")
    assert_refused(tfpart("diff", huge, huge), str(huge), "more than the 512 MiB")


# -- option checks before any work --------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--batch-size", str(10**10)], "--batch-size 10000000000 is more than 2147483647"),
    (["--microbatches", "100000"], f"--microbatches 100000 is more than {MAX_MICROBATCHES}"),
    (["--microbatches", "8", "--batch-size", "4"],
     "--microbatches 8 is more than --batch-size 4"),
])
def test_sizes_on_the_command_line(argv, words, tmp_path):
    code, lines, seconds = tfpart("compile", *argv, "-o", tmp_path / "out")
    assert_refused((code, lines, seconds), words)
    assert seconds < 30  # no model read, no TensorFlow


TOO_MANY_THREADS = max_threads() + 1
TRAIN = ["train", "m", "--cluster", "c.json", "--data", "d.npz", "-o", "out"]


@pytest.mark.parametrize("argv,words", [
    (["worker", "--inter-threads", TOO_MANY_THREADS],
     f"--inter-threads {TOO_MANY_THREADS} is more than {max_threads()} (16 per logical CPU"),
    (["profile", "m", "-o", "p.json", "--intra-threads", TOO_MANY_THREADS],
     f"--intra-threads {TOO_MANY_THREADS} is more than {max_threads()}"),
    (["worker", "--launch-timeout", "inf"], "--launch-timeout must be a finite number, not inf"),
    (["worker", "--launch-timeout", "1e400"], "--launch-timeout must be a finite number"),
    (["worker", "--launch-timeout", "0"], "--launch-timeout must be positive"),
    (["worker", "--launch-timeout", "-5"], "--launch-timeout must be positive"),
    (["worker", "--launch-timeout", "1e9"], "--launch-timeout 1e+09 is more than 86400 seconds"),
    (["worker", "--port", "70000"], "--port 70000 is more than 65535"),
    (["worker", "--task", "-1"], "--task must be at least 0"),
    ([*TRAIN, "--lr", "nan"], "--lr must be a finite number, not nan"),
    ([*TRAIN, "--lr", "0"], "--lr must be positive"),
    ([*TRAIN, "--momentum=-inf"], "--momentum must be a finite number, not -inf"),
    ([*TRAIN, "--momentum", "1"], "--momentum 1 must be less than 1"),
    ([*TRAIN, "--lambda0", "NaN"], "--lambda0 must be a finite number, not nan"),
    ([*TRAIN, "--eval-fraction", "nan"], "--eval-fraction must be a finite number"),
    ([*TRAIN, "--seed", "-1"], "--seed must be at least 0"),
    ([*TRAIN, "--steps", str(10**12)], "--steps 1000000000000 is more than 100000000"),
    ([*TRAIN, "--updates-per-call", "0"], "--updates-per-call must be positive"),
    (["run", "out", "--warmup", "-1"], "--warmup must be at least 0"),
    (["cluster", "probe", "c.json", "--rounds", "0"], "--rounds must be positive"),
    (["compile", "-o", "out", "--algorithm", "random", "--option", "seed=-1"],
     "--option seed=-1: must be from 0 to 2147483647"),
    (["compile", "-o", "out", "--algorithm", "ilp", "--option", "time_limit=nan"],
     "--option time_limit=nan: must be a finite number"),
    (["compile", "-o", "out", "--option", "refine_evaluations=99999999999"],
     "--option refine_evaluations=99999999999: must be from 0 to 2147483647"),
])
def test_numbers_on_the_command_line(argv, words, capsys, monkeypatch, tmp_path):
    """Every number option is checked before any work (in this process: the check
    comes before any file is read or TensorFlow is started)."""
    from tfpart.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    code = main([str(arg) for arg in argv])
    lines = capsys.readouterr().err.splitlines()
    assert_refused((code, lines, 0), words)


@pytest.mark.parametrize("argv,words", [
    (["worker", "--intra-threads", "100000"], "--intra-threads 100000 is more than"),
    (["worker", "--launch-timeout", "nan"], "--launch-timeout must be a finite number, not nan"),
    (["cluster", "detect", "-o", "detected.json", "--launch-timeout", "nan"],
     "--launch-timeout must be a finite number, not nan"),
])
def test_threads_and_timeouts_of_a_worker(argv, words, tmp_path):
    """``--intra-threads 100000`` crashed TensorFlow's server as it made its threads;
    the task here has a valid cluster file, so nothing but the option is wrong."""
    port = free_port()
    cluster = write(tmp_path / "c.json", json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}"]},
        "devices": [{"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    argv = [tmp_path / arg if arg.endswith(".json") else arg for arg in argv]
    if argv[0] == "worker":
        argv += ["--cluster", cluster, "--task", "0"]
    code, lines, seconds = tfpart(*argv, timeout=60)
    assert_refused((code, lines, seconds), words)
    assert seconds < 30  # before TensorFlow starts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- TF_CONFIG: read like any JSON input, each field checked ------------------------------
def tf_config(index=0, job="worker", addresses=("127.0.0.1:2222",), **changed):
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": job, "index": index}, **changed})


@pytest.mark.parametrize("raw,words", [
    ("[" * 5000 + "]" * 5000, "TF_CONFIG: nested 5000 levels deep, more than the 64 allowed"),
    (tf_config().replace('"index": 0', '"index": 1e400'),
     "TF_CONFIG: 1e400 is too large for a number"),
])
def test_tf_config_deep_or_with_a_huge_number(raw, words):
    """Both ended in tracebacks (RecursionError, OverflowError)."""
    assert_refused(tfpart("worker", env={"TF_CONFIG": raw}), words)


@pytest.mark.parametrize("raw,words", [
    (tf_config(index=1.0), "TF_CONFIG: task.index: must be an integer, not 1.0"),
    (tf_config(index=True), "TF_CONFIG: task.index: must be an integer, not True"),
    (tf_config(index="0"), "TF_CONFIG: task.index: must be an integer, not '0'"),
    (tf_config(index=1), "TF_CONFIG: task.index: 1 is not a task of job 'worker', which has 1"),
    (tf_config(index=-1), "TF_CONFIG: task.index: -1 is not a task of job 'worker'"),
    (tf_config(index=10**30), f"TF_CONFIG: task.index: {10**30} is not a task"),
    (tf_config(job="ps"), "TF_CONFIG: task.type: 'ps' is not a job of the cluster (worker)"),
    (tf_config(job=["worker"]), "TF_CONFIG: task.type: ['worker'] is not a job"),
    (tf_config(addresses=["127.0.0.1:99999"]),
     "TF_CONFIG: cluster.worker[0]: '127.0.0.1:99999' is not a host:port address"),
    (tf_config(addresses=[7]), "TF_CONFIG: cluster.worker[0]: 7 is not a host:port address"),
    (tf_config(addresses=[]), "TF_CONFIG: cluster.worker: must be a list of host:port"),
    (tf_config(cluster={"a/b": ["h:1"]}), "TF_CONFIG: cluster.a/b: is not a job name"),
    (tf_config(cluster=[]), "TF_CONFIG: cluster: must be an object of jobs"),
    (tf_config(task=None), 'TF_CONFIG: task: must be an object with "type" and "index"'),
    ("[1]", 'TF_CONFIG: must be a JSON object with "cluster" and "task"'),
    ('{"cluster": ', "TF_CONFIG: not valid JSON: Expecting value"),
    (" " * (MAX_TF_CONFIG_BYTES + 1), f"more than the {MAX_TF_CONFIG_BYTES} it may have"),
])
def test_each_field_of_tf_config(raw, words):
    from tfpart.commands import tf_config_task
    from tfpart.core.errors import TfpartError

    with pytest.raises(TfpartError) as error:
        tf_config_task(raw)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_valid_tf_config():
    from tfpart.commands import tf_config_task

    raw = tf_config(index=1, addresses=["10.0.0.1:2222", "[fe80::1]:2222"],
                    environment="cloud")
    assert tf_config_task(raw) == ({"worker": ["10.0.0.1:2222", "[fe80::1]:2222"]}, 1,
                                   "worker")


# -- devices ------------------------------------------------------------------------------
def many_devices(n):
    return {"name": f"{n} devices", "devices": [
        {"name": f"/job:worker/task:{i // 8}/device:GPU:{i % 8}",
         "kind": "V100" if i % 2 else "T4"} for i in range(n)],
        "cluster": {"worker": [f"10.0.{i // 256}.{i % 256}:2222" for i in range(n // 8)]},
        "links": {"pairs": [{"between": ["/job:worker/task:0/device:GPU:0",
                                         "/job:worker/task:0/device:GPU:1"],
                             "bandwidth": "300GB/s"}]}}


def test_ten_thousand_devices_load_in_seconds(tmp_path):
    from costmodel.roofline import CostModel
    from tfpart.core.cluster import load_cluster
    from tfpart.core.graph import OpGraph

    path = write(tmp_path / "c.json", json.dumps(many_devices(10_000)))
    start = time.monotonic()
    cluster = load_cluster(path)
    graph = OpGraph()
    for i in range(100):
        graph.add_op(f"op{i}", op_type="MatMul", flops=1e9, bytes_accessed=1e6)
    cost = CostModel(graph, cluster)
    assert time.monotonic() - start < 10  # about 1 s on a 2-core machine
    assert cost.compute.shape == (100, 10_000)
    assert cluster.link(0, 1).bandwidth == 300e9  # the named pair
    assert cluster.link(2, 3) == cluster.link(9_990, 9_991)  # same host, same kinds
    assert cluster.link(0, 9_999) == cluster.link(8, 16)  # across hosts
    assert len(cluster.links) == 10_000 * 9_999 // 2  # computed on demand, not stored


def test_too_many_devices_to_plan(tmp_path):
    cluster = write(tmp_path / "c.json", json.dumps(many_devices(MAX_PLANNED_DEVICES + 8)))
    assert_refused(tfpart("compile", "--cluster", cluster, "-o", tmp_path / "out"),
                   str(cluster), f"at most {MAX_PLANNED_DEVICES} devices")


def test_link_tables_equal_pairwise_links():
    """The dense tables the solvers read hold each pair's own link."""
    from tfpart.core.cluster import cluster_from_dict, sub_cluster

    cluster = cluster_from_dict(many_devices(24))
    arrays = cluster.link_table.arrays()
    for i in range(24):
        for j in range(24):
            link = cluster.link(i, j)
            assert arrays["latency"][i, j] == (link.latency if link else 0.0)
            assert arrays["inverse_bandwidth"][i, j] == (1 / link.bandwidth if link else 0)
    small = sub_cluster(cluster, [1, 0, 9])
    assert small.link(0, 1) == cluster.link(0, 1) and small.link(1, 2) == cluster.link(0, 9)


# -- the model: batch size, inlined size --------------------------------------------------
@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_batch_size_past_tensorflows_tensor_limit(tmp_path):
    """It crashed Grappler (batch 10**7 on the example model) before the check."""
    result = tfpart("compile", "--batch-size", 10**7, "-o", tmp_path / "out", timeout=300,
                    memory=TF_MEMORY)
    assert_refused(result, str(DEFAULT_MODEL_DIR), "more than TensorFlow's limit of 2**31-1",
                   "the largest batch size this model allows is 65535")


@pytest.mark.slow
@pytest.mark.any_onednn
def test_simulate_a_plan_of_a_huge_batch(tmp_path):
    plan = write(tmp_path / "plan.json", json.dumps({
        "format_version": 2, "assignment": {}, "algorithm": "greedy", "options": {},
        "microbatches": 1, "predicted": None, "lower_bound": None,
        "context": {"batch_size": 10**9, "cluster_file": str(DEFAULT_CLUSTER_FILE)}}))
    assert_refused(tfpart("simulate", DEFAULT_MODEL_DIR, plan, timeout=300,
                          memory=TF_MEMORY), "at batch size 1000000000",
                   "the largest batch size this model allows is 65535")
    plan.write_text(plan.read_text().replace(str(10**9), str(10**12)))
    assert_refused(tfpart("simulate", DEFAULT_MODEL_DIR, plan),
                   "context.batch_size 1000000000000 is more than 2147483647")


def deepen(model, levels):
    """Make a SavedModel's function that calls another function twice call a copy of
    itself instead, ``levels`` deep: each level doubles the ops inlining makes.
    (Tracing so many levels is itself exponential in TensorFlow: 20 take minutes.)"""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = Path(model) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    library = proto.meta_graphs[0].graph_def.library

    def calls(fdef):
        return [n for n in fdef.node_def if n.op in ("PartitionedCall",
                                                     "StatefulPartitionedCall")]

    doublers = [f for f in library.function if len(calls(f)) == 2]
    top = {}
    for doubler in doublers:
        below = doubler.signature.name
        for level in range(1, levels):
            copy = library.function.add()
            copy.CopyFrom(doubler)
            copy.signature.name = f"{doubler.signature.name}_level{level}"
            for node in calls(copy):
                node.attr["f"].func.name = below
            below = copy.signature.name
        top[doubler.signature.name] = below
    for fdef in library.function:
        if len(calls(fdef)) == 1:  # the functions that call a doubler
            for node in calls(fdef):
                node.attr["f"].func.name = top.get(node.attr["f"].func.name,
                                                   node.attr["f"].func.name)
    pb.write_bytes(proto.SerializeToString())
    return pb.stat().st_size


@pytest.mark.slow
@pytest.mark.any_onednn
def test_functions_calling_each_other_twice_per_level(tmp_path):
    """20 levels inline into 2**22 ops from a SavedModel of about 30 KB (each level two
    calls, an add and an identity; the leaf a relu and an identity; two more above)."""
    import tensorflow as tf

    leaf = tf.function(tf.nn.relu, autograph=False)
    twice = tf.function(lambda x: leaf(x) + leaf(x), autograph=False)
    module = tf.Module()
    module.f = tf.function(lambda x: twice(x), autograph=False,
                           input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    model = tmp_path / "bomb"
    tf.saved_model.save(module, str(model), signatures={"serving_default": module.f})
    assert deepen(model, 20) < 64_000
    result = tfpart("compile", model, "-o", tmp_path / "out", timeout=300, memory=TF_MEMORY)
    assert_refused(result, str(model), "inlining the signature's function calls would make "
                   f"{2**22} ops, more than the {MAX_GRAPH_OPS} tfpart handles")


@pytest.mark.slow
@pytest.mark.any_onednn
def test_more_microbatches_than_the_model_batch(tmp_path):
    """The example model's signature fixes no batch: its default batch is 1."""
    assert_refused(tfpart("compile", "--microbatches", 4, "-o", tmp_path / "out",
                          timeout=300, memory=TF_MEMORY),
                   "4 micro-batches of a batch of 1", "--microbatches 1 or fewer")


@pytest.mark.slow
@pytest.mark.any_onednn
def test_microbatches_past_what_a_compiled_graph_may_hold(tmp_path):
    """1024 micro-batches of the example model's 92 ops ran past 300 s in the rewrite;
    refused once the model is read, before planning, naming the most allowed."""
    largest = MAX_COMPILED_OPS // 92
    code, lines, seconds = tfpart("compile", "--batch-size", 1024, "--microbatches", 1024,
                                  "-o", tmp_path / "out", timeout=120, memory=TF_MEMORY)
    assert_refused((code, lines, seconds), str(DEFAULT_MODEL_DIR),
                   f"1024 micro-batches of 92 ops make 94208 ops to compile, more than the "
                   f"{MAX_COMPILED_OPS} tfpart handles; at most {largest} micro-batches")
    assert seconds < 60 and not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.any_onednn
def test_microbatches_a_compile_chooses_keep_to_the_same_bound():
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster
    from tfpart.core.limits import largest_microbatches

    planned = plan_model(DEFAULT_MODEL_DIR, load_cluster(DEFAULT_CLUSTER_FILE),
                         batch_size=1024, pipeline=True, options={"max_microbatches": 1024})
    plan, graph = planned.plan, planned.graph
    tried = sorted(int(m) for m in plan.predicted.pipeline.microbatch_choices)
    most = largest_microbatches(len(graph))
    assert most == MAX_COMPILED_OPS // len(graph) < 1024
    assert tried[-1] <= most and plan.microbatches <= most
    assert plan.options["max_microbatches"] == most


# -- simulate checks a plan against its model and cluster ---------------------------------
@pytest.fixture(scope="module")
def example_plan(tmp_path_factory):
    """A plan of the example model: every op on the first device."""
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.core.cluster import load_cluster
    from tfpart.core.plan import Plan

    graph, info = read_model(read_saved_model(DEFAULT_MODEL_DIR), DEFAULT_MODEL_DIR)
    device = load_cluster(DEFAULT_CLUSTER_FILE).device_names[0]
    return Plan(assignment={op: device for op in graph.ops}, algorithm="single", context={
        "batch_size": info.batch_size, "cluster_file": str(DEFAULT_CLUSTER_FILE),
        "signature": info.signature})


def simulate_in_process(capsys, plan, tmp_path):
    from tfpart.cli import main

    plan.save(tmp_path / "plan.json")
    code = main(["simulate", str(DEFAULT_MODEL_DIR), str(tmp_path / "plan.json")])
    return code, capsys.readouterr().err.splitlines()


def changed(plan, **fields):
    import dataclasses

    return dataclasses.replace(plan, **fields)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_simulate_checks_the_plan_against_model_and_cluster(example_plan, capsys, tmp_path):
    code, lines = simulate_in_process(capsys, example_plan, tmp_path)
    assert code == 0, lines
    ops = list(example_plan.assignment)
    first = example_plan.assignment[ops[0]]
    cases = [
        (changed(example_plan, assignment={**example_plan.assignment, "no/such/op": first}),
         "places 1 op the model does not have, e.g. no/such/op"),
        (changed(example_plan, assignment={op: first for op in ops[1:]}),
         f"does not place 1 op of the model, e.g. {ops[0]}"),
        (changed(example_plan, assignment={**example_plan.assignment,
                                           ops[0]: "/device:GPU:7"}),
         "places ops on /device:GPU:7, which the cluster"),
        (changed(example_plan, stages={op: 0 for op in ops} | {"ghost": 0}),
         "(in stages), e.g. ghost"),
        (changed(example_plan, stages={op: 9 for op in ops}),
         "has stage 9, but a cluster of 3 devices runs at most 3 stages"),
        (changed(example_plan, stages=Stages({op: 0 for op in ops}, microbatches=2)),
         "2 micro-batches of a batch of 1"),
    ]
    for plan, words in cases:
        code, lines = simulate_in_process(capsys, plan, tmp_path)
        assert_refused((code, lines, 0), str(tmp_path / "plan.json"), words)
