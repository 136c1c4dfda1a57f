"""Every compile writes out/report.html: one self-contained page, looked at in a real
headless browser."""
import re
import shutil
import subprocess

import pytest

from tfpart.cli import main
from tfpart.report import SECTIONS

BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser",
                                                 "google-chrome") if shutil.which(name)), None)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    assert main(["compile", "--batch-size", "4", "--verify", "-o", str(out)]) == 0
    return out


def test_the_report_is_self_contained_and_has_every_section(compiled):
    page = (compiled / "report.html").read_text()
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from the network
    assert "data:image/png;base64," in page  # the Gantt chart, inline
    assert "Verification <span class=\"ok\">passed</span>" in page
    assert "Predicted step time" in page and "within" in page  # the gap to the bound


@pytest.mark.skipif(BROWSER is None, reason="no Chromium here (CI installs it)")
def test_the_report_renders_in_headless_chromium_without_console_errors(compiled, tmp_path):
    flags = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
             "--v=0", "--window-size=1280,2400"]
    url = (compiled / "report.html").as_uri()
    shot = tmp_path / "report.png"
    run = subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a page of tables and pictures, not a blank one
    assert "CONSOLE" not in run.stderr, run.stderr[-2000:]
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout
    rendered = re.findall(r"<h2>(.*?)</h2>", dom)
    assert rendered == list(SECTIONS)
    assert "<svg" in dom or "DOT" in dom  # the placement picture, or its source


def test_a_pipeline_reports_the_traffic_between_its_stages(tmp_path, capsys):
    """Regression: a pipeline's report said nothing crosses between devices. The
    stages' links carry what the simulation moves over the batch; the summary names the
    fused kernels the model really has."""
    import json

    out = tmp_path / "out"
    assert main(["compile", "--pipeline", "--microbatches", "2", "--batch-size", "4",
                 "-o", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert len(set(plan["stages"]["of"].values())) > 1
    links = plan["predicted"]["links"]
    assert links and all(nbytes > 0 for nbytes in links.values())
    assert plan["predicted"]["bytes_moved"] == pytest.approx(sum(links.values()))
    page = (out / "report.html").read_text()
    assert "Nothing crosses" not in page
    assert all(link.replace(">", "&gt;") in page for link in links)
    printed = capsys.readouterr().out
    fused = re.search(r"fused kernels\s+\((.*?)\)\s+are each placed", printed, re.S)
    assert fused and "Conv2D" in fused.group(1)  # the default model is a CNN


def test_replicas_report_the_rows_sent_to_each_replica_and_its_results_back(tmp_path):
    """Regression: the simulation of data-parallel replicas priced no copy between
    devices. The batch arrives where the first replica is and is sliced there: another
    replica receives its rows and sends its results back, as the rewriter does."""
    import json

    import numpy as np
    import tensorflow as tf

    from profiles import CLUSTERS_DIR, DEFAULT_MODEL_DIR

    out = tmp_path / "out"
    # two replicas whatever the kinds predict (the A100 alone may be as fast at batch 6)
    assert main(["compile", "--strategy", "data_parallel", "--option", "replicas=2",
                 "--batch-size", "6", "--cluster",
                 str(CLUSTERS_DIR / "a100_l4_one_host.json"), "-o", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    first, second = plan["replicas"]["devices"]
    rows = round(plan["replicas"]["fractions"][1] * 6)
    signature = tf.saved_model.load(str(DEFAULT_MODEL_DIR)).signatures["serving_default"]

    def row_bytes(specs):
        return sum(int(np.prod(s.shape[1:])) * s.dtype.size for s in specs)
    links = plan["predicted"]["links"]
    assert links == {
        f"{first} -> {second}": rows * row_bytes(
            signature.structured_input_signature[1].values()),
        f"{second} -> {first}": rows * row_bytes(signature.structured_outputs.values())}
    page = (out / "report.html").read_text()
    assert all(link.replace(">", "&gt;") in page for link in links)


def test_a_report_given_the_plans_simulated_step_neither_builds_a_cost_model_nor_simulates(
        monkeypatch):
    """The compile hands the report the chosen plan's simulated step; drawing its
    schedule then costs no second cost model and no second simulation."""
    import costmodel.execution
    from costmodel.execution import simulate_execution
    from costmodel.roofline import CostModel
    from tfpart.core.cluster import cluster_of_devices
    from tfpart.core.graph import OpGraph
    from tfpart.core.plan import Plan
    from tfpart.report import report_html

    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder")
    graph.add_op("y", op_type="MatMul", flops=1e9)
    graph.add_edge("x", "y", bytes=4e6)
    cluster = cluster_of_devices(["cpu", "cpu"])
    first, second = cluster.device_names
    plan = Plan(assignment={"x": first, "y": second})
    run = simulate_execution(plan, CostModel(graph, cluster))

    def refused(*args, **kwargs):
        raise AssertionError("built or simulated again")

    monkeypatch.setattr(CostModel, "__init__", refused)
    monkeypatch.setattr(costmodel.execution, "simulate", refused)
    page = report_html(plan, graph, cluster, run=run)
    assert "data:image/png;base64," in page
