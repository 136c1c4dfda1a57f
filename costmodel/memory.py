"""Memory of a placement: persistent bytes plus an upper bound on activations.

Each device holds the variables of the colocation groups placed on it, the outputs of
the ops it runs (except ops whose output aliases their input's buffer, such as
``ReadVariableOp`` and ``Reshape``), and one copy of every tensor it receives from
another device. Counting
every activation as alive for the whole step is an upper bound on the true peak; a
schedule-aware live-range estimate can only lower it.
"""
from __future__ import annotations

from tfpart.dtypes import tensor_bytes
from tfpart.ops import ALIASING_OPS


def output_bytes(attrs):
    """Bytes of all outputs of an op (from its ``outputs`` list of (shape, dtype))."""
    return sum(tensor_bytes(shape, dtype) for shape, dtype in attrs["outputs"])


def new_output_bytes(attrs):
    """Bytes an op's outputs add on its own device (nothing for aliasing ops)."""
    if attrs["op_type"] in ALIASING_OPS:
        return 0
    return sum(tensor_bytes(shape, dtype) for shape, dtype in attrs["outputs"])


def device_memory(graph, assignment, device_names):
    """Predicted peak bytes per device name for an op -> device assignment.

    Examples
    --------
    >>> from tfpart.graph import OpGraph
    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp", param_bytes=400)
    >>> g.add_op("y", op_type="MatMul", outputs=[((10,), "float32")])
    >>> g.add_edge("w", "y")
    >>> device_memory(g, {"w": "A", "y": "B"}, ["A", "B"])
    {'A': 400, 'B': 40}
    """
    memory = {name: 0 for name in device_names}
    received = set()
    for name, attrs in graph.ops.items():
        device = assignment[name]
        memory[device] += attrs["param_bytes"] + new_output_bytes(attrs)
        for succ, edge in graph.out_edges(name).items():
            dst = assignment[succ]
            if not edge["control"] and dst != device and (name, dst) not in received:
                received.add((name, dst))
                memory[dst] += output_bytes(attrs)
    return memory
