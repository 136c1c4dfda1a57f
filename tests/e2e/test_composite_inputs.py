"""Models whose inputs random 0s and 1s cannot fill, and whose probe needs the
function library, compile and verify under the strategies that cut the batch:
ragged and sparse inputs get valid values built from their specs (or the user's,
``--inputs``), and a lookup table feeding a ``tf.cond`` runs in the batch-mixing probe
with its branch functions."""
import numpy as np
import pytest

from tests.conftest import local_cluster
from tfpart.cli import main
from tfpart.core.plan import Plan
from tfpart.verification import verify

# The values the probe and verification draw do not depend on oneDNN's fusions.
pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]


def export_ragged_and_sparse(path):
    """A ``tf.Module`` of three inputs: ragged token ids (the mean of their rows of a
    20-row embedding), sparse features (times a 10 x 4 matrix) and a dense ``[batch,
    4]``, summed."""
    import tensorflow as tf

    class RaggedSparse(tf.Module):
        def __init__(self):
            super().__init__()
            self.embedding = tf.Variable(tf.random.stateless_normal([20, 4], seed=[1, 2]))
            self.weights = tf.Variable(tf.random.stateless_normal([10, 4], seed=[3, 2]))

        @tf.function(input_signature=[
            tf.RaggedTensorSpec([None, None], tf.int64, row_splits_dtype=tf.int64),
            tf.SparseTensorSpec([None, 10], tf.float32), tf.TensorSpec([None, 4], tf.float32)])
        def __call__(self, tokens, features, dense):
            mean = tf.reduce_mean(tf.nn.embedding_lookup(self.embedding, tokens), axis=1)
            return {"y": mean + tf.sparse.sparse_dense_matmul(features, self.weights) + dense}

    module = RaggedSparse()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_table_cond(path):
    """A ``tf.Module`` looking words up in a hash table, their rows of an embedding
    then through a ``tf.cond`` on a variable (the same branch for every sample)."""
    import tensorflow as tf

    class TableCond(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(["a", "b", "c", "d"]), tf.range(4, dtype=tf.int64)), 4)
            self.embedding = tf.Variable(tf.random.stateless_normal([5, 4], seed=[1, 2]))
            self.scale = tf.Variable(1.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words"),
                                      tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, words, x):
            rows = tf.gather(self.embedding, self.table.lookup(words))
            return {"y": tf.nn.relu(tf.cond(self.scale > 0, lambda: rows * self.scale + x,
                                            lambda: rows - x))}

    module = TableCond()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_padded(path):
    """A ``tf.Module`` whose ragged input comes out padded to the batch's longest row
    (``to_tensor``), beside its rows' sums of the same padding (per sample)."""
    import tensorflow as tf

    class Padded(tf.Module):
        @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.float32)])
        def __call__(self, values):
            padded = values.to_tensor()
            return {"sums": tf.reduce_sum(padded, axis=1), "padded": padded}

    module = Padded()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_ragged_rank_2(path):
    """A ``tf.Module`` summing each sample of a ragged-rank-2 input whose middle
    dimension is uniform (3 lists of any length per sample) into one number."""
    import tensorflow as tf

    class RaggedRank2(tf.Module):
        @tf.function(input_signature=[
            tf.RaggedTensorSpec([None, 3, None], tf.float32, ragged_rank=2)])
        def __call__(self, lists):
            return {"y": tf.reduce_sum(lists, axis=[1, 2])}

    module = RaggedRank2()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("composite")
    return {"ragged_sparse": export_ragged_and_sparse(folder / "ragged_sparse"),
            "table_cond": export_table_cond(folder / "table_cond"),
            "padded": export_padded(folder / "padded"),
            "ragged_rank_2": export_ragged_rank_2(folder / "ragged_rank_2")}


def compile_verified(model, cluster, out, *strategy):
    return main(["compile", str(model), "--cluster", str(cluster), "-o", str(out),
                 "--batch-size", "4", "--verify", *strategy])


def test_ragged_and_sparse_inputs_compile_as_a_placement(models, write_cluster, tmp_path):
    """``--verify``'s exit code 0: the outputs are equal at batch sizes 4, 1 and 5."""
    cluster = write_cluster(local_cluster(2))
    assert compile_verified(models["ragged_sparse"], cluster, tmp_path / "out",
                            "--strategy", "placement") == 0


def test_ragged_and_sparse_inputs_compile_as_data_parallel(models, write_cluster, tmp_path,
                                                           capsys):
    """Each replica gets its rows of the ragged and sparse inputs; the user's inputs
    (``--inputs``) verify it too, and a file lacking one of them is one line, exit 2."""
    model, out = models["ragged_sparse"], tmp_path / "out"
    cluster = write_cluster(local_cluster(2))
    assert compile_verified(model, cluster, out, "--strategy", "data_parallel",
                            "--option", "replicas=2") == 0
    assert len(Plan.load(out / "plan.json").replicas.devices) == 2
    # ``run``: the rebuilt model takes the components as tensors; plan.json says what
    # they make up
    assert main(["run", str(out), "--repeats", "1", "--warmup", "0"]) == 0

    rows = {"tokens.values": np.array([19, 2, 3, 0, 5, 6, 7]),
            "tokens.row_splits": np.array([0, 2, 3, 7]),
            "features.indices": np.array([[0, 1], [1, 3], [2, 0], [2, 9]]),
            "features.values": np.array([1.0, 2.0, 3.0, 4.0]),
            "features.dense_shape": np.array([3, 10]), "dense": np.ones((3, 4))}
    given = tmp_path / "rows.npz"
    np.savez(given, **rows)
    report = verify(model, out, inputs=given)
    assert report.ok and [(size, equal) for size, _, equal in report.batches] == [
        (4, True), (1, True), (5, True)]
    assert main(["run", str(out), "--repeats", "1", "--warmup", "0", "--inputs",
                 str(given)]) == 0

    lacking = tmp_path / "lacking.npz"
    np.savez(lacking, **{k: v for k, v in rows.items() if k != "features.dense_shape"})
    capsys.readouterr()
    assert main(["verify", str(model), str(out), "--inputs", str(lacking)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(lacking) in err and \
        "'features.dense_shape'" in err, err


def test_a_table_feeding_a_cond_is_micro_batched_and_replicated(models, write_cluster,
                                                                tmp_path):
    """The probe imports the branches of the ``tf.cond`` with the graph: it finds
    nothing mixing samples, so the plan cuts the batch as asked. (One test: a probe
    that failed leaves the branches registered in the process, so a second compile in
    it would pass even without them.)"""
    cluster = write_cluster(local_cluster(2))
    for strategy, cuts in [
            (["pipeline", "--microbatches", "2"], lambda plan: plan.microbatches),
            (["data_parallel", "--option", "replicas=2"],
             lambda plan: len(plan.replicas.devices))]:
        out = tmp_path / strategy[0]
        assert compile_verified(models["table_cond"], cluster, out, "--strategy",
                                *strategy) == 0
        assert cuts(Plan.load(out / "plan.json")) == 2


def test_the_probe_refuses_only_an_output_padded_to_the_longest_row(models):
    """Its first row the shortest, the probe sees the padding inside ``to_tensor`` as
    rows (sums per sample pass); its first row the longest, the padded output is
    named."""
    from rewriters.batch_check import batch_mixing_ops
    from rewriters.savedmodel_io import read_saved_model

    for name, refused in [("ragged_sparse", []), ("padded", ["'padded'"])]:
        path = models[name]
        found = batch_mixing_ops(read_saved_model(path), path)
        assert [why.split()[1] for _, why in found] == refused, found


def test_a_ragged_rank_2_input_runs_where_the_placement_says(models, write_cluster,
                                                              tmp_path):
    """Regression: a ragged reduction's ``boolean_mask`` takes ``Prod(Shape(x))``, which
    Grappler runs as ``Size(x)`` on the Shape's device (``--verify``: 2 ops on another
    CPU than planned). A random placement splits them unless the reader groups them."""
    cluster = write_cluster(local_cluster(2))
    assert compile_verified(models["ragged_rank_2"], cluster, tmp_path / "out",
                            "--algorithm", "random", "--option", "seed=0") == 0


def test_profiled_ragged_and_sparse_inputs_are_valid(models):
    """``tfpart profile``'s inputs: a valid value of each ragged and sparse input's spec
    (a uniform ragged dimension of 3 lists per sample included), so every op runs."""
    from rewriters.flat_signature import import_flat
    from rewriters.flatten import flatten_signature
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.profiling import measure_ops, with_open_composites

    for name, op_type in [("ragged_sparse", "SparseTensorDenseMatMul"),
                          ("ragged_rank_2", "UnsortedSegmentSum")]:
        flat = flatten_signature(read_saved_model(models[name]), models[name], 4)
        per_op, _, _ = measure_ops(flat, import_flat(with_open_composites(flat)), repeats=1,
                                   warmup=0, intra_threads=1)
        types = {op.name: op.type for op in import_flat(flat).get_operations()}
        assert op_type in {types.get(op) for op in per_op}, (name, sorted(per_op))


def test_the_probe_names_the_users_inputs_it_failed_on(models, tmp_path):
    """A probe on ``--inputs`` that cannot run says it ran on that file, not on random
    inputs of its own (an id past the embedding's 20 rows)."""
    from rewriters.batch_check import batch_mixing_ops
    from rewriters.given_inputs import read_given_inputs
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.core.errors import ModelError

    path = models["ragged_sparse"]
    given = tmp_path / "past.npz"
    np.savez(given, **{"tokens.values": np.array([25, 2, 3]),
                       "tokens.row_splits": np.array([0, 1, 2, 3]),
                       "features.indices": np.array([[0, 1], [1, 3], [2, 0]]),
                       "features.values": np.ones(3), "features.dense_shape": np.array([3, 10]),
                       "dense": np.ones((3, 4))})
    proto = read_saved_model(path)
    with pytest.raises(ModelError, match=f"3 rows of the inputs of {given}: "):
        batch_mixing_ops(proto, path, given=read_given_inputs(given, proto.meta_graphs[0]))
