"""Ragged and sparse values built from their specs are valid and keep their rows when
cut (rewriters.composite_inputs), and a user's .npz of inputs is refused in one line
naming the file and the input (rewriters.given_inputs). No model is exported."""
import numpy as np
import pytest
from tensorflow.core.protobuf import meta_graph_pb2

from rewriters.composite_inputs import (MAX_ROW_LENGTH, CompositeInput, composite_value,
                                        take_rows, tensor_rows, value_problem, value_rows)
from rewriters.given_inputs import cycled, given_rows, read_given_inputs
from tfpart.core.errors import TfpartError

RAGGED = CompositeInput("ragged", ("t", "t_1"), (None, None), "int64", ragged_rank=1)
NESTED = CompositeInput("ragged", ("n", "n_1", "n_2"), (None, 2, None, 3), "float32",
                        ragged_rank=2, row_splits_dtype="int32")  # a uniform dimension of 2
SPARSE = CompositeInput("sparse", ("s", "s_1", "s_2"), (None, 5, None), "float32")


def draw(key, shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


def as_lists(composite, value):
    """A ragged value as nested lists of its rows, a sparse one as its dense array."""
    if composite.kind == "sparse":
        indices, values, shape = (value[key] for key in composite.keys)
        dense = np.zeros(shape, values.dtype)
        dense[tuple(indices.T)] = values
        return dense.tolist()
    values, *splits = (value[key] for key in composite.keys)
    rows = values.tolist()
    for level in reversed(splits):
        rows = [rows[a:b] for a, b in zip(level[:-1], level[1:])]
    return rows


@pytest.mark.parametrize("composite", [RAGGED, NESTED, SPARSE], ids=lambda c: c.keys[0])
@pytest.mark.parametrize("first_length", [None, 1, MAX_ROW_LENGTH + 1])
def test_built_values_are_valid_values_of_their_spec(composite, first_length):
    for seed in range(5):
        value = composite_value(composite, 4, np.random.default_rng(seed), draw,
                                first_length)
        assert value_problem(composite, value) is None
        assert value_rows(composite, value) == 4
        rows = as_lists(composite, value)
        assert len(rows) == 4
        if composite is NESTED:
            assert all(len(row) == 2 for row in rows)  # the uniform dimension kept
            assert value["n_1"].dtype == np.int32 and value["n"].shape[1:] == (3,)
        if composite is SPARSE:
            indices = value["s"]
            assert indices.dtype == np.int64 and value["s_2"].tolist()[:2] == [4, 5]
            order = np.lexsort(indices.T[::-1])
            assert (order == np.arange(len(indices))).all()  # row-major order
            assert len({tuple(i) for i in indices.tolist()}) == len(indices)  # no repeats
            entries = np.bincount(indices[:, 0], minlength=4)
            assert entries.min() >= 1 and entries.max() <= max(MAX_ROW_LENGTH,
                                                                first_length or 0)
        if composite is RAGGED:
            lengths = np.diff(value["t_1"])
            assert lengths.min() >= 1
            if first_length == 1:  # the others keep the longest row
                assert lengths[0] == 1
            if first_length == MAX_ROW_LENGTH + 1:
                assert lengths[0] > lengths[1:].max()


@pytest.mark.parametrize("composite", [RAGGED, NESTED, SPARSE], ids=lambda c: c.keys[0])
def test_taken_rows_are_those_rows(composite):
    value = composite_value(composite, 5, np.random.default_rng(3), draw)
    rows = as_lists(composite, value)
    for picked in ([1, 2, 3, 4], [4, 0, 4], [2]):
        taken = take_rows(composite, value, picked)
        assert value_problem(composite, taken) is None
        assert as_lists(composite, taken) == [rows[i] for i in picked]


@pytest.mark.parametrize("composite", [RAGGED, NESTED, SPARSE], ids=lambda c: c.keys[0])
def test_rows_cut_in_a_graph_equal_rows_taken(composite):
    """What the pipeline feeds each micro-batch (tensor_rows) is take_rows' value."""
    import tensorflow as tf

    value = composite_value(composite, 5, np.random.default_rng(4), draw)
    tensors = {key: tf.constant(array) for key, array in value.items()}
    for start, stop in [(0, 2), (2, 5), (4, 5)]:
        cut = tensor_rows([composite], tensors, tf.constant(start), tf.constant(stop))
        expected = take_rows(composite, value, list(range(start, stop)))
        assert {key: cut[key].numpy().tolist() for key in composite.keys} == \
            {key: expected[key].tolist() for key in composite.keys}


def test_values_that_describe_no_tensor_are_named():
    ragged = {"t": np.arange(4), "t_1": np.array([0, 3, 2, 4])}
    assert value_problem(RAGGED, ragged) == "its row splits decrease"
    ragged["t_1"] = np.array([1, 2, 4])
    assert value_problem(RAGGED, ragged) == "its row splits do not start at 0"
    sparse = {"s": np.array([[0, 1, 0], [1, 5, 0]]), "s_1": np.ones(2),
              "s_2": np.array([2, 5, 3])}
    assert value_problem(SPARSE, sparse) == "an index lies outside its dense shape [2, 5, 3]"
    sparse["s_1"] = np.ones(3)
    assert "2 indices but values of shape (3,)" in value_problem(SPARSE, sparse)


def signature(**inputs):
    """A MetaGraphDef whose serving_default takes ``inputs`` (key -> (shape, dtype
    enum)), -1 for an open dimension."""
    meta = meta_graph_pb2.MetaGraphDef()
    for key, (shape, dtype) in inputs.items():
        info = meta.signature_def["serving_default"].inputs[key]
        info.name, info.dtype = f"serving_default_{key}:0", dtype
        for size in shape:
            info.tensor_shape.dim.add().size = size
    return meta


META = signature(x=((-1, 4), 1), ids=((-1,), 9), words=((-1,), 7))  # float, int64, string
GOOD = {"x": np.ones((3, 4)), "ids": np.array([4, 5, 6]), "words": np.array(["a", "b", "c"])}


def test_given_inputs_are_cut_into_batches_of_any_size(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, **GOOD)
    given = read_given_inputs(path, META)
    assert given.rows == 3 and given.arrays["words"].tolist() == [b"a", b"b", b"c"]
    assert given.arrays["x"].dtype == np.float32  # as the signature takes it
    batch = given_rows(given, cycled(given, 5, start=1))
    assert batch["ids"].tolist() == [5, 6, 4, 5, 6] and batch["x"].shape == (5, 4)


@pytest.mark.parametrize("arrays,words", [
    ({**GOOD, "x": np.ones((3, 5))}, ["input 'x' has shape (3, 5)", "(None, 4)"]),
    ({k: v for k, v in GOOD.items() if k != "ids"}, ["lacks input 'ids'"]),
    ({**GOOD, "idz": GOOD["ids"]}, ["'idz'", "no input of signature 'serving_default'"]),
    ({**GOOD, "ids": np.ones(3)}, ["input 'ids' holds float64 values", "int64"]),
    ({**GOOD, "ids": np.array([1, 2])}, ["input 'ids' holds 2 rows but 'words' holds 3"]),
    ({**GOOD, "words": np.array(["a", None, "c"], dtype=object)},
     ["array 'words' holds Python objects"]),
    ({"x": np.ones((0, 4)), "ids": np.zeros(0, int), "words": np.array([], str)},
     ["holds no rows"]),
], ids=["shape", "missing", "unknown", "dtype", "rows", "objects", "empty"])
def test_a_bad_inputs_file_is_one_error_naming_it_and_the_input(tmp_path, arrays, words):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    with pytest.raises(TfpartError) as raised:
        read_given_inputs(path, META)
    assert raised.value.path == str(path) and "\n" not in str(raised.value)
    for word in words:
        assert word in raised.value.problem, raised.value.problem


@pytest.mark.parametrize("content,problem", [
    (None, "no such file"), (b"not a zip", "not an .npz file"),
    (b"\x93NUMPY", "not an .npz file")])
def test_an_inputs_file_that_is_no_npz_is_named(tmp_path, content, problem):
    path = tmp_path / "data.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TfpartError, match=problem):
        read_given_inputs(path, META)
    np.save(tmp_path / "one.npy", np.ones(3))  # one array, not an archive of them
    with pytest.raises(TfpartError, match="not an .npz file"):
        read_given_inputs(tmp_path / "one.npy", META)


def test_an_inputs_file_that_unpacks_past_the_bound_is_refused_before_it_is_read(
        tmp_path, monkeypatch):
    import rewriters.given_inputs as given_inputs

    path = tmp_path / "data.npz"
    np.savez_compressed(path, **{**GOOD, "x": np.zeros((3, 4), np.float32)},
                        padding=np.zeros(2**20, np.uint8))  # 1 MiB of zeros: about 1 KB
    assert path.stat().st_size < 20_000
    monkeypatch.setattr(given_inputs, "MAX_INPUT_FILE_BYTES", 2**19)
    with pytest.raises(TfpartError, match=r"its arrays unpack to 1,04\d,\d{3} bytes, more "
                                          r"than 524,288"):
        read_given_inputs(path, META)
