"""Ops TensorFlow never runs: stateless ops none of whose outputs reach a signature
output or a stateful op. Grappler's pruner and the function runtime drop them (Keras
RNN layers leave such ops behind: a cell step computed outside the loop to learn its
output shapes), so they take no time, hold no memory and receive no tensors."""
from __future__ import annotations


def dead_ops(graph, output_ops):
    """Names of the ops of ``graph`` (an OpGraph) from which no path leads to one of
    ``output_ops`` or to a stateful op.

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> for name in "xyzw": g.add_op(name, op_type="MatMul")
    >>> g.add_op("assign", op_type="AssignVariableOp", stateful=True)
    >>> g.add_edge("x", "y"); g.add_edge("x", "z"); g.add_edge("w", "assign")
    >>> sorted(dead_ops(g, ["y"]))
    ['z']
    """
    needed = set(output_ops) | {op for op, attrs in graph.ops.items() if attrs["stateful"]}
    stack = list(needed)
    while stack:
        for source in graph.predecessors(stack.pop()):
            if source not in needed:
                needed.add(source)
                stack.append(source)
    return set(graph.ops) - needed


def drop_costs(graph, ops):
    """Give ``ops`` no work and no outputs, and make their inputs control edges: no
    tensor is sent to them or kept for them. They stay in the graph, so a plan still
    gives them a device.

    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> g.add_op("x", op_type="MatMul", outputs=[((8,), "float32")])
    >>> g.add_op("y", op_type="MatMul", flops=64.0, outputs=[((8,), "float32")])
    >>> g.add_edge("x", "y", bytes=32)
    >>> drop_costs(g, ["y"])
    >>> g.ops["y"]["flops"], g.ops["y"]["outputs"], g.edge("x", "y")
    (0.0, [], {'bytes': 0.0, 'control': True})
    """
    for op in ops:
        attrs = graph.ops[op]
        attrs.update(flops=0.0, bytes_accessed=0.0, outputs=[], body_bytes=0)
        for edge in graph.in_edges(op).values():
            edge.update(bytes=0.0, control=True)
