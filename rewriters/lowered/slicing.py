"""The slicing pass: each micro-batch's rows of the batch, as the tensors its pieces
read.

The batch is cut along its first dimension into M micro-batches of ``ceil(B / M)``
rows (the last one smaller when M does not divide B), or into the replicas'
shares of it, each share cut the same way for replicas of a pipeline
(:func:`split_rows`). A step of one micro-batch and no replicas is not cut
(:func:`whole_batch_env`).
"""
from __future__ import annotations

from rewriters.composite_inputs import batch_rows, tensor_rows
from rewriters.tf_import import tensorflow


def split_rows(rows, m_count, replicas):
    """Rows and first row of each micro-batch (scalar tensors): ``ceil(rows / M)`` each
    but the last, or the replicas' largest-remainder shares of ``rows`` (as
    :func:`partitioner.shares.proportional_shares` computes them, the faster replica
    first on ties), each cut the same way into its micro-batches for replicas of a
    pipeline.

    >>> sizes, firsts = split_rows(10, 4, None)
    >>> [int(s) for s in sizes], firsts
    ([3, 3, 3, 1], [0, 3, 6, 9])
    """
    tf = tensorflow()
    if not replicas:
        size = (rows + m_count - 1) // m_count
        return ([tf.clip_by_value(rows - m * size, 0, size) for m in range(m_count)],
                [m * size for m in range(m_count)])
    exact = tf.cast(rows, tf.float64) * tf.constant(replicas.fractions, tf.float64)
    whole = tf.floor(exact)
    left = tf.cast(rows, tf.float64) - tf.reduce_sum(whole)
    rank = tf.argsort(tf.argsort(whole - exact, stable=True), stable=True)
    sizes = tf.cast(whole + tf.cast(tf.cast(rank, tf.float64) < left, tf.float64), tf.int32)
    per = replicas.microbatches or 1
    if per > 1:  # replicas of a pipeline: each share in micro-batches of ceil(share / per)
        step = (sizes + per - 1) // per
        sizes = tf.reshape(tf.clip_by_value(
            sizes[:, None] - step[:, None] * tf.range(per)[None, :], 0, step[:, None]), [-1])
    offsets = tf.cumsum(sizes, exclusive=True)
    return [sizes[m] for m in range(m_count)], [offsets[m] for m in range(m_count)]


def whole_batch_env(flat, handles, keys, args):
    """The tensors the one piece per stage reads when the batch is not cut: the
    ``handles`` (the variables' and tables' stand-ins) and the inputs ``args`` (by
    sorted ``keys``) as they are, no bounds computed on one device and sent to the
    others."""
    env = dict(handles)
    for key, value in zip(keys, args):
        env[f"{flat.inputs[key][0]}:0"] = value
    return env


def microbatch_envs(flat, plan, first_device, handles, keys, args):
    """Per micro-batch, the tensors its pieces read: its ``handles`` (one per
    micro-batch) and its rows of each input ``args`` (by sorted ``keys``), sliced on
    ``first_device``, where the batch arrives; and each micro-batch's rows and share
    of the batch (float64 scalars)."""
    tf = tensorflow()
    m_count = plan.microbatches
    inputs = dict(zip(keys, args))
    with tf.device(first_device):
        rows = batch_rows(flat.composites, inputs, keys)
        real, offsets = split_rows(rows, m_count, plan.replicas)
    envs = []
    for m in range(m_count):
        # A micro-batch past the end of a small batch runs on one borrowed row whose
        # result is dropped: oneDNN's fused convolutions mis-shape empty inputs.
        with tf.device(first_device):
            start = tf.maximum(tf.minimum(offsets[m], rows - 1), 0)
            stop = start + tf.maximum(real[m], 1)
            composite_rows = tensor_rows(flat.composites, inputs, start, stop)
        env = dict(handles[m])
        for key, value in zip(keys, args):
            placeholder = flat.inputs[key][0]
            with tf.device(plan.assignment.get(placeholder, first_device)):
                env[f"{placeholder}:0"] = composite_rows[key] if key in composite_rows \
                    else value[start:stop]
        envs.append(env)
    with tf.device(first_device):
        shares = [tf.cast(r, tf.float64) / tf.cast(rows, tf.float64) for r in real]
    return envs, real, shares
