"""Fusion groups: the ops TensorFlow will run as one kernel.

At run time Grappler's remapper replaces patterns such as Conv2D + BiasAdd + Relu by
one fused node (``_FusedConv2D``) that takes the name of the pattern's last op and runs
on the device of its first. A plan that puts the members of such a pattern on
different devices therefore runs partly off-plan. tfpart asks TensorFlow which ops it
fuses by running the remapper offline on the flattened signature
(:func:`grappler_fusion_groups`) and maps the optimised graph back to the original
ops: a fused node's group is the node plus the ops the remapper removed on the paths
into it.

The remapper fuses differently per device type and, on CPUs, with oneDNN on or off
(fixed once per process at TensorFlow's start-up); a CPU-only TensorFlow cannot run
its GPU rules at all. :func:`table_fusion_groups` covers those from a table of the
remapper's patterns (CPU with oneDNN on and off, GPU), which the tests hold against
Grappler's own output in whichever oneDNN mode they run. :func:`fusion_groups` joins
both, so a plan keeps together whatever any of those runtimes fuses.

Grappler's shape optimizer makes one kernel too: it rewrites ``Prod(Shape(x))`` (the
elements of ``x``; ``tf.boolean_mask`` computes one, so every ragged reduction does) as
``Size(x)``, under the Prod's name but on the Shape's device, once constant folding has
removed a slice between them that keeps the whole shape. Neither pass runs on the
reader's graph, whose batch size is fixed, so :func:`shape_size_groups` finds these
from the graph: each Prod of a Shape, through slices or not, with the ops between.

Examples
--------
>>> from tfpart.core.graph import OpGraph
>>> g = OpGraph()
>>> for name, op in [("x", "Placeholder"), ("conv", "Conv2D"), ("bias", "BiasAdd"),
...                  ("relu", "Relu"), ("pool", "MaxPool")]:
...     g.add_op(name, op_type=op)
>>> for a, b in [("x", "conv"), ("conv", "bias"), ("bias", "relu"), ("relu", "pool")]:
...     g.add_edge(a, b, bytes=4)
>>> table_fusion_groups(g)
[['bias', 'conv', 'relu']]
"""
from __future__ import annotations

from tfpart.core.graph import UnionFind

CONTRACTIONS = {"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul"}
BATCH_NORMS = {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"}
ACTIVATIONS = {"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Softplus", "Gelu"}
ADDS = {"Add", "AddV2"}
# op type -> the op types it is fused into when it is the only reader of their output
# (Grappler's remapper.cc: contraction + bias (+ add) (+ activation), convolution +
# batch norm (+ activation), batch norm + activation; the residual add with oneDNN).
# A contraction without a bias add fuses nothing.
FUSED_INTO = {
    "BiasAdd": CONTRACTIONS,
    **{bn: {"Conv2D", "DepthwiseConv2dNative"} for bn in BATCH_NORMS},
    **{add: BATCH_NORMS | {"BiasAdd"} for add in ADDS},
    **{act: BATCH_NORMS | ADDS | {"BiasAdd"} for act in ACTIVATIONS},
}
FUSION_ROOTS = CONTRACTIONS | BATCH_NORMS
# Ops between a Shape and the Prod that Grappler's shape optimizer may read it through
# (a slice constant folding finds keeps the whole shape becomes an Identity, then goes).
SHAPE_PASSING = {"StridedSlice", "Slice", "Identity"}
# Readers of a static shape, which Grappler folds into constants before the remapper
# runs (a training step's gradient of an add reads its inputs' shapes).
SHAPE_READERS = {"Shape", "ShapeN", "Size", "Rank"}


def _data_readers(graph, op):
    return [v for v, edge in graph.out_edges(op).items() if not edge["control"]
            and graph.ops[v]["op_type"] not in SHAPE_READERS]


def _fuses_into(graph, source, op):
    """Whether the remapper fuses ``op`` into the pattern ``source`` is in."""
    source_type, op_type = graph.ops[source]["op_type"], graph.ops[op]["op_type"]
    return source_type in FUSED_INTO.get(op_type, ()) or (
        op_type in ADDS and source_type in CONTRACTIONS and _adds_a_bias(graph, op, source))


def _adds_a_bias(graph, op, contraction):
    """Whether add ``op`` adds a vector to ``contraction``'s output: the remapper fuses
    such an add as a bias (Keras 3's ``Dense`` without an activation)."""
    others = [graph.ops[source]["outputs"] for source, edge in graph.in_edges(op).items()
              if not edge["control"] and source != contraction]
    return len(others) == 1 and len(others[0]) == 1 and len(others[0][0][0]) == 1


def table_fusion_groups(graph):
    """Fusion groups (sorted lists of op names, two ops or more) of an OpGraph by the
    remapper patterns in :data:`FUSED_INTO` (and a contraction with an add of a
    vector, which fuses as a bias add): an op joins the pattern of the first op it
    reads that starts or continues a pattern, is of a type it fuses into, and has no
    other reader (but shape reads, which Grappler folds first). A residual add joins
    every such input: which one the remapper fuses depends on the order of the graph it
    sees after placement (measured: the same model fused its first input offline and
    its second at run time), so only keeping both with the add is safe."""
    in_pattern = set()
    groups = UnionFind()
    for op in graph.topological_order():
        op_type = graph.ops[op]["op_type"]
        if op_type in FUSION_ROOTS:
            in_pattern.add(op)
        for source, edge in graph.in_edges(op).items():
            if (not edge["control"] and source in in_pattern
                    and _fuses_into(graph, source, op)
                    and _data_readers(graph, source) == [op]):
                groups.union(source, op)
                in_pattern.add(op)
                if op_type not in ADDS:
                    break  # one pattern per op, but see the docstring for adds
    return _as_lists(groups)


def shape_size_groups(graph):
    """Each ``Prod`` of an OpGraph that reads a ``Shape`` (directly or through
    :data:`SHAPE_PASSING` ops) with that Shape and the ops between: Grappler's shape
    optimizer may run it as ``Size`` on the Shape's device (see the module docstring).
    Whether it does depends on shapes known only at run time, so every such Prod is
    grouped; they are a few integers each.

    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> for name, op in [("x", "Placeholder"), ("shape", "Shape"), ("begin", "Const"),
    ...                  ("slice", "StridedSlice"), ("axes", "Const"), ("prod", "Prod"),
    ...                  ("other", "Prod")]:
    ...     g.add_op(name, op_type=op)
    >>> for a, b in [("x", "shape"), ("shape", "slice"), ("begin", "slice"),
    ...              ("slice", "prod"), ("axes", "prod"), ("x", "other")]:
    ...     g.add_edge(a, b, bytes=4)
    >>> shape_size_groups(g)
    [['prod', 'shape', 'slice']]
    """
    groups = []
    for op, attrs in graph.ops.items():
        if attrs["op_type"] == "Prod":
            path = _path_from_shape(graph, op)
            if path:
                groups.append(sorted([*path, op]))
    return sorted(groups)


def _path_from_shape(graph, op):
    """The ops from a Shape to ``op``'s input through :data:`SHAPE_PASSING` ops, the
    Shape first, or [] if ``op`` reads no Shape so."""
    for source, edge in graph.in_edges(op).items():
        op_type = graph.ops[source]["op_type"]
        if edge["control"]:
            continue
        if op_type == "Shape":
            return [source]
        if op_type in SHAPE_PASSING:
            path = _path_from_shape(graph, source)
            if path:
                return [*path, source]
    return []


def grappler_fusion_groups(graph_def, outputs, device="/job:localhost/replica:0/task:0"
                           "/device:CPU:0"):
    """Fusion groups that Grappler's remapper makes of ``graph_def`` (a flat GraphDef,
    every shape inferable) when all of it runs on ``device``, in this process's oneDNN
    mode. ``outputs`` are the tensors the signature returns; they are read through
    Identity ops, as a function's ``_Retval`` nodes read them, so they stay fusable.
    """
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        for k, tensor in enumerate(outputs):
            fetch = tf.identity(graph.get_tensor_by_name(tensor), name=f"tfpart_fetch_{k}")
            graph.add_to_collection("train_op", fetch.op)
    original = graph.as_graph_def()
    for node in original.node:
        node.device = device
    meta = tf.compat.v1.train.export_meta_graph(graph_def=original, graph=graph)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append("remap")  # only the remapper: no folding or pruning
    rewrite.min_graph_nodes = -1
    optimised = tf_optimizer.OptimizeGraph(config, meta)
    return fused_groups_of(original, optimised)


def fused_groups_of(original, optimised):
    """Map an optimised GraphDef back to ``original``'s ops: each node whose op changed
    (a fused kernel under the pattern's last name) groups with the removed ops on the
    paths into it."""
    from rewriters.functions import split_input

    before = {node.name: node for node in original.node}
    after = {node.name: node for node in optimised.node}
    removed = before.keys() - after.keys()
    groups = UnionFind()
    for name, node in after.items():
        if name not in before or before[name].op == node.op:
            continue
        stack = [name]
        while stack:
            current = stack.pop()
            for text in before[current].input:
                source, _, control = split_input(text)
                if not control and source in removed and groups.find(source) != groups.find(name):
                    groups.union(source, name)
                    stack.append(source)
    return _as_lists(groups)


def fusion_groups(graph, graph_def=None, outputs=(), found=()):
    """Fusion groups of an OpGraph: Grappler's own on this process's CPU (when
    ``graph_def`` is given), joined with the table's for every other runtime, the
    shape optimizer's (:func:`shape_size_groups`) and those ``found`` before (of the
    same model, its ops that ``graph`` lacks left out). Overlapping groups merge."""
    groups = UnionFind()
    found = table_fusion_groups(graph) + shape_size_groups(graph) + [list(g) for g in found]
    if graph_def is not None:
        found += grappler_fusion_groups(graph_def, outputs)
    for members in found:
        for other in members[1:]:
            if other in graph and members[0] in graph:
                groups.union(members[0], other)
    return _as_lists(groups)


def _as_lists(groups):
    return sorted(sorted(members) for members in groups.sets() if len(members) > 1)
