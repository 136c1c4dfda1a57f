"""Which tables are cut into row shards, and how many rows each shard holds.

A table (a variable read only by rows: embeddings, lookup tables) that is larger than
the memory any one device has for it cannot be placed whole; cut along its first axis
into consecutive rows (:mod:`tfpart.core.row_shards`) it can. Each device then takes a
share of the rows in proportion to the memory it has (largest remainder,
:mod:`partitioner.shares`), so every shard fits where there is room for it and the
devices keep the same fraction of their memory for the rest of the model. Memory, not
speed, sets the shares: a lookup reads a few rows per id, so its time barely depends on
how many rows a shard holds, while the shard's size decides where it fits. A table
whose update works on every row (a dense optimizer update), cut because that is faster,
is shared by speed instead, within each device's memory (:func:`speed_shares`). The
partitioner then places the shards, and the lookups beside them, like any other op.

Examples
--------
A 512 MB table of 2M rows over three devices with 270 MB free each: three shards of a
third of the rows; a 40 MB table stays whole.

>>> row_shard_sizes({"items": (512e6, 2_000_000), "users": (40e6, 100_000)}, [270e6] * 3)
{'items': [666667, 666667, 666666]}
"""
from __future__ import annotations

from partitioner.shares import proportional_shares


def row_shard_sizes(tables, memories):
    """The rows of each shard of every table that fits no device whole.

    Parameters
    ----------
    tables : dict
        Table name -> ``(bytes, rows)`` (rows: the length of its first axis).
    memories : sequence of float
        The bytes each device has for the plan.

    Returns
    -------
    dict
        Table name -> the rows of each shard, in order (at least two; devices whose
        share rounds to nothing hold none), for the tables larger than the roomiest
        device; the others are not named.
    """
    roomiest = max(memories, default=0.0)
    room = [max(float(memory), 0.0) for memory in memories]
    cut = {}
    for name, (nbytes, rows) in sorted(tables.items()):
        if nbytes <= roomiest or rows < 2 or not any(room):
            continue
        sizes = [size for size in proportional_shares(int(rows), room) if size > 0]
        if len(sizes) >= 2:
            cut[name] = sizes
    return cut


def speed_shares(rows, speeds, row_bytes, memories):
    """The rows of each shard of a table whose work grows with its rows, in proportion
    to each device's ``speeds`` at that work, no shard holding more rows than its
    device has memory for (``row_bytes`` each, the slots' included): a device at its
    limit keeps it, and the others share the rest by speed again.

    Returns
    -------
    list of int or None
        The rows of each shard, in device order, devices with none left out; ``None``
        if the rows do not fit the devices, or fit in fewer than two shards.

    Examples
    --------
    >>> speed_shares(90, [2.0, 1.0], 1.0, [100, 100])  # twice as fast: twice the rows
    [60, 30]
    >>> speed_shares(90, [2.0, 1.0], 1.0, [50, 100])  # ... but room for 50 rows only
    [50, 40]
    >>> speed_shares(90, [1.0, 1.0], 1.0, [40, 40]) is None
    True
    """
    limit = [int(max(memory, 0.0) // row_bytes) if row_bytes > 0 else int(rows)
             for memory in memories]
    shares = [0] * len(limit)
    active = [d for d in range(len(limit)) if speeds[d] > 0 and limit[d] > 0]
    left = int(rows)
    while left and active:
        trial = proportional_shares(left, [speeds[d] for d in active])
        over = [d for d, share in zip(active, trial) if share > limit[d]]
        if not over:
            for d, share in zip(active, trial):
                shares[d] = share
            left = 0
            break
        for d in over:
            shares[d] = limit[d]
            left -= limit[d]
        active = [d for d in active if d not in over]
    sizes = [share for share in shares if share > 0]
    return sizes if not left and len(sizes) >= 2 else None


__all__ = ["row_shard_sizes", "speed_shares"]
