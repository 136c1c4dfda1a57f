"""``tfpart worker --memory-stats``: a task's CPU allocator figures, read by
``LocalWorkers.memory`` and ``reset_memory``, see the tensors it computes for a remote
client, and only its own."""
import subprocess
import sys
from pathlib import Path

import pytest

from tfpart.local_workers import LocalWorkers

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]

ROOT = Path(__file__).resolve().parents[2]
TENSOR_BYTES = 64 * 2**20
# A client that makes a 64 MiB float32 tensor on task 1 (random: nothing to fold into a
# constant) and fetches only its sum, then lets go of everything.
CLIENT = """
import json, sys
import tensorflow as tf
cluster = json.load(open(sys.argv[1]))["cluster"]
tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster))

@tf.function
def total():
    with tf.device("/job:worker/task:1/device:CPU:0"):
        return tf.reduce_sum(tf.random.uniform([%d], seed=1))

print(float(total()))
""" % (TENSOR_BYTES // 4)


def test_a_workers_peak_rises_by_the_tensor_it_computes(tmp_path):
    with LocalWorkers(2, tmp_path, pin=False, memory_stats=True) as workers:
        idle, busy = (f"/job:worker/task:{k}/device:CPU:0" for k in range(2))
        before = workers.reset_memory()
        assert before[busy]["peak"] == before[busy]["current"]  # reset to what it holds
        done = subprocess.run([sys.executable, "-c", CLIENT, str(workers.path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        after = workers.memory()
        rise = after[busy]["peak"] - before[busy]["current"]
        # at least the tensor (measured: the tensor and 512 bytes), not the process's
        # whole footprint
        assert TENSOR_BYTES <= rise < 2 * TENSOR_BYTES, rise
        assert after[busy]["current"] - before[busy]["current"] < 2**20  # freed again
        assert after[idle]["peak"] - before[idle]["current"] < 2**20  # its own tensors only
        assert after[busy]["start"] == before[busy]["start"]  # right after its start
        again = workers.reset_memory()
        assert again[busy]["peak"] == again[busy]["current"] < TENSOR_BYTES
        assert workers.processes[1].poll() is None  # the signals did not stop it


def test_memory_figures_need_the_option(tmp_path):
    with LocalWorkers(1, tmp_path, pin=False) as workers:
        with pytest.raises(RuntimeError, match="memory_stats=True"):
            workers.memory()


def test_the_allocation_log_shows_the_tensor_and_where_the_window_opens(tmp_path):
    with LocalWorkers(2, tmp_path, pin=False, allocation_log=True) as workers:
        idle, busy = (f"/job:worker/task:{k}/device:CPU:0" for k in range(2))
        mark = workers.log_lines()
        done = subprocess.run([sys.executable, "-c", CLIENT, str(workers.path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        peaks = workers.tensor_peaks(mark)
        # the tensor at its own size, give or take the step's scalars; the allocator's
        # chunk for it at least as big
        assert TENSOR_BYTES <= peaks[busy]["requested"] < TENSOR_BYTES + 2**20, peaks
        assert peaks[busy]["allocated"] >= peaks[busy]["requested"]
        assert peaks[idle]["requested"] < 2**20
        after = workers.log_lines()
        assert workers.tensor_peaks(after)[busy]["requested"] < 2**20  # freed by then
