"""The collectives pass: for replicas that each keep a copy of the variables, what each
replica's copy of the update reads, all-reduced with TensorFlow's collective ops among
the devices that hold each tensor in every replica (every replica gets the same sum),
in packs (:func:`costmodel.pipeline.gradient_packs`), one collective each, as the
simulator prices them (``pack/`` and ``allreduce/`` ops).
"""
from __future__ import annotations

import zlib

from costmodel.pipeline import gradient_packs
from rewriters.tf_import import tensorflow
from tfpart.core.plan import replica_device


def all_reduced(plan, regions, graph_def, stand_ins, tokens, envs, shares, lanes):
    """Per replica, what its copy of the update reads: the replicas' values of each
    tensor of ``regions``' boundary computed from the batch (summed over the replica's
    micro-batches ``lanes[r]``, of ``envs``, each weighted by its ``shares``),
    all-reduced, and its own value of the others (its copy's weight reads, constants).

    ``graph_def``, the flat graph, orders the collectives: TensorFlow runs a device's
    in the order they are made (their ``tokens``, by device, order them), the order
    the graph computes the gradients in. ``stand_ins``: the plan's
    :func:`tfpart.core.plan.device_stand_ins`."""
    replicas = plan.replicas
    totals = [{} for _ in lanes]
    position = {node.name: i for i, node in enumerate(graph_def.node)}
    boundary = sorted(regions.boundary - regions.batched,
                      key=lambda t: (position.get(t.rsplit(":", 1)[0], -1), t))
    reduced = {}  # the tensor's device in each replica -> (tensor, dtype, bytes)
    for tensor in boundary:
        op, value = tensor.rsplit(":", 1)[0], envs[0][tensor]
        if op in regions.data_dependent and value.dtype.is_floating:
            elements = value.shape.num_elements()
            group = tuple(replica_device(replicas, stand_ins, r, op, plan.assignment.get(op))
                          for r in range(len(lanes)))
            reduced.setdefault(group, []).append(
                (tensor, value.dtype, elements and elements * value.dtype.size))
        else:
            for total, lane in zip(totals, lanes):
                total[tensor] = envs[lane[0]][tensor]
    instance = collective_keys(replicas.devices, boundary)[1]
    for group, tensors in reduced.items():
        group_key = collective_keys(group, boundary)[0]
        for pack in gradient_packs(tensors):
            for r, (device, lane) in enumerate(zip(group, lanes)):
                totals[r].update(all_reduce_pack(
                    [[envs[m][tensor] for m in lane] for tensor in pack],
                    [shares[m] for m in lane], device, len(lanes),
                    (group_key, instance), tokens[device], f"pack{instance}", pack))
            instance += 1
    return totals


def all_reduce_pack(values, shares, device, group_size, keys, token, name, tensors):
    """On ``device``: each of ``tensors``' ``values`` (one per micro-batch) weighted by
    the micro-batches' ``shares`` and summed, flattened into one vector, all-reduced
    over ``group_size`` devices with ``keys`` (group, instance) and the ordering
    ``token``; the sums, by ``tensors`` (their names), in their shapes."""
    from tensorflow.python.ops import collective_ops

    tf = tensorflow()
    with tf.device(device), tf.name_scope(f"tfpart_allreduce/{name}"):
        weighted = [tf.add_n([value * tf.cast(share, value.dtype)
                              for value, share in zip(per_microbatch, shares)])
                    for per_microbatch in values]
        flat = tf.concat([tf.reshape(value, [-1]) for value in weighted], axis=0)
        summed = collective_ops.all_reduce_v2(
            flat, group_size=group_size, group_key=keys[0], instance_key=keys[1],
            ordering_token=token.handle)
        parts = tf.split(summed, tf.stack([tf.size(value) for value in weighted]),
                         num=len(weighted))
        return {tensor: tf.reshape(part, tf.shape(value))
                for tensor, part, value in zip(tensors, parts, weighted)}


def collective_keys(devices, tensors):
    """The group key of ``devices`` and the first of the instance keys of the
    all-reduces of ``tensors``: stable across processes (every worker must agree),
    and unlikely to meet another compiled model's in one process.

    >>> group, first = collective_keys(["/device:CPU:0", "/device:CPU:1"], ["g:0"])
    >>> (group, first) == collective_keys(["/device:CPU:0", "/device:CPU:1"], ["g:0"])
    True
    >>> 0 < group < 2 ** 31 and 0 < first < 2 ** 31 - 2 ** 14
    True
    """
    group = 1 + zlib.crc32(",".join(devices).encode()) % (2 ** 30)
    first_instance = 1 + zlib.crc32(",".join(tensors).encode()) % (2 ** 16) * 2 ** 14
    return group, first_instance
