"""Filter splits: one op's output channels computed in slices on several devices.

A plan's ``splits`` maps an op to a :class:`tfpart.core.plan.Split`: slice ``i``
of its output's last axis (``sizes[i]`` channels, in order) is computed on
``devices[i]`` from the same slice of one operand (the filters of a convolution, the
columns of a matmul's right-hand side) and the whole of the others, and the op's own
name then concatenates the slices on the op's planned device. This module is the
vocabulary the cost model (:mod:`costmodel.splits`), the partitioner and the rewriter
(:mod:`rewriters.channel_split`) share: which ops split, which operand they slice, and
how the slices are named.

Every op here is linear in the sliced operand along the output's last axis, so the
slices concatenate to exactly the whole output: a convolution's output channel ``c``
reads filter ``c`` only, a matmul's column ``c`` reads column ``c`` of its right-hand
side, the filter gradient's channel ``c`` reads the output gradient's channel ``c``,
and the input gradient's channel ``c`` reads input channel ``c`` of the filters.

Examples
--------
>>> part_name("model/conv/Conv2D", 1)
'model/conv/Conv2D/tfpart_split/part1'
>>> part_of("StatefulPartitionedCall/model/conv/Conv2D/tfpart_split/part1")
('StatefulPartitionedCall/model/conv/Conv2D', 1)
>>> part_of("model/conv/Conv2D") is None
True
>>> sliced_operand("MatMul", {"transpose_b": True}), sliced_operand("Relu", {})
((1, 0), None)
"""
from __future__ import annotations

import re

SCOPE = "tfpart_split"
_PART = re.compile(rf"^(.*)/{SCOPE}/part(\d+)$")

# op type -> (index of the data input that is sliced, its axis that is sliced); the
# output is always sliced along its last axis. Convolutions in NHWC only.
_SLICED = {
    "Conv2D": (1, 3),  # filters [h, w, in, out]
    "Conv2DBackpropFilter": (2, 3),  # (input, filter_sizes, out_backprop [n, h, w, out])
    "Conv2DBackpropInput": (1, 2),  # (input_sizes, filter [h, w, in, out], out_backprop)
}
# op type -> the data input that gives the output's shape as a vector (the last entry
# is then the slice's channel count)
SIZES_INPUT = {"Conv2DBackpropFilter": 1, "Conv2DBackpropInput": 0}
SPLITTABLE_OPS = frozenset(_SLICED) | {"MatMul"}


def sliced_operand(op_type, attrs):
    """``(data input index, axis)`` of the operand an op's slices cut, or None if the
    op does not split. ``attrs`` holds the op's attributes as plain values
    (``transpose_b`` for a MatMul, ``data_format`` for a convolution)."""
    if op_type == "MatMul":
        return (1, 0 if attrs.get("transpose_b") else 1)
    if op_type in _SLICED and attrs.get("data_format", "NHWC") in ("NHWC", b"NHWC"):
        return _SLICED[op_type]
    return None


def part_name(op, i):
    """The name of slice ``i`` of ``op``."""
    return f"{op}/{SCOPE}/part{i}"


def part_of(name):
    """``(op, i)`` if ``name`` is slice ``i`` of a split op ``op``, else None."""
    found = _PART.match(name)
    return (found.group(1), int(found.group(2))) if found else None
