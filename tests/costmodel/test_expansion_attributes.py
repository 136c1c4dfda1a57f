"""The execution graphs the simulator prices say in every op's attributes which op it
copies, for which replica and micro-batch (``costmodel.pipeline.copy_attrs``): no
name is parsed to recover them. On random training steps, every expansion (replicas
reducing to one device or all-reducing, a pipeline, replicas of a pipeline) holds
exactly one copy of each per-sample op per replica and micro-batch, and the shared ops
and the ops that feed and merge the batch carry none."""
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.pipeline import (_replicate, all_reduce_replicas_graph, pipeline_replicas_graph,
                                replicas_graph, shared_ops)
from tests.random_graphs import random_dags


@st.composite
def training_steps(draw):
    """A random DAG whose last op is a training step's update of a variable it reads."""
    graph = draw(random_dags(min_ops=3, max_ops=12))
    ops = list(graph.ops)
    graph.add_op("w", op_type="VarHandleOp", param_bytes=1000)
    graph.add_op("apply", op_type="ResourceApplyGradientDescent", phase="update",
                 colocation="w")
    graph.add_edge("w", ops[0], bytes=1000)
    graph.add_edge(ops[-1], "apply", bytes=1000)
    graph.add_edge("w", "apply")
    return graph


def copies(graph):
    """(origin, replica, microbatch) of every copy, counted."""
    return Counter((a["origin"], a["replica"], a["microbatch"]) for a in graph.ops.values()
                   if a.get("origin") is not None)


@settings(max_examples=25, deadline=None)
@given(training_steps(), st.integers(1, 3), st.integers(1, 3))
def test_every_copy_says_what_it_copies(graph, replicas, microbatches):
    shared = shared_ops(graph)
    per_sample = [op for op in graph.ops if op not in shared]
    fractions = [1.0 / replicas] * replicas
    expected = Counter((op, r, None) for op in per_sample for r in range(replicas))
    one, _ = replicas_graph(graph, fractions, list(range(replicas)), 0, set())
    assert copies(one) == expected
    assert all(one.ops[op].get("origin") is None for op in shared)
    ring, _ = all_reduce_replicas_graph(graph, fractions, list(range(replicas)), set())
    assert copies(ring) == expected + Counter((op, r, None) for op in shared
                                              for r in range(replicas))
    stage_of = {op: 0 for op in per_sample}
    device_of = {op: 0 for op in graph.ops}
    pipeline, _ = _replicate(graph, ["d0"], device_of, stage_of, microbatches, "gpipe")
    assert copies(pipeline) == Counter((op, None, m) for op in per_sample
                                       for m in range(microbatches))
    names = [f"d{r}" for r in range(replicas)]
    maps = [{op: r for op in graph.ops} for r in range(replicas)]
    staged, _ = pipeline_replicas_graph(graph, names, fractions, maps, stage_of, microbatches)
    per_microbatch = Counter((op, r, m) for op in per_sample for r in range(replicas)
                             for m in range(microbatches))
    assert copies(staged) == per_microbatch
    staged, _ = pipeline_replicas_graph(graph, names, fractions, maps, stage_of, microbatches,
                                        all_reduce=True)
    assert copies(staged) == per_microbatch + Counter((op, r, None) for op in shared
                                                      for r in range(replicas))
