"""Filter splits in a GraphDef: an op's output channels computed in slices on several
devices and concatenated (:mod:`tfpart.core.splits` says which ops and operands).

For an op with slices of ``sizes`` channels on ``devices``, the rewritten graph has

* ``<op>/tfpart_split/slices``: a ``SplitV`` of the sliced operand (the filters, or
  the columns of a matmul's right-hand side) into those sizes, on the device of the
  operand's producer, so only each slice crosses to its device;
* ``<op>/tfpart_split/part<i>``: a copy of the op reading slice ``i`` and the other
  operands whole, on ``devices[i]`` (a gradient op that takes its output's shape as a
  vector reads that vector with the last entry replaced by the slice's size);
* ``<op>`` itself: the ``ConcatV2`` of the slices along the last axis, on the op's
  own device, so every reader of the op reads the same tensor as before.

This is a library function of the pipeline pass, which imports the rewritten flat
graph (:mod:`rewriters.pipeline`); it is not a pass by itself.

Examples
--------
>>> import numpy as np, tensorflow as tf
>>> graph = tf.Graph()
>>> with graph.as_default():
...     x = tf.constant(np.arange(6.0).reshape(2, 3), name="x")
...     w = tf.constant(np.arange(12.0).reshape(3, 4), name="w")
...     y = tf.matmul(x, w, name="y")
>>> from tfpart.core.plan import Split
>>> split, devices = split_channels(graph.as_graph_def(), {"y": Split(
...     ["/device:CPU:0", "/device:CPU:1"], [3, 1])}, lambda name: "/device:CPU:0")
>>> devices["y/tfpart_split/part1"], [n.op for n in split.node if n.name == "y"]
('/device:CPU:1', ['ConcatV2'])
>>> with tf.Graph().as_default():
...     out = tf.graph_util.import_graph_def(split, return_elements=["y:0"], name="")
...     np.array_equal(tf.compat.v1.Session().run(out[0]),
...                    np.arange(6.0).reshape(2, 3) @ np.arange(12.0).reshape(3, 4))
True
"""
from __future__ import annotations

from rewriters.node_defs import int_attr, int_constant, make_node, type_attr
from rewriters.tf_import import tensorflow
from tfpart.core.errors import PlacementError
from tfpart.core.splits import SCOPE, SIZES_INPUT, part_name, sliced_operand


def split_channels(graph_def, splits, device_of):
    """A copy of ``graph_def`` with each op of ``splits`` computed in slices.

    Parameters
    ----------
    graph_def : tensorflow.GraphDef
    splits : dict
        A plan's ``splits``: op name -> :class:`tfpart.core.plan.Split`.
    device_of : callable
        The planned device of a node of ``graph_def``, by name.

    Returns
    -------
    (tensorflow.GraphDef, dict)
        The rewritten graph, and the device of each node it adds (the split ops keep
        their names, as the concatenations, on their own devices).

    Raises
    ------
    tfpart.core.errors.PlacementError
        If a split names an op that is missing or cannot be split.
    """
    tf = tensorflow()
    missing = sorted(set(splits) - {node.name for node in graph_def.node})
    if missing:
        raise PlacementError("", f"the plan splits op {missing[0]}, which the model does not have")
    new = tf.compat.v1.GraphDef()
    new.versions.CopyFrom(graph_def.versions)
    new.library.CopyFrom(graph_def.library)
    devices = {}
    for node in graph_def.node:
        if node.name in splits:
            for added, device in _split_node(node, splits[node.name], device_of):
                new.node.add().CopyFrom(added)
                devices[added.name] = device
        else:
            new.node.add().CopyFrom(node)
    return new, devices


def _split_node(node, split, device_of):
    """``(NodeDef, device)`` of the nodes that replace ``node``."""
    attrs = {"transpose_b": node.attr["transpose_b"].b if "transpose_b" in node.attr else False,
             "data_format": node.attr["data_format"].s if "data_format" in node.attr else "NHWC"}
    rule = sliced_operand(node.op, attrs)
    if rule is None:
        raise PlacementError("", f"the plan splits op {node.name}, but a {node.op} "
                             "cannot be split along its output channels")
    index, axis = rule
    data = [source for source in node.input if not source.startswith("^")]
    control = [source for source in node.input if source.startswith("^")]
    scope, sizes = f"{node.name}/{SCOPE}", [int(size) for size in split.sizes]
    operand_device = device_of(data[index].split(":")[0])
    own_device = device_of(node.name)
    dtype = node.attr["T"]
    added = [
        (int_constant(f"{scope}/slice_sizes", sizes), operand_device),
        (int_constant(f"{scope}/slice_axis", axis), operand_device),
        (make_node(f"{scope}/slices", "SplitV", [data[index], f"{scope}/slice_sizes",
                                             f"{scope}/slice_axis"],
               T=dtype, Tlen=type_attr("int32"), num_split=int_attr(len(sizes))), operand_device),
        (int_constant(f"{scope}/concat_axis", -1), own_device)]
    sizes_input = SIZES_INPUT.get(node.op)
    if sizes_input is not None:  # a 2-D convolution's output shape: its first 3 entries
        added += [(int_constant(f"{scope}/shape_begin", [0]), own_device),
                  (int_constant(f"{scope}/shape_size", [3]), own_device),
                  (make_node(f"{scope}/shape_head", "Slice", [
                      data[sizes_input], f"{scope}/shape_begin", f"{scope}/shape_size"],
                      T=type_attr("int32"), Index=type_attr("int32")), own_device)]
    for i, (device, size) in enumerate(zip(split.devices, sizes)):
        inputs = list(data)
        inputs[index] = f"{scope}/slices:{i}"
        if sizes_input is not None:
            added.append((int_constant(f"{scope}/channels{i}", [size]), own_device))
            added.append((make_node(f"{scope}/shape{i}", "ConcatV2", [
                f"{scope}/shape_head", f"{scope}/channels{i}", f"{scope}/concat_axis"],
                N=int_attr(2), T=type_attr("int32"), Tidx=type_attr("int32")), own_device))
            inputs[sizes_input] = f"{scope}/shape{i}"
        part = type(node)()
        part.CopyFrom(node)
        part.name = part_name(node.name, i)
        del part.input[:]
        part.input.extend(inputs + control)
        for name in ("_class", "_output_shapes"):
            part.attr.pop(name, None)
        added.append((part, device))
    added.append((make_node(node.name, "ConcatV2", [part_name(node.name, i)
                                                for i in range(len(sizes))]
                        + [f"{scope}/concat_axis"],
                        N=int_attr(len(sizes)), T=dtype, Tidx=type_attr("int32")), own_device))
    return added
