"""Device remapping rewriter: rename devices throughout a (compiled) SavedModel proto.

Used to run a plan made for devices that do not exist here (GPUs, other hosts) on local
logical CPU devices, one for each cluster device, keeping the partition intact.

Examples
--------
>>> local_device_map(["/job:worker/replica:0/task:1/device:GPU:0"])
{'/job:worker/replica:0/task:1/device:GPU:0': '/job:localhost/replica:0/task:0/device:CPU:0'}
"""
from __future__ import annotations


def local_device_map(device_names):
    """Cluster device i -> local logical CPU i."""
    return {name: f"/job:localhost/replica:0/task:0/device:CPU:{i}"
            for i, name in enumerate(device_names)}


def remap_devices(proto, mapping):
    """A copy of ``proto`` whose node, variable and resource devices are renamed by
    ``mapping`` (names not in it are left alone)."""
    from tensorflow.core.protobuf import saved_model_pb2

    new = saved_model_pb2.SavedModel()
    new.CopyFrom(proto)
    meta = new.meta_graphs[0]
    nodes = list(meta.graph_def.node)
    for fdef in meta.graph_def.library.function:
        nodes.extend(fdef.node_def)
    for node in nodes:
        node.device = mapping.get(node.device, node.device)
    for obj in meta.object_graph_def.nodes:
        if obj.HasField("variable") or obj.HasField("resource"):  # variables and tables
            saved = getattr(obj, obj.WhichOneof("kind"))
            saved.device = mapping.get(saved.device, saved.device)
    return new
