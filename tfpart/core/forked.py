"""Pure-Python work run in a forked copy of this process, on another core, while this
process goes on.

A compile plans several strategies, most of them pure Python over the same cost model;
Python's lock keeps them on one core in one process. A forked child shares the parent's
memory (copy on write: nothing is pickled to start it), plans its share and sends back
only its answer, pickled through a pipe. What runs in the child must not use
TensorFlow: TensorFlow does not support being used after a fork (its thread pools are
not copied). The child leaves with ``os._exit``, running none of the parent's exit
handlers, and a child that dies or sends nothing readable is reported to the caller,
which can do the work itself.

Forking is used only where it is safe and can pay: Linux (macOS's frameworks are not
fork-safe; Windows has no fork) and two or more cores for this process.

Examples
--------
>>> work = start_forked(lambda: sum(range(10)))
>>> work.result()
45
>>> start_forked(lambda: 1 / 0).result()
Traceback (most recent call last):
ZeroDivisionError: division by zero
>>> start_forked(lambda: os._exit(3)).result()
Traceback (most recent call last):
tfpart.core.forked.ChildLost: the planning process ended with status 768
"""
from __future__ import annotations

import os
import pickle
import sys


class ChildLost(Exception):
    """The forked child died, or sent back nothing that could be read."""


def fork_can_pay():
    """Whether forking is safe here and another core is free to run the child: Linux,
    and two or more cores this process may run on.

    >>> isinstance(fork_can_pay(), bool)
    True
    """
    return sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) > 1


def start_forked(work):
    """``work()`` begun in a forked child: a :class:`Forked` whose :meth:`~Forked.result`
    gives its answer."""
    import warnings

    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of any fork beside threads:
        warnings.simplefilter("ignore", DeprecationWarning)  # the child runs none of theirs
        pid = os.fork()
    if pid == 0:  # the child: answer, or the exception raised, then leave at once
        os.close(read_end)
        code = 0
        try:
            try:
                answer = (True, work())
            except Exception as exc:  # noqa: BLE001 -- handed to the parent
                answer = (False, exc)
            with os.fdopen(write_end, "wb") as pipe:
                pickle.dump(answer, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:  # noqa: BLE001 -- unpicklable, or interrupted: send nothing
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    return Forked(pid, read_end)


class Forked:
    """A forked child's pending answer."""

    def __init__(self, pid, read_end):
        self._pid, self._read_end = pid, read_end
        self._pending = True

    def result(self):
        """The child's answer (waiting for it), or what it raised, raised here.

        Raises
        ------
        ChildLost
            If the child died or sent nothing readable.
        """
        with os.fdopen(self._read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pending = False
        try:
            ok, answer = pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 -- empty or cut short: the child died
            raise ChildLost(f"the planning process ended with status {status}") from exc
        if not ok:
            raise answer
        return answer

    def cancel(self):
        """End the child without its answer (the parent is interrupted or failed)."""
        import signal

        if not self._pending:
            return
        self._pending = False
        os.kill(self._pid, signal.SIGKILL)
        os.waitpid(self._pid, 0)
        try:
            os.close(self._read_end)
        except OSError:  # closed already by an interrupted result()
            pass
