"""Which devices run their kernels apart from the host, and what issuing an op costs it.

TensorFlow runs a CPU device's kernels on the host's own threads: the executor that
dispatches an op then computes it, so the two are one timeline. An accelerator (a GPU)
has two: the host's executor issues each op, and the device runs the kernels it was
given, in order, while the host goes on issuing (:mod:`costmodel.simulate`). Issuing
costs the host a fixed time per op, a property of the host and of TensorFlow: a
measured profile of the accelerator's kind gives it, else the kind (``op_overhead_s``).

Examples
--------
>>> from tfpart.core.device_kinds import load_device_kinds
>>> kinds = load_device_kinds()
>>> runs_kernels_on_host(kinds["cpu"]), runs_kernels_on_host(kinds["H100"])
(True, False)
>>> host_dispatch(kinds["H100"], {}) == kinds["H100"].op_overhead_s
True
"""
from __future__ import annotations

import numpy as np


def runs_kernels_on_host(kind):
    """Whether devices of ``kind`` run their kernels on the host's threads, as a CPU
    does: a kind without ``multiprocessors``. Every GPU kind of the kinds file has them
    (so do kinds that take a GPU's figures with ``efficiency_from``); a CPU kind, or a
    kind declared without them, is priced on one timeline, dispatch and kernel in turn,
    which never predicts it faster than two would."""
    return kind.multiprocessors is None


def host_dispatch(kind, profiles):
    """Seconds the host takes to issue one op to an accelerator of ``kind``.

    Measured where ``kind``'s own profile says (``profiles``: device kind name -> a
    :class:`~costmodel.measured.MeasuredProfile`, whose ``host_dispatch`` only
    ``tfpart profile`` measures), else the kind's ``op_overhead_s``. A CPU's profile
    is no figure for a GPU: issuing to a CPU device is the executor's cost alone
    (about 1.6 µs an op here), issuing a GPU kernel adds the launch through its driver.

    >>> from types import SimpleNamespace
    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> kinds = load_device_kinds()
    >>> measured = SimpleNamespace(host_dispatch=7e-6)
    >>> host_dispatch(kinds["T4"], {"T4": measured})
    7e-06
    >>> host_dispatch(kinds["T4"], {"cpu": measured}) == kinds["T4"].op_overhead_s
    True
    """
    own = profiles.get(kind.name)
    if own is not None and own.host_dispatch is not None:
        return own.host_dispatch
    return kind.op_overhead_s


def device_lanes(devices, profiles):
    """Per device: whether it is an accelerator (two timelines), and the host's
    dispatch per op on it (:func:`host_dispatch`; 0 on CPU devices, whose op times hold
    their executor's cost).

    >>> from tfpart.core.cluster import cluster_of_devices
    >>> accelerator, dispatch = device_lanes(cluster_of_devices(["cpu", "H100"]).devices, {})
    >>> accelerator.tolist(), bool(dispatch[0] == 0 < dispatch[1])
    ([False, True], True)
    """
    per_kind = {}  # a cluster of many devices has few kinds
    for device in devices:
        if id(device.kind) not in per_kind:
            accelerator = not runs_kernels_on_host(device.kind)
            per_kind[id(device.kind)] = (accelerator, host_dispatch(device.kind, profiles)
                                         if accelerator else 0.0)
    lanes = [per_kind[id(device.kind)] for device in devices]
    return (np.array([accelerator for accelerator, _ in lanes], dtype=np.bool_),
            np.array([dispatch for _, dispatch in lanes], dtype=float))
