"""Tables bigger than a device (issue 39): a table that fits no device is cut into row
shards on several devices, its lookups become partitioned lookups, and the compiled
model gives the original's outputs, each shard and its gathers on its planned device.

The table is 1.7 x a device's memory, as in the issue's case (a 512 MB table on three
300 MB devices, which ``benchmarks/embeddings.py`` compiles and times at full size):
here the recommender's 6.4 MB item table on three devices of 3.75 MB. A table read
other than by rows, updated by the signature, or read whole by another signature the
compiled model keeps is refused, naming the op or the signature."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import local_cluster
from tfpart.core.errors import PlacementError
from tfpart.core.row_shards import first_rows

# one xdist worker compiles and verifies the module's recommender, once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("row_shards")]
RATIO = 512 / 300
ITEMS = 100_000


def small_cluster(tmp_path, table_bytes):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(local_cluster(3, memory=int(table_bytes / RATIO))))
    return path


def outputs(model, **inputs):
    import tensorflow as tf

    served = tf.saved_model.load(str(model)).signatures["serving_default"]
    return {key: value.numpy() for key, value in served(**{
        key: tf.constant(value) for key, value in inputs.items()}).items()}


@pytest.fixture(scope="module")
def recommender(exported, tmp_path_factory):
    """The small recommender (a 100k x 16 item table: 6.4 MB) compiled and verified for
    three devices of 1 / 1.7 of its table: (model, compiled folder, compile result)."""
    from tfpart.compile import compile_model

    model = exported("small_recommender")
    work = tmp_path_factory.mktemp("recommender")
    out = work / "out"
    result = compile_model(model, small_cluster(work, ITEMS * 16 * 4), out, batch_size=8,
                           verify=True)
    return model, out, result


def test_a_recommender_table_bigger_than_any_device_is_cut_into_row_shards(recommender):
    import tensorflow as tf

    model, out, result = recommender
    assert result.verification.ok, result.verification.problem
    (table, shards), = result.plan.row_shards.items()
    assert table.endswith("item_table/embeddings")
    assert sum(shards.sizes) == ITEMS and len(set(shards.devices)) == 3
    plan = json.loads((out / "plan.json").read_text())
    assert plan["row_shards"][table]["sizes"] == list(shards.sizes)
    # `tfpart simulate` of plan.json makes the same cut and predicts the same step
    from tfpart.compile import simulate_model

    run, _ = simulate_model(model, out / "plan.json")
    assert run.step_time == pytest.approx(result.plan.predicted.step_time, rel=1e-9)
    # ids in every shard, at each shard's edges, the first and last rows, repeated
    edges = [row for first in first_rows(shards.sizes)[1:] for row in (first - 1, first)]
    items = np.array([[0], [ITEMS - 1], *([row] for row in edges), [0], [ITEMS - 1]],
                     np.int32)
    users = np.arange(len(items), dtype=np.int32).reshape(-1, 1) % 50
    expected = outputs(model, item=items, user=users)
    assert outputs(out, item=items, user=users).keys() == expected.keys()
    for key, value in outputs(out, item=items, user=users).items():
        np.testing.assert_array_equal(value, expected[key])
    # the compiled model holds the shards, not the whole table (nor a second copy)
    shapes = tf.train.load_checkpoint(str(out / "variables" / "variables")) \
        .get_variable_to_shape_map()
    rows = sorted(shape[0] for shape in shapes.values() if shape[1:] == [16])
    assert ITEMS not in rows and sum(rows) == ITEMS + 50  # the shards, and the user table


def test_the_compiled_model_runs_exactly_the_sharded_graph_that_was_priced(recommender):
    """What the cost model priced is what the rewriter built, node for node: the ops
    imported into the compiled signature are the OpGraph's (its inputs and variables,
    the shards among them, are bound to the signature's own tensors instead)."""
    from rewriters.copies import copies_in
    from rewriters.savedmodel_io import read_saved_model

    model, out, result = recommender
    imported = {copy.origin for copy in copies_in(read_saved_model(out).meta_graphs[0]).values()}
    priced = {op for op, attrs in result.graph.ops.items()
              if attrs["op_type"] not in ("Placeholder", "VarHandleOp")}
    assert imported == priced
    lookup = [op for op in priced if "/tfpart_rows/rows" in op]
    assert len(lookup) == 3  # one gather per shard
    assert {result.plan.assignment[op] for op in lookup} == set(
        result.plan.row_shards[next(iter(result.plan.row_shards))].devices)


def test_checkpoints_move_both_ways_between_the_original_and_its_shards(recommender,
                                                                       tmp_path):
    import tensorflow as tf

    from tfpart.checkpoints import checkpoint_to_compiled, checkpoint_to_original

    model, out, result = recommender
    (shards,) = result.plan.row_shards.values()
    items = np.array([[0], [ITEMS - 1], *([first] for first in first_rows(shards.sizes))],
                     np.int32)
    feeds = {"item": tf.constant(items), "user": tf.constant(np.ones_like(items))}

    def scores(loaded):
        return loaded.signatures["serving_default"](**feeds)["output_0"].numpy()

    # the original's newer weights (a checkpoint it wrote) restore into the compiled model
    original = tf.saved_model.load(str(model))
    tables = [v for v in original.variables if v.shape[-1] == 16]  # item and user tables
    for variable in tables:
        variable.assign(0.01 - variable)
    tf.train.Checkpoint(original).write(str(tmp_path / "original"))
    assert checkpoint_to_compiled(tmp_path / "original", out, model,
                                  tmp_path / "compiled") == 6
    compiled = tf.saved_model.load(str(out))
    tf.train.Checkpoint(compiled).read(str(tmp_path / "compiled")) \
        .assert_existing_objects_matched()
    np.testing.assert_array_equal(scores(compiled), scores(original))
    assert len(np.unique(scores(compiled))) > 1  # not saturated: the rows tell
    # and the compiled model's (trained) shards go back into the original's table
    for variable in compiled.variables_by_op.values():
        if variable.shape[-1] == 16:  # the item table's shards and the user table
            variable.assign(variable + 0.03)
    tf.train.Checkpoint(compiled).write(str(tmp_path / "trained"))
    assert checkpoint_to_original(tmp_path / "trained", out, model, tmp_path / "back") == 6
    restored = tf.saved_model.load(str(model))
    tf.train.Checkpoint(restored).read(str(tmp_path / "back")) \
        .assert_existing_objects_matched()
    np.testing.assert_array_equal(scores(restored), scores(compiled))
    assert not np.array_equal(scores(restored), scores(original))


def test_a_checkpoint_that_cannot_be_read_or_written_is_one_line(recommender, tmp_path):
    import shutil

    from tfpart.checkpoints import checkpoint_to_compiled, checkpoint_to_original
    from tfpart.core.errors import ModelError, OutputError

    model, out, _ = recommender
    truncated = tmp_path / "truncated"
    shutil.copytree(model / "variables", truncated)
    data = next(truncated.glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(ModelError, match="cannot read the variables"):
        checkpoint_to_compiled(truncated / "variables", out, model, tmp_path / "a")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(OutputError, match="cannot write it"):
        checkpoint_to_original(out / "variables" / "variables", out, model,
                               blocked / "ckpt")
    assert blocked.read_text() == "not a folder"
    assert not list(tmp_path.glob("a*"))


def test_gathers_segment_sums_and_safe_sparse_lookups_of_a_module_are_cut(exported, tmp_path):
    from tfpart.compile import compile_model

    model = exported("table_lookups")  # 1000 x 8: 32 KB
    out = tmp_path / "out"
    result = compile_model(model, small_cluster(tmp_path, 1000 * 8 * 4), out, batch_size=8,
                           verify=True)
    assert result.verification.ok, result.verification.problem
    (shards,) = result.plan.row_shards.values()
    firsts = first_rows(shards.sizes)
    # every shard, its edges, repeats, padding, and a sample without any id
    ids = np.array([[0, 999, -1], [firsts[1] - 1, firsts[1], firsts[1]],
                    [firsts[2], 999, 0], [-1, -1, -1], [5, 5, 5]], np.int64)
    expected = outputs(model, ids=ids)
    got = outputs(out, ids=ids)
    for key in ("first", "sums", "means"):
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-6, atol=1e-7)


@pytest.mark.any_onednn  # refused before any kernel runs
@pytest.mark.parametrize("exporter, table_bytes, signature, refusal", [
    ("table_lookups_whole", 1000 * 8 * 4, None,
     "'total' of the original, which the compiled model keeps, runs the original graph "
     "on the whole table"),
    ("sparse_reads", 1000 * 16 * 4, "update",  # its scatter is cut, the whole sum is not
     r"op StatefulPartitionedCall/Sum \(a Sum\) reads it other than by rows"),
])
def test_a_table_that_cannot_be_cut_is_refused_saying_why(exported, tmp_path, exporter,
                                                          table_bytes, signature, refusal):
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster

    if exporter == "table_lookups_whole":
        from examples.models import export_table_lookups

        model = export_table_lookups(tmp_path / "model", whole_read=True)
    else:
        model = exported(exporter)
    with pytest.raises(PlacementError, match=r"needs 64\.0 KB|needs 32\.0 KB") as caught:
        plan_model(model, load_cluster(small_cluster(tmp_path, table_bytes)),
                   signature=signature, batch_size=4)
    assert caught.match(refusal)


@pytest.mark.any_onednn  # refused before any kernel runs
def test_the_command_refuses_a_table_read_whole_in_one_line(exported, tmp_path):
    model = exported("sparse_reads")  # serving_default slices the table's first rows
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", "compile", str(model),
                           "--cluster", str(small_cluster(tmp_path, 1000 * 16 * 4)),
                           "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "cannot be cut into row shards: op StatefulPartitionedCall/strided_slice " \
           "(a StridedSlice) reads it other than by rows" in done.stderr
    assert not (tmp_path / "out").exists()


TRAINING_TABLE = (1000, 8)  # 32 KB


# Each device's memory against the table: the table with its slots fits none, and the
# step's updates (a few values of a shard's size at once) fit beside the shards; or
# (momentum at 2.5) the table and its slot fit a device but their dense update does not;
# or two tables with Adam's slots (six of the table's size) on devices of four.
# in both oneDNN modes: the sparse update and two tables with Adam's slots; the others once
@pytest.mark.parametrize("optimizer, slots, memory, tables", [
    ("sgd", 0, 1 / RATIO, 1),
    pytest.param("adam", 2, 3.0, 1, marks=pytest.mark.any_onednn),
    pytest.param("sgd_momentum", 1, 2.5, 1, marks=pytest.mark.any_onednn), ("adam", 2, 4.0, 2)])
def test_a_training_step_with_a_cut_table_trains_like_the_original(tmp_path, optimizer,
                                                                   slots, memory, tables):
    """Sparse (SGD: a scatter of the rows read) and dense updates (momentum, Adam: the
    gradient made dense, then the table and its slots updated whole): 20 steps with ids
    in every shard, the first and last rows and repeats give the original's losses,
    and every variable, slots and step counter included, ends as the original's (the
    compiled model's checkpoint moved back to the original's keys)."""
    import tensorflow as tf

    from examples.models import export_table_training
    from tfpart.checkpoints import checkpoint_to_original
    from tfpart.compile import compile_model

    rows, width = TRAINING_TABLE
    model = export_table_training(tmp_path / "model", rows, width, optimizer, tables=tables)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(3, memory=int(rows * width * 4 * memory))))
    out = tmp_path / "out"
    result = compile_model(model, cluster, out, signature="train_step", batch_size=8,
                           verify=True)
    assert result.verification.ok, result.verification.problem
    shards = result.plan.row_shards
    assert len(shards) == tables * (1 + slots)  # each table and each of its slots
    (sizes,) = {tuple(s.sizes) for s in shards.values()}
    placements = {tuple(s.devices) for s in shards.values()}
    assert len(placements) <= tables  # a shard's slots beside it
    assert all(len(set(devices)) >= 2 for devices in placements)  # none fits one device
    firsts = first_rows(sizes)

    rng = np.random.default_rng(0)
    batches = []
    for _ in range(20):
        ids = rng.integers(0, rows, (8, 2)).astype(np.int32)
        ids[:4] = [[0, rows - 1], [firsts[1], firsts[1]], [firsts[1] - 1, firsts[2]],
                   [firsts[2] - 1, 5]]
        batches.append((ids, rng.standard_normal((8, 1)).astype(np.float32)))

    def train(path, prefix):
        loaded = tf.saved_model.load(str(path))
        step = loaded.signatures["train_step"]
        losses = [float(step(x=tf.constant(x), y=tf.constant(y))["loss"]) for x, y in batches]
        tf.train.Checkpoint(loaded).write(str(prefix))
        return losses

    want = train(model, tmp_path / "original")
    got = train(out, tmp_path / "compiled")
    np.testing.assert_allclose(got, want, rtol=1e-5)
    checkpoint_to_original(tmp_path / "compiled", out, model, tmp_path / "back")
    keys = [key for key, _ in tf.train.list_variables(str(tmp_path / "original"))
            if "OBJECT_GRAPH" not in key]
    assert sorted(keys) == sorted(key for key, _ in tf.train.list_variables(
        str(tmp_path / "back")) if "OBJECT_GRAPH" not in key)
    trained = 0
    for key in keys:
        expected = tf.train.load_variable(str(tmp_path / "original"), key)
        np.testing.assert_allclose(tf.train.load_variable(str(tmp_path / "back"), key),
                                   expected, rtol=1e-5, atol=1e-7, err_msg=key)
        if np.shape(expected) == TRAINING_TABLE:
            trained += 1
    assert trained == tables * (1 + slots)
    table = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"
    initial = tf.train.load_variable(str(model / "variables" / "variables"), table)
    final = tf.train.load_variable(str(tmp_path / "back"), table)
    assert initial.shape == TRAINING_TABLE
    assert not np.array_equal(initial[[0, rows - 1]], final[[0, rows - 1]])  # it trained


def test_a_table_that_fits_is_cut_when_that_is_predicted_faster(tmp_path):
    """Adam updates its table and both slots densely, row by row: cut over three devices
    that each hold the table whole, each device updates a third of the rows, which the
    simulator predicts faster than the table whole; so the compile cuts it, says so
    beside the step with the table whole, and the compiled step trains as the original.
    ``--whole-tables`` keeps it whole."""
    import tensorflow as tf

    from examples.models import export_table_training
    from tfpart.compile import compile_model, plan_model
    from tfpart.core.cluster import load_cluster

    rows, width = 100_000, 16
    model = export_table_training(tmp_path / "model", rows, width, "adam")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(3, memory=int(rows * width * 4 * 10))))
    result = compile_model(model, cluster, tmp_path / "out", signature="train_step",
                           batch_size=64, verify=True, strategy="auto")
    assert result.verification.ok, result.verification.problem
    plan = result.plan
    assert len(plan.row_shards) == 3  # the table and its two slots
    (devices,) = {tuple(s.devices) for s in plan.row_shards.values()}
    assert len(set(devices)) == 3
    whole_steps = plan.context["strategy"]["tables whole"]
    assert plan.step_time < min(whole_steps.values())
    kept = plan_model(model, load_cluster(cluster), signature="train_step", batch_size=64,
                      whole_tables=True).plan
    assert not kept.row_shards
    assert kept.step_time == pytest.approx(whole_steps["greedy"])

    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, rows, (64, 2)).astype(np.int32),
                rng.standard_normal((64, 1)).astype(np.float32)) for _ in range(5)]

    def losses(path):
        step = tf.saved_model.load(str(path)).signatures["train_step"]
        return [float(step(x=tf.constant(x), y=tf.constant(y))["loss"]) for x, y in batches]

    np.testing.assert_allclose(losses(tmp_path / "out"), losses(model), rtol=1e-5)


@pytest.mark.any_onednn  # planned, not run
def test_a_table_cut_for_speed_is_shared_by_each_devices_speed(tmp_path):
    """Adam's update works on every row, so a device with twice the memory bandwidth
    (the element-wise update's bound) gets about twice the rows, and holds them."""
    from examples.models import export_table_training
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster
    from tfpart.core.device_kinds import load_device_kinds

    rows = 100_000
    model = export_table_training(tmp_path / "model", rows, 16, "adam")
    cpu = load_device_kinds()["cpu"]
    twice = {"description": "the cpu kind with twice its memory bandwidth",
             "peak_flops": {"fp32": cpu.peak_flops},
             "memory_bandwidth": 2 * cpu.memory_bandwidth, "memory": cpu.memory,
             "host_link_bandwidth": cpu.host_link_bandwidth,
             "peer_link_bandwidth": cpu.peer_link_bandwidth, "efficiency_from": "cpu",
             "op_overhead_s": cpu.op_overhead_s, "source": "test"}
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"name": "uneven", "kinds": {"cpu2x": twice}, "devices": [
        {"name": f"/device:CPU:{i}", "kind": kind, "memory": "100MB"}
        for i, kind in enumerate(["cpu", "cpu2x", "cpu"])]}))
    plan = plan_model(model, load_cluster(cluster), signature="train_step",
                      batch_size=64).plan
    table = next(name for name in plan.row_shards if name.endswith("item_table/embeddings"))
    shards = plan.row_shards[table]
    assert sum(shards.sizes) == rows
    largest = max(range(len(shards.sizes)), key=lambda i: shards.sizes[i])
    assert shards.devices[largest].endswith("CPU:1")
    others = [size for i, size in enumerate(shards.sizes) if i != largest]
    assert all(1.6 < shards.sizes[largest] / size < 2.4 for size in others)


@pytest.mark.any_onednn  # refused before any kernel runs
def test_pipeline_stages_of_a_training_step_with_a_cut_table_are_refused(tmp_path):
    from examples.models import export_table_training
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster

    rows, width = TRAINING_TABLE
    model = export_table_training(tmp_path / "model", rows, width, "sgd")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(3, memory=int(rows * width * 4 / RATIO))))
    with pytest.raises(PlacementError, match="cut into row shards, whose updates in a "
                                             "training step do not combine with pipeline "
                                             "stages yet"):
        plan_model(model, load_cluster(cluster), signature="train_step", batch_size=8,
                   microbatches=2)
