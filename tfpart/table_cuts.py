"""Which tables a compile cuts into row shards, and into how many rows each.

A table that fits no device is cut so that it fits (:func:`cut_tables`), and so is the
largest one when an op (a training step's dense update of a table and its slots) needs
more memory than any device has. A table that fits is cut too when the cut plans where
the whole table does not, or predicts a faster step (:func:`faster_with_tables_cut`).
The cut itself is :mod:`rewriters.row_shard`'s, priced by reading the cut graph again
(:func:`rewriters.reader.read_with_row_shards`); the rows of each shard are
:mod:`partitioner.row_shards`'. Row shards do not combine with replicas, filter splits
or a training step's pipeline stages yet (:func:`refusal`).

Examples
--------
>>> from partitioner.registry import get
>>> refusal(get("data_parallel"), training=False)
'do not combine with replicas or filter splits yet'
>>> refusal(get("pipeline"), training=False) is None, refusal(get("greedy"), training=True)
(True, None)
"""
from __future__ import annotations

import math

from partitioner.registry import get as get_algorithm
from tfpart.core.errors import PlacementError


def cut_tables(graph, info, proto, model_dir, cluster, timings):
    """The graph and info of the model with its tables that fit no device of
    ``cluster`` (with their optimizer's slots) cut into row shards
    (:mod:`partitioner.row_shards`), and the rows of each table's shards (empty if none
    is cut). When every variable fits but some op needs more memory than any device
    has (:func:`costmodel.memory.memory_lower_bound`: a training step's dense update
    of a table and its slots), the largest tables are cut while that lowers the need
    (:func:`_cut_for_an_op`).

    Raises
    ------
    PlacementError
        If such a table cannot be cut (a read other than by rows, a TF1 SavedModel),
        saying why."""
    from costmodel.memory import size_text
    from partitioner.row_shards import row_shard_sizes

    tables = _tables(graph, info)
    memories = [device.memory for device in cluster.devices]
    sizes = row_shard_sizes(tables, memories)
    if not sizes:
        if tables and info.format != "tf1":
            return _cut_for_an_op(graph, info, proto, model_dir, tables, memories, timings)
        return graph, info, {}
    table = max(sizes, key=lambda name: tables[name][0])
    too_big = (f"variable {table} needs {size_text(tables[table][0])}, more than any device "
               f"has for it ({size_text(max(memories))})")
    if info.format == "tf1":
        raise PlacementError(model_dir, f"{too_big}, and the tables of a TensorFlow 1 "
                             "SavedModel are not cut into row shards")
    try:
        graph, info, sizes = _read_cut(proto, model_dir, info, sizes, timings)
    except PlacementError as exc:
        raise PlacementError(model_dir, f"{too_big}, and {exc.problem}") from None
    return graph, info, sizes


def _tables(graph, info):
    """The model's variables with rows (name -> ``(bytes with its optimizer's slots,
    rows)``), which a cut could split."""
    from rewriters.row_region import table_shape

    nodes = {node.name: node for node in info.flat.graph_def.node} if info.flat else {}
    welded = {}  # a variable with its optimizer slots is placed as one
    for op, attrs in graph.ops.items():
        if attrs["op_type"] == "VarHandleOp":
            welded[attrs["colocation"]] = welded.get(attrs["colocation"], 0) + \
                attrs["param_bytes"]
    tables = {}
    for op, attrs in graph.ops.items():
        if attrs["op_type"] == "VarHandleOp" and attrs["param_bytes"] and op in nodes:
            shape = table_shape(nodes[op])[0]
            if shape and shape[0]:
                tables[op] = (welded[attrs["colocation"]], shape[0])
    return tables


def faster_with_tables_cut(whole, names, plan_cut):
    """``whole`` (the compile's attempt with no table cut,
    :class:`tfpart.compile._Attempt`, with its ``analysis``), or the same model with its
    largest cuttable tables (at most ``MAX_TABLES_CUT_FOR_AN_OP``) cut into a shard per
    device (shares by speed at the work that grows with the rows, within memory, when
    there is such work; else by memory) planned by ``plan_cut(graph, info, row_shards,
    names)`` with the strategies of ``names`` that combine with row shards, if that one
    plans where ``whole`` did not or predicts a faster step. When ``whole`` planned, the
    cut is tried only if spreading the tables' row work (a dense update) over their
    shards could save ``MIN_CUT_GAIN`` of its step: a lookup's time barely depends on a
    shard's rows."""
    from partitioner.row_shards import row_shard_sizes, speed_shares

    analysis = whole.analysis
    info = analysis.info
    usable = [name for name in names if not refusal(get_algorithm(name), info.training)]
    if info.format == "tf1" or not info.flat or not usable:
        return whole
    tables = _tables(analysis.graph, info)
    chosen = _largest_cuttable(info, tables)
    memories = [device.memory for device in whole.cost.cluster.devices]
    sizes, gain = {}, 0.0
    for table, region in chosen.items():
        nbytes, rows = tables[table]
        speeds = _row_work_speeds(whole.cost, region)
        shares = speed_shares(rows, speeds, nbytes / rows, memories) if speeds else None
        if shares:
            sizes[table] = shares
            gain += (1 - 1 / len(shares)) / max(speeds)  # its update spread, at best
        else:
            sizes.update(row_shard_sizes({table: (math.inf, rows)}, memories))
    step = whole.step_time
    if not sizes or gain < MIN_CUT_GAIN * step:  # planned whole, and a cut gains little
        return whole
    try:
        graph, cut_info, sizes = _read_cut(analysis.proto, analysis.model_dir, info, sizes,
                                           analysis.timings)
    except PlacementError:
        return whole
    cut = plan_cut(graph, cut_info, sizes, usable)
    if not cut.tried:
        return whole
    steps = {name: plan.step_time for name, (plan, _) in cut.tried.items()}
    if step <= min(steps.values()):
        whole.other = steps
        return whole
    cut.other = {name: plan.step_time for name, (plan, _) in whole.tried.items()}
    cut.failures = {**{name: failure for name, failure in whole.failures.items()
                       if name not in cut.tried}, **cut.failures}
    return cut


def _row_work_speeds(cost, region):
    """Each device's speed (1 / seconds) at the work of a table's rows that grows with
    them (a dense update in its ``region``: reads, element-wise arithmetic, segment
    sums, assignments of the table and its slots), from ``cost``; empty if there is
    none (lookups only, whose time barely depends on a shard's rows)."""
    rows = [cost.index[op] for op, kind in region.kinds.items()
            if kind in ROW_WORK and op in cost.index]
    seconds = cost.compute[rows].sum(axis=0) if rows else None
    if seconds is None or not (seconds > 0).any():
        return []
    return [1.0 / time if 0 < time < math.inf else 0.0 for time in seconds.tolist()]


# kinds of a region's ops (rewriters.row_region) whose time grows with a shard's rows
ROW_WORK = ("read", "elementwise", "segment_sum", "assign")
# a model that plans with its tables whole is planned again with them cut only if
# spreading their row work could save this fraction of its step
MIN_CUT_GAIN = 0.05


# tables tried one after the other when an op needs more memory than any device has
MAX_TABLES_CUT_FOR_AN_OP = 4


def _cut_for_an_op(graph, info, proto, model_dir, tables, memories, timings):
    """When every variable fits a device but some op needs more memory than any device
    has (:func:`costmodel.memory.memory_lower_bound`: a training step's dense update of
    a table and its slots), cut the largest cuttable tables (``tables``: name ->
    ``(bytes with its slots, rows)``), one after the other, each kept if it does not
    raise that need, until it fits the largest device. Returns what
    :func:`cut_tables` does (the model whole if the need stays above every device)."""
    from costmodel.memory import memory_lower_bound
    from partitioner.row_shards import row_shard_sizes

    need = memory_lower_bound(graph, len(memories))[0]
    best, chosen = (graph, info, {}), {}
    if need <= max(memories):
        return best
    for table in _largest_cuttable(info, tables):
        trial = {**chosen, **row_shard_sizes({table: (math.inf, tables[table][1])},
                                             memories)}
        try:
            cut = _read_cut(proto, model_dir, info, trial, timings)
        except PlacementError:
            continue
        cut_need = memory_lower_bound(cut[0], len(memories))[0]
        if cut_need <= need:  # two tables' updates may tie for the largest need
            best, chosen, need = cut, trial, cut_need
        if need <= max(memories):
            return best
    return graph, info, {}  # no plan fits either way: the partitioner says why


def _largest_cuttable(info, tables):
    """Of ``tables`` (:func:`_tables`), the largest whose rows can be cut, at most
    ``MAX_TABLES_CUT_FOR_AN_OP``, largest first: name -> its region
    (:func:`rewriters.row_region.row_region`)."""
    from rewriters.row_shard import cuttable_tables, output_nodes

    largest_first = sorted((name for name in tables if tables[name][1] >= 2),
                           key=lambda name: -tables[name][0])
    found = cuttable_tables(info.flat.graph_def, largest_first, output_nodes(info.flat))
    return dict(list(found.items())[:MAX_TABLES_CUT_FOR_AN_OP])


def _read_cut(proto, model_dir, info, sizes, timings):
    """The graph, info and sizes (companions added) of the model with the tables of
    ``sizes`` cut; PlacementError if one cannot be."""
    from rewriters.endpoints import check_nothing_kept_reads, kept_endpoints
    from rewriters.reader import read_with_row_shards
    from rewriters.row_shard import output_nodes, with_companions

    sizes = with_companions(info.flat.graph_def, sizes, output_nodes(info.flat))
    graph, cut_info = read_with_row_shards(proto, model_dir, info, sizes, timings)
    check_nothing_kept_reads(kept_endpoints(proto, info.signature), next(iter(sizes)),
                             model_dir)
    return graph, cut_info, sizes


def refusal(algorithm, training):
    """Why plans of ``algorithm`` (a :class:`partitioner.registry.Algorithm`) cannot be
    made with tables cut into row shards (the rewriter does not build the two
    together), or None if they can; ``training``: of a training step."""
    if algorithm.replicates or algorithm.splits:
        return "do not combine with replicas or filter splits yet"
    if algorithm.stages and training:
        return "whose updates in a training step do not combine with pipeline stages yet"
    return None


def check_combines(algorithm, row_shards, info, model_dir):
    """PlacementError naming ``model_dir`` if tables are cut (``row_shards``) and
    ``algorithm`` cannot plan them so (:func:`refusal`)."""
    why = refusal(algorithm, info.training) if row_shards else None
    if why:
        raise PlacementError(model_dir, f"table {next(iter(row_shards))} is cut into row "
                             f"shards, {'which ' * why.startswith('do')}{why}")
