"""Corrupt the example model and cluster file at random and run ``tfpart compile
--verify`` on each corruption, in this one process (TensorFlow starts once).

Run as ``python -m tests.fuzz_cli --seed S --cases N --work DIR``; prints one JSON
object: the corruptions tried and, for each run that broke a rule, what happened.
The rules: exit code 0 or 2; on 2, exactly one line on stderr starting
``tfpart: error:`` and no output (nor staging folder) left; never an escaping
exception (a traceback) or a run over ``--timeout`` seconds; inputs unchanged.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shutil
import signal
import sys
from pathlib import Path

import numpy as np

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR

TARGETS = ("saved_model.pb", "variables/variables.index",
           "variables/variables.data-00000-of-00001", "cluster.json")


def corrupt(data, rng):
    """``data`` with one random corruption: bit flips, a zeroed run, or truncation."""
    data = bytearray(data)
    how = rng.choice(["flip", "zero", "truncate"])
    if how == "flip":
        for _ in range(int(rng.integers(1, 9))):
            position = int(rng.integers(len(data)))
            data[position] ^= 1 << int(rng.integers(8))
    elif how == "zero":
        start = int(rng.integers(len(data)))
        data[start:start + int(rng.integers(1, 65))] = bytes(
            len(data[start:start + 64]))
    else:
        data = data[:int(rng.integers(len(data)))]
    return bytes(data), str(how)


def digest(path):
    sha = hashlib.sha256()
    for item in sorted(Path(path).rglob("*")) if Path(path).is_dir() else [Path(path)]:
        if item.is_file():
            sha.update(str(item).encode() + item.read_bytes())
    return sha.hexdigest()


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def run_case(work, case, target, rng, timeout):
    from tfpart.cli import main

    model, cluster = work / f"model{case}", work / f"cluster{case}.json"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    shutil.copy(DEFAULT_CLUSTER_FILE, cluster)
    victim = cluster if target == "cluster.json" else model / target
    data, how = corrupt(victim.read_bytes(), rng)
    victim.write_bytes(data)
    before = (digest(model), digest(cluster))
    out = work / f"out{case}"
    err, problem = io.StringIO(), None
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["compile", str(model), "--cluster", str(cluster), "-o", str(out),
                         "--verify"])
    except Hang:
        code, problem = None, f"no answer within {timeout} s"
    except BaseException as exc:  # noqa: BLE001 - the point is to catch anything
        code, problem = None, f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.alarm(0)
    lines = err.getvalue().strip().splitlines()
    if problem is None and code not in (0, 1, 2):
        problem = f"exit code {code}"
    elif problem is None and code == 2:
        if len(lines) != 1 or not lines[0].startswith("tfpart: error: "):
            problem = f"{len(lines)} lines on stderr: {lines[:3]}"
        elif out.exists() or list(work.glob(f".out{case}*tfpart-tmp-*")):
            problem = "output written on failure"
    if problem is None and (digest(model), digest(cluster)) != before:
        problem = "input modified"
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return {"case": case, "target": target, "how": how, "code": code,
            "message": lines[0][:160] if lines else "", "problem": problem}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--work", required=True)
    parser.add_argument("--timeout", type=int, default=120)
    args = parser.parse_args(argv)
    from tfpart.runtime import ensure_local_cpus

    ensure_local_cpus(3)
    signal.signal(signal.SIGALRM, _alarm)
    rng = np.random.default_rng(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = [run_case(work, case, TARGETS[case % len(TARGETS)], rng, args.timeout)
               for case in range(args.cases)]
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
