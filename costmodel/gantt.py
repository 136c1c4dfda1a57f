"""A Gantt chart of a simulated schedule: one row per device, one bar per op, and the
transfers on a row per link."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tfpart.core.ops import op_class

CLASS_COLOURS = {"matmul": "#1f77b4", "elementwise": "#2ca02c", "reduction": "#ff7f0e",
                 "data_movement": "#9467bd"}


def write_gantt(schedule, cost, path, title=""):
    """Draw ``schedule`` to a PNG at ``path``; return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = cost.cluster.device_names
    links = sorted({(src, dst) for _, src, dst, _, _ in schedule.transfers})
    rows = [n.replace("/replica:0", "") for n in names] + \
        [f"link {a}->{b}" for a, b in links]
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(rows) + 1.5))
    scale = 1e3  # milliseconds
    bars = {}  # (row, colour) -> spans: one broken_barh per row and colour is fast
    for i in np.flatnonzero(schedule.end > schedule.start):
        colour = CLASS_COLOURS[op_class(cost.graph.ops[cost.ops[i]]["op_type"])]
        bars.setdefault((schedule.device[i], colour), []).append(
            (schedule.start[i] * scale, (schedule.end[i] - schedule.start[i]) * scale))
    for _, src, dst, begin, finish in schedule.transfers:
        row = len(names) + links.index((src, dst))
        bars.setdefault((row, "#7f7f7f"), []).append((begin * scale, (finish - begin) * scale))
    for (row, colour), spans in bars.items():
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour, edgecolor="none")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"Simulated step: {schedule.makespan * scale:.3f} ms")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in CLASS_COLOURS.items()] +
              [Patch(color="#7f7f7f", label="transfer")], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
