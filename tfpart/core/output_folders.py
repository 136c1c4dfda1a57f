"""Output folders: tfpart deletes only what tfpart wrote, and a reader sees the old
output or the new one, never half of either.

Every folder a command writes (``compile -o``, ``train -o``) holds a marker file,
:data:`MARKER`, naming the command. An existing folder is replaced only when the
user asked for it (``--force``) and the folder carries the marker (or is empty);
anything else is refused in one line, so a mistyped ``-o`` never removes a user's data.

A new output is assembled in a temporary folder beside the target, whose name carries
:data:`TEMPORARY_TAG` and the writer's process id, then moved in with one ``rename``:
exclusively when the target does not exist (two runs cannot both win: Linux's
``renameat2(RENAME_NOREPLACE)``), or by an atomic swap with the old folder
(``RENAME_EXCHANGE``), which is removed only afterwards. A temporary folder of a
process that died without cleaning up (``SIGKILL``) is recognised by its name and
removed by the next run that writes beside it.

No input may be the output, lie inside it, or hold it (:func:`check_inputs_outside`).

Examples
--------
>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> staging = new_staging_folder(root / "out", force=False)
>>> _ = (staging / "result.txt").write_text("new")
>>> move_into_place(staging, root / "out", "compile")
>>> sorted(p.name for p in (root / "out").iterdir())
['.tfpart-output', 'result.txt']
>>> replaceable_reason(root / "out", "compile") is None
True
>>> (root / "mine").mkdir(); _ = (root / "mine" / "thesis.tex").write_text("x")
>>> replaceable_reason(root / "mine", "compile")
'exists and was not written by tfpart (it has no .tfpart-output): remove it yourself or choose another -o'
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tfpart.core.errors import OutputError

MARKER = ".tfpart-output"
TEMPORARY_TAG = ".tfpart-tmp-"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_TEMPORARY = re.compile(re.escape(TEMPORARY_TAG) + r"(\d+)-")


def check_inputs_outside(out, inputs):
    """Raise OutputError if an input file or folder is ``out``, lies inside it, or is
    a folder holding it (writing there would modify that input).

    >>> check_inputs_outside("/tmp/a/out", ["/tmp/a/cluster.json"])  # beside: fine
    >>> check_inputs_outside("/tmp/a", ["/tmp/a/cluster.json"])
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: /tmp/a: holds the input /tmp/a/cluster.json; writing there would replace it
    """
    target = _real(out)
    for given in inputs:
        if given is None:
            continue
        source = _real(given)
        if source == target or target in source.parents:
            raise OutputError(out, f"holds the input {given}; writing there would replace it")
        if source.is_dir() and source in target.parents:
            raise OutputError(out, f"lies inside the input {given}; writing there would "
                              "modify it")


def _real(path):
    return Path(os.path.realpath(os.path.abspath(path)))


def is_tfpart_output(path, command=None):
    """Whether ``path`` is a folder with tfpart's marker (written by ``command``, if
    given)."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return False
    if command is None:
        return True
    try:
        return json.loads(marker.read_text()).get("command") == command
    except (OSError, ValueError, AttributeError):
        return False


def write_marker(folder, command):
    """Mark ``folder`` as written by tfpart's ``command``."""
    (Path(folder) / MARKER).write_text(json.dumps({"tool": "tfpart", "command": command}))


def replaceable_reason(out, command, force=True):
    """Why the existing ``out`` may not be replaced by ``command`` (None: it may, or it
    does not exist)."""
    out = Path(out)
    if out.is_symlink():
        return "is a symbolic link; give the folder it points to, or another -o"
    if not out.exists():
        return None
    if not out.is_dir():
        return "exists and is not a folder"
    if not force:
        return "already exists (use --force to replace it)"
    if is_tfpart_output(out) or not any(out.iterdir()):
        return None
    return (f"exists and was not written by tfpart (it has no {MARKER}): remove it "
            "yourself or choose another -o")


def check_replaceable(out, command, force):
    """OutputError unless ``out`` is absent or may be replaced (see
    :func:`replaceable_reason`)."""
    reason = replaceable_reason(out, command, force)
    if reason:
        raise OutputError(out, reason)


# what a library's error says when the file system refused a write
_FILE_SYSTEM_PROBLEMS = ("No space left on device", "Read-only file system",
                         "Permission denied", "Disk quota exceeded", "File too large")


@contextmanager
def os_errors(path, doing="write", also=()):
    """Turn an OSError (read-only or full file system, permissions, a name too long)
    into a one-line OutputError naming ``path``; so too an error of the types ``also``
    (TensorFlow's, say) whose message says the file system refused a write.

    >>> with os_errors("out/"):
    ...     raise OSError(28, "No space left on device")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: out/: cannot write it: No space left on device
    """
    try:
        yield
    except OSError as exc:
        raise OutputError(path, f"cannot {doing} it: {exc.strerror or exc}") from None
    except also as exc:
        problem = next((p for p in _FILE_SYSTEM_PROBLEMS if p in str(exc)), None)
        if problem is None:
            raise
        raise OutputError(path, f"cannot {doing} it: {problem}") from None


def check_free_space(out, needed_bytes):
    """OutputError if the file system of ``out``'s folder has less than
    ``needed_bytes`` free (checked before the work, so a full disk is found at once)."""
    parent = Path(out).absolute().parent
    while not parent.exists():
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    if free < needed_bytes:
        raise OutputError(out, f"needs about {needed_bytes / 1e6:.1f} MB free but its file "
                          f"system has {free / 1e6:.1f} MB")


def folder_bytes(folder):
    """Bytes of the files under ``folder``."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def new_staging_folder(out, force, command="compile"):
    """A fresh temporary folder beside ``out`` for the caller to fill, after checking
    that ``out`` may be written (and removing dead writers' temporaries there)."""
    out = Path(out)
    check_replaceable(out, command, force)
    parent = out.absolute().parent
    with os_errors(out, "create"):
        parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temporaries(parent)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}{TEMPORARY_TAG}{os.getpid()}-",
                                     dir=parent))


def temporary_folder(out, purpose="work"):
    """Context manager: a temporary folder beside ``out``, recognised and removed by a
    later run if this process is killed before it can remove it."""
    parent = Path(out).absolute().parent
    with os_errors(out, "create"):
        parent.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(
        prefix=f".{Path(out).name}.{purpose}{TEMPORARY_TAG}{os.getpid()}-", dir=parent)


def remove_dead_temporaries(parent):
    """Remove the temporary folders in ``parent`` left by tfpart processes that no
    longer run (killed by a signal no process can catch)."""
    for item in Path(parent).iterdir():
        match = _TEMPORARY.search(item.name)
        if match and item.is_dir() and not item.is_symlink() \
                and not _alive(int(match.group(1))):
            shutil.rmtree(item, ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def move_into_place(staging, out, command, force=False):
    """Mark ``staging`` and rename it to ``out`` in one step; if ``out`` exists by now
    it is swapped out atomically (only if still replaceable with ``force``) and then
    removed. ``staging`` is removed on any failure."""
    staging, out = Path(staging), Path(out)
    try:
        write_marker(staging, command)
        with os_errors(out):
            if not _rename(staging, out, _RENAME_NOREPLACE):
                check_replaceable(out, command, force)  # someone may have written it since
                if not _rename(staging, out, _RENAME_EXCHANGE):
                    raise OutputError(out, "was created by another process while this one "
                                      "worked; nothing was replaced")
                shutil.rmtree(staging)  # now the old output
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _rename(source, target, flags):
    """``renameat2(source, target, flags)``; False if ``target`` exists (for
    NOREPLACE) or is missing (for EXCHANGE). Where the call is unavailable (not
    Linux, an old kernel or file system), plain renames do the same but for the
    race between two writers."""
    libc = _libc()
    if libc is not None:
        result = libc.renameat2(-100, os.fsencode(source), -100, os.fsencode(target), flags)
        if result == 0:
            return True
        code = ctypes.get_errno()
        if code in (errno.EEXIST, errno.ENOTEMPTY) and flags == _RENAME_NOREPLACE or \
                code == errno.ENOENT and flags == _RENAME_EXCHANGE:
            return False
        if code not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(code, os.strerror(code), str(target))
    return _rename_without_flags(Path(source), Path(target), flags)


def _rename_without_flags(source, target, flags):
    if flags == _RENAME_NOREPLACE:
        if target.exists() or target.is_symlink():
            return False
        os.rename(source, target)
        return True
    if not target.exists():
        return False
    old = source.with_name(source.name + ".old")
    os.rename(target, old)
    os.rename(source, target)
    os.rename(old, source)
    return True


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                   ctypes.c_char_p, ctypes.c_uint]
        return libc
    except (OSError, AttributeError):
        return None


def create_output_folder(out, command):
    """Create ``out`` (it must not exist: two runs cannot both create it) with the
    marker of ``command``; OutputError if it exists or cannot be created."""
    out = Path(out)
    with os_errors(out, "create"):
        out.absolute().parent.mkdir(parents=True, exist_ok=True)
        try:
            out.mkdir()
        except FileExistsError:
            raise OutputError(out, "already exists") from None
        write_marker(out, command)
    return out


def empty_output_folder(out, command):
    """Remove everything in the tfpart output ``out`` but its marker (refused if it is
    not one of ``command``'s)."""
    out = Path(out)
    if out.is_symlink() or not is_tfpart_output(out, command):
        raise OutputError(out, f"is not an output of tfpart {command} ({MARKER} missing); "
                          "remove it yourself or choose another -o")
    with os_errors(out, "empty"):
        for item in out.iterdir():
            if item.name != MARKER:
                (shutil.rmtree if item.is_dir() and not item.is_symlink() else os.remove)(item)


@contextmanager
def removed_on_failure(folder):
    """Remove ``folder`` if the block raises anything (an error, Ctrl-C, a signal
    turned into an exception)."""
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def write_file_atomically(path, text):
    """Write ``text`` to ``path`` through a temporary file renamed over it, so a reader
    (or a crash) never sees half a file; OS errors are one-line OutputErrors."""
    path = Path(path)
    with os_errors(path):
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile(
            "w", dir=path.absolute().parent, delete=False,
            prefix=f".{path.name}{TEMPORARY_TAG}{os.getpid()}-")
        try:
            with handle:
                handle.write(text)
            os.replace(handle.name, path)
        except BaseException:
            os.unlink(handle.name)
            raise
