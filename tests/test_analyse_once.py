"""A compile reads the signature once: each flattening (every function inlined into one
graph, :mod:`rewriters.flatten`) is counted. The batch-mixing probe, a training step's
regions (which compare two batch sizes) and the pipeline pass start from the reader's
flattening (``rewriters.flatten.flat_at``) instead of inlining again."""
import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR


@pytest.fixture
def flattenings(monkeypatch):
    import rewriters.flatten as flatten

    counted = []
    check_size = flatten._Inliner._check_size  # once per flattening, before inlining

    def counting(inliner, function):
        counted.append(function)
        return check_size(inliner, function)

    monkeypatch.setattr(flatten._Inliner, "_check_size", counting)
    return counted


def test_a_pipelined_compile_flattens_the_signature_once(tmp_path, flattenings):
    from tfpart.compile import compile_model

    result = compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, tmp_path / "out",
                           batch_size=8, strategy="pipeline")
    assert result.plan.stages and result.plan.microbatches > 1
    # before: reading it, the batch-mixing probe (at its own batch size), the pipeline
    # pass: three (four before the pass took the tables' devices from its flattening)
    assert len(flattenings) == 1, flattenings


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_pipelined_training_step_flattens_it_once(tmp_path, flattenings):
    from examples.models import export_training_step
    from tfpart.compile import compile_model

    model = export_training_step(tmp_path / "model", "mlp", "adam")
    flattenings.clear()
    result = compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "out", batch_size=8,
                           signature="train_step", strategy="pipeline", microbatches=2)
    assert result.plan.stages and result.info.training
    # before: reading it, its regions at two batch sizes, the pipeline pass and its
    # regions again at two batch sizes: six
    assert len(flattenings) == 1, flattenings


@pytest.fixture
def grappler_runs(monkeypatch):
    """Each run of Grappler's remapper on a graph (the fusion groups of a reading)."""
    import rewriters.fusion as fusion

    counted = []
    remapper = fusion.grappler_fusion_groups

    def counting(graph_def, outputs, *args, **kwargs):
        counted.append(len(graph_def.node))
        return remapper(graph_def, outputs, *args, **kwargs)

    monkeypatch.setattr(fusion, "grappler_fusion_groups", counting)
    return counted


@pytest.fixture
def greedy_placements(monkeypatch):
    """The cost model of each greedy placement made (its first step ranks the ops)."""
    import partitioner.greedy_placement as greedy_placement

    costs = []
    rank = greedy_placement.upward_rank

    def counting(cost, *args, **kwargs):
        costs.append(cost)  # kept alive: no other cost model takes its id
        return rank(cost, *args, **kwargs)

    monkeypatch.setattr(greedy_placement, "upward_rank", counting)
    return costs


@pytest.mark.slow
def test_auto_plans_every_strategy_from_one_reading(exported, grappler_runs,
                                                    greedy_placements, flattenings,
                                                    monkeypatch):
    """``auto`` reads the model once for its five strategies, and the filter splits
    start from the greedy's placement instead of making it again (before: twice on one
    cost model)."""
    from collections import Counter

    import tfpart.compile
    from tfpart.compile import plan_model

    # the placements plan in this process, where the greedy's runs are counted
    monkeypatch.setattr(tfpart.compile, "fork_can_pay", lambda: False)

    model = exported("mlp_module")  # two towers of matmuls, which filter splits cut
    flattenings.clear()
    result = plan_model(model, DEFAULT_CLUSTER_FILE, batch_size=8, strategy="auto")
    assert {"greedy", "filter_split"} <= set(result.compared)
    assert len(flattenings) == 1 and len(grappler_runs) == 1
    assert greedy_placements and max(Counter(map(id, greedy_placements)).values()) == 1


@pytest.mark.slow
@pytest.mark.any_onednn  # planned, not run
def test_the_table_cut_retry_keeps_the_reading_and_grapplers_fusions(
        exported, tmp_path, grappler_runs, flattenings):
    """A table that fits is cut when that is predicted faster: the retry plans the cut
    model from the same analysis, with the fusions Grappler found in the whole model
    (before: the remapper ran again on the cut graph)."""
    import json

    from tests.conftest import local_cluster
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster

    model = exported("table_training")  # 100,000 rows of 16, trained by Adam
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(3, memory=100_000 * 16 * 4 * 10)))
    flattenings.clear()
    result = plan_model(model, load_cluster(cluster), signature="train_step", batch_size=64,
                        strategy="auto")
    assert result.plan.row_shards and "tables whole" in result.plan.context["strategy"]
    assert len(flattenings) == 1 and len(grappler_runs) == 1, grappler_runs
    fused = {op for group in result.info.fusion_groups for op in group}
    assert fused and fused <= set(result.graph.ops)


def test_the_report_draws_the_planned_simulation_with_no_new_cost_model(tmp_path,
                                                                        monkeypatch):
    """The report's schedule is the chosen plan simulated on the cost model it was
    planned with (before: a cost model of the whole graph built again for it)."""
    from costmodel.roofline import CostModel
    from tfpart.compile import compile_model

    built, at_report = [], []
    init = CostModel.__init__

    def counting(self, graph, *args, **kwargs):
        built.append(len(graph))
        return init(self, graph, *args, **kwargs)

    def progress(step):
        if step == "writing the report":
            at_report.append(len(built))

    monkeypatch.setattr(CostModel, "__init__", counting)
    result = compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, tmp_path / "out",
                           batch_size=8, progress=progress)
    assert not result.plan.stages and at_report == [len(built)], built
    assert "data:image/png;base64," in (result.out / "report.html").read_text()


def test_a_model_that_fits_only_without_the_headroom_is_planned_again_from_its_reading(
        exported, flattenings, grappler_runs):
    """The headroom retry: on a device whose memory holds the plan's peak only when
    none of it is kept free, the strategies are planned again without the headroom,
    from the same reading of the model."""
    from tfpart.compile import MEMORY_HEADROOM, plan_model
    from tfpart.core.cluster import cluster_of_devices, with_memory

    model = exported("mlp_module")
    cluster = cluster_of_devices(["cpu"])
    flattenings.clear()
    roomy = plan_model(model, cluster, batch_size=8).plan
    assert roomy.context["memory_headroom"] == MEMORY_HEADROOM
    (peak,) = [device.peak_memory_bytes for device in roomy.predicted.devices.values()]
    tight = plan_model(model, with_memory(cluster, [peak / (1 - MEMORY_HEADROOM / 2)]),
                       batch_size=8).plan
    assert tight.context["memory_headroom"] == 0.0
    assert tight.step_time == roomy.step_time
    assert len(flattenings) == len(grappler_runs) == 2  # one reading per compile
