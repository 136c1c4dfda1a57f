"""Variables over parameter-server tasks in proportion to their size.

Each variable goes whole to one server. Largest first, each to the server whose bytes
would be the smallest share of its capacity after taking it (longest processing time
first, Graham 1969): every server then holds about its proportional share of the bytes,
and no server holds more than its share plus the largest variable. A server's state for
a variable (its velocity, mean square and the workers' copies of it) lives beside it,
so the share of updates each server applies follows the same bytes.

Examples
--------
>>> shard_by_size({"kernel": 400, "bias": 10, "head": 300, "head_bias": 5},
...               ["/job:ps/task:0", "/job:ps/task:1"])
{'kernel': '/job:ps/task:0', 'head': '/job:ps/task:1', 'bias': '/job:ps/task:1', 'head_bias': '/job:ps/task:1'}
"""
from __future__ import annotations


def shard_by_size(sizes, servers, capacities=None):
    """Which server holds each variable.

    Parameters
    ----------
    sizes : dict
        Variable name -> bytes.
    servers : sequence of str
        Device names of the parameter-server tasks.
    capacities : sequence of float, optional
        Relative capacity of each server (default: all equal).

    Returns
    -------
    dict
        Variable name -> server, in order of decreasing size (ties by name).
    """
    if not servers:
        raise ValueError("no parameter-server task to hold the variables")
    capacities = list(capacities or [1.0] * len(servers))
    if len(capacities) != len(servers) or min(capacities) <= 0:
        raise ValueError(f"need one positive capacity per server, got {capacities}")
    held = [0.0] * len(servers)
    placement = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        best = min(range(len(servers)),
                   key=lambda k: ((held[k] + sizes[name]) / capacities[k], k))
        held[best] += sizes[name]
        placement[name] = servers[best]
    return placement
