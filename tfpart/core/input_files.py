"""Reading input files within bounds, and writing JSON that is JSON.

Every file a user hands tfpart (cluster.json, a kinds file, a measured profile, a
plan.json) is read here. Before any byte is read the path must name a regular file
(a FIFO would block the read for ever, ``/dev/zero`` would never end) of at most
``max_bytes``; the text is then parsed as strict JSON: nested at most
:data:`MAX_JSON_DEPTH` levels, no number longer than :data:`MAX_NUMBER_CHARS`
characters, and no ``NaN`` or ``Infinity`` (which Python's ``json`` accepts and
writes by default, but JSON does not have). Each problem is one
:class:`~tfpart.core.errors.TfpartError` (of the class the caller names) naming the file.

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "c.json")
>>> _ = open(path, "w").write('{"memory": NaN}')
>>> read_json(path)
Traceback (most recent call last):
...
tfpart.core.errors.TfpartError: ...c.json: NaN is not a JSON number (numbers must be finite)
>>> _ = open(path, "w").write('{"a": [1, 2.5, "x"]}')
>>> read_json(path)
{'a': [1, 2.5, 'x']}
"""
from __future__ import annotations

import json
import math
import os
import stat

import numpy as np

from tfpart.core.errors import TfpartError

MAX_JSON_BYTES = 64 * 2**20  # a cluster of 10,000 devices is about 1 MB
MAX_JSON_DEPTH = 64  # tfpart's own files nest at most about 8 levels
MAX_NUMBER_CHARS = 40  # an int64 has 19 digits; a float's repr at most 24 characters

_NESTING = np.zeros(256, dtype=np.int8)  # byte -> how it changes the depth
_NESTING[[ord("["), ord("{")]], _NESTING[[ord("]"), ord("}")]] = 1, -1
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
          stat.S_IFDIR: "a directory"}


def check_regular_file(path, error=TfpartError, max_bytes=MAX_JSON_BYTES):
    """The size of ``path`` if it is a regular file of at most ``max_bytes`` (symbolic
    links followed); else ``error`` naming it. Nothing is opened, so a FIFO cannot
    block.

    >>> check_regular_file("/dev/null")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: /dev/null: not a regular file (a character device)
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(path, "no such file") from None
    except OSError as exc:
        raise error(path, f"cannot read: {exc.strerror}") from None
    return _checked_size(path, info, error, max_bytes)


def _checked_size(path, info, error, max_bytes):
    if not stat.S_ISREG(info.st_mode):
        raise error(path, _not_regular(info.st_mode))
    if info.st_size > max_bytes:
        raise error(path, f"{info.st_size / 2**20:.1f} MiB, more than the "
                    f"{max_bytes / 2**20:.0f} MiB an input file may have")
    return info.st_size


def check_tree(path, error=TfpartError):
    """Raise ``error`` naming the first entry below the folder ``path`` that is neither
    a folder nor a regular file (symbolic links followed): a FIFO among a SavedModel's
    variables would block TensorFlow's reader for ever.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(folder, "variables.index"))
    >>> check_tree(folder)
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: ...variables.index: not a regular file (a FIFO)
    """
    for root, folders, files in os.walk(path):
        for name in files + folders:
            entry = os.path.join(root, name)
            try:
                mode = os.stat(entry).st_mode
            except OSError as exc:
                raise error(entry, f"cannot read: {exc.strerror}") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise error(entry, _not_regular(mode))


def _not_regular(mode):
    return f"not a regular file ({_KINDS.get(stat.S_IFMT(mode), 'not a file')})"


def read_bounded(path, error=TfpartError, max_bytes=MAX_JSON_BYTES):
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them (checked
    on the open file too, so a file swapped or grown after the check is refused)."""
    check_regular_file(path, error, max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise error(path, f"cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        _checked_size(path, os.fstat(file.fileno()), error, max_bytes)
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        _checked_size(path, os.stat(path), error, max_bytes)  # it grew: says so
    return data


def json_depth(data):
    """How deeply arrays and objects nest in the JSON text ``data`` (bytes), counted
    without parsing it (strings' brackets ignored).

    >>> json_depth(b'{"a": [[1], "]]]"]}'), json_depth(b'3')
    (3, 0)
    """
    # Backslashes occur only in strings: without escaped pairs and escaped quotes,
    # every quote left opens or closes a string.
    codes = np.frombuffer(data.replace(b"\\\\", b"").replace(b'\\"', b""), dtype=np.uint8)
    in_string = np.bitwise_xor.accumulate((codes == ord('"')).view(np.uint8))
    steps = np.where(in_string, 0, _NESTING[codes])
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def parse_json(data, path="", error=TfpartError, max_depth=MAX_JSON_DEPTH, what="valid JSON"):
    """Strict JSON from ``data`` (bytes or str): bounded depth and numbers, no NaN
    or Infinity; ``error`` names ``path`` and the problem (text that does not parse
    is "not ``what``").

    >>> parse_json("1" * 50)
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: an integer of 50 digits: at most 40 characters per number
    >>> parse_json("[1e999]")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: 1e999 is too large for a number (numbers must be finite)
    """
    raw = data.encode() if isinstance(data, str) else data
    depth = json_depth(raw)
    if depth > max_depth:
        raise error(path, f"nested {depth} levels deep, more than the {max_depth} "
                    "allowed")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(path, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int,
                          parse_float=_bounded_float)
    except _NumberError as exc:
        raise error(path, str(exc)) from None
    except json.JSONDecodeError as exc:
        raise error(path, f"not {what}: {exc.msg} at line {exc.lineno} "
                    f"column {exc.colno}") from None


def read_json(path, error=TfpartError, max_bytes=MAX_JSON_BYTES, max_depth=MAX_JSON_DEPTH,
              what="valid JSON"):
    """:func:`parse_json` of the file ``path`` (:func:`read_bounded`)."""
    return parse_json(read_bounded(path, error, max_bytes), path, error, max_depth, what)


class _NumberError(ValueError):
    pass


def _refuse_constant(name):
    raise _NumberError(f"{name} is not a JSON number (numbers must be finite)")


def _bounded_int(text):
    if len(text) > MAX_NUMBER_CHARS:
        raise _NumberError(f"an integer of {len(text.lstrip('-'))} digits: at most "
                           f"{MAX_NUMBER_CHARS} characters per number")
    return int(text)


def _bounded_float(text):
    if len(text) > MAX_NUMBER_CHARS:
        raise _NumberError(f"a number of {len(text)} characters: at most "
                           f"{MAX_NUMBER_CHARS} per number")
    value = float(text)
    if not math.isfinite(value):
        raise _NumberError(f"{text} is too large for a number (numbers must be finite)")
    return value


def json_text(data, path="", error=TfpartError, **dumps):
    """``json.dumps(data, **dumps)`` with only finite numbers; ``error`` names the
    first field holding NaN or an infinity (writing one would make a file no JSON
    reader accepts).

    >>> json_text({"step": 1.5})
    '{"step": 1.5}'
    >>> json_text({"devices": {"a": {"busy_s": float("nan")}}}, "plan.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: plan.json: devices.a.busy_s is nan, not a finite number
    """
    try:
        return json.dumps(data, allow_nan=False, **dumps)
    except ValueError:
        where, value = _first_non_finite(data)
        raise error(path, f"{where} is {value}, not a finite number") from None


def _first_non_finite(data, where=""):
    stack = [(where, data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "(top level)", value
        items = value.items() if isinstance(value, dict) else \
            enumerate(value) if isinstance(value, (list, tuple)) else ()
        stack.extend(reversed([(f"{where}.{k}" if where else str(k), v) for k, v in items]))
    return "(somewhere)", "not finite"
