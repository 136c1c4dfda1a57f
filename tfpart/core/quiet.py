"""Keep TensorFlow's own logging out of the command line's output.

TensorFlow's C++ core and absl write to the process's file descriptors 1 and 2
directly (the oneDNN notice at import, gRPC teardown, Grappler warnings), whatever
``TF_CPP_MIN_LOG_LEVEL`` says for some of them. :func:`library_output_captured` points
both descriptors at a log file for the life of a ``tfpart`` command while Python's
``sys.stdout`` keeps the terminal: tfpart's tables go there, its one-line errors go to
:func:`user_stderr`, and everything written below Python goes to the log
(``TFPART_TF_LOG=path`` keeps it; by default it is a temporary file). Python-level
writes to ``sys.stderr`` (warnings, absl's Python logger) go to the log too.

Examples
--------
>>> import os, sys
>>> with library_output_captured() as log:
...     _ = os.write(2, b"I0000 a C++ log line\\n")
...     _ = log.seek(0)
...     logged = log.read()
>>> logged
b'I0000 a C++ log line\\n'
>>> user_stderr() is sys.stderr  # restored once the block ends
True
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager

_user_stderr = None  # the terminal's stderr while library output is captured


def user_stderr():
    """Where tfpart's own messages to stderr go (the terminal, even while captured)."""
    return _user_stderr or sys.stderr


def to_library_log(text):
    """Write ``text`` to the library log when output is captured (the full TensorFlow
    error behind a one-line message, say); do nothing otherwise, since an API caller
    gets the exception itself."""
    if _user_stderr is not None:
        print(text, file=sys.stderr, flush=True)


@contextmanager
def library_output_captured(log_path=None):
    """Send file descriptors 1 and 2 to a log while the block runs; see the module
    docstring. Restores everything on exit, so a traceback from a bug is seen."""
    global _user_stderr
    log_path = log_path or os.environ.get("TFPART_TF_LOG")
    log = open(log_path, "ab") if log_path else tempfile.TemporaryFile()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    python_stdout = sys.stdout
    try:
        for fd in (1, 2):
            os.dup2(log.fileno(), fd)
        sys.stdout = os.fdopen(os.dup(saved[1]), "w", buffering=1,
                               encoding=python_stdout.encoding or "utf-8")
        _user_stderr = os.fdopen(os.dup(saved[2]), "w", buffering=1,
                                 encoding=sys.stderr.encoding or "utf-8")
        yield log
    finally:
        for stream in (sys.stdout, _user_stderr, sys.stderr):
            if stream is not None:
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        if sys.stdout is not python_stdout:
            sys.stdout.close()
        sys.stdout = python_stdout
        if _user_stderr is not None:
            _user_stderr.close()
        _user_stderr = None
        log.close()
