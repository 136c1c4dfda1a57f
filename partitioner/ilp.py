"""ILP baseline: optimal placement and schedule of (coarsened) units, in pulp.

Variables: ``x[u, d]`` (unit u on device d), start times ``S[u]``, the makespan ``C``.
Constraints:

* every unit on exactly one device that has kernels for all its ops, and the units of
  one colocation group on the same device;
* precedence with transfer times that depend on both ends' devices:
  ``S[v] >= S[u] + p[u] + T[u, v]``, ``T[u, v] >= comm[a][b] (x[u, a] + x[v, b] - 1)``;
* no two units overlap on an executor (a device, or devices sharing a ``core_group``):
  a big-M disjunction with an order variable for every pair of units no path orders;
* memory: at each of the busiest moments of a reference run (the model alone on one
  device, :func:`live_cuts`), each device's variables plus the tensors of its units
  alive then within its capacity (received copies are left to the simulation, which
  judges the result: a placement it finds over memory is not kept);

minimising ``C`` (plus the cluster's fixed step overhead). HiGHS (through pulp) is used
and reports its bound; CBC is the fallback. Graphs larger than ``max_units`` are
coarsened first and the result mapped back to ops.

The solver starts from the greedy's placement (:mod:`partitioner.greedy_placement`; on a
coarsened graph each unit on the device most of its ops have), passed to HiGHS through
its own API (``setSolution``, which pulp's interface lacks) with the simulator's
schedule of it. The ILP may still order ops as the simulator's work-conserving
dispatch would not, so its plan is then judged by simulation against the greedy's and
the faster kept (``solver.kept``): the ILP is never slower than the greedy. The plan
records the solver's status, objective and bound; its predicted step time is, as for
every algorithm, the simulator's.

Example
-------
>>> g = OpGraph()
>>> for n in "abc": g.add_op(n, op_type="MatMul", flops=1e11)
>>> g.add_edge("a", "c", bytes=1e3); g.add_edge("b", "c", bytes=1e3)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> plan = partition(CostModel(g, cluster))
>>> plan.predicted.solver["status"], len(plan.devices_used())
('optimal', 2)
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import pulp

from costmodel.arrays import graph_arrays
from costmodel.simulate import live_peak, simulate
from partitioner.coarsen import CoarsenOptions, coarsen
from partitioner.greedy_placement import greedy_placement
from partitioner.finish import make_plan
from partitioner.lower_bound import critical_path_bound
from partitioner.units import less_room
from partitioner.validate import memory_hint
from tfpart.core.errors import PlacementError


@dataclass(frozen=True)
class ILPOptions:
    time_limit: float = 60.0
    mip_gap: float = 1e-4
    solver: str = "highs"  # or "cbc"
    max_units: int = 40
    link_queues: bool = True
    coarsen: CoarsenOptions = field(default_factory=CoarsenOptions)


@dataclass
class ILPResult:
    unit_device: dict
    status: str
    objective: float
    bound: float
    seconds: float


class _StartedHiGHS(pulp.HiGHS):
    """pulp's HiGHS interface, given a starting solution (variable name -> value)
    through HiGHS's own ``setSolution`` before it runs."""

    def __init__(self, start, **options):
        super().__init__(**options)
        self.start = start

    def callSolver(self, lp):
        if self.start:
            import highspy

            values = [0.0] * len(lp.variables())
            for var in lp.variables():
                values[var.index] = float(self.start.get(var.name, 0.0))
            solution = highspy.HighsSolution()
            solution.col_value = values  # one assignment: the binding returns copies
            solution.value_valid = True
            lp.solverModel.setSolution(solution)
        lp.solverModel.run()


def _solver(options, start=None):
    if options.solver == "highs" and "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        return _StartedHiGHS(start, msg=False, timeLimit=options.time_limit,
                             gapRel=options.mip_gap)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=options.time_limit, gapRel=options.mip_gap)


def solve(graph, cost, cluster, options=ILPOptions(), initial=None, live=None, room=None):
    """Solve the placement ILP on ``graph`` as it is (every op a unit), starting from
    the placement ``initial`` (device index per op of ``cost.ops``) if given; ``live``
    and ``room`` as for :func:`model`."""
    prob, x, unit, values = model(graph, cost, cluster, options, initial, live, room)
    units = list(cost.ops)
    n_dev = len(cluster)
    t0 = time.perf_counter()
    solver = _solver(options, values)
    status = prob.solve(solver)
    seconds = time.perf_counter() - t0
    if pulp.LpStatus[status] == "Infeasible":
        raise _infeasible(graph, cluster)
    assignment = {u: max(range(n_dev), key=lambda d: (x[u, d].value() or 0) if (u, d) in x
                         else -1) for u in units}
    found = getattr(prob, "sol_status", pulp.LpSolutionOptimal) in (
        pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if not found or any(x[u, assignment[u]].value() is None for u in units):
        raise PlacementError("", f"the ILP found no solution within {options.time_limit} s; "
                             "raise the time limit or coarsen further")
    objective = float(pulp.value(prob.objective)) * unit + cluster.step_overhead
    bound, exact = _bound(prob, solver, float(pulp.value(prob.objective)))
    bound *= unit
    return ILPResult(unit_device=assignment, status="optimal" if exact else "time limit",
                     objective=objective, bound=bound + cluster.step_overhead, seconds=seconds)


def model(graph, cost, cluster, options=ILPOptions(), initial=None, live=None, room=None):
    """The placement ILP of ``graph`` (every op a unit): the pulp problem, its placement
    variables ``x[op, device]``, the time unit its times are in (seconds), and the
    value of every variable for the simulated schedule of ``initial`` (None without).
    ``live`` (moments x units) are the bytes of each unit alive at the moments the
    memory constraints hold (default: :func:`live_cuts` of ``cost``), against ``room``
    bytes per device (default: their memory)."""
    units = list(cost.ops)
    n_dev = len(cluster)
    executors = cost.lane_of  # timelines of kernels: an accelerator's host issues ahead
    # Times in units of a thousandth of the serial worst case, so the solver's absolute
    # tolerances (about 1e-6) are small against every duration.
    worst = float(np.where(np.isfinite(cost.compute), cost.compute, 0.0).max(axis=1).sum())
    worst += sum(max(cost.edge_time(e, a, b) for a in range(n_dev) for b in range(n_dev))
                 for _, _, e in graph.edges())
    unit = worst / 1000 if worst > 0 else 1.0
    p = cost.device_time() / unit
    horizon = 1000.0 + 1e-6
    prob = pulp.LpProblem("placement", pulp.LpMinimize)
    x = {(u, d): prob.add_variable(f"x_{i}_{d}", cat="Binary")
         for i, u in enumerate(units) for d in range(n_dev) if np.isfinite(p[i, d])}
    start = {u: prob.add_variable(f"s_{i}", lowBound=0) for i, u in enumerate(units)}
    makespan = prob.add_variable("makespan", lowBound=0)
    prob += makespan
    duration = {}
    for i, u in enumerate(units):
        on = [d for d in range(n_dev) if (u, d) in x]
        if not on:
            raise PlacementError("", f"no device can run {u}")
        prob += pulp.lpSum(x[u, d] for d in on) == 1
        duration[u] = pulp.lpSum(float(p[i, d]) * x[u, d] for d in on)
        prob += makespan >= start[u] + duration[u]
    for members in graph.colocation_groups().values():
        for other in members[1:]:
            for d in range(n_dev):
                if (members[0], d) in x or (other, d) in x:
                    prob += x.get((members[0], d), 0) == x.get((other, d), 0)
    transfers = []
    for k, (u, v, edge) in enumerate(graph.edges()):
        transfer = prob.add_variable(f"t_{k}", lowBound=0)
        transfers.append((transfer, u, v, edge))
        for a in range(n_dev):
            for b in range(n_dev):
                c = cost.edge_time(edge, a, b) / unit
                if a != b and c > 0 and (u, a) in x and (v, b) in x:
                    prob += transfer >= c * (x[u, a] + x[v, b] - 1)
        prob += start[v] >= start[u] + duration[u] + transfer
    pairs = _no_overlap(prob, graph, units, x, start, duration, executors, n_dev, horizon)
    links = _link_queues(prob, cost, x, start, duration, makespan, unit, horizon) \
        if options.link_queues else _LinkQueues([], [])
    # Valid inequalities that tighten the relaxation: no executor can be busier than the
    # makespan, and no schedule beats the critical path.
    for e in sorted(set(executors)):
        prob += makespan >= pulp.lpSum(float(p[i, d]) * x[u, d] for i, u in enumerate(units)
                                       for d in range(n_dev)
                                       if executors[d] == e and (u, d) in x)
    prob += makespan >= critical_path_bound(cost) / unit
    _memory(prob, units, x, np.array([d.memory for d in cluster.devices], dtype=float)
            if room is None else room, live_cuts(cost) if live is None else live,
            [graph.ops[u]["param_bytes"] for u in units])
    values = None
    if initial is not None:
        values = _start_values(cost, initial, unit, x, transfers, pairs, links)
    return prob, x, unit, values


def _start_values(cost, device_of, unit, x, transfers, pairs, links):
    """Every variable's value (by name) for the placement ``device_of`` scheduled by the
    simulator: the solver's starting solution."""
    schedule = simulate(cost, device_of)
    where = dict(zip(cost.ops, device_of))
    executors = cost.lane_of
    values = {var.name: float(where[u] == d) for (u, d), var in x.items()}
    for i, u in enumerate(cost.ops):
        values[f"s_{i}"] = schedule.start[i] / unit
    values["makespan"] = float(schedule.end.max(initial=0.0)) / unit
    for var, u, v, edge in transfers:
        values[var.name] = cost.edge_time(edge, where[u], where[v]) / unit
    index = cost.index
    for same, first, u, v in pairs:
        values[same.name] = float(executors[where[u]] == executors[where[v]])
        values[first.name] = float(_not_after(schedule.end[index[u]], schedule.start[index[v]]))
    sent = {(cost.ops[i], dst): (begin, finish) for i, _, dst, begin, finish in
            schedule.transfers}
    span = {}
    for k, (u, b, copy, begin, on_link, latency) in enumerate(links.copies):
        a = where[u]
        shipped = (u, b) in sent
        values[copy.name] = float(shipped)
        start_at, finish = sent.get((u, b), (schedule.end[index[u]], schedule.end[index[u]]))
        readers = [e for v, e in cost.graph.out_edges(u).items()
                   if not e["control"] and where[v] == b]
        link = max([cost.edge_link_time(e, a, b) for e in readers], default=0.0)
        values[begin.name] = start_at / unit
        values[on_link.name] = link / unit if shipped else 0.0
        values[latency.name] = (finish - start_at - link) / unit if shipped else 0.0
        span[k] = (start_at, start_at + (link if shipped else 0.0), shipped, a)
    for same, first, i, j in links.pairs:
        (_, end1, on1, a1), (q2, _, on2, a2) = span[i], span[j]
        values[same.name] = float(on1 and on2 and a1 == a2)
        # i first if it is off the link when j starts (at a tie, an empty copy is first)
        values[first.name] = float(_not_after(end1, q2))
    return values


def _not_after(end, start):
    """Whether one span ends by the time another starts (to a relative 1e-9): which of
    two spans that do not overlap comes first, even when one is empty."""
    return end <= start + 1e-9 * max(1.0, abs(start))


def _no_overlap(prob, graph, units, x, start, duration, executors, n_dev, horizon):
    """No two units overlap on an executor; returns the ``(same, first, u, v)``
    variables of every unordered pair."""
    counter = itertools.count()
    pairs = []
    reach = graph.descendants()
    groups = sorted(set(executors))
    for i, u in enumerate(units):
        for v in units[i + 1:]:
            if v in reach[u] or u in reach[v]:
                continue
            same = prob.add_variable(f"same_{next(counter)}", lowBound=0, upBound=1)
            for e in groups:
                on_e = [d for d in range(n_dev) if executors[d] == e]
                prob += same >= pulp.lpSum(x[u, d] for d in on_e if (u, d) in x) + \
                    pulp.lpSum(x[v, d] for d in on_e if (v, d) in x) - 1
            first = prob.add_variable(f"o_{next(counter)}", cat="Binary")
            prob += start[v] >= start[u] + duration[u] - horizon * (1 - first) - \
                horizon * (1 - same)
            prob += start[u] >= start[v] + duration[v] - horizon * first - horizon * (1 - same)
            pairs.append((same, first, u, v))
    return pairs


@dataclass
class _LinkQueues:
    """The ILP's copies (``(u, b, copy, begin, on_link, latency)``: producer ``u``'s
    tensor sent to device ``b``) and the ``(same_link, first, k1, k2)`` variables of
    every pair of copies that may share a link."""

    copies: list
    pairs: list


def _link_queues(prob, cost, x, start, duration, makespan, unit, horizon):
    """Transfers queue on their links, as in the simulator: one copy of a producer's
    tensor per destination device, sent when the producer ends, occupying its directed
    link for its bytes / bandwidth, arriving one latency after its last byte leaves;
    two copies on one link do not overlap. Every simulated schedule satisfies these
    constraints, so the optimum stays a lower bound on any simulated step (the
    simulator's Send/Recv executor time, ``message_cost``, is not modelled)."""
    graph, n_dev = cost.graph, len(cost.cluster)
    counter = itertools.count()
    copies = []
    for u in cost.ops:
        readers = [(v, e) for v, e in graph.out_edges(u).items() if not e["control"]]
        for b in range(n_dev):
            to_b = [(v, e) for v, e in readers if (v, b) in x]
            sources = [a for a in range(n_dev) if a != b and (u, a) in x]
            times = {(v, a): (cost.edge_link_time(e, a, b) / unit,
                              cost.edge_time(e, a, b) / unit) for v, e in to_b for a in sources}
            if not any(total for _, total in times.values()):
                continue
            k = next(counter)
            copy = prob.add_variable(f"c_{k}", lowBound=0, upBound=1)
            begin = prob.add_variable(f"q_{k}", lowBound=0)
            on_link = prob.add_variable(f"l_{k}", lowBound=0)
            latency = prob.add_variable(f"a_{k}", lowBound=0)
            for v, _ in to_b:
                prob += copy >= x[v, b] - x.get((u, b), 0)
                prob += start[v] >= begin + on_link + latency - horizon * (1 - x[v, b])
            for (v, a), (link, total) in times.items():  # the largest tensor sent sets both
                if link > 0:
                    prob += on_link >= link * (x[u, a] + x[v, b] - 1)
                if total > link:
                    prob += latency >= (total - link) * (x[u, a] + x[v, b] - 1)
            prob += begin >= start[u] + duration[u]
            prob += makespan >= begin + on_link + latency
            copies.append((u, b, copy, begin, on_link, latency))
    pairs = []
    for i, first_copy in enumerate(copies):
        for j in range(i + 1, len(copies)):
            second = copies[j]
            if first_copy[1] != second[1]:
                continue
            (u1, b, c1, q1, l1, _), (u2, _, c2, q2, l2, _) = first_copy, second
            k = next(counter)
            same = prob.add_variable(f"z_{k}", lowBound=0, upBound=1)
            for a in range(n_dev):
                if a != b and (u1, a) in x and (u2, a) in x:
                    prob += same >= x[u1, a] + x[u2, a] + c1 + c2 - 3
            first = prob.add_variable(f"p_{k}", cat="Binary")
            prob += q2 >= q1 + l1 - horizon * (1 - first) - horizon * (1 - same)
            prob += q1 >= q2 + l2 - horizon * first - horizon * (1 - same)
            pairs.append((same, first, i, j))
    return _LinkQueues(copies, pairs)


def _memory(prob, units, x, room, live, params):
    """At every moment (row) of ``live``, each device's variables (``params`` per unit)
    and alive tensors within its ``room``."""
    params = np.asarray(params, dtype=float)
    for d, capacity in enumerate(room):
        on = [(i, u) for i, u in enumerate(units) if (u, d) in x]
        for row in np.atleast_2d(live):
            terms = [float(params[i] + row[i]) * x[u, d] for i, u in on
                     if params[i] + row[i] > 0]
            if terms:
                prob += pulp.lpSum(terms) <= float(capacity)


MEMORY_CUTS = 12  # moments of the reference run the ILP's memory constraints hold at


def live_cuts(cost, unit_of=None, n_units=None, cuts=MEMORY_CUTS):
    """Bytes of each unit's tensors alive at the ``cuts`` busiest moments of a
    reference run: the graph alone on one device (each op on the first that runs it),
    in the simulator's order, every output alive from its op until its last reader (an
    aliasing op's until its own last reader), graph outputs to the end.

    Parameters
    ----------
    cost : costmodel.CostModel
    unit_of : numpy.ndarray of int, optional
        The unit of each op of ``cost.ops`` (default: every op its own unit).
    n_units : int, optional

    Returns
    -------
    numpy.ndarray, shape (moments, units)

    Examples
    --------
    >>> g = OpGraph()
    >>> for n in "abc": g.add_op(n, op_type="Relu", outputs=[((64,), "float32")])
    >>> g.add_edge("a", "b", bytes=256); g.add_edge("b", "c", bytes=256)
    >>> live_cuts(CostModel(g, cluster_of_devices(["cpu"]))).tolist()  # a freed once b ran
    [[0.0, 256.0, 256.0]]
    """
    a = graph_arrays(cost)
    n_ops = len(cost.ops)
    unit_of = np.arange(n_ops) if unit_of is None else np.asarray(unit_of)
    n_units = n_ops if n_units is None else n_units
    order = np.asarray(simulate(cost, np.argmax(np.isfinite(cost.compute), axis=1),
                                memory=False).order, dtype=np.int64)
    position = np.empty(n_ops, dtype=np.int64)
    position[order] = np.arange(n_ops)
    owner, last = np.arange(n_ops), position.copy()
    last[np.diff(a.succ_ptr) == 0] = n_ops  # graph outputs stay
    for i in order.tolist():
        data = [a.pred_op[k] for k in range(a.pred_ptr[i], a.pred_ptr[i + 1])
                if not a.edge_control[a.pred_edge[k]]]
        if a.aliasing[i] and data:
            owner[i] = owner[data[0]]
        for p in data:
            last[owner[p]] = max(last[owner[p]], position[i])
    begins, ends = position, last
    change = np.zeros(n_ops + 2)
    np.add.at(change, begins, a.own_bytes)
    np.add.at(change, ends + 1, -a.own_bytes)
    total = np.cumsum(change)[:n_ops]
    peaks = [t for t in range(n_ops) if total[t] > 0 and
             (t == 0 or total[t] >= total[t - 1]) and (t == n_ops - 1 or total[t] > total[t + 1])]
    chosen = sorted(peaks, key=lambda t: -total[t])[:cuts] or [int(np.argmax(total))]
    rows = np.zeros((len(chosen), n_units))
    for r, t in enumerate(chosen):
        alive = (begins <= t) & (ends >= t)
        rows[r] = np.bincount(unit_of[alive], a.own_bytes[alive], minlength=n_units)
    return rows


def _bound(prob, solver, objective):
    model = getattr(solver, "solverModel", None) or getattr(prob, "solverModel", None)
    if model is not None and hasattr(model, "getInfo"):
        bound = float(model.getInfo().mip_dual_bound)
        exact = model.modelStatusToString(model.getModelStatus()) == "Optimal"
        return min(bound, objective), exact
    exact = pulp.LpStatus[prob.status] == "Optimal"
    return (objective if exact else 0.0), exact


def _infeasible(graph, cluster):
    biggest = max(graph.ops, key=lambda o: graph.ops[o]["param_bytes"])
    need = graph.ops[biggest]["param_bytes"]
    roomiest = max(cluster.devices, key=lambda d: d.memory)
    if need > roomiest.memory:
        return PlacementError("", f"{biggest} needs {need / 1e6:.1f} MB but the largest "
                              f"device, {roomiest.name}, has {roomiest.memory / 1e6:.1f} MB")
    tightest = min(cluster.devices, key=lambda d: d.memory)
    return PlacementError("", f"no placement fits the devices' memory (tightest: "
                          f"{tightest.name} with {tightest.memory / 1e6:.1f} MB)")


def partition(cost, options=ILPOptions()):
    """Optimal (or best found, with bound) placement, started from the greedy's and
    never slower than it by simulation. Graphs of more than ``options.max_units`` ops
    are coarsened first; the result is then optimal for the coarse graph only (status
    ``coarse ...``), and its bound bounds that graph only."""
    graph = cost.graph
    try:
        greedy, _ = greedy_placement(cost)
    except PlacementError:
        greedy = None
    try:
        device_of, result, units = _solve_within_memory(cost, options, greedy)
    except PlacementError:
        if greedy is None:
            raise
        # no solution within the time limit (CBC, which takes no start): the greedy's
        device_of, units = greedy, len(graph)
        result = ILPResult(unit_device={}, status="no solution", objective=None,
                           bound=0.0, seconds=options.time_limit)
    if result.status.endswith("simulation"):
        if greedy is None:
            raise PlacementError("", f"the ILP's placements overflow memory in simulation; "
                                 f"{memory_hint(cost)}")
        device_of = greedy
    own_step = None if result.status == "no solution" or \
        result.status.endswith("simulation") else simulate(cost, device_of, memory=False).makespan
    kept = "ilp"
    if greedy is not None and (own_step is None or
                               simulate(cost, greedy, memory=False).makespan < own_step):
        device_of, kept = greedy, "greedy"
    plan = make_plan(cost, device_of, "ilp", options)
    plan.predicted.solver = {"status": result.status, "objective": result.objective,
                             "bound": result.bound, "units": units,
                             "solve_seconds": result.seconds, "kept": kept,
                             "own_step_time": own_step,
                             "started_from": "greedy" if greedy is not None else None}
    return plan


REPAIRS = 3  # solves again with less room where the simulation overflowed


def _solve_within_memory(cost, options, greedy):
    """:func:`_solve_model`, solved again (a few times at most) with each device's room
    cut by what the simulated live-range peak of the last solution put over it: the
    ILP's moments and its omission of received copies only estimate that peak."""
    problem = _problem(cost, options, greedy)
    room = np.array([d.memory for d in cost.cluster.devices], dtype=float)
    capacity = room.copy()
    for _ in range(REPAIRS + 1):
        device_of, result = _solve_model(cost, options, problem, capacity)
        excess = live_peak(cost, device_of) - room
        if (excess <= 0).all():
            return device_of, result, len(problem.graph)
        capacity = less_room(capacity, excess, room)
    result.status += ", over memory in simulation"
    return device_of, result, len(problem.graph)


@dataclass(frozen=True)
class _Problem:
    """What the ILP solves for a cost model: its graph, coarsened past ``max_units``
    (``coarse``, None if not), that graph's cost model, the starting placement and the
    units' bytes alive at the reference run's busiest moments (:func:`live_cuts`)."""

    graph: object
    cost: object
    start: object
    live: np.ndarray
    coarse: object = None


def _problem(cost, options, greedy):
    """The :class:`_Problem` of ``cost``, started from the greedy's placement."""
    graph = cost.graph
    if len(graph) <= options.max_units:
        return _Problem(graph, cost, greedy, live_cuts(cost))
    # weights join their readers: variables, which lead every topological order,
    # would otherwise fill the first piece together, more than any device holds
    target = CoarsenOptions(chains=options.coarsen.chains,
                            name_scope_depth=options.coarsen.name_scope_depth,
                            target_units=min(options.max_units,
                                             options.coarsen.target_units or 10**9),
                            weights_with_reader=True)
    coarse = coarsen(graph, cost, target)
    coarse_cost = cost.of(coarse.graph)
    start = None if greedy is None else _by_majority(coarse, cost, greedy, coarse_cost)
    unit_index = {unit: k for k, unit in enumerate(coarse_cost.ops)}
    unit_of = np.empty(len(cost.ops), dtype=np.int64)
    for unit, members in coarse.members.items():
        unit_of[[cost.index[op] for op in members]] = unit_index[unit]
    return _Problem(coarse.graph, coarse_cost, start,
                    live_cuts(cost, unit_of, len(unit_index)), coarse)


def _solve_model(cost, options, problem, room):
    """The ILP's placement of ``problem`` within ``room`` bytes per device (device
    index per op of ``cost.ops``) and its result."""
    names = cost.cluster.device_names
    result = solve(problem.graph, problem.cost, cost.cluster, options, problem.start,
                   problem.live, room)
    assignment = {u: names[d] for u, d in result.unit_device.items()}
    if problem.coarse is not None:
        assignment = problem.coarse.expand(assignment)
        result.status = f"coarse {result.status}"
    return np.array([names.index(assignment[op]) for op in cost.ops]), result


def _by_majority(coarse, cost, device_of, coarse_cost):
    """A placement of the coarse units: each unit where most of its ops' time is."""
    chosen = []
    for unit in coarse_cost.ops:
        members = [cost.index[op] for op in coarse.members[unit]]
        weights = np.bincount(device_of[members], weights=cost.mean_time()[members] + 1e-12,
                              minlength=len(cost.cluster))
        runnable = np.isfinite(coarse_cost.compute[coarse_cost.index[unit]])
        chosen.append(int(np.argmax(np.where(runnable, weights, -1.0))))
    return np.array(chosen)
