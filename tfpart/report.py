"""``out/report.html``: one self-contained page (no network) that explains a compiled
plan: the model, the cluster, the algorithm and its options, each device's load and
memory and what its figures came from, the lower bound and the gap to it, the placement
picture, the simulated schedule as a Gantt chart, the traffic per link, the pipeline
stages and micro-batch candidates of a pipelined plan, and the verification when
``--verify`` ran.

Examples
--------
>>> from tfpart.core.graph import OpGraph
>>> from tfpart.core.cluster import cluster_of_devices
>>> from tfpart.core.plan import Plan
>>> g = OpGraph(); g.add_op("x"); g.add_op("y"); g.add_edge("x", "y", bytes=8)
>>> cluster = cluster_of_devices(["cpu"])
>>> plan = Plan(assignment=dict.fromkeys(g.ops, cluster.device_names[0]))
>>> page = report_html(plan, g, cluster)
>>> page.startswith("<!DOCTYPE html>") and "Per-device figures" in page
True
"""
from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from pathlib import Path

from tfpart.strategy_lines import row_shards_line

SECTIONS = ("Model", "Cluster", "Algorithm", "Per-device figures", "Step time and bound",
            "Placement", "Schedule", "Link traffic", "Pipeline", "Verification")

STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.picture { overflow: auto; max-height: 900px; border: 1px solid #eee; }
.ok { color: #2a7f2a; } .bad { color: #c62828; } pre { white-space: pre-wrap; }
"""


def write_report(plan, graph, cluster, path, verification=None, timings=None, cost=None,
                 picture=None, run=None):
    """Write the report of ``plan`` to ``path`` (replaced atomically); return ``path``.
    ``cost`` is the cost model the plan was made with (default: the roofline's),
    ``picture`` the placement section if already drawn (:func:`placement_section`),
    ``run`` the plan's simulated step if already made
    (:func:`costmodel.execution.simulate_execution`: then neither a cost model is built
    nor the plan simulated again)."""
    page = report_html(plan, graph, cluster, verification, timings=timings, cost=cost,
                       picture=picture, run=run)
    path = Path(path)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False,
                                     encoding="utf-8") as staged:
        staged.write(page)
    os.chmod(staged.name, 0o644)  # a temporary file is private; a report is not
    os.replace(staged.name, path)
    return path


def report_html(plan, graph, cluster, verification=None, timings=None, cost=None,
                picture=None, run=None):
    """The report page as a string (``cost``, ``picture`` and ``run`` as
    :func:`write_report` takes them)."""
    if run is None:
        from costmodel import CostModel
        from costmodel.execution import simulate_execution

        cost = cost or CostModel(graph, cluster, tf32=(plan.context or {}).get("tf32"))
        run = simulate_execution(plan, cost)
    context = plan.context or {}
    parts = [f"<h1>tfpart plan: {_e(Path(str(context.get('model', 'model'))).name)} on "
             f"{_e(cluster.name or 'cluster')}</h1>"]
    sections = {
        "Model": _model(plan, graph, context, timings),
        "Cluster": _cluster(cluster),
        "Algorithm": _algorithm(plan),
        "Per-device figures": _devices(plan),
        "Step time and bound": _bound(plan),
        "Placement": picture or placement_section(plan, graph),
        "Schedule": _schedule(run),
        "Link traffic": _links(plan),
        "Pipeline": (f"<p>{_e(row_shards_line(plan))}.</p>" if plan.row_shards else "")
        + _pipeline(plan),
        "Verification": _verification(verification),
    }
    for title in SECTIONS:
        parts.append(f'<section id="{title.lower().replace(" ", "-")}"><h2>{title}</h2>'
                     f"{sections[title]}</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>tfpart report</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def _e(text):
    return html.escape(str(text))


def _table(header, rows):
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _model(plan, graph, context, timings):
    rows = [("SavedModel", context.get("model", "?")),
            ("signature", context.get("signature", "?")),
            ("batch size", context.get("batch_size", "?")), ("ops", len(graph)),
            ("inputs", json.dumps(context.get("inputs", {})))]
    rows += [(f"time to {step}", f"{seconds:.2f} s") for step, seconds in
             (timings or {}).items()]
    return _table(("", ""), rows)


def _cluster(cluster):
    return _table(("device", "kind", "host", "memory GB"),
                  [(d.name, d.kind.name, d.host, f"{d.memory / 1e9:.1f}")
                   for d in cluster.devices])


def _algorithm(plan):
    from partitioner.registry import describe_plan  # what the algorithm says it made

    options = json.dumps(plan.options or {}, indent=1, sort_keys=True)
    described = describe_plan(plan)
    return (f"<p>{_e(plan.algorithm)}</p>" + (f"<p>{_e(described)}.</p>" if described else "")
            + f"<pre>{_e(options)}</pre>")


def _devices(plan):
    if not plan.predicted:
        return "<p>No predictions in this plan.</p>"
    rows = []
    for name, d in plan.predicted.devices.items():
        rows.append((name, d.kind, d.ops, f"{d.param_bytes / 1e6:.2f}",
                     f"{d.busy_s * 1e3:.3f}", f"{d.idle_s * 1e3:.3f}",
                     f"{d.peak_memory_bytes / 1e6:.1f}", f"{d.memory_bytes / 1e6:.0f}"))
    return _table(("device", "kind", "ops", "variables MB", "busy ms", "idle ms",
                   "peak MB", "capacity MB"), rows) + _figures_basis(plan.figures)


def _figures_basis(figures):
    """What each device's figures came from (plan.json's ``context.figures``; nothing
    for plans written before it): a table, and a line on the links."""
    if not figures:
        return ""
    from costmodel.figures_basis import dispatch_text, links_text, op_time_text

    rows = [(name, op_time_text(record), dispatch_text(record))
            for name, record in figures["devices"].items()]
    links = figures.get("links")
    said = links_text(links) if links and sum(links.values()) else ""
    text = f"<p>{_e(said[:1].upper() + said[1:])}.</p>" if said else ""
    return ("<p>Where these figures come from (profile a device with <code>tfpart "
            "profile</code> for measured op times, probe the links with <code>tfpart cluster "
            "probe</code>):</p>" + _table(("device", "op times", "host dispatch cost"), rows)
            + text)


def _bound(plan):
    step, bound = plan.step_time, plan.lower_bound
    if step is None:
        return "<p>No prediction.</p>"
    text = f"<p>Predicted step time: <b>{step * 1e3:.3f} ms</b>."
    if bound:
        text += (f" Lower bound (critical path, work spread over the devices, LP "
                 f"relaxation): {bound * 1e3:.3f} ms; the plan is within "
                 f"{(step / bound - 1) * 100:.1f}% of it.")
    predicted = plan.predicted
    if predicted and predicted.transfers is not None:
        text += (f" {predicted.transfers} tensor copies between devices per step "
                 f"({predicted.cross_host_transfers} between hosts), "
                 f"{predicted.bytes_moved / 1e6:.2f} MB.")
    solver = predicted.solver if predicted else None
    if solver:
        text += f"</p><pre>{_e(json.dumps(solver, indent=1, sort_keys=True))}</pre><p>"
    return text + "</p>"


def placement_section(plan, graph):
    """The report's placement picture: inline SVG where Graphviz's ``dot`` is
    installed, else its DOT source."""
    import shutil

    from tfpart.picture import placement_picture

    picture = placement_picture(plan, graph)
    if shutil.which("dot"):
        svg = picture.dot.pipe(format="svg").decode()
        svg = svg[svg.index("<svg"):]  # drop the XML prologue and DOCTYPE
        return f'<div class="picture">{svg}</div>'
    return ("<p>Graphviz's dot is not installed here, so the picture is its DOT source "
            "(render with <code>dot -Tsvg</code>).</p>"
            f"<details><summary>DOT</summary><pre>{_e(picture.dot.source)}</pre></details>")


def _schedule(run):
    from costmodel.gantt import write_gantt

    with tempfile.TemporaryDirectory() as directory:
        png = write_gantt(run.schedule, run.cost, Path(directory) / "gantt.png").read_bytes()
    data = base64.b64encode(png).decode()
    return f'<img alt="Gantt chart of the simulated step" src="data:image/png;base64,{data}">'


def _links(plan):
    links = plan.predicted.links if plan.predicted else {}
    if not links:
        return "<p>Nothing crosses between devices.</p>"
    return _table(("link", "MB per step"), [(link, f"{nbytes / 1e6:.3f}")
                                           for link, nbytes in sorted(links.items())])


def _pipeline(plan):
    pipeline = plan.predicted.pipeline if plan.predicted else None
    if plan.replicas:
        batch = (plan.context or {}).get("batch_size") or 1
        replicas = plan.replicas
        return (_table(  # described in the Algorithm section
                    ("replica", "device", "share", "samples"),
                    [(r, d, f"{f:.3f}", round(f * batch)) for r, (d, f) in
                     enumerate(zip(replicas.devices, replicas.fractions))]))
    if plan.splits:
        return ("<p>Not pipelined. Filter splits: each op's output channels computed in "
                "slices on several devices, concatenated on the op's own device.</p>"
                + _table(("op", "slices (device: channels)"),
                         [(op, ", ".join(f"{d}: {n}" for d, n in zip(s.devices, s.sizes)))
                          for op, s in sorted(plan.splits.items())]))
    if pipeline is None:
        return "<p>Not pipelined.</p>"
    rows = [(k, s.device, s.units, f"{s.load * 1e3:.3f}")
            for k, s in enumerate(pipeline.stages)]
    text = (f"<p>Throughput {pipeline.throughput:.1f} samples/s, bubble "
            f"{pipeline.bubble_fraction:.1%}, first result after "
            f"{pipeline.first_result * 1e3:.3f} ms.</p>"
            + _table(("stage", "device", "units", "load ms"), rows))
    if pipeline.microbatch_choices:
        keys = sorted({k for figures in pipeline.microbatch_choices.values() for k in figures})
        text += "<p>Micro-batch candidates (simulated):</p>" + _table(
            ("M", *keys), [(m, *(figures.get(k, "") for k in keys))
                           for m, figures in pipeline.microbatch_choices.items()])
    return text


def _verification(report):
    if report is None:
        return "<p>Not verified (run <code>tfpart compile --verify</code> or " \
               "<code>tfpart verify</code>).</p>"
    status = '<span class="ok">passed</span>' if report.ok else \
        '<span class="bad">failed</span>'
    return (f"<p>Verification {status}: largest output difference "
            f"{report.max_abs_diff:.3g}; {report.ops_checked} ops checked against "
            f"TensorFlow's placement, {len(report.op_mismatches)} elsewhere than planned, "
            f"{len(report.variable_mismatches)} variables misplaced.</p>"
            + _table(("device", "ops TensorFlow ran there"),
                     sorted(report.ops_per_device.items())))
