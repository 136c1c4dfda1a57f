"""Pipeline stages: convex stages on (heterogeneous) devices, and a micro-batch count
(the library behind :mod:`partitioner.pipeline` and the replicas of a pipeline).

The graph is coarsened to at most ``target_units`` units (colocation groups, each
weight with the first op that reads it, ops Grappler fuses kept together, chains, then
contiguous topological pieces),
devices are grouped into kinds (same device kind
and memory), and :mod:`partitioner.stage_dp` finds the stages and the kind of device
each runs on that minimise the largest stage load: compute plus the transfers into
and out of the stage. In the search a stage's memory is its variables (and, in a
training step, the activations its forward ops keep for the backward pass, at the full
batch), against each device's memory less room kept for the other activations: those of
the whole model at their peak on one device, else half that, else what its largest op
needs, the first for which the stages fit; the plan is held to the live-range peak of
every device in the op-by-op simulation of the chosen micro-batch count and schedule.

A training step (ops marked with a phase by the reader) is staged in its forward graph
(:mod:`partitioner.training_stages`): each forward op carries its backward ops' time,
its backward ops then join its stage and the update ops their variables; the schedule
(one of :mod:`costmodel.schedules`, ``options.schedule`` overrides) is chosen with M.
A schedule that puts several stages on each device (interleaved 1F1B) gets its own
stage search, over that many times the devices, stage k on device k mod D.

The micro-batch count M (``options.microbatches`` overrides) is the one whose
simulated batch time is least among 1, 2, 4, … up to the batch size, among those whose
op-by-op simulation fits every device's memory: more micro-batches
shrink the pipeline bubble (K - 1) / (M + K - 1) but make every op run at a smaller
batch, which pays its launch overhead and weight reads M times
(:mod:`costmodel.pipeline`). The candidates are simulated on the coarse units (each
unit's ops back to back, its tensors sent when it ends); the fastest are then simulated
op by op, with memory, until one fits.

See :mod:`partitioner.pipeline` for an example.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import numpy as np

from costmodel.memory import new_output_bytes, size_text
from costmodel.pipeline import microbatch_graph, simulate_pipeline
from costmodel.schedules import SCHEDULES, schedule_named
from costmodel.simulate import activation_peak
from partitioner.coarsen import CoarsenOptions, coarsen, regroup
from partitioner.stage_dp import IDEAL_LIMIT, StageProblem, load_of, solve
from partitioner.training_stages import (forward_partners, forward_view, is_training_graph,
                                         place_followers)
from tfpart.core.errors import PlacementError
from partitioner.validate import check_plan
from tfpart.core.plan import (DeviceFigures, PipelineFigures, Plan, Predicted, StageFigures,
                              Stages)


@dataclass(frozen=True)
class PipelineOptions:
    batch_size: int = 1
    microbatches: int | None = None  # None: chosen by simulation
    max_microbatches: int = 32
    target_units: int = 64
    ideal_limit: int = IDEAL_LIMIT
    schedule: str | None = None  # training steps: one of costmodel.schedules; None: the fastest


def pipeline_plan(cost, options=PipelineOptions()):
    """A pipelined plan: ``plan.stages`` (op -> stage), ``plan.microbatches`` and, for a
    training step, ``plan.schedule``."""
    graph, cluster = cost.graph, cost.cluster
    if options.microbatches is not None and not 1 <= options.microbatches:
        raise PlacementError("", f"--microbatches must be at least 1, not "
                             f"{options.microbatches}")
    training = is_training_graph(graph)
    partners = forward_partners(graph) if training else {}
    staged = forward_view(graph, cost, partners) if training else graph
    staged_cost = cost.of(staged) if training else cost
    coarse = coarsen(staged, staged_cost, CoarsenOptions(target_units=options.target_units,
                                                         weights_with_reader=True))
    unit_graph = coarse.graph
    units = [u for u in unit_graph.ops if unit_graph.in_degree(u) + unit_graph.out_degree(u)] \
        or list(unit_graph.ops)
    kinds = device_kinds(cluster)
    kept = _kept_for_backward(graph) if training else {}
    # an inference step runs one forward per micro-batch: every order is fill-drain's
    schedules = ([options.schedule] if options.schedule else list(SCHEDULES)) \
        if training else ["gpipe"]
    failure = None
    micro = _Microbatches(cost)
    for reserve in _activation_reserves(cost, graph, training):
        try:
            problem = stage_problem(staged, staged_cost, kinds, units, coarse.members, kept,
                                    reserve)
            layouts = {}  # stages per device -> (device_of, stage_of, members, solution)
            for chunks in sorted({schedule_named(s).CHUNKS for s in schedules}):
                solution, stage_devices = _stage_solution(problem, kinds, chunks,
                                                          options.ideal_limit)
                if solution is not None:
                    layouts[chunks] = (*_stages_placed(
                        graph, staged, cluster, coarse, units, stage_devices, solution,
                        partners, training), solution)
            tried = [s for s in schedules if schedule_named(s).CHUNKS in layouts]
            if not tried:
                raise PlacementError("", f"the {schedules[0]} schedule needs "
                                     f"{schedule_named(schedules[0]).CHUNKS} stages on each "
                                     "of at least two devices of one kind")
            layout_of = {s: layouts[schedule_named(s).CHUNKS] for s in tried}
            runs = {(m, s): _simulate_units(micro, layout_of[s][2], *layout_of[s][:2], m, s)
                    for m in microbatch_candidates(options) for s in tried}
            (chosen, schedule), best, peaks = _fastest_fitting(micro, runs, layout_of)
            device_of, stage_of, _, solution = layout_of[schedule]
            break
        except PlacementError as exc:
            failure = exc  # the last: with the least room kept, the closest to fitting
    else:
        raise failure
    names = cluster.device_names
    assignment = {op: names[d] for op, d in device_of.items()}
    peak = best.peak_memory
    plan = Plan(
        assignment=assignment, algorithm="pipeline", options=asdict(options),
        stages=Stages(stage_of, best.microbatches, schedule if training else None),
        predicted=Predicted(
            step_time=float(best.batch_time), links=best.links,
            bytes_moved=float(sum(best.links.values())), transfers=best.transfers,
            cross_host_transfers=best.cross_host_transfers,
            devices={name: DeviceFigures(
                kind=cluster.devices[d].kind.name, busy_s=float(best.busy[name]),
                ops=sum(1 for device in device_of.values() if device == d),
                memory_bytes=float(cluster.devices[d].memory),
                peak_memory_bytes=peak[name])
                for d, name in enumerate(names)},
            pipeline=PipelineFigures(
                throughput=options.batch_size / best.batch_time if best.batch_time else 0.0,
                first_result=float(best.first_result), interval=float(best.interval),
                bubble_fraction=float(best.bubble_fraction),
                stage_max_load=float(solution.max_load), exact=bool(solution.exact),
                ideals=int(solution.ideals), units=len(units),
                stages=[StageFigures(device=names[device_of[coarse.members[units[m[0]]][0]]],
                                     units=len(m), load=float(load))
                        for (_, m), load in zip(solution.stages, solution.loads)],
                microbatch_choices={
                    (f"{key[0]} {key[1]}" if training else str(key[0])): {
                        "batch_time": run.batch_time, "first_result": run.first_result,
                        "bubble_fraction": run.bubble_fraction,
                        **({"peak_memory_bytes": max(peaks[key].values())} if key in peaks
                           else {})}
                    for key, run in runs.items()})),
        lower_bound=pipeline_lower_bound(cost, best.microbatches,
                                         micro.cost_of(best.microbatches)))
    check_plan(plan, graph, cluster)
    return plan


class _Microbatches:
    """The micro-batch graphs of ``cost``'s graph and their cost models, each built once
    for one plan however many schedules and searches price it."""

    def __init__(self, cost):
        self.cost, self._graphs, self._costs = cost, {}, {}

    def graph(self, microbatches):
        """:func:`~costmodel.pipeline.microbatch_graph` of ``microbatches``."""
        if microbatches not in self._graphs:
            self._graphs[microbatches] = microbatch_graph(self.cost.graph, microbatches)
        return self._graphs[microbatches]

    def cost_of(self, microbatches):
        """The cost model of :meth:`graph`."""
        if microbatches not in self._costs:
            self._costs[microbatches] = self.cost.of(self.graph(microbatches))
        return self._costs[microbatches]


def _fastest_fitting(micro, runs, layout_of):
    """The (micro-batches, schedule) key of least coarse batch time among ``runs``
    whose op-by-op simulation fits every device's memory, that simulation, and the
    peaks per device of every key simulated so. ``micro``: the :class:`_Microbatches`
    of the cost model; ``layout_of``: schedule -> its stages' ``(device_of, stage_of,
    …)``."""
    cost = micro.cost
    cluster, peaks = cost.cluster, {}
    for key in sorted(runs, key=lambda key: (runs[key].batch_time, key[0], key[1])):
        device_of, stage_of = layout_of[key[1]][:2]
        run = simulate_pipeline(micro.graph(key[0]), cluster, device_of,
                                stage_of, key[0], cost, key[1], memory=True)
        peaks[key] = run.peak_memory
        if all(run.peak_memory[d.name] <= d.memory for d in cluster.devices):
            return key, run, peaks
    over = {key: max(peak[d.name] - d.memory for d in cluster.devices)
            for key, peak in peaks.items()}
    (m, schedule), excess = min(over.items(), key=lambda item: item[1])
    named = f" {schedule}" if len({key[1] for key in runs}) > 1 else ""
    raise PlacementError("", f"the pipeline stages found fit no device's memory at any "
                         f"micro-batch count: at the closest ({m} micro-batches{named}) a "
                         f"device needs {size_text(excess)} more")


def _stage_solution(problem, kinds, chunks, ideal_limit):
    """The stage search's solution for ``chunks`` stages per device, and the device
    of each stage (:func:`_interleaved_solution` for more than one)."""
    if chunks > 1:
        return _interleaved_solution(problem, kinds, chunks, ideal_limit)
    solution = solve(problem, ideal_limit=ideal_limit)
    free = {k: list(devices) for k, devices in enumerate(kinds)}
    return solution, [free[kind].pop(0) for kind, _ in solution.stages]


def _interleaved_solution(problem, kinds, chunks, ideal_limit):
    """Stages for ``chunks`` per device of one kind (an interleaved schedule): the
    search over ``chunks`` times as many devices, each ``1 / chunks`` of a device's
    memory, its neighbouring stages of least joint load merged until each of D
    devices holds ``chunks``; stage k runs on device k mod D. ``(None, None)`` when
    fewer than two devices would be used or the devices differ in kind."""
    if len(kinds) != 1:
        return None, None
    devices = kinds[0]
    search = dataclasses.replace(problem, count=(len(devices) * chunks,),
                                 capacity=problem.capacity / chunks)
    solution = solve(search, ideal_limit=ideal_limit)
    used = min(len(devices), len(solution.stages) // chunks)
    if used < 2:
        return None, None
    stages = [units for _, units in solution.stages]
    while len(stages) > used * chunks:
        joint = [load_of(search, a + b, 0) for a, b in zip(stages, stages[1:])]
        i = int(np.argmin(joint))
        stages[i:i + 2] = [stages[i] + stages[i + 1]]
    loads = [load_of(search, units, 0) for units in stages]
    merged = dataclasses.replace(solution, stages=[(0, units) for units in stages],
                                 loads=loads, max_load=max(loads))
    return merged, [devices[k % used] for k in range(len(stages))]


def _stages_placed(graph, staged, cluster, coarse, units, stage_devices, solution, partners,
                   training):
    """The device and stage of every op for the stage search's ``solution``, stage k on
    device ``stage_devices[k]``, and the simulation units."""
    device_of, stage_of = {}, {}
    for stage, (_, members) in enumerate(solution.stages):
        device = stage_devices[stage]
        for u in members:
            for op in coarse.members[units[u]]:
                device_of[op], stage_of[op] = device, stage
    _place_unconnected(staged, cluster, coarse, set(units), device_of, stage_of)
    members = coarse.members
    if training:
        place_followers(graph, partners, device_of, stage_of)
        members = _training_units(graph, coarse.members, stage_of)
    return device_of, stage_of, members


def _activation_reserves(cost, graph, training):
    """The room for activations the stage search keeps on every device, tried in turn
    until a search's stages fit by simulation: the whole graph's transient
    activations (:func:`_transient_activations`), half of them, and what its largest op
    needs with its inputs and outputs (a stage holds only its own part of them)."""
    whole = _transient_activations(cost, graph, training)
    largest = max((sum(new_output_bytes(graph.ops[u]) for u in graph.predecessors(op)) +
                   new_output_bytes(attrs) for op, attrs in graph.ops.items()), default=0.0)
    return sorted({whole, whole / 2, min(largest, whole)}, reverse=True)


def _kept_for_backward(graph):
    """Bytes each forward op of a training step keeps for the backward pass (its
    output, when a backward op reads it), at the full batch."""
    return {op: new_output_bytes(attrs) for op, attrs in graph.ops.items()
            if attrs.get("phase") == "forward" and any(
                graph.ops[s].get("phase") == "backward" for s in graph.successors(op))}


def _transient_activations(cost, graph, training):
    """The activations every stage's device should keep room for: the graph's
    :func:`~costmodel.simulate.activation_peak` less, in a training step, the
    activations kept for the backward pass, which the stages count."""
    kept = sum(_kept_for_backward(graph).values()) if training else 0.0
    return max(0.0, activation_peak(cost) - kept)


def _training_units(graph, members, stage_of):
    """Simulation units of a training step: the staged units of forward ops, each
    stage's backward ops as one unit (the backward pass only goes back a stage, so
    the units stay acyclic), and every update op alone (they run once)."""
    units = {unit: list(ops) for unit, ops in members.items()}
    for op, attrs in graph.ops.items():
        if attrs["phase"] == "backward":
            units.setdefault(f"stage{stage_of[op]}/backward", []).append(op)
    grouped = {op for ops in units.values() for op in ops}
    units.update({op: [op] for op in graph.ops if op not in grouped})
    return units


def _simulate_units(micro, members, device_of, stage_of, microbatches, schedule):
    """Pipelined simulation of the coarse units (fast enough to try every M);
    ``micro``: the :class:`_Microbatches` of the cost model."""
    cost = micro.cost
    units = regroup(micro.graph(microbatches), micro.cost_of(microbatches), members)
    first = {unit: ops[0] for unit, ops in members.items()}
    for unit, op in first.items():
        units.graph.ops[unit]["phase"] = cost.graph.ops[op].get("phase")
    return simulate_pipeline(units.graph, cost.cluster,
                             {u: device_of[first[u]] for u in members},
                             {u: stage_of[first[u]] for u in members}, microbatches, cost,
                             schedule)


def _place_unconnected(graph, cluster, coarse, staged, device_of, stage_of):
    """Units with no edges (variables the signature never reads, which still hold
    memory) go to the stage device with the most memory left; they would only multiply
    the DP's ideals."""
    stage_device = {stage: device_of[op] for op, stage in stage_of.items()}
    left = {d: cluster.devices[d].memory for d in stage_device.values()}
    for op, device in device_of.items():
        left[device] -= graph.ops[op]["param_bytes"] + new_output_bytes(graph.ops[op])
    lonely = [u for u in coarse.graph.ops if u not in staged]
    for unit in sorted(lonely, key=lambda u: -coarse.graph.ops[u]["param_bytes"]):
        stage, device = max(stage_device.items(), key=lambda item: (left[item[1]], -item[0]))
        for op in coarse.members[unit]:
            device_of[op], stage_of[op] = device, stage
            left[device] -= graph.ops[op]["param_bytes"] + new_output_bytes(graph.ops[op])


def microbatch_candidates(options):
    """1, 2, 4, … up to the batch size and ``max_microbatches`` (or the override)."""
    if options.microbatches is not None:
        return [options.microbatches]
    limit = max(1, min(options.batch_size, options.max_microbatches))
    return [2 ** i for i in range(int(np.log2(limit)) + 1)]


def device_kinds(cluster):
    """Device indices grouped by (kind, memory), in cluster order."""
    groups = {}
    for d, device in enumerate(cluster.devices):
        groups.setdefault((device.kind.name, device.memory), []).append(d)
    return list(groups.values())


def stage_problem(graph, cost, kinds, units, members, kept=None, transient=0.0):
    """The :class:`StageProblem` of ``graph`` grouped into ``units``.

    A unit's size is its variables plus what its ops keep for a backward pass
    (``kept``: op -> bytes); each kind's capacity is its memory less ``transient``.

    A tensor leaving its unit costs, on a device of each kind, its mean transfer time
    from that device to the others; each stage holding some but not all of the units
    that produce and consume it pays it once.
    """
    unit_of = {op: u for u, name in enumerate(units) for op in members[name]}
    first = [devices[0] for devices in kinds]
    time = np.zeros((len(kinds), len(units)))
    size = np.zeros(len(units))
    for op, u in unit_of.items():
        time[:, u] += cost.compute[cost.index[op], first]
        size[u] += graph.ops[op]["param_bytes"] + (kept or {}).get(op, 0.0)
    preds = [set() for _ in units]
    tensors = {}
    others = [[d for d in range(len(cost.cluster)) if d != f] for f in first]
    for src, dst, edge in graph.edges():
        a, b = unit_of.get(src), unit_of.get(dst)
        if a is None or a == b:  # inside one unit, or inside a unit left out (no edges out)
            continue
        preds[b].add(a)
        per_kind = [float(np.mean([cost.edge_time(edge, f, d) for d in rest])) if rest else 0.0
                    for f, rest in zip(first, others)]
        consumers, price = tensors.setdefault(src, ({a}, np.zeros(len(kinds))))
        consumers.add(b)
        np.maximum(price, per_kind, out=price)
    groups = {}
    for src, (touched, price) in tensors.items():
        key = (unit_of[src], *sorted(touched - {unit_of[src]}))
        groups[key] = groups.get(key, 0.0) + price
    capacity = np.array([cost.cluster.devices[devices[0]].memory for devices in kinds],
                        dtype=float) - transient
    return StageProblem(preds=[sorted(p) for p in preds], time=time, size=size,
                        groups=list(groups),
                        comm=np.array(list(groups.values())).T.reshape(len(kinds), -1),
                        capacity=capacity, count=tuple(len(d) for d in kinds))


def pipeline_lower_bound(cost, microbatches, micro=None):
    """No schedule of M micro-batches beats the fastest total work spread over every
    executor, nor one micro-batch's critical path (a valid bound on the batch time).
    ``micro``: the cost model of the micro-batch graph, if the caller has it."""
    from partitioner.lower_bound import critical_path_bound

    cluster = cost.cluster
    if micro is None:
        micro = cost.of(microbatch_graph(cost.graph, microbatches))
    times = micro.device_time()  # an accelerator's kernels: its host issues ahead
    fastest = np.where(np.isfinite(times), times, np.inf).min(axis=1)
    work = float(fastest.sum()) * microbatches / len(set(micro.lane_of))
    return max(work, critical_path_bound(micro)) + cluster.step_overhead
