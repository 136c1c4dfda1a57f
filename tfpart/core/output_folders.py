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
(``RENAME_EXCHANGE``), which is removed only afterwards.

A temporary folder of a process that died without cleaning up (``SIGKILL``) is
removed by the next run that writes beside it, and only such a folder: its creator
keeps an ``flock`` on the file :data:`LOCK_FILE` inside it for as long as it lives
(the kernel, or the network file system's lock manager, drops it when the process
dies), and a run removes a temporary only once it holds that lock itself. A process
id would not do: the folder may be shared by containers with their own process ids,
or by other hosts, where another compile's id names nothing, or some other process
(:func:`remove_dead_temporaries`).

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
import fcntl
import glob
import json
import os
import re
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from tfpart.core.errors import OutputError

MARKER = ".tfpart-output"
TEMPORARY_TAG = ".tfpart-tmp-"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
# tfpart's temporaries are hidden: ".<output>[.<purpose>].tfpart-tmp-<pid>-<random>"
_TEMPORARY = re.compile(r"^\..+" + re.escape(TEMPORARY_TAG) + r"(\d+)-")
LOCK_FILE = ".tfpart-lock"  # in a temporary folder: its creator holds an flock on it
# A temporary without a lock file is left alone this long after it last changed: one
# being made has none for an instant (between mkdtemp and its lock file).
TEMPORARY_GRACE_S = 60.0
_held_locks = {}  # temporary folder (str) -> descriptor of its lock file, kept open


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
    """A fresh temporary folder beside ``out`` for the caller to fill, locked by this
    process (:func:`locked_temporary_folder`) until :func:`move_into_place` or
    :func:`removed_on_failure` ends it, after checking that ``out`` may be written
    (and removing dead writers' temporaries there)."""
    out = Path(out)
    check_replaceable(out, command, force)
    parent = out.absolute().parent
    with os_errors(out, "create"):
        parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temporaries(parent)
        return locked_temporary_folder(parent, f".{out.name}{TEMPORARY_TAG}{os.getpid()}-")


@contextmanager
def temporary_folder(out, purpose="work"):
    """Context manager: the path (a str) of a temporary folder beside ``out``, locked
    by this process and removed when the block ends; a later run removes it if this
    process is killed first.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with temporary_folder(root / "out", "rewrite") as work:
    ...     [p.name for p in pathlib.Path(work).iterdir()]
    ['.tfpart-lock']
    >>> list(root.iterdir())
    []
    """
    parent = Path(out).absolute().parent
    with os_errors(out, "create"):
        parent.mkdir(parents=True, exist_ok=True)
        folder = locked_temporary_folder(
            parent, f".{Path(out).name}.{purpose}{TEMPORARY_TAG}{os.getpid()}-")
    try:
        yield str(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        release_temporary(folder)


def locked_temporary_folder(parent, prefix):
    """A new folder in ``parent`` named ``prefix`` and random characters
    (``tempfile.mkdtemp``), holding :data:`LOCK_FILE`, on which this process keeps an
    exclusive ``flock`` until :func:`release_temporary` (or its death).

    The lock file is made under another name and renamed once locked, so no other
    process ever finds it unlocked while its creator lives. On a file system without
    locks the folder has no lock file (see :func:`remove_dead_temporaries`).

    >>> import tempfile, pathlib
    >>> folder = locked_temporary_folder(tempfile.mkdtemp(), ".out.tfpart-tmp-1-")
    >>> [p.name for p in folder.iterdir()], take_lock(folder / LOCK_FILE)
    (['.tfpart-lock'], None)
    >>> release_temporary(folder); folder.rmdir()
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        descriptor = _new_lock(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if descriptor is not None:
        _held_locks[str(folder)] = descriptor
    return folder


def _new_lock(folder):
    """The descriptor of ``folder``'s new lock file, locked; None where the file
    system has no locks (then no lock file is left)."""
    making = folder / f"{LOCK_FILE}.new"
    descriptor = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(making, folder / LOCK_FILE)
    except OSError as exc:
        os.close(descriptor)
        os.unlink(making)
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise
    return descriptor


def release_temporary(folder, moved_to=None):
    """End this process's lock on the temporary ``folder`` (a no-op if it holds none)
    once it has been removed, or moved to ``moved_to``: its lock file is removed
    first, from wherever it is (only this lock's), so no folder keeps it."""
    descriptor = _held_locks.pop(str(folder), None)
    if descriptor is None:
        return
    for place in (folder, moved_to) if moved_to else (folder,):
        lock = Path(place) / LOCK_FILE
        try:
            if os.path.samestat(os.lstat(lock), os.fstat(descriptor)):
                os.unlink(lock)
        except OSError:
            pass  # not there
    os.close(descriptor)


def remove_dead_temporaries(parent, grace_s=TEMPORARY_GRACE_S):
    """Remove the temporary folders in ``parent`` whose creator no longer runs (killed
    by a signal no process can catch), wherever it ran.

    A temporary with a lock file is dead when this process can take the file's
    ``flock`` (without waiting); it is removed while that lock is held, so no other
    run removes it meanwhile. Its creator holds the lock for as long as it lives, in
    whatever PID namespace or (on a network file system with locks) on whatever
    host. A lock that cannot be tried (unreadable, or a file system without locks)
    counts as held.

    A temporary without a lock file was made by an older tfpart, by a process killed
    while making it, or on a file system without locks, or it is being made: it is left
    alone for ``grace_s`` seconds after it last changed (:data:`TEMPORARY_GRACE_S`),
    and while the process id in its name runs here, the one sign of life such a
    temporary gives. One holding :data:`MARKER` is an old output that a run swapped
    out for its new one (:func:`move_into_place`), left only to be removed: it is
    removed unless that run is still here to remove it.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> mine = locked_temporary_folder(root, ".out.tfpart-tmp-1-")
    >>> dead = locked_temporary_folder(root, ".out.tfpart-tmp-1-")
    >>> release_temporary(dead); (dead / LOCK_FILE).touch()  # as if its creator died
    >>> remove_dead_temporaries(root)
    >>> [p == mine for p in root.iterdir()]
    [True]
    """
    for item in Path(parent).iterdir():
        match = _TEMPORARY.search(item.name)
        if not match or item.is_symlink() or not item.is_dir():
            continue
        lock = take_lock(item / LOCK_FILE)
        if lock == NO_LOCK_FILE:
            swapped_out = (item / MARKER).is_file()
            if (swapped_out or not changed_within(item, grace_s)) \
                    and not _alive(int(match.group(1))):
                shutil.rmtree(item, ignore_errors=True)
        elif lock is not None:
            try:
                shutil.rmtree(item, ignore_errors=True)
            finally:
                os.close(lock)


NO_LOCK_FILE = -1


def take_lock(path):
    """A descriptor of the lock file ``path`` with its ``flock`` taken by this process;
    None if another process holds it, or it cannot be tried (not readable, not a
    regular file, no locks on this file system); :data:`NO_LOCK_FILE` if there is
    no such file."""
    descriptor = None
    for mode in (os.O_RDWR, os.O_RDONLY):  # read-only: another user's, on a local disk
        try:
            descriptor = os.open(path, mode | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            return NO_LOCK_FILE
        except PermissionError:
            continue
        except OSError:  # a symbolic link, say: not a lock tfpart made
            return None
    if descriptor is None:
        return None
    try:
        if stat.S_ISREG(os.fstat(descriptor).st_mode):
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
    except OSError:  # held (EWOULDBLOCK), or no locks here
        pass
    os.close(descriptor)
    return None


def changed_within(path, seconds):
    """Whether ``path`` changed (its inode: entries added or removed, renamed) less than
    ``seconds`` ago, or cannot be read."""
    try:
        return time.time() - os.lstat(path).st_ctime < seconds
    except OSError:
        return True


def _alive(pid):
    """Whether a process ``pid`` runs in this PID namespace (which says nothing of
    other namespaces or hosts: only for temporaries without a lock file).

    >>> _alive(os.getpid()), _alive(2**40)
    (True, False)
    """
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # an id past pid_max names no process
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
                # now the old output, which a run in another PID namespace may be
                # removing too (remove_dead_temporaries)
                shutil.rmtree(staging, ignore_errors=True)
        release_temporary(staging, moved_to=out)  # locked until moved: never found dead
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        release_temporary(staging, moved_to=out)
        raise


def rename_exclusively(source, target):
    """Rename ``source`` to ``target`` unless ``target`` exists (then False), in one
    step where the system allows (Linux's ``renameat2(RENAME_NOREPLACE)``)."""
    return _rename(source, target, _RENAME_NOREPLACE)


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
        release_temporary(folder)
        raise


def write_file_atomically(path, content, may_replace=None):
    """Write ``content`` (str or bytes) to ``path`` through a temporary file beside it,
    renamed over it, so a reader (or a crash) never sees half a file; OS errors are
    one-line OutputErrors. A file it replaces keeps its permissions (a new one gets
    the umask's). With ``may_replace``, a ``path`` is taken only where none exists at
    the rename, or after ``may_replace()`` returned (it raises to refuse).

    The temporary holds an ``flock`` for as long as its writer lives, so that the
    next writer beside it removes it only once its writer is dead (as for
    temporary folders, :func:`remove_dead_temporaries`), wherever the writer ran.
    """
    path = Path(path)
    data = content.encode() if isinstance(content, str) else content
    with os_errors(path):
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temporary_files(path)
        handle = tempfile.NamedTemporaryFile(
            "wb", dir=path.absolute().parent, delete=False,
            prefix=f".{path.name}{TEMPORARY_TAG}{os.getpid()}-")
        try:
            with handle:
                _lock_if_possible(handle.fileno())
                handle.write(data)
                os.fchmod(handle.fileno(), _mode_for(path))  # not mkstemp's 0600
                handle.flush()
                if may_replace is None:
                    os.replace(handle.name, path)
                elif not rename_exclusively(handle.name, path):
                    may_replace()  # created meanwhile
                    os.replace(handle.name, path)
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise
    return path


def remove_dead_temporary_files(path, grace_s=TEMPORARY_GRACE_S):
    """Remove the temporary files beside ``path`` (:func:`write_file_atomically`'s)
    whose writer died before it could (``SIGKILL``): those whose ``flock`` this process
    can take, unchanged for ``grace_s`` seconds (for the instant between a temporary's
    creation and its lock). One whose lock cannot be tried (a file system without
    locks) is kept."""
    path = Path(path)
    prefix = f".{path.name}{TEMPORARY_TAG}"
    for item in path.absolute().parent.glob(glob.escape(prefix) + "*"):
        if item.is_symlink() or not item.is_file():
            continue
        lock = take_lock(item)
        if lock in (None, NO_LOCK_FILE):
            continue
        try:
            if not changed_within(item, grace_s):
                item.unlink(missing_ok=True)
        finally:
            os.close(lock)


def _lock_if_possible(descriptor):
    """Take an exclusive ``flock`` on ``descriptor`` (nothing where the file system has
    no locks)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def _mode_for(path):
    """The permissions of ``path`` where it exists (a file replaced keeps them), else
    those a new file gets here (the umask's)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask():
    """This process's umask, read without changing it (``os.umask`` sets it: another
    thread creating a file meanwhile would get the wrong permissions)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1], 8) for line in status
                        if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o022
