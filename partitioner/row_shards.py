"""Which tables are cut into row shards, and how many rows each shard holds.

A table (a variable read only by rows: embeddings, lookup tables) that is larger than
the memory any one device has for it cannot be placed whole; cut along its first axis
into consecutive rows (:mod:`tfpart.core.row_shards`) it can. Each device then takes a
share of the rows in proportion to the memory it has (largest remainder,
:mod:`partitioner.shares`), so every shard fits where there is room for it and the
devices keep the same fraction of their memory for the rest of the model. Memory, not
speed, sets the shares: a lookup reads a few rows per id, so its time barely depends on
how many rows a shard holds, while the shard's size decides where it fits. The
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


__all__ = ["row_shard_sizes"]
