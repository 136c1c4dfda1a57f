"""Plan validation: is a plan possible for a graph on a cluster?

Every algorithm's plan passes through :func:`check_plan` before it is returned.

Examples
--------
>>> from tfpart.core.plan import Plan
>>> g = OpGraph(); g.add_op("a"); g.add_op("b", colocation="a")
>>> plan = Plan(assignment={"a": "/job:localhost/replica:0/task:0/device:CPU:0",
...                         "b": "/job:localhost/replica:0/task:0/device:CPU:1"})
>>> check_plan(plan, g, cluster_of_devices(["cpu", "cpu"]))
Traceback (most recent call last):
...
tfpart.core.errors.PlacementError: colocation group 'a' is split over 2 devices: a, b
"""
from __future__ import annotations

import numpy as np

from costmodel.memory import memory_lower_bound, size_text
from tfpart.core.errors import PlacementError

HOST_KIND = "cpu"  # the device kind that runs host-only ops (strings, hash tables)


def check_plan(plan, graph, cluster, memory=None):
    """Raise PlacementError unless ``plan`` is valid for ``graph`` on ``cluster``.

    Parameters
    ----------
    plan : tfpart.core.plan.Plan
    graph : tfpart.core.graph.OpGraph
    cluster : tfpart.core.cluster.Cluster
    memory : dict, optional
        The plan's peak bytes per device name (default: the predicted
        ``peak_memory_bytes`` of the plan's devices; not checked if it has none).

    Raises
    ------
    PlacementError
        An op is unplaced or on a device not in the cluster, a colocation group (which
        includes ops fused into one kernel) is split, an op sits on a device kind
        without its kernel, or a device's peak memory exceeds its capacity.
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
    if memory is None and plan.predicted is not None:
        memory = {name: figures.peak_memory_bytes
                  for name, figures in plan.predicted.devices.items()}
    if memory is not None:
        check_memory(cluster, memory)


def _raise_split(graph, plan, group):
    members = graph.colocation_groups()[group]
    devices = {plan.assignment[m] for m in members}
    raise PlacementError("", f"colocation group {group!r} is split over "
                         f"{len(devices)} devices: {', '.join(members[:4])}")


def check_memory(cluster, used):
    """Raise PlacementError if some device's peak bytes (``used``, by device name: the
    live-range peak, :func:`costmodel.simulate.live_peak`) exceed its memory."""
    for device in cluster.devices:
        if used.get(device.name, 0.0) > device.memory:
            raise PlacementError("", f"{device.name} needs {size_text(used[device.name])}"
                                 f" but has {size_text(device.memory)}")


def memory_hint(cost):
    """What memory some plan of ``cost``'s graph needs at least (from
    :func:`costmodel.memory.memory_lower_bound`), for errors when none fits.

    >>> g = OpGraph()
    >>> for name in "uvw": g.add_op(name, op_type="VarHandleOp", param_bytes=1e9)
    >>> print(memory_hint(CostModel(g, cluster_of_devices(["T4", "T4"]))))
    a plan needs devices of at least 1500.0 MB each (the model's variables spread evenly over 2 devices); the largest here has 16000.0 MB
    """
    need, why = memory_lower_bound(cost.graph, len(cost.cluster))
    largest = max(device.memory for device in cost.cluster.devices)
    return (f"a plan needs devices of at least {size_text(need)} each ({why}); the "
            f"largest here has {size_text(largest)}")


def check_kernels(cost):
    """Raise PlacementError if some colocation group has no device of the cluster that
    can run all its ops (:func:`kernel_problem` says which and why)."""
    problem = kernel_problem(cost)
    if problem:
        raise PlacementError("", problem)


def kernel_problem(cost, op=None):
    """Why no device of ``cost``'s cluster can run the colocation group of ``op`` (by
    default: of the first such group), in one line naming an op; None if every group
    has a device.

    Examples
    --------
    >>> g = OpGraph()
    >>> g.add_op("tokens", op_type="Placeholder", allowed_kinds=frozenset({"cpu"}))
    >>> g.add_op("lower", op_type="StringLower", colocation="tokens",
    ...          allowed_kinds=frozenset({"cpu"}))
    >>> print(kernel_problem(CostModel(g, cluster_of_devices(["T4", "T4"]))))
    no device can run lower (StringLower): it has a kernel only on cpu devices (string, hash-table and other host ops run on a host CPU: add one to the cluster, kind cpu)
    >>> kernel_problem(CostModel(g, cluster_of_devices(["T4", "cpu"]))) is None
    True
    """
    graph = cost.graph
    runs = np.isfinite(cost.compute)
    groups = graph.colocation_groups()
    wanted = [graph.ops[op]["colocation"]] if op is not None else list(groups)
    for label in wanted:
        members = groups[label]
        rows = runs[[cost.index[m] for m in members]]
        if rows.all(axis=0).any():
            continue
        alone = sorted(m for m, row in zip(members, rows) if not row.any())
        if alone:
            return f"no device can run {_op_text(graph, alone[0])}: " + \
                _kernels_text(graph, alone[0], cost.cluster)
        first = max(members, key=lambda m: (len(members) - runs[cost.index[m]].sum(), m))
        other = next(m for m in members
                     if not (runs[cost.index[m]] & runs[cost.index[first]]).any())
        return (f"no device can run both {_op_text(graph, first)} and "
                f"{_op_text(graph, other)}, which must share one device (they use one "
                f"variable or resource, or run as one kernel): {_op_text(graph, first)} "
                + _kernels_text(graph, first, cost.cluster).removeprefix("it "))
    return None


def _op_text(graph, op):
    return f"{op} ({graph.ops[op]['op_type']})"


def _kernels_text(graph, op, cluster):
    allowed = graph.ops[op]["allowed_kinds"]
    if allowed is None:
        return "it has no cost on any device of the cluster"
    text = f"it has a kernel only on {', '.join(sorted(allowed))} devices"
    kinds = {d.kind.name for d in cluster.devices}
    if HOST_KIND in allowed and HOST_KIND not in kinds:
        text += (" (string, hash-table and other host ops run on a host CPU: add one to "
                 f"the cluster, kind {HOST_KIND})")
    return text
