"""A Gantt chart of a simulated schedule: one row per device, one bar per op (an
accelerator's kernels, and a row of its host issuing them), and the transfers on a row
per link; written under the output rule of
:mod:`tfpart.core.output_files`, in the format its suffix names (PNG, SVG or PDF),
with tfpart's mark in the picture's metadata."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from tfpart.core.ops import op_class
from tfpart.core.output_files import (PICTURE_MARK, PICTURES, check_output_file, picture_kind,
                                      write_output_file)

GANTT_FORMATS = {suffix: PICTURES[suffix] for suffix in (".png", ".svg", ".pdf")}
# the metadata field each format's matplotlib writer keeps as text
MARK_FIELD = {".png": "Software", ".svg": "Creator", ".pdf": "Creator"}

CLASS_COLOURS = {"matmul": "#1f77b4", "elementwise": "#2ca02c", "reduction": "#ff7f0e",
                 "data_movement": "#9467bd"}
HOST_COLOUR = "#bcbd22"
SCALE = 1e3  # the chart's unit, milliseconds


def issue_spans(schedule, cost):
    """Per accelerator (device index), the ``(start, length)`` in milliseconds of each
    op its host spent time issuing; none for CPU devices, whose row holds it all.

    >>> import numpy as np
    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> from costmodel.simulate import simulate
    >>> g = OpGraph(); g.add_op("a", op_type="Relu", bytes_accessed=1e9)
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "H100"]))
    >>> issue_spans(simulate(cost, np.array([1])), cost)  # doctest: +ELLIPSIS
    {1: [(0.0, 0.005...)]}
    >>> issue_spans(simulate(cost, np.array([0])), cost)
    {}
    """
    dispatch = cost.dispatch_time()
    spans = {}
    for i in np.flatnonzero(cost.accelerator[schedule.device]):
        d = schedule.device[i]
        if dispatch[i, d] > 0:
            spans.setdefault(int(d), []).append((float(schedule.issued[i]) * SCALE,
                                                 float(dispatch[i, d]) * SCALE))
    return spans


def check_gantt_path(path, force=False):
    """OutputError unless a Gantt chart may be written to ``path``: its suffix names a
    format matplotlib draws here and the output rule allows it
    (:func:`tfpart.core.output_files.check_output_file`). Checked before any work.

    >>> check_gantt_path("schedule.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: schedule.json: cannot draw a picture in the format of its suffix ('.json'): give a file ending in .png, .svg or .pdf
    """
    check_output_file(path, picture_kind(path, GANTT_FORMATS), force)


def write_gantt(schedule, cost, path, title="", force=False):
    """Draw ``schedule`` to ``path`` in the format of its suffix (:data:`GANTT_FORMATS`),
    marked as tfpart's, atomically and under the output rule (``force``: replace a
    picture of the same format tfpart did not write); return the path."""
    kind = picture_kind(path, GANTT_FORMATS)
    check_output_file(path, kind, force)  # before the drawing, which takes a while
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = cost.cluster.device_names
    links = sorted({(src, dst) for _, src, dst, _, _ in schedule.transfers})
    issuing = issue_spans(schedule, cost)
    hosts = sorted(issuing)
    rows = [n.replace("/replica:0", "") for n in names] + \
        [f"host of {names[d].replace('/replica:0', '')}" for d in hosts] + \
        [f"link {a}->{b}" for a, b in links]
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(rows) + 1.5))
    bars = {}  # (row, colour) -> spans: one broken_barh per row and colour is fast
    for i in np.flatnonzero(schedule.end > schedule.start):
        colour = CLASS_COLOURS[op_class(cost.graph.ops[cost.ops[i]]["op_type"])]
        bars.setdefault((schedule.device[i], colour), []).append(
            (schedule.start[i] * SCALE, (schedule.end[i] - schedule.start[i]) * SCALE))
    for d, spans in issuing.items():
        bars[len(names) + hosts.index(d), HOST_COLOUR] = spans
    for _, src, dst, begin, finish in schedule.transfers:
        row = len(names) + len(hosts) + links.index((src, dst))
        bars.setdefault((row, "#7f7f7f"), []).append((begin * SCALE, (finish - begin) * SCALE))
    for (row, colour), spans in bars.items():
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour, edgecolor="none")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"Simulated step: {schedule.makespan * SCALE:.3f} ms")
    keys = [Patch(color=c, label=k) for k, c in CLASS_COLOURS.items()]
    if hosts:
        keys.append(Patch(color=HOST_COLOUR, label="host issuing"))
    keys.append(Patch(color="#7f7f7f", label="transfer"))
    ax.legend(handles=keys, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    suffix = Path(path).suffix.lower()
    picture = io.BytesIO()
    try:
        fig.savefig(picture, format=suffix[1:], dpi=110, metadata={
            MARK_FIELD[suffix]: f"tfpart simulate --gantt ({PICTURE_MARK.decode()}) with "
                                f"Matplotlib {matplotlib.__version__}"})
    finally:
        plt.close(fig)
    return write_output_file(path, picture.getvalue(), kind, force)
