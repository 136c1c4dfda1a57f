"""The accumulation pass: what a training step's update reads (the gradients, and the
loss the signature returns), summed over the micro-batches, each weighted by its share
of the batch, which keeps a mean loss's gradients exact; the update then runs once
per step, after every micro-batch's copy of what it waits for.
"""
from __future__ import annotations

from rewriters.copies import stamp_op
from rewriters.lowered import GATE
from rewriters.tf_import import tensorflow

ACCUMULATE = "tfpart_accumulate"  # the scope of a sum over micro-batches or replicas


def accumulated(regions, envs, shares, device_of):
    """Each tensor the update reads or the signature returns once per step (of the
    step's ``regions``): the micro-batches' values (``envs``, tensors by name) weighted
    by their ``shares`` of the batch if computed from the batch, each sum on
    ``device_of(op)``; else micro-batch 0's (a weight read, a constant; every one
    without ``shares``: the batch was not cut)."""
    tf = tensorflow()
    total = {}
    for tensor in sorted(regions.boundary):
        op = tensor.rsplit(":", 1)[0]
        if tensor in regions.batched:
            continue
        if shares is None or op not in regions.data_dependent or \
                not envs[0][tensor].dtype.is_floating:
            total[tensor] = envs[0][tensor]
            continue
        # every op of the sum in one scope, the op accumulate/<op> of the execution
        # graph the simulator prices (costmodel.pipeline.accumulate_for_update)
        with tf.device(device_of(op)), tf.name_scope(f"{ACCUMULATE}/{op}/"):
            dtype = envs[0][tensor].dtype
            weights = [tf.cast(share, dtype) for share in shares]
            weighted = [env[tensor] * weight for env, weight in zip(envs, weights)]
            total[tensor] = tf.add_n(weighted, name="sum")
        made = [total[tensor], *weighted, *(w for w, share in zip(weights, shares)
                                            if w is not share)]  # not a no-op cast
        for value in made:
            stamp_op(value.op, f"accumulate/{op}")
    return total


def after_every_microbatch(update, ops_of, gated=True):
    """Control inputs of the ``update`` piece (a GraphDef) for what it waits for among
    the per-micro-batch ops: a constant after every micro-batch's copy (``ops_of``,
    per micro-batch, ops by name); with ``gated``, its gate, which waits for
    nothing."""
    tf = tensorflow()
    control = {}
    for node in update.node:
        for source in node.input:
            name = source[1:]
            if source.startswith("^") and name != GATE and name in ops_of[0]:
                with tf.device(ops_of[0][name].device), \
                        tf.control_dependencies([ops[name] for ops in ops_of]):
                    control[source] = tf.constant(0.0)
    if gated:
        with tf.control_dependencies([]):
            control[f"^{GATE}"] = tf.constant(0.0)
    return control
