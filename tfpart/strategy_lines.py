"""One line per part of a plan's strategy, as ``tfpart compile`` prints them and the
report quotes them: tables cut into row shards (the compile's cut, whatever the
algorithm), then the line the plan's algorithm gives on what it made (its ``describe``
in :mod:`partitioner.registry`: data-parallel replicas, filter splits, pipeline stages,
or a plug-in's own). A new kind of plan declares its line with its algorithm, and adds
nothing here or to the command line.

The lines of tfpart's own kinds of plan, and the units they are written in, are in
:mod:`tfpart.core.plan_lines` (the registry's algorithms describe with them).

Examples
--------
>>> from tfpart.core.plan import Plan
>>> strategy_lines(Plan(assignment={"x": "A"}, algorithm="greedy"))
[]
>>> strategy_lines(Plan(assignment={}, algorithm="filter_split", splits={}))
['Filter split: no split shortens the predicted step; a placement of whole ops']
"""
from __future__ import annotations

from tfpart.core.plan_lines import byte_text, counted, seconds

# byte_text and seconds: the units of every line, read from here by the commands' output
__all__ = ["strategy_lines", "transfers_line", "row_shards_line", "byte_text", "seconds"]


def strategy_lines(plan):
    """The summary lines of ``plan``'s strategy: its row shards, and what its algorithm
    says of it (:func:`partitioner.registry.describe_plan`; none for a plain op
    placement, or when that algorithm is not installed here)."""
    from partitioner.registry import describe_plan  # the algorithms: slow to import

    lines = [row_shards_line(plan)] if plan.row_shards else []
    described = describe_plan(plan)
    return lines + [described] if described else lines


def transfers_line(predicted, hosts):
    """One line on the tensor copies of a step between devices (``predicted``, a
    :class:`~tfpart.core.plan.Predicted`) on a cluster of ``hosts`` hosts: how many
    cross between hosts where there are several and the plan counted them.

    >>> from tfpart.core.plan import Predicted
    >>> transfers_line(Predicted(1.0, {}, bytes_moved=2450.0, transfers=11), 1)
    '11 tensor copies between devices per step (2.45 KB)'
    >>> transfers_line(Predicted(1.0, {}, bytes_moved=5e6, transfers=1,
    ...                          cross_host_transfers=1), 2)
    '1 tensor copy between devices per step (1 between hosts, 5.00 MB)'
    """
    between_hosts = f"{predicted.cross_host_transfers} between hosts, " \
        if hosts > 1 and predicted.cross_host_transfers is not None else ""
    return (f"{counted(predicted.transfers, 'tensor copy')} between devices per step "
            f"({between_hosts}{byte_text(predicted.bytes_moved)})")


def row_shards_line(plan):
    """One line on a plan's tables cut into row shards: each table's shards' rows and
    devices.

    >>> from tfpart.core.plan import Plan
    >>> row_shards_line(Plan(assignment={}, row_shards={"items": {
    ...     "sizes": [600, 400], "devices": ["A", "B"]}}))
    'Row shards: table items in 2 shards of consecutive rows (A 600 rows, B 400 rows); each lookup gathers every id on its shard and stitches the rows back in order'
    """
    shown = [f"table {table} in {len(s.sizes)} shards of consecutive rows ("
             + ", ".join(f"{d} {n} rows" for d, n in zip(s.devices, s.sizes)) + ")"
             for table, s in sorted(plan.row_shards.items())]
    return (f"Row shards: {'; '.join(shown)}; each lookup gathers every id on its shard and "
            "stitches the rows back in order")
