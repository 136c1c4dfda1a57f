"""Turn a device-per-op array into a checked Plan with the simulator's figures.

``peak_memory_bytes`` is the simulated peak (live ranges under the schedule), the
figure ``check_plan`` holds against each device's memory.
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np

from costmodel.simulate import simulate
from partitioner.lower_bound import lower_bound
from partitioner.validate import check_plan
from tfpart.core.errors import PlacementError
from tfpart.core.plan import DeviceFigures, Plan, Predicted


def make_plan(cost, device_of, algorithm, options, priority=None):
    """Simulate the placement, record per-device figures, and check the plan.

    Parameters
    ----------
    cost : costmodel.CostModel
    device_of : numpy.ndarray of int
        The device index of every op of ``cost.ops``.
    algorithm : str
        The name the plan records.
    options : dataclass
        The algorithm's options, echoed into the plan.
    priority : numpy.ndarray, optional
        The simulator's tie-breaking priority per op (default: upward rank).

    Returns
    -------
    tfpart.core.plan.Plan

    Raises
    ------
    tfpart.core.errors.PlacementError
        If the plan breaks a device's memory or runs an op where it cannot run.
    """
    graph, cluster = cost.graph, cost.cluster
    names = cluster.device_names
    assignment = {op: names[d] for op, d in zip(cost.ops, device_of)}
    schedule = simulate(cost, device_of, priority)
    per_device = {}
    for d, name in enumerate(names):
        mine = np.flatnonzero(device_of == d)
        per_device[name] = DeviceFigures(
            kind=cluster.devices[d].kind.name, ops=int(len(mine)),
            param_bytes=int(sum(graph.ops[cost.ops[i]]["param_bytes"] for i in mine)),
            busy_s=float(schedule.busy[d]), idle_s=float(schedule.idle[d]),
            peak_memory_bytes=float(schedule.peak_memory[d]),
            memory_bytes=float(cluster.devices[d].memory))
    hosts = [device.host for device in cluster.devices]
    predicted = Predicted(step_time=float(schedule.makespan), devices=per_device,
                          bytes_moved=float(schedule.bytes_moved),
                          transfers=len(schedule.transfers),
                          cross_host_transfers=sum(hosts[src] != hosts[dst] for _, src, dst, _, _
                                                   in schedule.transfers),
                          links={f"{names[a]} -> {names[b]}": float(n)
                                 for (a, b), n in sorted(schedule.link_bytes.items())})
    plan = Plan(assignment=assignment, algorithm=algorithm, options=asdict(options),
                predicted=predicted, lower_bound=lower_bound(cost))
    check_plan(plan, graph, cluster)
    return plan


def fastest_plan(attempts, nothing_fits):
    """The plan of least predicted step among ``attempts`` (callables that make a plan
    or raise PlacementError); if none makes one, the first failure, else
    ``nothing_fits`` (a PlacementError) when there was no attempt at all.

    >>> from tfpart.core.errors import PlacementError
    >>> from tfpart.core.plan import Plan, Predicted
    >>> def plan(step):
    ...     return lambda: Plan(assignment={}, predicted=Predicted(step_time=step, devices={}))
    >>> def fails():
    ...     raise PlacementError("", "no room")
    >>> fastest_plan([plan(2.0), fails, plan(1.0)], None).step_time
    1.0
    >>> fastest_plan([fails], None)
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: no room
    """
    best, failure = None, None
    for attempt in attempts:
        try:
            candidate = attempt()
        except PlacementError as exc:
            failure = failure or exc
            continue
        if best is None or candidate.step_time < best.step_time:
            best = candidate
    if best is None:
        raise failure or nothing_fits
    return best
