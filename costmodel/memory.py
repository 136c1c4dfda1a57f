"""Memory of a placement: the bytes of its tensors, the all-alive reference figure and
a lower bound.

The memory a plan is held to is the live-range peak of each device under the
simulator's schedule (:func:`costmodel.simulate.peak_memory`): variables for the whole
step, every other tensor from when it is produced (or starts arriving) until its last
reader there ends. :func:`all_alive_memory`, every tensor alive for the whole step, is
kept only as the reference it replaced (benchmarks and tests compare the two); no
decision uses it.
"""
from __future__ import annotations

from tfpart.core.dtypes import chunk_bytes, tensor_bytes
from tfpart.core.ops import ALIASING_OPS, INPUT_COPYING_OPS


def output_bytes(attrs):
    """Bytes of all outputs of an op (from its ``outputs`` list of (shape, dtype), times
    its ``memory_fraction`` when it runs on a part of the batch: a micro-batch, a
    replica's share)."""
    fraction, total = attrs.get("memory_fraction", 1.0), 0
    for shape, dtype in attrs["outputs"]:  # a loop, not sum(): the simulator's hot path
        total += chunk_bytes(tensor_bytes(shape, dtype) * fraction)
    return total


def new_output_bytes(attrs):
    """Bytes an op's outputs add on its own device (nothing for aliasing ops)."""
    return 0 if attrs["op_type"] in ALIASING_OPS else output_bytes(attrs)


def scratch_bytes(attrs, in_edges):
    """Bytes an op holds only while it runs: the tensors of a control-flow op's or a
    call's bodies (one trip), the copies a kernel makes of its inputs (Einsum's
    operands, transposed for a batched matmul), at its share of the batch.

    >>> scratch_bytes({"op_type": "While", "body_bytes": 800, "memory_fraction": 0.5}, [])
    400.0
    >>> scratch_bytes({"op_type": "Einsum", "body_bytes": 0},
    ...                [{"bytes": 64.0, "control": False}, {"bytes": 0.0, "control": True}])
    64.0
    """
    copies = sum(edge["bytes"] for edge in in_edges if not edge["control"]) \
        if attrs["op_type"] in INPUT_COPYING_OPS else 0.0
    return copies + attrs.get("body_bytes", 0) * attrs.get("memory_fraction", 1.0)


def all_alive_memory(graph, assignment, device_names):
    """Bytes per device name if every tensor stayed alive for the whole step: variables,
    new outputs of the ops placed there and one copy of every tensor it receives (the
    figure tfpart used before live ranges; an upper bound on the live-range peak).

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp", param_bytes=400)
    >>> g.add_op("y", op_type="MatMul", outputs=[((64,), "float32")])
    >>> g.add_edge("w", "y")
    >>> all_alive_memory(g, {"w": "A", "y": "B"}, ["A", "B"])
    {'A': 400, 'B': 256}
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


def memory_lower_bound(graph, n_devices):
    """The least memory every one of ``n_devices`` equal devices needs for some plan to
    fit, and why: an op's colocation group's variables, its inputs and its outputs are
    on one device at once, and the variables are spread at best evenly.

    Returns
    -------
    tuple of (float, str)
        Bytes, and a phrase naming what needs them.

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp", param_bytes=400)
    >>> g.add_op("y", op_type="MatMul", outputs=[((64,), "float32")], colocation="w")
    >>> g.add_op("z", op_type="Relu", outputs=[((64,), "float32")])
    >>> g.add_edge("w", "y"); g.add_edge("y", "z", bytes=256)
    >>> memory_lower_bound(g, 2)
    (656.0, 'y (MatMul) with its inputs, outputs, scratch and the 400 B of variables it is \
colocated with')
    """
    group_params = {}
    for attrs in graph.ops.values():
        group_params[attrs["colocation"]] = group_params.get(attrs["colocation"], 0) + \
            attrs["param_bytes"]
    best, why = 0, "nothing"
    for op, attrs in graph.ops.items():
        inputs = sum(output_bytes(graph.ops[src]) for src, edge in graph.in_edges(op).items()
                     if not edge["control"] and graph.ops[src]["op_type"] not in ALIASING_OPS)
        need = group_params[attrs["colocation"]] + inputs + new_output_bytes(attrs) + \
            scratch_bytes(attrs, graph.in_edges(op).values())
        if need > best:
            best, why = need, (f"{op} ({attrs['op_type']}) with its inputs, outputs, scratch "
                               f"and the {size_text(group_params[attrs['colocation']])} of "
                               f"variables it is colocated with")
    spread = graph.total_param_bytes() / max(n_devices, 1)
    if spread > best:
        best, why = spread, f"the model's variables spread evenly over {n_devices} devices"
    return best, why


def size_text(nbytes):
    """Bytes for a message: in MB, or in KB or B when that would read 0.0 MB.

    >>> size_text(29.5e6), size_text(33_280), size_text(400)
    ('29.5 MB', '33.3 KB', '400 B')
    """
    if nbytes >= 1e5:
        return f"{nbytes / 1e6:.1f} MB"
    return f"{nbytes / 1e3:.1f} KB" if nbytes >= 1e3 else f"{nbytes:.0f} B"
