"""What the simulator prices is what TensorFlow is given: for plans with micro-batches or
replicas, every op the pipeline rewriter imports into the compiled signature, on its
device, is a node of the execution graph the simulator prices
(``costmodel.execution.expand``), and every tensor the compiled model copies
between devices is an edge of it between those devices, and the other way round.

Both sides are read by the copy each op computes (its origin, replica and micro-batch):
the compiled model's ops by the stamps the rewriter puts on them
(:mod:`rewriters.copies`), the execution graph's by the attributes each copy carries.
Left out on both sides: the slices of the batch and the concatenation of the outputs
(not stamped; priced as ``feed/``, ``merge/``), the constants that give a filter
split's sizes and axes (not priced), the collectives of an all-reduce (priced as
``pack/`` and ``allreduce/``) and the variables (captured, not imported).

The schedule's ordering edges are compared too, as tasks: each barrier of the
execution graph (``…-waits``) and each gate of the compiled signature
(``tfpart_gate…``) says that, on its device, the task whose last ops it waits for
runs before the task whose first ops wait for it; a task is (replica, micro-batch,
stage, phase), read from the copies on either side of it. Both sides must give the
same set of such pairs, which fixes each device's order of tasks: the schedule's task
table (:mod:`costmodel.schedules`), for every schedule."""
import collections
import re

import pytest

from tests.conftest import local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]  # the graphs, not how they run

NOT_IMPORTED = ("Placeholder", "PlaceholderWithDefault", "VarHandleOp")
PRICED_ELSEWHERE = re.compile(r"(^|/)(feed|merge|pack|allreduce)/|-waits$")
# a filter split's sizes and axes: constants the rewriter adds to slice and concatenate
SPLIT_CONSTANTS = re.compile(r"/tfpart_split/(slice_sizes|slice_axis|concat_axis)$")


def _task(result, copy):
    """The task (replica, micro-batch, stage, phase) that op copy ``(origin, replica,
    micro-batch)`` belongs to, or None for an op of no stage."""
    origin, replica, microbatch = copy
    stage = (result.plan.stages or {}).get(origin)
    if stage is None:
        return None
    return replica, microbatch, stage, result.graph.ops[origin].get("phase") or "forward"


def _key(copy):
    """A stamped copy (:mod:`rewriters.copies`) as (origin, replica, micro-batch)."""
    return copy.origin, copy.replica, copy.microbatch


def _one_task(result, copies, what):
    """The one task ``copies`` belong to (AssertionError if several)."""
    tasks = {_task(result, copy) for copy in copies} - {None}
    assert len(tasks) == 1, (what, tasks)
    return tasks.pop()


def _priced_order(result):
    """The schedule's (earlier task, later task, device) pairs in the execution graph:
    one per barrier (``…-waits``), from the copies before and after it."""
    from costmodel.execution import expand
    from costmodel.roofline import CostModel
    from tfpart.core.cluster import normalize_device_name

    expansion = expand(result.plan, CostModel(result.graph, result.cluster))
    graph, where = expansion.cost.graph, expansion.where()
    names = result.cluster.device_names

    def copy(op):
        attrs = graph.ops[op]
        return attrs.get("origin", op), attrs.get("replica"), attrs.get("microbatch")

    return {(_one_task(result, map(copy, graph.predecessors(op)), op),
             _one_task(result, map(copy, graph.successors(op)), op),
             normalize_device_name(names[where[op]]))
            for op in graph.ops if op.endswith("-waits")}


def _built_order(result, out):
    """The schedule's (earlier task, later task, device) pairs in the compiled
    signature: one per gate (``tfpart_gate…``) that waits for a task, from the stamped
    copies it waits for and those that wait for it."""
    from rewriters.copies import copies_in
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.core.cluster import normalize_device_name

    meta = read_saved_model(out).meta_graphs[0]
    copies = copies_in(meta)
    body = next(f for f in meta.graph_def.library.function
                if any(n.name in copies for n in f.node_def))
    gates = {node.name: node for node in body.node_def if node.name.startswith("tfpart_gate")}
    waiting = collections.defaultdict(list)
    for node in body.node_def:
        for source in node.input:
            if source.startswith("^") and source[1:] in gates and node.name in copies:
                waiting[source[1:]].append(_key(copies[node.name]))
    order = set()
    for name, gate in gates.items():
        before = [_key(copies[source[1:]]) for source in gate.input
                  if source.startswith("^") and source[1:] in copies]
        if before:
            order.add((_one_task(result, before, name), _one_task(result, waiting[name], name),
                       normalize_device_name(gate.device)))
    return order


def _priced(result):
    """(nodes, cross-device edges) of the execution graph the simulator prices."""
    from costmodel.execution import expand
    from costmodel.roofline import CostModel
    from tfpart.core.cluster import normalize_device_name

    expansion = expand(result.plan, CostModel(result.graph, result.cluster))
    graph, where = expansion.cost.graph, expansion.where()
    names = result.cluster.device_names
    key = {}
    for op, attrs in graph.ops.items():
        origin = attrs.get("origin", op)
        if PRICED_ELSEWHERE.search(op) or result.graph.ops.get(origin, {}).get(
                "op_type") in NOT_IMPORTED:
            continue
        key[op] = (origin, attrs.get("replica"), attrs.get("microbatch"))
    nodes = collections.Counter((key[op], normalize_device_name(names[where[op]]))
                                for op in key)
    edges = {(key[u], key[v]) for u, v, edge in graph.edges()
             if u in key and v in key and not edge["control"] and where[u] != where[v]}
    return nodes, edges


def _built(result, out):
    """(nodes, cross-device edges) of the signature the rewriter built in ``out``, each
    op keyed by the copy it is stamped as (:mod:`rewriters.copies`). The ops of a sum
    over micro-batches or replicas (casts, products, the sum) are one node."""
    from rewriters.copies import copies_in
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.core.cluster import normalize_device_name

    meta = read_saved_model(out).meta_graphs[0]
    copies = copies_in(meta)
    body = next(f for f in meta.graph_def.library.function
                if any(n.name in copies for n in f.node_def))
    key, device = {}, {}
    for node in body.node_def:
        copy = copies.get(node.name)
        if copy is None or result.graph.ops.get(copy.origin, {}).get(
                "op_type") in NOT_IMPORTED or SPLIT_CONSTANTS.search(copy.origin):
            continue
        key[node.name] = (copy.origin, copy.replica, copy.microbatch)
        device[node.name] = normalize_device_name(node.device)
    nodes = collections.Counter((key[name], device[name]) for name in key
                                if not key[name][0].startswith("accumulate/"))
    nodes.update({(key[name], device[name]) for name in key
                  if key[name][0].startswith("accumulate/")})
    edges = set()
    for node in body.node_def:
        for source in node.input:
            source = source.split(":")[0]
            if node.name in key and source in key and device[source] != device[node.name] \
                    and not source.startswith("^"):
                edges.add((key[source], key[node.name]))
    return nodes, edges


@pytest.mark.parametrize("model, batch, devices, options", [
    pytest.param("residual_cnn", 8, 3, {"microbatches": 3}, id="pipeline"),
    pytest.param("training_step:conv_tower", 8, 3, {"microbatches": 2, "schedule": "gpipe"},
                 id="training-pipeline"),
    pytest.param("training_step:conv_tower", 8, 3, {"microbatches": 3, "schedule": "1f1b"},
                 id="training-pipeline-1f1b"),
    pytest.param("training_step:conv_tower", 8, 3, {"microbatches": 4,
                                                     "schedule": "interleaved"},
                 id="training-pipeline-interleaved"),
    pytest.param("training_step:conv_tower", 8, 3, {"strategy": "data_parallel"},
                 id="training-replicas-all_reduce"),
    pytest.param("residual_cnn", 16, 4, {"algorithm": "hybrid", "options": {
        "groups": 2, "form": "pipeline"}}, id="replicas-of-a-pipeline"),
    pytest.param("residual_cnn", 16, 4, {"algorithm": "hybrid", "options": {
        "groups": 2, "form": "placement"}}, id="replicas-of-a-placement"),
    pytest.param("training_step:conv_tower", 8, 4, {"algorithm": "hybrid", "options": {
        "groups": 2, "form": "pipeline", "schedule": "interleaved"}},
                 id="training-replicas-of-an-interleaved-pipeline"),
    pytest.param("residual_cnn", 8, 3, {"algorithm": "filter_split", "options": {
        "min_gain": -1e9, "candidates": 10 ** 6}}, id="filter-splits"),
])
def test_the_rewriter_builds_the_execution_graph_the_simulator_prices(
        model, batch, devices, options, exported, training_step, write_cluster, tmp_path):
    from tfpart.compile import compile_model

    if model.startswith("training_step:"):
        path = training_step(model.split(":")[1], "adam")
        options = {**options, "signature": "train_step"}
    else:
        path = exported(model)
    out = tmp_path / "out"
    result = compile_model(path, write_cluster(local_cluster(devices)), out,
                           batch_size=batch, **options)
    assert result.plan.microbatches > 1 or result.plan.replicas or result.plan.splits
    priced_nodes, priced_edges = _priced(result)
    built_nodes, built_edges = _built(result, out)
    assert len(priced_nodes) > len(result.graph) / 2  # the copies were read
    assert priced_nodes == built_nodes, (priced_nodes - built_nodes, built_nodes - priced_nodes)
    assert priced_edges == built_edges, (priced_edges - built_edges, built_edges - priced_edges)
    if result.plan.stages and len(set(result.plan.stages.values())) > 1:
        assert priced_edges  # a pipeline over devices copies between them
    if "schedule" in options:
        assert result.plan.schedule == options["schedule"]
    priced_order, built_order = _priced_order(result), _built_order(result, out)
    if result.plan.microbatches > 1 and len(set(result.plan.stages.values())) > 1:
        assert priced_order  # the schedule orders a device's tasks
    assert priced_order == built_order, (priced_order - built_order, built_order - priced_order)
