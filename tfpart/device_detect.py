"""The devices of this host, as TensorFlow sees them, for a cluster file
(``tfpart cluster detect``, and every task a launcher starts).

A GPU is matched to a kind of ``profiles/device_kinds.json`` by the name TensorFlow
reports for it (``tf.config.experimental.get_device_details``): the kind whose name's
parts are all words of the device's name, the most specific first (``NVIDIA H100
PCIe`` is ``H100-PCIe``; ``NVIDIA L40S`` is not ``L4``). Its memory is the device's
own where ``nvidia-smi`` reports it, else the kind's datasheet figure. A GPU no kind
matches gets a kind of its own, derived from the known kind nearest its compute
capability, which the file says (``source``) and the command prints. The host's CPU
is one device of the ``cpu`` kind holding the machine's memory.

Examples
--------
>>> kinds = ["V100", "T4", "A100-40GB", "A100-80GB", "A100", "H100", "H100-PCIe", "L4",
...          "RTX4090"]
>>> [gpu_kind(name, kinds) for name in ("Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB",
...     "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA L4", "NVIDIA GeForce RTX 4090",
...     "NVIDIA L40S")]
['V100', 'A100-80GB', 'H100', 'H100-PCIe', 'L4', 'RTX4090', None]
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

# The compute capability of the kinds shipped, for a GPU no kind's name matches.
CAPABILITY = {"V100": (7, 0), "T4": (7, 5), "A100-40GB": (8, 0), "L4": (8, 9), "H100": (9, 0)}


def gpu_kind(device_name, kinds):
    """The kind (of the names ``kinds``) whose name's parts are all words of
    ``device_name``, the one with the most parts; None if none."""
    words = re.findall(r"[a-z0-9]+", device_name.lower())
    joined = {a + b for a, b in zip(words, words[1:])}  # "RTX 4090" is RTX4090
    found = [kind for kind in kinds if all(
        part in words or part in joined for part in re.findall(r"[a-z0-9]+", kind.lower()))]
    return max(found, key=lambda kind: (len(re.findall(r"[a-z0-9]+", kind)), kind),
               default=None)


def nearest_kind(capability):
    """The shipped kind nearest a GPU's compute capability ``(major, minor)``.

    >>> nearest_kind((8, 6)), nearest_kind((10, 0))
    ('L4', 'H100')
    """
    return min(CAPABILITY, key=lambda kind: (abs(CAPABILITY[kind][0] - capability[0]),
                                             abs(CAPABILITY[kind][1] - capability[1])))


def host_memory():
    """Bytes of this machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_memories():
    """Each GPU's memory in bytes, as ``nvidia-smi`` reports it; [] without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=30, check=False)
    if done.returncode:
        return []
    return [int(line) * 2**20 for line in done.stdout.split() if line.strip().isdigit()]


def detect_devices(prefix=""):
    """This host's devices as cluster-file entries (names under ``prefix``, e.g.
    ``/job:worker/task:2``), and the ``kinds`` entries made for GPUs no kind matches.

    Returns
    -------
    (list of dict, dict)
    """
    from rewriters.tf_import import tensorflow
    from tfpart.core.device_kinds import load_device_kinds

    tf = tensorflow()
    known = load_device_kinds()
    devices = [{"name": f"{prefix}/device:CPU:0", "kind": "cpu", "memory": host_memory()}]
    made = {}
    memories = gpu_memories()
    for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
        details = tf.config.experimental.get_device_details(gpu)
        name = details.get("device_name", f"GPU {i}")
        kind = gpu_kind(name, list(known))
        entry = {"name": f"{prefix}/device:GPU:{i}", "kind": kind}
        if kind is None:
            kind = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
            base = nearest_kind(details.get("compute_capability") or (8, 0))
            made[kind] = derived_kind(name, known[base], base, details)
            entry["kind"] = kind
        if i < len(memories):
            entry["memory"] = memories[i]
        devices.append(entry)
    return devices, made


def derived_kind(name, base, base_name, details):
    """A kinds-file entry for a GPU no kind matches: ``base``'s figures (a
    :class:`tfpart.core.device_kinds.DeviceKind`), saying so."""
    return {"description": name, "peak_flops": dict(base.peaks) or {"fp32": base.peak_flops},
            "memory_bandwidth": base.memory_bandwidth, "memory": base.memory,
            "host_link_bandwidth": base.host_link_bandwidth,
            "peer_link_bandwidth": base.peer_link_bandwidth,
            "efficiency_from": base_name,
            "source": f"derived by tfpart cluster detect: {name} (compute capability "
                      f"{details.get('compute_capability')}) matches no known kind; the "
                      f"figures of {base_name}, the nearest in compute capability, "
                      "not measured"}
