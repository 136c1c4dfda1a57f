"""Pause Python's cyclic garbage collector around passes that allocate many small
objects while a large graph is alive.

Each generation-2 collection walks every container object in the process, and a
networkx graph of 10,000 ops is hundreds of thousands of them; building the arrays of
such a graph triggers several. Measured on the greedy at 10,000 ops: 0.72 s with the
collector paused against 1.19 s without (``benchmarks/partition_quality.py``,
scaling). The passes make no reference cycles worth collecting before they end.

Examples
--------
>>> import gc
>>> with collector_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""
from __future__ import annotations

import functools
import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """Disable the cyclic collector for the block; re-enable it after if it was on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def long_lived_frozen():
    """For the block, a function that moves every object alive now out of the cyclic
    collector's reach (``gc.freeze``), so that its generation-2 collections walk only
    what was made after (a compile's model, graph and TensorFlow graphs are hundreds
    of thousands of containers, walked again by each full collection: about 0.3 s
    each, some ten times a compile of ResNet50); on leaving, they are handed back
    (``gc.unfreeze``). Reference counting still frees what they drop meanwhile; only a
    frozen cycle waits for the block's end. If objects are frozen already when the block
    starts (the caller manages the collector), the function does nothing.

    >>> import gc
    >>> with long_lived_frozen() as freeze:
    ...     freeze()
    ...     gc.get_freeze_count() > 0
    True
    >>> gc.get_freeze_count()
    0
    """
    owner = gc.get_freeze_count() == 0
    try:
        yield gc.freeze if owner else (lambda: None)
    finally:
        if owner:
            gc.unfreeze()


def with_collector_paused(function):
    """Decorator: run ``function`` inside :func:`collector_paused`."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with collector_paused():
            return function(*args, **kwargs)
    return wrapper
