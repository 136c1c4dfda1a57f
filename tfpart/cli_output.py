"""What the command line prints: the plan's table and summary lines, a verification's
result, the simulated step, progress. Tables and progress use ``rich`` (a well-kept
terminal library, rather than hand-aligned columns and spinners)."""
from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from tfpart.strategy_lines import byte_text, seconds, strategy_lines, transfers_line

console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


def strategy_line(strategy):
    """Why ``--strategy auto`` chose what it chose (``plan.context["strategy"]``).

    >>> strategy_line({"chosen": "pipeline", "step_times": {"greedy": 0.02,
    ...                "pipeline": 0.012}, "refused": {"data_parallel": "no room"}})
    'Strategy pipeline: the least predicted step (12.000 ms; greedy 20.000 ms; data_parallel impossible: no room)'
    >>> strategy_line({"chosen": "greedy", "step_times": {"greedy": 0.02}, "refused": {},
    ...                "tables cut": {"greedy": 0.03}})
    'Strategy greedy: the least predicted step (20.000 ms; greedy with the tables cut 30.000 ms)'
    """
    chosen, times = strategy["chosen"], strategy["step_times"]
    others = [f"{name} {seconds(t)}" for name, t in sorted(times.items()) if name != chosen]
    others += [f"{name} impossible: {why}" for name, why in sorted(strategy["refused"].items())]
    others += [f"{name} with the {key} {seconds(t)}" for key in ("tables cut", "tables whole")
               for name, t in sorted(strategy.get(key, {}).items())]
    return (f"Strategy {chosen}: the least predicted step ({seconds(times[chosen])}"
            + "".join(f"; {text}" for text in others) + ")")


def plan_table(plan):
    """A rich Table: one row per device with the plan's predicted figures."""
    ops = {}
    for device in plan.assignment.values():
        ops[device] = ops.get(device, 0) + 1
    pipelined = bool(plan.stages) and not plan.replicas
    stage_of_device = {plan.assignment[op]: stage for op, stage in (plan.stages or {}).items()}
    table = Table(title="Placement per device (predicted)")
    columns = ["device", "kind", "ops", "busy", "peak memory", "of memory"]
    if pipelined:
        columns.insert(2, "stage")
    for column in columns:
        table.add_column(column, justify="left" if column in ("device", "kind") else "right")
    for name, figures in plan.predicted.devices.items():
        memory = figures.peak_memory_bytes
        count = figures.ops if plan.replicas else ops.get(name, 0)  # replicas' copies
        row = [name, figures.kind, str(count), seconds(figures.busy_s),
               byte_text(memory), f"{100 * memory / figures.memory_bytes:.1f}%"]
        if pipelined:
            row.insert(2, str(stage_of_device.get(name, "-")))
        table.add_row(*row)
    return table


def print_plan(result, default_cluster):
    plan = result.plan
    if default_cluster:
        console.print(f"No --cluster given: using the shipped default {result.cluster.source}")
    console.print(f"Model {plan.context['model']} (signature {plan.context['signature']}, "
                  f"batch size {plan.context['batch_size']}): {len(result.graph)} ops on "
                  f"cluster '{result.cluster.name}' ({len(result.cluster)} devices)")
    console.print(plan_table(plan))
    unread = plan.context.get("unread_variables") or {}
    if unread.get("count"):
        console.print(f"{unread['count']} variables the signature never reads "
                      f"({byte_text(unread['bytes'])}) stay on the host {unread['device']}, "
                      "outside every device's memory")
    fused = plan.context.get("fusion_groups") or []
    if fused:
        console.print(f"{sum(map(len, fused))} ops in {len(fused)} fused kernels "
                      f"({fusion_kinds(fused, result.graph)}) are each placed as one unit")
    gap = plan.gap
    if plan.context.get("samples_mixed_by"):
        op, why = plan.context["samples_mixed_by"][0]
        console.print(f"Op {op} mixes the samples of a batch ({why}): the stages run whole "
                      "batches (no micro-batches)")
    kept = plan.context.get("kept") or {}
    if kept.get("signatures") or kept.get("endpoints"):
        console.print("Kept from the original: " + "; ".join(
            f"{what} {', '.join(kept[what])}" for what in ("signatures", "endpoints")
            if kept.get(what)) + f" ({kept['runs']})")
    compiled = "; ".join(f"{what} {', '.join(kept[key])}" for what, key in (
        ("signatures", "compiled_signatures"), ("endpoints", "compiled_endpoints"))
        if kept.get(key))
    if compiled:
        console.print(f"Running the compiled signature too: {compiled} (the same signature, "
                      f"or a function {plan.context['signature']} only wraps)")
    for name, why in sorted((kept.get("without_xla") or {}).items()):
        console.print(f"Kept without XLA: {name} ({why})")
    strategy = plan.context.get("strategy")
    if strategy:
        console.print(strategy_line(strategy))
    for line in strategy_lines(plan):
        console.print(line)
    if plan.predicted.transfers is not None:
        console.print(transfers_line(plan.predicted,
                                     len({device.host for device in result.cluster.devices})))
    if plan.figures:
        from costmodel.figures_basis import figures_line  # costmodel takes a second to import

        console.print(figures_line(plan.figures), markup=False)
    console.print(f"Predicted step time {seconds(plan.step_time)}; lower bound "
                  f"{seconds(plan.lower_bound)}" + (f" (gap {100 * gap:.1f}%)" if gap is not None else ""))
    console.print("Time: " + ", ".join(f"{k} {v:.2f} s" for k, v in result.timings.items()))
    console.print(f"Wrote {result.out} (with plan.json and report.html)")


def fusion_kinds(groups, graph, most=3):
    """The kinds of the fused kernels ``groups`` (lists of op names of ``graph``), the
    most common first, as their op types joined by "+".

    >>> from tfpart.core.graph import OpGraph
    >>> graph = OpGraph()
    >>> for name, op_type in [("m", "MatMul"), ("b", "BiasAdd"), ("c", "Conv2D"),
    ...                       ("d", "BiasAdd"), ("e", "Conv2D"), ("f", "BiasAdd")]:
    ...     graph.add_op(name, op_type=op_type)
    >>> fusion_kinds([["m", "b"], ["c", "d"], ["e", "f"]], graph)
    'Conv2D+BiasAdd ×2, MatMul+BiasAdd'
    """
    from collections import Counter

    kinds = Counter("+".join(graph.ops[op]["op_type"] for op in group if op in graph.ops)
                    for group in groups)
    shown = [f"{kind} ×{n}" if n > 1 else kind for kind, n in kinds.most_common(most)]
    return ", ".join(shown) + (", ..." if len(kinds) > most else "")


def print_verify(report):
    table = Table(title="Ops TensorFlow placed per device (run metadata)")
    table.add_column("device")
    table.add_column("ops", justify="right")
    inverse = {v: k for k, v in report.device_map.items()}
    for device, count in sorted(report.ops_per_device.items()):
        label = device if inverse.get(device, device) == device else \
            f"{inverse[device]} -> {device}"
        table.add_row(label, str(count))
    console.print(table)
    sizes = ", ".join(str(size) for size, _, _ in report.batches)
    console.print(f"Outputs {'equal' if report.outputs_equal else 'DIFFER'} "
                  + (f"at batch sizes {sizes} " if sizes else "")
                  + f"(max abs difference {report.max_abs_diff:.3g}); "
                  f"{report.ops_checked} ops checked against the plan, "
                  f"{len(report.op_mismatches)} on another device; "
                  f"{len(report.variable_mismatches)} variables misplaced")
    if report.other_signatures:
        same = sorted(name for name, status in report.other_signatures.items()
                      if status == "equal")
        console.print(f"Other signatures: {len(same)} of {len(report.other_signatures)} "
                      "give the original's outputs on the same inputs "
                      f"({', '.join(same) or 'none'})")
    if report.moved_constants:
        console.print(f"{len(report.moved_constants)} constants ran beside what Grappler "
                      "folded them into, not where planned (they hold no work)")
    for op, planned, actual in report.op_mismatches[:5]:
        console.print(f"  {op}: planned {planned}, ran on {actual}")


@contextmanager
def progress_display():
    with console.status("starting") as status:
        yield lambda message: status.update(message + " ...")


def efficiency_text(value):
    """A fitted fraction, or a KernelEfficiency's JSON, in a few characters."""
    from tfpart.core.device_kinds import KernelEfficiency

    if isinstance(value, (int, float)):
        return f"{value:.2f}"
    value = KernelEfficiency.parse(value)
    compute = "/".join(f"{p} {c:.2f}" for p, c in sorted(value.compute.items()))
    launch = f", launch {seconds(value.launch_s)}" if value.launch_s else ""
    return f"(compute {compute}, memory {value.memory:.2f}{launch})"


def run_line(run, batch):
    """The simulated step in one line, with a pipeline's figures if it runs several
    micro-batches."""
    if not run.microbatch_ends:
        return f"Predicted step time {seconds(run.step_time)}"
    return (f"Predicted batch time {seconds(run.step_time)} "
            f"({batch / run.step_time:.1f} samples/s) over {len(run.microbatch_ends)} "
            f"micro-batches; first result after {seconds(run.first_result)}; one "
            f"micro-batch every {seconds(run.interval)}; bubble "
            f"{100 * run.bubble_fraction:.0f}%")
