"""The cost of filter splits: an op's output channels computed in slices on several
devices (:mod:`tfpart.core.splits`).

:func:`split_graph` rewrites a graph the way the rewriter does: the sliced operand
goes whole to a ``SplitV`` on its producer's device, which sends each slice to its
device (only the slice crosses the link); the other operands are sent whole to every
slice's device (the broadcast); slice ``i`` does ``sizes[i] / channels`` of the
arithmetic; and the op's own name becomes the concatenation, on the op's device, which
gathers the slices' outputs. A slice keeps the op's fixed per-kernel costs, so slices
too thin to pay for their launches and copies come out slower, as they run.

Examples
--------
A matmul split 3:1 over two devices: the slices do 3/4 and 1/4 of the arithmetic, the
weights' columns are cut on the weights' device, the activations go to both.

>>> from tfpart.core.graph import OpGraph
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder", outputs=[((8, 16), "float32")])
>>> g.add_op("w", op_type="ReadVariableOp", outputs=[((16, 4), "float32")])
>>> g.add_op("y", op_type="MatMul", flops=1024.0, input_shapes=((8, 16), (16, 4)),
...          outputs=[((8, 4), "float32")],
...          sliced={"input": 1, "axis": 1, "producer": "w"})
>>> g.add_edge("x", "y", bytes=512); g.add_edge("w", "y", bytes=256)
>>> split, where = split_graph(g, {"y": ([0, 1], [3, 1])}, {"x": 0, "w": 0, "y": 0})
>>> [split.ops[op]["flops"] for op in ("y/tfpart_split/part0", "y/tfpart_split/part1")]
[768.0, 256.0]
>>> split.edge("y/tfpart_split/slices", "y/tfpart_split/part1")["bytes"], where["y/tfpart_split/part1"]
(64.0, 1)
>>> split.ops["y"]["op_type"], sorted(split.predecessors("y"))
('ConcatV2', ['y/tfpart_split/part0', 'y/tfpart_split/part1'])
"""
from __future__ import annotations

import numpy as np

from tfpart.core.dtypes import tensor_bytes
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph, op_attributes
from tfpart.core.splits import SCOPE, part_name


def slicer_name(op):
    """The ``SplitV`` that cuts ``op``'s sliced operand."""
    return f"{op}/{SCOPE}/slices"


def split_graph(graph, splits, device_of):
    """``graph`` with each op of ``splits`` computed in slices.

    Parameters
    ----------
    graph : tfpart.core.graph.OpGraph
    splits : dict
        Op name -> ``(device indices, channel counts)``, one pair per slice, in the
        order of the output's channels; the op must carry ``sliced``.
    device_of : dict
        Op name -> device index of every op of ``graph``.

    Returns
    -------
    (tfpart.core.graph.OpGraph, dict)
        The split graph and the device index of each of its ops.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If an op of ``splits`` has no output channels to split (a plan made for
        another model, or edited by hand).
    """
    for op in splits:
        attrs = graph.ops[op]
        if not attrs.get("sliced") or not attrs["outputs"]:
            raise PlacementError("", f"splits op {op} ({attrs['op_type']}), which has no "
                                 "output channels to split")
    ops, where = {}, dict(device_of)
    for op, attrs in graph.ops.items():
        if op not in splits:
            ops[op] = op_attributes(op, attrs)
            continue
        devices, sizes = splits[op]
        out_shape, dtype = attrs["outputs"][0]
        out_bytes = tensor_bytes(out_shape, dtype)
        ops[op] = op_attributes(op, dict(attrs, op_type="ConcatV2", flops=0.0, sliced=None,
                                         bytes_accessed=2.0 * out_bytes, cost=None))
        operand = attrs["sliced"]
        operand_shape = tuple(attrs["input_shapes"][operand["input"]])
        ops[slicer_name(op)] = op_attributes(slicer_name(op), dict(
            op_type="SplitV", phase=attrs.get("phase"),
            bytes_accessed=2.0 * tensor_bytes(operand_shape, dtype),
            outputs=[(_resized(operand_shape, operand["axis"], size), dtype)
                     for size in sizes]))
        where[slicer_name(op)] = device_of[operand["producer"]]
        broadcast = sum(edge["bytes"] for src, edge in graph.in_edges(op).items()
                        if not edge["control"]) - tensor_bytes(operand_shape, dtype)
        for i, (device, size) in enumerate(zip(devices, sizes)):
            share = size / sum(sizes)
            table = attrs.get("cost")
            ops[part_name(op, i)] = op_attributes(part_name(op, i), dict(
                attrs, flops=attrs["flops"] * share, colocation=part_name(op, i),
                bytes_accessed=broadcast + share * (attrs["bytes_accessed"] - broadcast),
                outputs=[(_resized(out_shape, len(out_shape) - 1, size), dtype)],
                batch_fraction=share, sliced=None,
                cost=None if table is None else {d: t * share for d, t in table.items()}))
            where[part_name(op, i)] = device
    split = OpGraph.from_tables(ops, {})  # every op first: each edge then joins two
    add_edge = split.add_edge
    for src, dst, edge in graph.edges():
        if dst not in splits:
            add_edge(src, dst, bytes=edge["bytes"], control=edge["control"],
                     comm=edge.get("comm"))
            continue
        operand = graph.ops[dst]["sliced"]
        nbytes = edge["bytes"]
        if src == operand["producer"] and not edge["control"]:
            shape = graph.ops[dst]["input_shapes"][operand["input"]]
            operand_bytes = tensor_bytes(shape, graph.ops[dst]["outputs"][0][1])
            add_edge(src, slicer_name(dst), bytes=operand_bytes)
            nbytes -= operand_bytes  # what else it sends (the same tensor twice: x @ x)
            if nbytes <= 0:
                continue
        for i in range(len(splits[dst][0])):
            add_edge(src, part_name(dst, i), bytes=nbytes, control=edge["control"])
    for op in splits:
        for i, slice_bytes in enumerate(_output_bytes(ops[slicer_name(op)])):
            add_edge(slicer_name(op), part_name(op, i), bytes=slice_bytes)
            add_edge(part_name(op, i), op, bytes=_output_bytes(ops[part_name(op, i)])[0])
    return split, where


def split_cost(cost, splits, device_of):
    """The cost model of :func:`split_graph` (same cluster, profiles and precision)
    and the device index of each of its ops, from ``device_of`` (an array over
    ``cost.ops``)."""
    split, where = split_graph(cost.graph, splits, dict(zip(cost.ops, map(int, device_of))))
    split_costs = cost.of(split, unchanged=set(cost.index).difference(splits))
    return split_costs, np.array([where[op] for op in split_costs.ops])


def _resized(shape, axis, size):
    return tuple(size if k == axis else n for k, n in enumerate(shape))


def _output_bytes(attrs):
    return [float(tensor_bytes(shape, dtype)) for shape, dtype in attrs["outputs"]]
