"""Variables over parameter-server tasks in proportion to their size.

A variable of at least twice ``min_shard_bytes`` is cut along its first axis into
``min(servers, rows, bytes // min_shard_bytes)`` pieces of about equal rows, as
TensorFlow's ``MinSizePartitioner`` cuts a ``ShardedVariable``; smaller ones stay
whole. The pieces then go largest first, each to the server whose bytes would be the
smallest share of its capacity after taking it (longest processing time first, Graham
1969), never two pieces of one variable to the same server: every server then holds
about its proportional share of the bytes, and no server holds more than its share
plus the largest piece. A server's state for a piece (its velocity, mean square and the
workers' copies of it) lives beside it, so the share of updates each server applies
follows the same bytes.

Examples
--------
>>> shard_variables({"kernel": 400, "bias": 10, "head": 300},
...                 ["/job:ps/task:0", "/job:ps/task:1"], rows={"kernel": 4}, min_shard_bytes=150)
{'kernel': [Shard(server='/job:ps/task:1', rows=2), Shard(server='/job:ps/task:0', rows=2)], \
'head': [Shard(server='/job:ps/task:0', rows=None)], 'bias': [Shard(server='/job:ps/task:1', rows=None)]}
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from partitioner.shares import proportional_shares

MIN_SHARD_BYTES = 256 * 1024  # TensorFlow's MinSizePartitioner default


class Shard(NamedTuple):
    """One piece of a variable: its server and how many of its first-axis rows it
    holds (None: the variable is whole)."""
    server: str
    rows: Optional[int]


def piece_rows(size, rows, servers, min_shard_bytes=MIN_SHARD_BYTES):
    """Rows of each piece a variable of ``size`` bytes and ``rows`` first-axis rows
    is cut into (``[None]``: it stays whole).

    >>> piece_rows(1000, 5, 2, min_shard_bytes=300)
    [3, 2]
    >>> piece_rows(1000, 5, 2, min_shard_bytes=600)
    [None]
    """
    count = min(servers, rows or 0, int(size // min_shard_bytes)) if min_shard_bytes > 0 \
        else min(servers, rows or 0)
    return proportional_shares(rows, [1.0] * count) if count >= 2 else [None]


def shard_variables(sizes, servers, capacities=None, rows=None,
                    min_shard_bytes=MIN_SHARD_BYTES):
    """Which server holds each variable, or each piece of it.

    Parameters
    ----------
    sizes : dict
        Variable name -> bytes.
    servers : sequence of str
        Device names of the parameter-server tasks.
    capacities : sequence of float, optional
        Relative capacity of each server (default: all equal).
    rows : dict, optional
        Variable name -> length of its first axis; a variable not named (or of one
        row) is never cut.
    min_shard_bytes : int
        The smallest piece a variable is cut into (0: cut every named variable over
        every server).

    Returns
    -------
    dict
        Variable name -> its :class:`Shard` pieces in the order of their rows, names in
        order of decreasing size (ties by name).
    """
    if not servers:
        raise ValueError("no parameter-server task to hold the variables")
    capacities = list(capacities or [1.0] * len(servers))
    if len(capacities) != len(servers) or min(capacities) <= 0:
        raise ValueError(f"need one positive capacity per server, got {capacities}")
    rows = rows or {}
    pieces = []  # (bytes, name, index, rows)
    for name, size in sizes.items():
        cut = piece_rows(size, rows.get(name), len(servers), min_shard_bytes)
        pieces += [(size * (r / rows[name]) if r else size, name, k, r)
                   for k, r in enumerate(cut)]
    held = [0.0] * len(servers)
    placed = {name: {} for name in sorted(sizes, key=lambda n: (-sizes[n], n))}
    for size, name, index, count in sorted(pieces, key=lambda p: (-p[0], p[1], p[2])):
        taken = {shard.server for shard in placed[name].values()}
        best = min((k for k in range(len(servers)) if servers[k] not in taken),
                   key=lambda k: ((held[k] + size) / capacities[k], k))
        held[best] += size
        placed[name][index] = Shard(servers[best], count)
    return {name: [by_index[k] for k in sorted(by_index)] for name, by_index in placed.items()}
