"""Plan validation: is a plan possible for a graph on a cluster?

Every algorithm's plan passes through :func:`check_plan` before it is returned.

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from tfpart.plan import Plan
>>> g = OpGraph(); g.add_op("a"); g.add_op("b", colocation="a")
>>> plan = Plan(assignment={"a": "/job:localhost/replica:0/task:0/device:CPU:0",
...                         "b": "/job:localhost/replica:0/task:0/device:CPU:1"})
>>> check_plan(plan, g, cluster_of_devices(["cpu", "cpu"]))
Traceback (most recent call last):
...
tfpart.errors.PlacementError: colocation group 'a' is split over 2 devices: a, b
"""
from __future__ import annotations

from costmodel.memory import device_memory
from tfpart.errors import PlacementError


def check_plan(plan, graph, cluster, memory=None):
    """Raise PlacementError unless ``plan`` is valid for ``graph`` on ``cluster``.

    Parameters
    ----------
    plan : tfpart.plan.Plan
    graph : tfpart.graph.OpGraph
    cluster : tfpart.cluster.Cluster
    memory : dict, optional
        The plan's memory bound per device name, if already computed.

    Raises
    ------
    PlacementError
        An op is unplaced or on a device not in the cluster, a colocation group (which
        includes ops fused into one kernel) is split, an op sits on a device kind
        without its kernel, or a device's memory bound is exceeded.
    """
    names = set(cluster.device_names)
    unplaced = [op for op in graph.ops if op not in plan.assignment]
    if unplaced:
        raise PlacementError("", f"{len(unplaced)} ops unplaced, e.g. {unplaced[0]}")
    unknown = sorted({d for d in plan.assignment.values() if d not in names})
    if unknown:
        raise PlacementError("", f"plan names devices not in the cluster: {unknown}")
    group_device = {}
    for op, attrs in graph.ops.items():
        if group_device.setdefault(attrs["colocation"], plan.assignment[op]) != \
                plan.assignment[op]:
            _raise_split(graph, plan, attrs["colocation"])
    kind_of = {d.name: d.kind.name for d in cluster.devices}
    for op, attrs in graph.ops.items():
        allowed = attrs["allowed_kinds"]
        if allowed is not None and kind_of[plan.assignment[op]] not in allowed:
            raise PlacementError("", f"op {op} ({attrs['op_type']}) is on "
                                 f"{plan.assignment[op]}, a {kind_of[plan.assignment[op]]}"
                                 f" without its kernel")
    check_memory(graph, plan.assignment, cluster, memory)


def _raise_split(graph, plan, group):
    members = graph.colocation_groups()[group]
    devices = {plan.assignment[m] for m in members}
    raise PlacementError("", f"colocation group {group!r} is split over "
                         f"{len(devices)} devices: {', '.join(members[:4])}")


def check_memory(graph, assignment, cluster, used=None):
    """Raise PlacementError if the ops of ``assignment`` (op -> device name) exceed
    some device's memory bound (:func:`costmodel.memory.device_memory`, unless given
    as ``used``)."""
    if used is None:
        used = device_memory(graph, assignment, cluster.device_names)
    for device in cluster.devices:
        if used[device.name] > device.memory:
            raise PlacementError("", f"{device.name} needs {used[device.name] / 1e6:.1f} MB"
                                 f" but has {device.memory / 1e6:.1f} MB")
