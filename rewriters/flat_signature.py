"""A SavedModel signature flattened into one GraphDef (:mod:`rewriters.flatten`): what
the flattening returns (:class:`FlatSignature`, with the :class:`ModelInfo` the reader
learns), which signature is read and which call computes it, and the flat graph imported
into a ``tf.Graph`` so that TensorFlow's shape inference gives every tensor its shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rewriters.functions import callee, library_index, split_input
from rewriters.tf_import import tensorflow
from tfpart.core.errors import ModelError, first_line


@dataclass
class ModelInfo:
    """What the reader learned besides the graph."""

    signature: str
    root_function: str
    batch_size: int
    inputs: dict  # signature input name -> (shape at batch size, dtype)
    variable_ops: dict = field(default_factory=dict)  # object-graph node id -> op name
    # the other captures (constants, resources, assets): node id -> rewriters.captures.Capture
    captures: dict = field(default_factory=dict)
    signatures: list = field(default_factory=list)
    fusion_groups: list = field(default_factory=list)  # lists of ops run as one kernel
    unread_variables: dict = field(default_factory=dict)  # node id -> (op name, bytes)
    training: bool = False  # the signature updates variables from the batch
    format: str = "tf2"  # "tf1": a MetaGraphDef with signatures and no object graph
    nonlinear: list = field(default_factory=list)  # ops making samples depend on the batch
    # a training step's regions (rewriters.training_regions.StepRegions), once computed
    regions: object = field(default=None, repr=False, compare=False)
    # the flattened signature itself (FlatSignature), for what rebuilds it: one
    # flattening per compile (the batch-mixing probe, the pipeline pass)
    flat: object = field(default=None, repr=False, compare=False)


def variable_op_name(node_id, saved_variable):
    """OpGraph name of the variable at object-graph node ``node_id``."""
    return f"variables/{node_id}/{saved_variable.name}" if saved_variable.name else \
        f"variables/{node_id}"


def choose_signature(meta, signature, path):
    names = sorted(k for k in meta.signature_def if not k.startswith("__"))
    if not names:
        raise ModelError(path, "the SavedModel has no signatures to compile")
    if signature is None:
        return "serving_default" if "serving_default" in names else names[0]
    if signature not in names:
        raise ModelError(path, f"no signature {signature!r} (has: {', '.join(names)})")
    return signature


def signature_call(meta, signature, path):
    """The top-level call node that computes ``signature`` and its function's name."""
    nodes = {n.name: n for n in meta.graph_def.node}
    output = next(iter(meta.signature_def[signature].outputs.values())).name
    node = nodes.get(split_input(output)[0])
    functions = library_index(meta.graph_def.library)
    if node is None or callee(node, functions) not in functions:
        raise ModelError(path, f"signature {signature!r} is not computed by a function call;"
                         " only TensorFlow 2 SavedModels are supported")
    return node, callee(node, functions), nodes


@dataclass
class FlatSignature:
    """One signature inlined into a single GraphDef (see the module docstring)."""

    graph_def: object
    inputs: dict  # signature input name -> (placeholder name, shape, dtype name)
    outputs: list  # flat tensor names of the signature's outputs
    variable_ops: dict  # object-graph node id -> VarHandleOp name
    info: ModelInfo
    batch_axes: dict = field(default_factory=dict)  # placeholder -> axes the batch sizes
    # a table's row shards (rewriters.row_shard): shard op -> (table op, first row, rows)
    row_shards: dict = field(default_factory=dict)
    # each shard's variables with the ops that read or update its rows: placed as one
    row_shard_groups: list = field(default_factory=list)
    # the ragged and sparse arguments (rewriters.composite_inputs.CompositeInput)
    composites: tuple = ()

    def outputs_by_key(self, proto):
        """The flat tensor of each of the signature's outputs, by its key in ``proto``'s
        ``signature_def`` (a TF1 signature names the graph's own tensors)."""
        outputs = proto.meta_graphs[0].signature_def[self.info.signature].outputs
        if self.info.format == "tf1":
            return {key: info.name for key, info in outputs.items()}
        return {key: self.outputs[int(info.name.rsplit(":", 1)[1])]
                for key, info in outputs.items()}

    def bound_outside(self):
        """A test of a node's name: whether it is one a rebuilt function binds to
        tensors of its own instead of importing it (an input's placeholder, a variable,
        or any node of a captured table or asset)."""
        from rewriters.captures import HANDLE_KINDS

        names = set(self.variable_ops.values()) | set(self.row_shards) | \
            {p for p, _, _ in self.inputs.values()}
        handles = {c.op_name for c in self.info.captures.values() if c.kind in HANDLE_KINDS}
        prefixes = tuple(f"{h}/" for h in handles)
        return lambda name: name in names or name in handles or name.startswith(prefixes)


def import_flat(flat, path=""):
    """A ``tf.Graph`` holding the flattened signature, every shape inferred."""
    tf = tensorflow()
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(flat.graph_def, name="")
        except (ValueError, tf.errors.OpError) as exc:
            raise ModelError(path, f"cannot rebuild signature {flat.info.signature!r}: "
                             f"{first_line(exc)}") from None
    return graph


def signature_batch(signature_def):
    for tensor in signature_def.inputs.values():
        dims = tensor.tensor_shape.dim
        if dims and dims[0].size > 0:
            return dims[0].size
    return None


__all__ = ["FlatSignature", "ModelInfo", "choose_signature", "import_flat", "signature_batch",
           "signature_call", "variable_op_name"]
