"""Row shards: a table (a variable read by rows) cut along its first axis into pieces
held on several devices.

A plan's ``row_shards`` maps a table's variable op to a :class:`tfpart.core.plan.RowShards`:
shard ``i`` holds ``sizes[i]`` consecutive rows, from row ``sum(sizes[:i])`` on ("div"
partitioning, as TensorFlow's ``embedding_lookup(..., partition_strategy="div")`` and
a ``ShardedVariable`` cut them). Consecutive rows, not ``id mod shards``, because the
shares are uneven (in proportion to each device's memory), and a contiguous range is a
slice of the original checkpoint's tensor, which moves to and from the shards as it is.

Each lookup of the table's rows becomes a partitioned lookup that routes every id to
its shard, gathers it there and stitches the rows back in the order of the ids. This
module is the vocabulary the partitioner, the cost model and the rewriter
(:mod:`rewriters.row_shard`) share: the names of the shards and of the lookup's ops.

Examples
--------
>>> shard_name("variables/9/item_table/embeddings", 2)
'variables/9/item_table/embeddings/tfpart_shard2'
>>> shard_of("variables/9/item_table/embeddings/tfpart_shard2")
('variables/9/item_table/embeddings', 2)
>>> lookup_scope("model/item_table/GatherV2")
'model/item_table/GatherV2/tfpart_rows'
>>> first_rows([50, 30, 20])
[0, 50, 80]
"""
from __future__ import annotations

import re

SHARD = "tfpart_shard"
SCOPE = "tfpart_rows"
_SHARD = re.compile(rf"^(.*)/{SHARD}(\d+)$")


def shard_name(table, i):
    """The variable op holding shard ``i`` of ``table``."""
    return f"{table}/{SHARD}{i}"


def shard_of(name):
    """``(table, i)`` if ``name`` is shard ``i`` of a table's variable, else None."""
    found = _SHARD.match(name)
    return (found.group(1), int(found.group(2))) if found else None


def lookup_scope(reader):
    """The scope of the ops of the partitioned lookup that replaces ``reader``."""
    return f"{reader}/{SCOPE}"


def first_rows(sizes):
    """The first row of each shard of ``sizes`` rows."""
    starts, row = [], 0
    for size in sizes:
        starts.append(row)
        row += int(size)
    return starts
