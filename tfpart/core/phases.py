"""The seconds each phase of a compile takes (read, analyse, cost, partition, rewrite,
write, verify, picture, report), shown in the CLI's ``Time:`` line and the report, and
the seconds of repeated calls (:func:`timed_calls`).

>>> timings = {}
>>> with timed(timings, "read"):
...     pass
>>> list(timings), timings["read"] >= 0.0
(['read'], True)
>>> with timed(None, "read"):  # nobody asked: nothing recorded
...     pass
"""
import time
from contextlib import contextmanager


@contextmanager
def timed(timings, phase):
    """Add the seconds the block takes to ``timings[phase]`` (nothing if ``timings`` is
    None), also when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if timings is not None:
            timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start


def timed_calls(fn, repeats, warmup=0):
    """Seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed ones.

    >>> len(timed_calls(lambda: None, 3, warmup=1))
    3
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times
