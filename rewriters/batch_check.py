"""Which ops mix the samples of a batch (so micro-batching would change the result).

Pipelining splits a batch into micro-batches and runs the model on each, which is only
right when every output row depends on its own input row alone. TensorFlow's shape
inference is run on the flattened signature at two batch sizes; a tensor whose shape
changes with the batch carries the batch. An op that reads such a tensor and outputs
only tensors that do not carry it (a reduction over the batch, a ``tf.cond`` on a batch
sum, a reshape that folds the batch into other dimensions) mixes samples. Ops that read
only a tensor's shape (``Shape``, ``Size``, ``Rank``) do not, and ops with outputs of
unknown shape are given the benefit of the doubt (``verify`` still compares outputs).
So are ops whose outputs are handles (variants such as the TensorList a recurrent
layer's loop unstacks its time axis into, resources): their shape says nothing of the
batch inside them.

Examples
--------
>>> shapes = {"x:0": ((8, 4), (9, 4)), "sum:0": ((), ()), "row:0": ((8,), (9,))}
>>> batch_mixing(shapes, [("sum", "Sum", ["x:0"], ["sum:0"]),
...                       ("row", "Sum", ["x:0"], ["row:0"])])
['sum']
"""
from __future__ import annotations

from rewriters.reader import tensor_shapes
from tfpart.ops import SHAPE_ONLY_OPS


def batch_mixing_ops(proto, path, batch_size, signature=None):
    """Names of the ops of ``signature`` that mix the samples of a batch."""
    shapes, ops, _ = tensor_shapes(proto, path, batch_size, signature)
    return batch_mixing(shapes, [(name, op_type, inputs, outputs)
                                 for name, op_type, inputs, _, outputs in ops])


def batch_mixing(shapes, ops):
    """Ops ``(name, type, input tensors, output tensors)`` that read a tensor whose
    shape differs between the two batch sizes in ``shapes`` and output only tensors
    whose shapes do not."""
    def known(tensor):
        return all(dims is not None and None not in dims for dims in shapes[tensor])

    def batched(tensor):
        first, second = shapes[tensor]
        return known(tensor) and first != second

    return [name for name, op_type, inputs, outputs in ops
            if op_type not in SHAPE_ONLY_OPS and outputs and all(map(known, outputs))
            and any(batched(t) for t in inputs) and not any(batched(t) for t in outputs)]
