"""What the reader prices a row lookup at (``tfpart.core.touched``): the rows it reads and
writes, never the whole table it addresses, in a Keras embedding (``GatherV2`` of the
read table) and in a ``tf.Module``'s gathers, sparse segment sums, slices and in-place
scatters. The times TensorFlow measures for them are in BENCHMARKS.md
(``benchmarks/embeddings.py``)."""
import pytest

from rewriters.reader import read_model
from rewriters.savedmodel_io import read_saved_model
from tfpart.core.dtypes import tensor_bytes
from tfpart.core.ops import FREE_OPS

BATCH = 8


def ops_of_type(graph, op_type):
    return [attrs for attrs in graph.ops.values() if attrs["op_type"] == op_type]


def test_an_embedding_lookup_reads_its_rows_not_its_table(exported):
    model = exported("small_recommender")  # a 100k x 16 item table, 6.4 MB
    graph, _ = read_model(read_saved_model(model), model, batch_size=BATCH)
    table = tensor_bytes((100_000, 16), "float32")
    rows = tensor_bytes((BATCH, 1, 16), "float32")
    ids = tensor_bytes((BATCH, 1), "int32")
    lookups = [op for op, attrs in graph.ops.items() if attrs["op_type"] == "GatherV2"
               and any(edge["bytes"] == table for edge in graph.in_edges(op).values())]
    assert len(lookups) == 1  # the item table's, which receives the whole table
    touched = graph.ops[lookups[0]]["bytes_accessed"]
    assert touched == pytest.approx(ids + 2 * rows, abs=8)  # + the axis
    assert touched < table / 1000


@pytest.mark.parametrize("signature", ["serving_default", "update"])
def test_gathers_segment_sums_slices_and_scatters_touch_the_rows_they_address(exported,
                                                                              signature):
    model = exported("sparse_reads")  # a 1000 x 16 table
    graph, _ = read_model(read_saved_model(model), model, batch_size=BATCH,
                          signature=signature)
    rows, ids = tensor_bytes((BATCH, 16), "float32"), tensor_bytes((BATCH,), "int32")
    table = tensor_bytes((1000, 16), "float32")
    touched = {a["op_type"]: a["bytes_accessed"] for a in graph.ops.values()}
    if signature == "update":
        assert touched["ResourceScatterAdd"] == ids + 3 * rows  # updates, and rows read, written
        return
    assert touched["ResourceGather"] == pytest.approx(ids + 2 * rows, abs=8)
    sums = ops_of_type(graph, "SparseSegmentSum")[0]
    assert sums["bytes_accessed"] == 2 * ids + rows + tensor_bytes(*sums["outputs"][0])
    head = tensor_bytes((2, 16), "float32")
    assert touched["StridedSlice"] == pytest.approx(2 * head, abs=64)  # + begin, end, strides
    # nothing TensorFlow runs reads the table whole (reading the variable aliases it)
    assert max(nbytes for op_type, nbytes in touched.items() if op_type not in FREE_OPS) < table
