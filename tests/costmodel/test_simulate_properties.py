"""Invariants of the simulator on random DAGs, placements and clusters."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, simulate
from costmodel.arrays import graph_arrays
from partitioner.lower_bound import critical_path_bound, work_bound
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.cluster import cluster_from_dict, cluster_of_devices
from tfpart.core.graph import OpGraph

PROPERTY = settings(max_examples=80, deadline=None)


@st.composite
def placed_graphs(draw):
    graph, cluster = draw(random_dags()), draw(random_clusters())
    device_of = np.array(draw(st.lists(st.integers(0, len(cluster) - 1),
                                       min_size=len(graph), max_size=len(graph))))
    return graph, cluster, device_of


@PROPERTY
@given(placed_graphs())
def test_precedence_and_transfers_are_respected(case):
    graph, cluster, device_of = case
    cost = CostModel(graph, cluster)
    s = simulate(cost, device_of)
    for u, v, edge in graph.edges():
        i, j = cost.index[u], cost.index[v]
        delay = cost.edge_time(edge, device_of[i], device_of[j]) if not edge["control"] else 0.0
        assert s.start[j] >= s.end[i] + delay - 1e-12


@PROPERTY
@given(placed_graphs())
def test_no_two_ops_overlap_on_an_executor(case):
    graph, cluster, device_of = case
    s = simulate(CostModel(graph, cluster), device_of)
    executor = np.array(cluster.executor_of)[device_of]
    for e in set(executor):
        mine = np.flatnonzero(executor == e)
        spans = sorted(zip(s.start[mine], s.end[mine]))
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in
                   zip(spans, spans[1:]))


@PROPERTY
@given(placed_graphs())
def test_makespan_is_above_both_lower_bounds(case):
    graph, cluster, device_of = case
    cost = CostModel(graph, cluster)
    makespan = simulate(cost, device_of).makespan
    assert makespan >= critical_path_bound(cost) * (1 - 1e-9)
    assert makespan >= work_bound(cost) * (1 - 1e-9)


@PROPERTY
@given(random_dags())
def test_single_cpu_makespan_is_the_sum_of_op_times(graph):
    cost = CostModel(graph, cluster_of_devices(["cpu"]))
    s = simulate(cost, np.zeros(len(graph), dtype=int))
    assert s.makespan == pytest.approx(cost.compute.sum())
    assert s.bytes_moved == 0


DISPATCH = 10e-6  # the test GPU's host cost per op
TEST_GPU = {"description": "a GPU whose kernels take bytes / bandwidth, no more",
            "peak_flops": {"fp32": 1e14}, "memory_bandwidth": 1e12, "memory": 1e10,
            "host_link_bandwidth": 1e10, "peer_link_bandwidth": 1e10, "efficiency": {},
            "multiprocessors": 80, "op_overhead_s": DISPATCH, "source": "a test"}
KERNEL_SIZES = {"tiny": (0.01, 1.0), "large": (1.0, 50.0), "mixed": (0.01, 50.0)}


@st.composite
def gpu_dags(draw):
    """A random DAG of element-wise ops whose kernels on the test GPU take between the
    regime's bounds times the host's dispatch."""
    regime = draw(st.sampled_from(sorted(KERNEL_SIZES)))
    low, high = KERNEL_SIZES[regime]
    n = draw(st.integers(1, 25))
    graph = OpGraph()
    for i in range(n):
        kernel = draw(st.floats(low, high)) * DISPATCH
        graph.add_op(f"op{i}", op_type="Relu", bytes_accessed=kernel * 1e12)
        for j in draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else ():
            graph.add_edge(f"op{j}", f"op{i}", bytes=4096)
    return regime, graph


@settings(max_examples=20, deadline=None)
@given(gpu_dags())
def test_a_gpu_step_is_bounded_by_the_host_issuing_and_the_device_running_kernels(case):
    """The host issues the GPU's ops one after another; the GPU runs each kernel once it
    is issued and the kernel before it is done. With kernels shorter than an issue the
    host sets the pace (the step is every dispatch and the last kernel); with longer
    ones the GPU does (the first dispatch, then every kernel back to back); never
    less than either timeline's total."""
    regime, graph = case
    cluster = cluster_from_dict({"kinds": {"test-gpu": TEST_GPU},
                                 "devices": [{"name": "/device:GPU:0", "kind": "test-gpu"}]})
    cost = CostModel(graph, cluster)
    s = simulate(cost, np.zeros(len(graph), dtype=int))
    kernels = cost.compute[:, 0] - DISPATCH
    dispatches = DISPATCH * len(graph)
    assert s.host_busy[0] == pytest.approx(dispatches)
    assert s.busy[0] == pytest.approx(kernels.sum())
    assert s.makespan >= max(dispatches, kernels.sum()) * (1 - 1e-9)
    assert s.makespan <= cost.compute.sum() * (1 + 1e-9)
    if regime == "tiny":
        assert s.makespan == pytest.approx(dispatches + kernels[s.order[-1]])
    elif regime == "large":
        assert s.makespan == pytest.approx(DISPATCH + kernels.sum())


@PROPERTY
@given(placed_graphs())
def test_live_range_peak_is_bounded_and_equals_a_replay_of_the_schedule(case):
    """The live-range peak is never above the all-alive figure, never below any op's
    inputs and outputs beside the device's variables, and equals a brute-force replay
    of the simulated schedule's buffers."""
    from costmodel.memory import all_alive_memory
    from costmodel.simulate import live_peak

    graph, cluster, device_of = case
    cost = CostModel(graph, cluster)
    s = simulate(cost, device_of)
    names = cluster.device_names
    bound = all_alive_memory(graph, {op: names[d] for op, d in zip(cost.ops, device_of)},
                             names)
    replayed = replay_peaks(cost, s)
    for d, name in enumerate(names):
        params = sum(graph.ops[cost.ops[i]]["param_bytes"] for i in np.flatnonzero(device_of == d))
        assert params <= s.peak_memory[d] <= bound[name] + 1e-6
        assert s.peak_memory[d] == pytest.approx(params + replayed[d], abs=1e-6)
    assert live_peak(cost, device_of).tolist() == pytest.approx(s.peak_memory.tolist())
    a = graph_arrays(cost)
    for i, op in enumerate(cost.ops):
        d = device_of[i]
        if cost.compute[i, d] <= 0 or a.forwarding[i]:  # a zero-time op's inputs may be
            continue  # freed as it starts; a forwarding op may write into its input
        inputs = sum(a.out_bytes[p] if device_of[p] != d else
                     0.0 if a.aliasing[p] else a.own_bytes[p]
                     for p in {cost.index[u] for u, e in graph.in_edges(op).items()
                               if not e["control"]})
        params = a.param_bytes[device_of == d].sum()
        assert s.peak_memory[d] >= params + a.own_bytes[i] + inputs - 1e-6


def replay_peaks(cost, schedule):
    """Activation peak per device, replayed buffer by buffer in plain Python: an op's
    output from its start (a received copy from its transfer's start) until the last
    reader there ends (or its transfers finish, on the sender), through aliasing ops
    on the same device and forwarding ops that write into an input's buffer once
    every other reader of it is done, shape-only readers holding nothing; graph
    outputs to the end; kernels' copies of their inputs while they run; at equal
    times frees first."""
    graph, a = cost.graph, graph_arrays(cost)
    device = schedule.device
    owner, begin, nbytes = {}, {}, {}  # by (owner op, device)
    readers = {}  # (owner op, device) -> [(reader op or None for a send, end)]
    inputs = {i: [cost.index[u] for u, e in graph.in_edges(op).items() if not e["control"]]
              for i, op in enumerate(cost.ops)}
    for i in schedule.order:
        if a.aliasing[i] and inputs[i] and device[inputs[i][0]] == device[i]:
            owner[i] = owner[inputs[i][0]]
        else:
            owner[i] = i
            begin[i, device[i]], nbytes[i, device[i]] = schedule.start[i], a.own_bytes[i]
        for p in inputs[i] if not a.shape_only[i] else ():
            readers.setdefault((owner[p], device[i]), []).append((i, schedule.end[i]))
    for i, src, dst, start, finish in schedule.transfers:
        begin[owner[i], dst], nbytes[owner[i], dst] = start, a.out_bytes[i]
        readers.setdefault((owner[i], src), []).append((None, finish))
    buffer = {key: key for key in begin}  # forwarded outputs live in an input's buffer
    for i in schedule.order:
        key = (i, device[i])
        if not a.forwarding[i] or not nbytes.get(key):
            continue
        for p in inputs[i]:
            source = (owner[p], device[i])
            output = any(not graph.out_edges(cost.ops[j]) for j in owner if owner[j] == owner[p]
                         and device[j] == device[i])
            if not a.constant[owner[p]] and source in nbytes and not output \
                    and nbytes[source] == pytest.approx(a.own_bytes[i], rel=1e-6) \
                    and all(end <= schedule.start[i] for r, end in readers[source] if r != i):
                buffer[key] = buffer[source]
                break
    buffers = {}
    for key, home in buffer.items():
        last = schedule.makespan if not graph.out_edges(cost.ops[key[0]]) else \
            max([end for _, end in readers.get(key, [])] + [begin[key]])
        if home == key:
            buffers[home] = [begin[key], last, nbytes[key]]
    for key, home in buffer.items():
        if home != key:
            buffers[home][1] = max(buffers[home][1], schedule.makespan if not
                                   graph.out_edges(cost.ops[key[0]]) else
                                   max([end for _, end in readers.get(key, [])], default=0))
    for i in np.flatnonzero(a.scratch_bytes):  # a kernel's copies of its inputs
        buffers[f"scratch of {i}", device[i]] = [schedule.start[i], schedule.end[i],
                                                 a.scratch_bytes[i]]
    peaks = np.zeros(len(cost.cluster))
    for d in range(len(peaks)):
        mine = [b for (o, dd), b in buffers.items() if dd == d and b[2] > 0]
        for t in {b[0] for b in mine}:
            alive = sum(b[2] for b in mine if b[0] <= t < max(b[1], b[0]))
            peaks[d] = max(peaks[d], alive)
    return peaks


def chain(n, nbytes, op_type="Relu"):
    graph = OpGraph()
    for i in range(n):
        graph.add_op(f"op{i}", op_type=op_type, bytes_accessed=1e9,
                     outputs=[((nbytes // 4,), "float32")])
        if i:
            graph.add_edge(f"op{i - 1}", f"op{i}", bytes=nbytes)
    return graph


def test_chain_frees_activations_as_it_goes():
    graph = chain(10, 4_000_000, "Transpose")
    s = simulate(CostModel(graph, cluster_of_devices(["cpu"])), np.zeros(10, dtype=int))
    assert s.peak_memory[0] == pytest.approx(2 * 4_000_000)  # an op's input and output


def test_element_wise_ops_write_into_the_buffer_of_an_input_they_read_last():
    graph = chain(10, 4_000_000, "Relu")
    s = simulate(CostModel(graph, cluster_of_devices(["cpu"])), np.zeros(10, dtype=int))
    assert s.peak_memory[0] == pytest.approx(4_000_000)  # one buffer, written over
    graph.add_op("late", op_type="Transpose", bytes_accessed=1e9,
                 outputs=[((1_000_000,), "float32")])
    graph.add_edge("op0", "late", bytes=4_000_000)  # op0 is read after op1 starts
    graph.add_edge("op9", "late", bytes=4_000_000)
    s = simulate(CostModel(graph, cluster_of_devices(["cpu"])), np.zeros(11, dtype=int))
    assert s.peak_memory[0] == pytest.approx(3 * 4_000_000)  # op0, op9's chain, late


def test_shape_reads_hold_no_buffer_and_einsum_holds_copies_of_its_inputs_while_it_runs():
    graph = chain(3, 4_000_000, "Transpose")
    graph.add_op("shape", op_type="Shape", outputs=[((1,), "int32")])
    graph.add_edge("op0", "shape", bytes=4_000_000)  # runs last: nothing reads it
    cost = CostModel(graph, cluster_of_devices(["cpu"]))
    s = simulate(cost, np.zeros(4, dtype=int), priority=np.array([3.0, 2.0, 1.0, 0.0]))
    assert s.start[3] >= s.end[2]
    assert s.peak_memory[0] == pytest.approx(2 * 4_000_000)  # not op0 beside op1 and op2
    graph = chain(2, 4_000_000, "Einsum")
    s = simulate(CostModel(graph, cluster_of_devices(["cpu"])), np.zeros(2, dtype=int))
    assert s.peak_memory[0] == pytest.approx(3 * 4_000_000)  # input, its copy, output


def test_concurrent_transfers_share_a_link():
    graph = OpGraph()
    graph.add_op("src", op_type="Relu", bytes_accessed=1e6,
                 outputs=[((1_000_000,), "float32")] * 2)
    for k in range(2):
        graph.add_op(f"dst{k}", op_type="Relu", bytes_accessed=1e6)
    graph.add_op("other", op_type="Relu", bytes_accessed=1e6, outputs=[((1_000_000,), "float32")])
    graph.add_edge("src", "dst0", bytes=4e6)
    graph.add_edge("other", "dst1", bytes=4e6)
    cluster = cluster_from_dict({"devices": [
        {"name": f"/device:CPU:{i}", "kind": "cpu"} for i in range(2)],
        "links": {"same_host": {"bandwidth": "1GB/s", "latency": 0}}})
    cost = CostModel(graph, cluster)
    # src and other both on device 0, both consumers on device 1: one link, two transfers
    s = simulate(cost, np.array([0, 1, 1, 0]))
    spans = sorted((t[3], t[4]) for t in s.transfers)
    assert len(spans) == 2 and spans[1][0] >= spans[0][1]  # the second waits
    assert s.link_bytes == {(0, 1): 8e6}


def test_a_copy_queued_on_its_link_does_not_hold_its_sender():
    # 'first' and 'second' on device 0 both send 4 MB to device 1 over one 1 GB/s link;
    # 'after' (device 0) reads only 'second', so it starts when 'second' ends (plus
    # the Send's moment), not when the queued copy of 'second' reaches the link.
    graph = OpGraph()
    for name in ("first", "second", "after", "far0", "far1"):
        graph.add_op(name, op_type="Relu", bytes_accessed=1e6,
                     outputs=[((1_000_000,), "float32")])
    graph.add_edge("first", "second", control=True)
    graph.add_edge("first", "far0", bytes=4e6)
    graph.add_edge("second", "far1", bytes=4e6)
    graph.add_edge("second", "after", bytes=4e6)
    cost = CostModel(graph, two_device_cluster(message_cost="1us"))
    s = simulate(cost, np.array([0, 0, 0, 1, 1]))
    second, after = cost.index["second"], cost.index["after"]
    queued = max(t[3] for t in s.transfers if t[0] == second)
    assert queued > s.end[second] + 1e-3  # its copy waits for the first one's
    assert s.start[after] == pytest.approx(s.end[second] + 1e-6)


def test_an_executor_chooses_among_all_ops_ready_at_the_same_moment():
    # When 'head' ends, 'tail' (its consumer, first on the long path) and 'side'
    # (ready since the start, no successors) are both ready on the one device: the
    # higher upward rank goes first, though 'side' was queued earlier.
    graph = OpGraph()
    for name, work in (("head", 1e9), ("side", 1e8), ("tail", 1e9), ("end", 1e9)):
        graph.add_op(name, op_type="Relu", bytes_accessed=work)
    graph.add_edge("head", "tail")
    graph.add_edge("tail", "end")
    cost = CostModel(graph, cluster_of_devices(["cpu"]))
    s = simulate(cost, np.zeros(4, dtype=int))
    assert s.start[cost.index["tail"]] == pytest.approx(s.end[cost.index["head"]])
    assert s.start[cost.index["side"]] == pytest.approx(s.end[cost.index["end"]])


def test_core_group_devices_share_an_executor():
    graph = OpGraph()
    for n in "ab":
        graph.add_op(n, op_type="Relu", bytes_accessed=2e10)
    shared = cluster_from_dict({"devices": [
        {"name": f"/device:CPU:{i}", "kind": "cpu", "core_group": "process"} for i in range(2)]})
    separate = cluster_of_devices(["cpu", "cpu"])
    both = np.array([0, 1])
    assert simulate(CostModel(graph, shared), both).makespan == pytest.approx(2.0, rel=1e-4)
    assert simulate(CostModel(graph, separate), both).makespan == pytest.approx(1.0, rel=1e-4)


def two_device_cluster(**link):
    return cluster_from_dict({"devices": [
        {"name": f"/device:CPU:{i}", "kind": "cpu"} for i in range(2)],
        "links": {"same_host": {"bandwidth": "1GB/s", "latency": 0, **link}}})


def producer_and_parallel_work():
    """src (device 0) sends 4 MB to dst (device 1) while device 1 also has 'busy' work."""
    graph = OpGraph()
    graph.add_op("src", op_type="Relu", bytes_accessed=1e6, outputs=[((1_000_000,), "float32")])
    graph.add_op("dst", op_type="Relu", bytes_accessed=1e6)
    graph.add_op("busy", op_type="Relu", bytes_accessed=2e8)
    graph.add_edge("src", "dst", bytes=4e6)
    return graph


def test_cpu_copy_links_keep_both_endpoints_busy():
    graph = producer_and_parallel_work()
    device_of = np.array([0, 1, 1])
    plain = simulate(CostModel(graph, two_device_cluster()), device_of)
    copying = simulate(CostModel(graph, two_device_cluster(cpu_copy=True)), device_of)
    # With a DMA-like link, the 4 ms transfer overlaps the 10 ms of 'busy' on device 1;
    # when device 1's core does the copy, the two add up.
    assert copying.makespan > plain.makespan + 3e-3


def test_step_overhead_is_added_once():
    graph = producer_and_parallel_work()
    base = cluster_of_devices(["cpu"])
    slow = cluster_from_dict({"step_overhead": "2ms",
                              "devices": [{"name": "/device:CPU:0", "kind": "cpu"}]})
    device_of = np.zeros(3, dtype=int)
    assert simulate(CostModel(graph, slow), device_of).makespan == pytest.approx(
        simulate(CostModel(graph, base), device_of).makespan + 2e-3)


def test_replicated_graphs_do_not_depend_on_the_process_hash_seed():
    """The ops replicas share come from a set; the replicated graph (whose op order
    breaks the simulator's ties) must not follow that set's order, which changes with
    each process's string hashing: the same model once predicted 11.8 or 12.3 ms."""
    script = ("from tfpart.core.graph import OpGraph\n"
              "from costmodel.pipeline import replicas_graph, _replicate\n"
              "g = OpGraph()\n"
              "for i in range(12):\n"
              "    g.add_op(f'v{i}', op_type='VarHandleOp', param_bytes=4)\n"
              "    g.add_op(f'r{i}', op_type='ReadVariableOp'); g.add_edge(f'v{i}', f'r{i}')\n"
              "rep, _ = replicas_graph(g, [0.5, 0.5], [0, 1], 0, set())\n"
              "mb, _ = _replicate(g, ['a'], dict.fromkeys(g.ops, 0), dict.fromkeys(g.ops, 0), 2,"
              " 'gpipe')\n"
              "print(list(rep.ops), list(mb.ops))\n")
    orders = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True, env={"PYTHONHASHSEED": seed, "PATH": ""},
                             cwd=Path(__file__).parents[2]).stdout
              for seed in ("1", "2", "3")}
    assert len(orders) == 1


def test_a_gpu_host_issues_at_the_dispatch_cost_a_profile_of_the_host_measured(tmp_path):
    """A profile of a GPU's kind measured on its host (``tfpart profile``) holds the cost
    per op of issuing to it; the GPU is priced with it, and a chain of tiny ops on the
    GPU takes one such cost per op. A CPU's profile is no figure for a GPU. A profile
    written before the figure was recorded derives it when loaded."""
    from costmodel.measured import MeasuredProfile
    from tfpart.core.device_kinds import load_device_kinds

    tiny = {"op_type": "AddV2", "input_shapes": [[2], [2]], "time_s": 20e-6, "count": 3,
            "flops": 2.0, "bytes_accessed": 24.0}
    kinds = load_device_kinds()
    profile = MeasuredProfile.from_measurements("T4", [tiny], kinds["T4"],
                                                dispatch_overhead_s=5e-6,
                                                hardware={"cpu": "a test", "gpu": "T4"})
    assert profile.host_dispatch == pytest.approx(25e-6)
    old = profile.to_dict()
    old["fitted"] = {k: v for k, v in old["fitted"].items() if k != "host_dispatch_s"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert MeasuredProfile.load(tmp_path / "old.json").host_dispatch == pytest.approx(25e-6)
    cpu_profile = MeasuredProfile.from_measurements("cpu", [tiny], kinds["cpu"],
                                                    dispatch_overhead_s=5e-6,
                                                    hardware={"cpu": "a test"})

    graph = OpGraph()
    for i in range(8):
        graph.add_op(f"op{i}", op_type="Relu", bytes_accessed=1e4)
        if i:
            graph.add_edge(f"op{i - 1}", f"op{i}", bytes=4096)
    cluster = cluster_of_devices(["cpu", "T4"])
    measured = CostModel(graph, cluster, measured=[profile])
    datasheet = CostModel(graph, cluster)
    assert measured.host_dispatch.tolist() == [0.0, pytest.approx(25e-6)]
    assert datasheet.host_dispatch[1] == kinds["T4"].op_overhead_s
    assert CostModel(graph, cluster, measured=[cpu_profile]).host_dispatch[1] == \
        kinds["T4"].op_overhead_s
    on_gpu = np.ones(8, dtype=int)
    kernel = measured.device_time()[-1, 1]
    assert kernel < 25e-6  # the host sets the pace
    assert simulate(measured, on_gpu).makespan == pytest.approx(8 * 25e-6 + kernel)
