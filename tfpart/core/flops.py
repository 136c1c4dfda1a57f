"""Floating-point operation counts of TensorFlow ops from their shapes and attributes.

Multiply-add counts as two FLOPs. Shapes are tuples of ints (already concrete).

Examples
--------
>>> matmul_like_flops("MatMul", [(32, 128), (128, 10)], [(32, 10)], {})
81920
>>> matmul_like_flops("Conv2D", [(1, 8, 8, 3), (3, 3, 3, 4)], [(1, 8, 8, 4)], {})
13824
>>> op_flops("Relu", [(2, 5)], [(2, 5)], {})
10
>>> op_flops("Reshape", [(2, 5), (2,)], [(10,)], {})
0
>>> op_flops("Conv2DBackpropFilter", [(1, 8, 8, 3), (4,), (1, 8, 8, 4)], [(3, 3, 3, 4)], {})
13824
"""
from __future__ import annotations

import math
import re

from tfpart.core.ops import (AXIS_REDUCTION_OPS, CONV_BACKPROP_FILTER_OPS, CONV_BACKPROP_INPUT_OPS,
                             DATA_MOVEMENT_OPS, FREE_OPS, MATMUL_OPS)

PER_ELEMENT = {"FusedBatchNorm": 4, "FusedBatchNormV3": 4, "Softmax": 5, "LogSoftmax": 5,
               "Gelu": 8, "Erf": 8, "Tanh": 4, "Sigmoid": 4, "Exp": 4, "Log": 4, "Rsqrt": 2,
               "Sqrt": 2, "Pow": 4, "LayerNorm": 8}
WINDOWED = {"MaxPool", "AvgPool", "MaxPoolV2", "MaxPool3D", "AvgPool3D"}


def matmul_like_flops(op_type, inputs, outputs, attrs):
    """FLOPs of the matrix-multiply and convolution family."""
    out = math.prod(outputs[0]) if outputs else 0
    if op_type in ("MatMul", "_FusedMatMul"):
        a = inputs[0]
        return 2 * out * (a[0] if attrs.get("transpose_a") else a[-1])
    if op_type.startswith("BatchMatMul"):
        a = inputs[0]
        return 2 * out * (a[-2] if attrs.get("adj_x") else a[-1])
    if op_type in ("Conv2D", "Conv3D", "_FusedConv2D", "Conv"):
        filt = inputs[1]
        return 2 * out * math.prod(filt[:-1])
    if op_type == "DepthwiseConv2dNative":
        filt = inputs[1]
        return 2 * out * filt[0] * filt[1]
    if op_type in CONV_BACKPROP_INPUT_OPS:  # (input sizes, filter, output gradient)
        filt, grad = inputs[1], inputs[2]
        per_output = filt[0] * filt[1] if op_type.startswith("Depthwise") else \
            math.prod(filt[:-1])
        return 2 * math.prod(grad) * per_output
    if op_type in CONV_BACKPROP_FILTER_OPS:  # (input, filter sizes, output gradient)
        grad, filt = inputs[2], outputs[0] if outputs else ()
        per_output = filt[0] * filt[1] if op_type.startswith("Depthwise") else \
            math.prod(filt[:-1])
        return 2 * math.prod(grad) * per_output
    if op_type == "Einsum":
        return einsum_flops(attrs.get("equation", ""), inputs, outputs)
    return 2 * out


def einsum_flops(equation, inputs, outputs):
    """2 x the product of every index's extent (ellipsis dims through the output).

    >>> einsum_flops("abc,cd->abd", [(2, 3, 4), (4, 5)], [(2, 3, 5)])
    240
    """
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    extents = {}
    for spec, shape in zip(lhs, inputs):
        letters = spec.replace("...", "")
        offset = len(shape) - len(letters) if "..." in spec else 0
        start = spec.index("...") if "..." in spec else len(letters)
        for k, letter in enumerate(letters):
            extents[letter] = shape[k + (offset if k >= start else 0)]
    out = math.prod(outputs[0]) if outputs else 1
    out_letters = re.sub(r"[^A-Za-z]", "", equation.split("->")[-1]) if "->" in equation else ""
    ellipsis = out // max(1, math.prod(extents.get(c, 1) for c in out_letters))
    return 2 * math.prod(extents.values()) * ellipsis


def op_flops(op_type, inputs, outputs, attrs):
    """FLOPs of one op; shapes are lists of int tuples, attrs plain Python values (an
    empty shape among a matmul's or convolution's operands is one TensorFlow could not
    infer, as in a ``tf.compat.v1.while_loop``'s body: 0 FLOPs).

    >>> op_flops("MatMul", [(), (3, 3)], [()], {})
    0
    """
    if op_type in MATMUL_OPS:
        if any(not shape for shape in inputs[:3]):
            return 0
        return matmul_like_flops(op_type, inputs, outputs, attrs)
    if op_type in FREE_OPS or op_type in DATA_MOVEMENT_OPS or not outputs:
        return 0
    if op_type in WINDOWED:
        window = math.prod(attrs.get("ksize", [1]))
        return math.prod(outputs[0]) * window
    if op_type in AXIS_REDUCTION_OPS:
        return math.prod(inputs[0]) if inputs else 0
    elements = max(math.prod(shape) for shape in outputs)
    return PER_ELEMENT.get(op_type, 1) * elements
