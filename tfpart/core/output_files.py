"""Output files: one rule for every file a command writes (``cluster detect -o``,
``cluster probe -o``, ``simulate --gantt``, ``calibrate -o``, ``profile -o``,
``checkpoint -o``, ``compile --draw``, the cluster file a launch writes).

- An absent path is created.
- An existing path is replaced only when tfpart wrote it and nobody changed it since
  (its mark, below), or, with ``--force``, when it is the same kind of file (a cluster
  file for a cluster file, a PNG picture for a PNG picture). Anything else, a symbolic
  link, a folder, a FIFO or a device, is refused in one line, and the file is untouched.
- The file is written atomically: a temporary file beside it, renamed over it, so a
  reader (or a crash) sees the old file or the new, never half of either. Where the path
  was absent, the rename refuses to replace a file another process created meanwhile.

The mark. A JSON file tfpart writes carries a top-level ``"written_by"`` object naming
tfpart, the command, and the SHA-256 of the rest of its content (canonical JSON): a file
edited by hand since no longer matches, and is the user's again. A picture carries its
format's text metadata naming tfpart (:data:`PICTURE_MARK`): a PNG ``tEXt`` chunk, a
comment or (matplotlib's) metadata in an SVG, a comment in a DOT file, the ``Creator``
of a PDF matplotlib draws or a comment at the end of one Graphviz draws
(:func:`with_picture_mark`); pictures are not checked for edits. A picture's format
is the one its suffix names (:func:`picture_kind`).

Examples
--------
>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> notes = folder / "notes.json"
>>> _ = notes.write_text('{"devices": "my notes"}')
>>> check_output_file(notes, CLUSTER_FILE)
Traceback (most recent call last):
...
tfpart.core.errors.OutputError: ...notes.json: exists and tfpart did not write it: give --force to replace it, or another path
>>> written = write_json_output(folder / "c.json", {"devices": []}, CLUSTER_FILE,
...                             command="cluster detect")
>>> check_output_file(written, CLUSTER_FILE) is None  # tfpart wrote it: replaceable
True
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tfpart.core.errors import OutputError, TfpartError
from tfpart.core.input_files import json_text, parse_json
from tfpart.core.output_folders import write_file_atomically

MARK_KEY = "written_by"
PICTURE_MARK = b"written by tfpart"
SNIFF_BYTES = 64 * 2**10  # where a picture's mark and magic number are looked for
# a JSON output is read whole to check its mark and kind: up to the largest tfpart
# reads (a profile of a million measured ops, costmodel.measured.MAX_PROFILE_BYTES)
MAX_CHECKED_BYTES = 256 * 2**20


@dataclass(frozen=True)
class FileKind:
    """A kind of file a command writes.

    Attributes
    ----------
    name : str
        What the messages call it ("cluster file").
    same_kind : callable
        ``bytes -> bool``: whether a file's content is of this kind (it is the file's
        first :data:`SNIFF_BYTES` for pictures, the whole file for JSON kinds).
    ours : callable
        ``bytes -> bool``: whether tfpart wrote that content, unchanged since.
    whole : bool
        Whether ``same_kind`` and ``ours`` need the whole file (JSON) or its head.
    """

    name: str
    same_kind: Callable[[bytes], bool]
    ours: Callable[[bytes], bool]
    whole: bool = True


# JSON files --------------------------------------------------------------------------

def _json_object(data):
    try:
        value = parse_json(data)
    except TfpartError:
        return None
    return value if isinstance(value, dict) else None


def _digest(value, path="", error=OutputError):
    content = {key: item for key, item in value.items() if key != MARK_KEY}
    canonical = json_text(content, path, error, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def marked(value, command, path="", error=OutputError):
    """``value`` (a JSON object) with tfpart's mark for ``command``; ``error`` naming
    ``path`` and the first field that is not a finite number, if one is not.

    >>> marked({"devices": []}, "cluster detect")[MARK_KEY]["command"]
    'cluster detect'
    >>> marked({"step": float("nan")}, "profile", "p.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: p.json: step is nan, not a finite number
    """
    return {**{key: item for key, item in value.items() if key != MARK_KEY},
            MARK_KEY: {"tool": "tfpart", "command": command,
                       "sha256": _digest(value, path, error)}}


def written_by_tfpart(value):
    """Whether the JSON object ``value`` carries tfpart's mark and the content it marks.

    >>> value = marked({"devices": [1]}, "cluster detect")
    >>> written_by_tfpart(value), written_by_tfpart({**value, "devices": [2]})
    (True, False)
    """
    mark = value.get(MARK_KEY) if isinstance(value, dict) else None
    return (isinstance(mark, dict) and mark.get("tool") == "tfpart"
            and mark.get("sha256") == _digest(value))


def json_kind(name, *keys):
    """The kind of the JSON files that are objects holding every one of ``keys``.

    >>> json_kind("profile", "device_kind", "ops").same_kind(b'{"device_kind": 1, "ops": []}')
    True
    """
    def same_kind(data):
        value = _json_object(data)
        return value is not None and all(key in value for key in keys)

    def ours(data):
        value = _json_object(data)
        return same_kind(data) and written_by_tfpart(value)
    return FileKind(name, same_kind, ours)


CLUSTER_FILE = json_kind("cluster file", "devices")
PROFILE = json_kind("profile", "device_kind", "ops")
KINDS_FILE = json_kind("kinds file", "kinds")


# Pictures ----------------------------------------------------------------------------

def _picture_kind(name, magic, inside=b"", any_case=False):
    """The kind of the pictures whose content starts with one of ``magic`` (after
    blanks) and holds ``inside`` in its head."""
    def same_kind(head):
        head = head.lower() if any_case else head
        return any(head.lstrip().startswith(m) for m in magic) and inside in head

    def ours(head):
        return same_kind(head) and PICTURE_MARK in head
    return FileKind(name, same_kind, ours, whole=False)


DOT_GRAPH = _picture_kind("DOT graph", (b"//", b"/*", b"digraph", b"graph", b"strict"),
                          inside=b"graph", any_case=True)
PICTURES = {
    ".png": _picture_kind("PNG picture", (b"\x89PNG\r\n\x1a\n",)),
    ".svg": _picture_kind("SVG picture", (b"<?xml", b"<svg", b"<!--"), inside=b"<svg"),
    ".pdf": _picture_kind("PDF document", (b"%PDF-",)),
    ".dot": DOT_GRAPH,
    ".gv": DOT_GRAPH,
}


def picture_kind(path, formats=PICTURES):
    """The kind of picture ``path``'s suffix names; OutputError naming the formats that
    can be written when it names none.

    >>> picture_kind("schedule.png").name
    'PNG picture'
    >>> picture_kind("x.json", {".png": PICTURES[".png"]})
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: x.json: cannot draw a picture in the format of its suffix ('.json'): give a file ending in .png
    """
    kind = formats.get(Path(path).suffix.lower())
    if kind is None:
        *others, last = formats
        raise OutputError(path, "cannot draw a picture in the format of its suffix "
                          f"({Path(path).suffix or 'none'!r}): give a file ending in "
                          + (f"{', '.join(others)} or {last}" if others else last))
    return kind


def with_picture_mark(data, suffix, command):
    """The picture ``data`` (bytes in the format of ``suffix``) with tfpart's mark for
    ``command`` in its format's own place for text: a ``tEXt`` chunk after a PNG's
    header, a comment after an SVG's XML declaration or atop a DOT graph, and a PDF
    comment at the end, after which the PDF's last ``startxref`` is repeated so that
    it still ends as a PDF must (nothing before it moves: its offsets stay right).

    >>> header = b"\\x89PNG\\r\\n\\x1a\\n" + (13).to_bytes(4, "big") + b"IHDR" + bytes(17)
    >>> png = with_picture_mark(header, ".png", "compile --draw")
    >>> PICTURES[".png"].ours(png), png[37:41]  # the chunk after the header's
    (True, b'tEXt')
    >>> with_picture_mark(b"<svg/>", ".svg", "compile --draw")
    b'<!-- written by tfpart compile draw -->\\n<svg/>'
    >>> with_picture_mark(b"digraph {}", ".dot", "compile --draw")
    b'// written by tfpart compile --draw\\ndigraph {}'
    """
    note = PICTURE_MARK + b" " + command.encode()
    suffix = suffix.lower()
    if suffix == ".png":
        header_end = 8 + 12 + int.from_bytes(data[8:12], "big")  # after IHDR
        text = b"Software\x00" + note
        chunk = (len(text).to_bytes(4, "big") + b"tEXt" + text
                 + zlib.crc32(b"tEXt" + text).to_bytes(4, "big"))
        return data[:header_end] + chunk + data[header_end:]
    if suffix == ".svg":  # an XML comment may not hold "--" ("compile --draw")
        comment = b"<!-- " + note.replace(b"--", b"") + b" -->\n"
        start = len(data) - len(data.lstrip())
        if data[start:].startswith(b"<?xml"):
            start = data.index(b"?>", start) + 2
            comment = b"\n" + comment.rstrip(b"\n")
        return data[:start] + comment + data[start:]
    if suffix == ".pdf":
        found = re.findall(rb"startxref\s+(\d+)", data[-SNIFF_BYTES:])
        ending = b"startxref\n" + found[-1] + b"\n%%EOF\n" if found else b""
        return data.rstrip(b"\r\n") + b"\n% " + note + b"\n" + ending
    return b"// " + note + b"\n" + data


# The rule ----------------------------------------------------------------------------

def _content(path, kind):
    """What ``kind`` needs of the regular file ``path`` (None if it is too large to be
    of a kind tfpart writes)."""
    size = os.stat(path).st_size
    if kind.whole and size > MAX_CHECKED_BYTES:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        head = file.read(MAX_CHECKED_BYTES if kind.whole else SNIFF_BYTES)
        if kind.whole:
            return head
        file.seek(max(size - SNIFF_BYTES, len(head)))  # a PDF's Creator is at its end
        return head + file.read(SNIFF_BYTES)


def replace_problem(path, kind, force=False, force_flag="--force"):
    """Why ``path`` may not be written as a file of ``kind`` (None: it may);
    ``force_flag`` is the option that gives ``force``, named in the answer (None where
    the command has none).

    >>> replace_problem("/dev/null", CLUSTER_FILE, force=True)
    'exists and is not a regular file: choose another path'
    """
    if os.path.islink(path):
        return "is a symbolic link: give the file it points to, or another path"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if stat.S_ISDIR(mode):
        return "is a folder: give a file's path"
    if not stat.S_ISREG(mode):
        return "exists and is not a regular file: choose another path"
    try:
        content = _content(path, kind)
    except OSError as exc:
        return f"exists and cannot be read: {exc.strerror}"
    if content is not None and kind.ours(content):
        return None
    if content is None or not kind.same_kind(content):
        return (f"exists and is not a {kind.name}: tfpart replaces only a {kind.name} "
                "(remove it yourself or choose another path)")
    if force:
        return None
    if force_flag is None:
        return "exists and tfpart did not write it: remove it yourself or choose another path"
    return (f"exists and tfpart did not write it: give {force_flag} to replace it, or "
            "another path")


def check_output_file(path, kind, force=False, force_flag="--force"):
    """OutputError unless ``path`` may be written as a file of ``kind``
    (:func:`replace_problem`)."""
    problem = replace_problem(path, kind, force, force_flag)
    if problem:
        raise OutputError(path, problem)


def write_output_file(path, content, kind, force=False, force_flag="--force"):
    """Write ``content`` (bytes or str) to ``path`` atomically
    (:func:`~tfpart.core.output_folders.write_file_atomically`), once the rule allows
    it, and again at the rename, should another process have created the file
    meanwhile. Returns ``path``."""
    check_output_file(path, kind, force, force_flag)
    return write_file_atomically(path, content, may_replace=lambda: check_output_file(
        path, kind, force, force_flag))


def write_json_output(path, value, kind, command, force=False, force_flag="--force",
                      error=OutputError, **dumps):
    """Write the JSON object ``value`` to ``path`` with tfpart's mark for ``command``
    (:func:`write_output_file`); only finite numbers (``error`` naming the first field
    that is not). Returns ``path``."""
    text = json_text(marked(value, command, path, error), path, error, **dumps)
    return write_output_file(path, text, kind, force, force_flag)
