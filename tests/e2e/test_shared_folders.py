"""Temporaries in a folder that processes of several PID namespaces share (containers
on one machine, or hosts on one network file system): a run removes only the
temporaries whose creator died, decided by the lock the creator holds, never by a
process id, which means nothing in another namespace or names some other process.

Each holder is a real process that makes its temporary as a compile does
(:func:`tfpart.core.output_folders.new_staging_folder`) and then waits; a dead one is
killed with SIGKILL, which no process can catch. No TensorFlow."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfpart.core.output_folders import (LOCK_FILE, MARKER, TEMPORARY_TAG, move_into_place,
                                        new_staging_folder, release_temporary,
                                        remove_dead_temporaries, temporary_folder)

ROOT = Path(__file__).resolve().parents[2]
# makes a temporary beside argv[1] as a compile does, says where, and holds it until
# its stdin closes (or it is killed)
HOLD = ("import os, sys; from tfpart.core.output_folders import new_staging_folder; "
        "print(os.getpid(), new_staging_folder(sys.argv[1], force=False), flush=True); "
        "sys.stdin.read()")
# another compile starting beside it: making its own temporary removes the dead ones
START = ("import os, sys; from tfpart.core.output_folders import new_staging_folder; "
         "print(os.getpid(), new_staging_folder(sys.argv[1], force=False), flush=True)")


def _pid_namespace_command():
    """The command prefix that runs a program as process 1 of a new PID namespace with
    its own /proc (as root, or through an unprivileged user namespace), or None."""
    for prefix in (["unshare", "--pid", "--fork", "--mount-proc"],
                   ["unshare", "--user", "--map-root-user", "--pid", "--fork",
                    "--mount-proc"]):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return None


NAMESPACE = _pid_namespace_command()
needs_namespaces = pytest.mark.skipif(
    NAMESPACE is None, reason="no PID namespace can be made here: unshare needs root, "
    "or unprivileged user namespaces, which this machine does not allow")


def start(script, out, namespace=None):
    """Run ``script`` beside ``out`` (in a new PID namespace if ``namespace``); the
    process, the process id it sees, and the temporary it made."""
    process = subprocess.Popen([*(namespace or ()), sys.executable, "-c", script, str(out)],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    line = process.stdout.readline().split(maxsplit=1)
    assert len(line) == 2, f"the process made no temporary (exit code {process.poll()})"
    pid, folder = int(line[0]), Path(line[1].strip())
    assert folder.is_dir() and TEMPORARY_TAG in folder.name
    return process, pid, folder


def kill(process, namespace=None):
    """SIGKILL the holder ``process`` started (the namespace's process 1, if it runs in
    one: ``unshare`` itself only waits for it)."""
    os.kill(child_of(process.pid) if namespace else process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def child_of(pid):
    """The process whose parent is ``pid`` (as this namespace numbers it)."""
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(status.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if parent == pid:
            return int(status.parent.name)
    raise AssertionError(f"process {pid} has no child")


def stop(process):
    process.stdin.close()
    process.wait(timeout=30)


@needs_namespaces
def test_a_compile_in_another_pid_namespace_keeps_a_live_temporary(tmp_path):
    """The issue: a compile in a container removed the temporary of a live compile on
    the host, since the host's process id named no process in the container."""
    out = tmp_path / "out"
    live, _, kept = start(HOLD, out)
    dead, _, left = start(HOLD, out)
    kill(dead)
    try:
        other = subprocess.run([*NAMESPACE, sys.executable, "-c", START, str(out)], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert other.returncode == 0, other.stderr
        assert other.stdout.split()[0] == "1"  # it ran in a namespace of its own
        assert kept.is_dir() and (kept / LOCK_FILE).is_file()  # the live one's work
        assert not left.exists()  # the dead one's
    finally:
        stop(live)
    assert live.returncode == 0


@needs_namespaces
def test_temporaries_of_processes_in_other_namespaces_with_colliding_ids(tmp_path):
    """Holders that are each process 1 of their own namespace: the id in their
    temporaries' names is the host's init here, alive for ever, yet the killed one's
    temporary is removed, and the live one's kept."""
    out = tmp_path / "out"
    live, live_pid, kept = start(HOLD, out, NAMESPACE)
    dead, dead_pid, left = start(HOLD, out, NAMESPACE)
    assert live_pid == dead_pid == 1
    kill(dead, NAMESPACE)
    try:
        remove_dead_temporaries(tmp_path)
        assert kept.is_dir() and not left.exists()
    finally:
        stop(live)


def test_a_temporary_is_removed_once_its_creator_is_killed(tmp_path):
    out = tmp_path / "out"
    live, _, kept = start(HOLD, out)
    dead, _, left = start(HOLD, out)
    try:
        remove_dead_temporaries(tmp_path)
        assert kept.is_dir() and left.is_dir()  # both alive
        kill(dead)
        remove_dead_temporaries(tmp_path)
        assert kept.is_dir() and not left.exists()
    finally:
        stop(live)


def test_this_processes_own_temporaries_are_alive(tmp_path):
    """flock locks of two open files conflict within one process too: a process's
    cleanup (two compiles in threads, say) never removes its own live temporaries, and
    nothing of the lock moves into the output."""
    staging = new_staging_folder(tmp_path / "out", force=False)
    with temporary_folder(tmp_path / "out", "rewrite") as work:
        remove_dead_temporaries(tmp_path)
        assert Path(work).is_dir() and staging.is_dir()
        (staging / "saved_model.pb").write_bytes(b"")
    assert not Path(work).exists()
    move_into_place(staging, tmp_path / "out", "compile")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".tfpart-output", "saved_model.pb"]
    assert list(tmp_path.iterdir()) == [tmp_path / "out"]
    again = new_staging_folder(tmp_path / "out", force=True)
    move_into_place(again, tmp_path / "out", "compile", force=True)  # swapped in
    assert [p.name for p in (tmp_path / "out").iterdir()] == [".tfpart-output"]
    assert list(tmp_path.iterdir()) == [tmp_path / "out"]


@pytest.fixture
def dead_pid():
    """The id of a process that has ended."""
    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_temporaries_without_a_lock_file(tmp_path, dead_pid):
    """Made by an older tfpart, or being made: left alone while recent, and while the
    process id in the name runs here; else removed. An old output swapped out by a
    run that was killed before it removed it is removed at once."""
    running = tmp_path / f".out{TEMPORARY_TAG}{os.getpid()}-running"
    old = tmp_path / f".out{TEMPORARY_TAG}{dead_pid}-old"
    past_pid_max = tmp_path / f".out{TEMPORARY_TAG}{2**64}-old"
    swapped_out = tmp_path / f".out{TEMPORARY_TAG}{dead_pid}-swapped"
    being_removed = tmp_path / f".out{TEMPORARY_TAG}{os.getpid()}-swapped"
    for folder in (running, old, past_pid_max, swapped_out, being_removed):
        folder.mkdir()
    for folder in (swapped_out, being_removed):
        (folder / MARKER).write_text("{}")
    remove_dead_temporaries(tmp_path)
    assert not swapped_out.exists() and being_removed.is_dir()
    assert all(folder.is_dir() for folder in (running, old, past_pid_max))
    time.sleep(1.0)
    recent = tmp_path / f".out{TEMPORARY_TAG}{dead_pid}-recent"
    recent.mkdir()
    remove_dead_temporaries(tmp_path, grace_s=0.5)
    assert recent.is_dir() and running.is_dir()
    assert not old.exists() and not past_pid_max.exists()


def test_a_folder_named_like_a_temporary_but_not_hidden_is_the_users(tmp_path, dead_pid):
    """Only tfpart's own names, hidden (".<output>…"), are temporaries: a user's folder
    that merely holds the tag is never removed, however old."""
    mine = tmp_path / f"mybackup{TEMPORARY_TAG}{dead_pid}-keep"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    remove_dead_temporaries(tmp_path, grace_s=0)
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_lock_file_that_is_a_link_is_not_taken(tmp_path, dead_pid):
    """A lock file tfpart did not make (a symbolic link) keeps the temporary: the
    cleanup removes only what it understands."""
    folder = tmp_path / f".out{TEMPORARY_TAG}{dead_pid}-x"
    folder.mkdir()
    (tmp_path / "elsewhere").write_text("")
    (folder / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    remove_dead_temporaries(tmp_path, grace_s=0)
    assert folder.is_dir()


def test_releasing_a_temporary_removes_its_lock_file_first(tmp_path):
    staging = new_staging_folder(tmp_path / "out", force=False)
    assert (staging / LOCK_FILE).is_file()
    release_temporary(staging)
    assert not (staging / LOCK_FILE).exists()
    release_temporary(staging)  # a second time: nothing held
