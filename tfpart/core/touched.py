"""Bytes an op reads and writes in memory, from its inputs' and outputs' shapes: the
roofline's memory term (:func:`costmodel.roofline.roofline_time`).

Most kernels read every input and write every output. Those that address a few rows of
a large operand do not: a gather of 80 rows from a 2M x 64 table reads 80 rows, not
512 MB; a scatter into a variable reads and writes the rows it updates; a sparse
segment reduction reads the rows its indices name; a slice copies the slice. Counting
their whole operand priced an 80-row lookup at 25.6 ms on a CPU where TensorFlow runs
it in microseconds (issue 39).

Examples
--------
>>> table, ids, rows = ((2_000_000, 64), "float32"), ((80,), "int32"), ((80, 64), "float32")
>>> bytes_touched("GatherV2", [table, ids, ((), "int32")], [rows])  # ids, rows read, rows written
41284
>>> bytes_touched("MatMul", [((80, 64), "float32"), ((64, 64), "float32")], [rows])
57344
"""
from __future__ import annotations

import math

from tfpart.core.dtypes import tensor_bytes

# Read rows of their first input (params) at the positions the other inputs give.
GATHER_OPS = {"Gather", "GatherV2", "ResourceGather", "GatherNd", "ResourceGatherNd"}
# Update, in place, the rows of their first input (a variable) that the indices name,
# from the last input (updates): the rows are read and written.
SCATTER_OPS = {
    f"{prefix}{kind}" for prefix in ("Scatter", "ResourceScatter", "ScatterNd",
                                     "ResourceScatterNd")
    for kind in ("Update", "Add", "Sub", "Mul", "Div", "Min", "Max")}
# Reduce the rows of their first input (data) that their second (indices) names.
SPARSE_SEGMENT_OPS = {f"SparseSegment{kind}{suffix}" for kind in ("Sum", "Mean", "SqrtN")
                      for suffix in ("", "WithNumSegments")}
# Copy part of their first input.
SLICE_OPS = {"Slice", "StridedSlice"}


def bytes_touched(op_type, inputs, outputs):
    """Bytes ``op_type`` reads and writes, given its inputs' and outputs' ``(shape,
    dtype)``: the rows a gather, scatter or sparse segment reduction addresses and the
    part a slice copies, else every input and output in full.

    >>> update = ((80, 64), "float32")
    >>> bytes_touched("ResourceScatterAdd", [((), "resource"), ((80,), "int32"), update], [])
    61760
    >>> bytes_touched("SparseSegmentSum", [((1000, 8), "float32"), ((10,), "int32"),
    ...                                    ((10,), "int32")], [((4, 8), "float32")])
    528
    >>> bytes_touched("Slice", [((1000, 8), "float32"), ((2,), "int32"), ((2,), "int32")],
    ...               [((1, 8), "float32")])
    80
    """
    whole = [tensor_bytes(shape, dtype) for shape, dtype in inputs]
    written = sum(tensor_bytes(shape, dtype) for shape, dtype in outputs)
    if op_type in GATHER_OPS or op_type in SLICE_OPS:
        return sum(whole[1:]) + 2 * written
    if op_type in SCATTER_OPS and len(inputs) >= 3:
        return sum(whole[1:]) + 2 * whole[-1]
    if op_type in SPARSE_SEGMENT_OPS and len(inputs) >= 2:
        (data_shape, dtype), (index_shape, _) = inputs[0], inputs[1]
        row = tensor_bytes(data_shape[1:], dtype)
        return math.prod(index_shape) * row + sum(whole[1:]) + written
    return sum(whole) + written
