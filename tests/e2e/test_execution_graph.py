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
split's sizes and axes (not priced), the barriers of the
schedule (control edges), the collectives of an all-reduce (priced as ``pack/`` and
``allreduce/``) and the variables (captured, not imported)."""
import collections
import re

import pytest

from tests.conftest import local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]  # the graphs, not how they run

NOT_IMPORTED = ("Placeholder", "PlaceholderWithDefault", "VarHandleOp")
PRICED_ELSEWHERE = re.compile(r"(^|/)(feed|merge|pack|allreduce)/|-waits$")
# a filter split's sizes and axes: constants the rewriter adds to slice and concatenate
SPLIT_CONSTANTS = re.compile(r"/tfpart_split/(slice_sizes|slice_axis|concat_axis)$")


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
    pytest.param("training_step:conv_tower", 8, 3, {"microbatches": 2},
                 id="training-pipeline"),
    pytest.param("training_step:conv_tower", 8, 3, {"strategy": "data_parallel"},
                 id="training-replicas-all_reduce"),
    pytest.param("residual_cnn", 16, 4, {"algorithm": "hybrid", "options": {
        "groups": 2, "form": "pipeline"}}, id="replicas-of-a-pipeline"),
    pytest.param("residual_cnn", 16, 4, {"algorithm": "hybrid", "options": {
        "groups": 2, "form": "placement"}}, id="replicas-of-a-placement"),
    pytest.param("residual_cnn", 8, 3, {"algorithm": "filter_split", "options": {
        "min_gain": -1e9, "candidates": 10 ** 6}}, id="filter-splits"),
])
def test_the_rewriter_builds_the_execution_graph_the_simulator_prices(
        model, batch, devices, options, exported, write_cluster, tmp_path):
    import examples.models as models
    from tfpart.compile import compile_model

    if model.startswith("training_step:"):
        path = models.export_training_step(tmp_path / "model", model.split(":")[1], "adam")
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
