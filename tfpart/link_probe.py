"""Links measured, not assumed: ``tfpart cluster probe cluster.json`` times tensor copies
between every pair of a running cluster's devices over TensorFlow's own runtime and
fits the alpha-beta model the cost model uses (a copy of ``n`` bytes takes ``latency +
n / bandwidth``), then writes each pair's figures into the cluster file.

A copy from device ``a`` to device ``b`` is timed as a function that reduces a tensor
living on ``a`` on device ``b``, less the same function run on ``a`` (which copies
nothing), over tensors of 1 KiB to 16 MiB; each pair one way, from the device listed
first, since the cost model's links are the same both ways. Bandwidth is the inverse
slope through the three larger sizes; latency what the smallest copy costs beyond its
bytes (a remote call's fixed cost, which a straight-line fit would hide). The whole probe runs
``rounds`` times; a pair gets the median of its rounds, and the file keeps every
round's figures (``measured``), so their spread is on record. A pair's
``message_cost``, the executor time each copy takes beyond its latency (the simulator
charges it at both ends), is what each of 16 small copies sent at once adds to one,
less the same reductions where the tensors are. The cost of launching a step on the
cluster (calling an empty function placed on its first device, less one run here)
becomes the file's ``step_overhead``.

Examples
--------
>>> fitted = fit_link([1024, 2**20, 2**22, 2**24], [60e-6, 0.55e-3, 2.05e-3, 8.05e-3])
>>> round(fitted["bandwidth"] / 1e9, 2), round(fitted["latency_s"] * 1e6, 1)
(2.1, 59.5)
"""
from __future__ import annotations

import itertools
import statistics

import numpy as np

from tfpart.core.phases import timed_calls

SIZES = (256, 262_144, 1_048_576, 4_194_304)  # float32 elements: 1 KiB to 16 MiB
METHOD = ("a reduction on one device of a float32 tensor held on the other, less the "
          "same reduction where the tensor is; 1 KiB to 16 MiB; median of the calls")


def fit_link(sizes, seconds):
    """Latency and bandwidth of copies of ``sizes`` bytes that took ``seconds``."""
    slope = np.polyfit(sizes[1:], seconds[1:], 1)[0]
    bandwidth = float(1 / max(slope, 1e-12))
    return {"latency_s": max(seconds[0] - sizes[0] / bandwidth, 1e-6), "bandwidth": bandwidth}


def median_call(fn, repeats, warmup=3):
    """Median seconds of ``repeats`` calls of ``fn`` after ``warmup``."""
    return statistics.median(timed_calls(fn, repeats, warmup))


def probe_pair(tf, source, target, repeats):
    """Latency and bandwidth of copies from device ``source`` to ``target``."""
    seconds = []
    for elements in SIZES:
        with tf.device(source):
            held = tf.random.uniform([elements])

        def reduced_on(device, held=held):
            @tf.function
            def reduce():
                with tf.device(device):
                    return tf.reduce_max(held)
            return reduce

        across, here = reduced_on(target), reduced_on(source)
        seconds.append(max(median_call(lambda: across().numpy(), repeats) -
                           median_call(lambda: here().numpy(), repeats), 1e-7))
    return fit_link([4 * n for n in SIZES], seconds)


MESSAGES = 16  # small copies sent at once to time what each costs beyond its latency


def message_cost(tf, source, target, repeats):
    """Seconds each copy from ``source`` to ``target`` adds when ``MESSAGES`` small
    copies go at once (their latencies overlap, so this is the work each one costs
    the tasks), less what the same reductions cost on ``source``."""
    with tf.device(source):
        held = [tf.random.uniform([64]) + k for k in range(MESSAGES)]

    def reduced_on(device, count):
        @tf.function
        def reduce():
            with tf.device(device):
                return tf.add_n([tf.reduce_max(tensor) for tensor in held[:count]])
        return lambda: reduce().numpy()

    def added(device):
        return (median_call(reduced_on(device, MESSAGES), repeats) -
                median_call(reduced_on(device, 1), repeats)) / (MESSAGES - 1)
    return max(added(target) - added(source), 0.0)


def launch_cost(tf, device, repeats):
    """Seconds a call of an empty function placed on ``device`` costs beyond one run
    in this process: what launching a step on the cluster adds."""
    @tf.function
    def there():
        with tf.device(device):
            return tf.constant(0.0) + 1.0

    @tf.function
    def here():
        return tf.constant(0.0) + 1.0
    return max(median_call(lambda: there().numpy(), repeats) -
               median_call(lambda: here().numpy(), repeats), 0.0)


def probe_cluster(cluster, rounds=3, repeats=30, progress=None):
    """Every pair of ``cluster``'s devices (this process a client of its tasks),
    probed ``rounds`` times: ``{"pairs": [(a, b, [fitted per round])], "step_overhead":
    [seconds per round]}``."""
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    names = cluster.device_names
    pairs = list(itertools.combinations(names, 2))
    found = {pair: [] for pair in pairs}
    overheads = []
    for round_ in range(rounds):
        for a, b in pairs:
            if progress:
                progress(f"round {round_ + 1} of {rounds}: {a} -> {b}")
            found[(a, b)].append({**probe_pair(tf, a, b, repeats),
                                  "message_cost": message_cost(tf, a, b, repeats)})
        overheads.append(launch_cost(tf, names[0], repeats))
    return {"pairs": [(a, b, found[(a, b)]) for a, b in pairs], "step_overhead": overheads}


def with_probed_links(data, probed, cpu_devices=()):
    """A copy of cluster-file contents ``data`` whose ``links.pairs`` hold the probed
    pairs (the median of their rounds; each round kept under ``measured``), replacing
    earlier entries for the same pairs, and whose ``step_overhead`` is the median
    measured launch cost. A pair of ``cpu_devices`` is a ``cpu_copy`` link (its
    endpoints' cores copy).

    >>> data = {"devices": [], "links": {"pairs": [{"between": ["a", "b"], "bandwidth": 1}]}}
    >>> rounds = [{"latency_s": 1e-4, "bandwidth": 2e9, "message_cost": 3e-5},
    ...           {"latency_s": 2e-4, "bandwidth": 3e9, "message_cost": 4e-5},
    ...           {"latency_s": 3e-4, "bandwidth": 1e9, "message_cost": 2e-5}]
    >>> new = with_probed_links(data, {"pairs": [("a", "b", rounds)],
    ...                                "step_overhead": [1e-3, 2e-3, 3e-3]}, {"a", "b"})
    >>> pair = new["links"]["pairs"][0]
    >>> pair["bandwidth"], pair["latency"], pair["cpu_copy"], new["step_overhead"]
    (2000000000.0, 0.0002, True, 0.002)
    >>> pair["message_cost"]
    3e-05
    >>> len(new["links"]["pairs"]), pair["measured"]["bandwidth"]
    (1, [2000000000.0, 3000000000.0, 1000000000.0])
    """
    probed_pairs = {frozenset((a, b)) for a, b, _ in probed["pairs"]}
    links = dict(data.get("links", {}))
    kept = [pair for pair in links.get("pairs", [])
            if frozenset(pair["between"]) not in probed_pairs]
    for a, b, rounds in probed["pairs"]:
        entry = {"between": [a, b],
                 "bandwidth": float(statistics.median(r["bandwidth"] for r in rounds)),
                 "latency": float(statistics.median(r["latency_s"] for r in rounds)),
                 "measured": {"method": METHOD, "bandwidth": [r["bandwidth"] for r in rounds],
                              "latency": [r["latency_s"] for r in rounds]}}
        if all("message_cost" in r for r in rounds):
            entry["message_cost"] = float(statistics.median(r["message_cost"] for r in rounds))
            entry["measured"]["message_cost"] = [r["message_cost"] for r in rounds]
        if a in cpu_devices and b in cpu_devices:
            entry["cpu_copy"] = True
        kept.append(entry)
    links["pairs"] = kept
    return {**data, "links": links,
            "step_overhead": float(statistics.median(probed["step_overhead"]))}
