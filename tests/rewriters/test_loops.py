"""What a recurrent model's loops hold, as the reader counts it: the TensorLists of the
sequence going in and coming out, and the trips TensorFlow runs ahead of the
recurrence (``rewriters.loops``; measured against TensorFlow's allocator in
tests/e2e/test_memory_fit.py)."""
from rewriters.reader import read_model
from rewriters.savedmodel_io import read_saved_model
from tfpart.core.dtypes import tensor_bytes

SEQ, FEATURES, UNITS, BATCH = 12, 16, 32, 4  # examples.models.export_stacked_lstm


def test_a_recurrent_layer_holds_its_sequences_and_the_input_projections_run_ahead(exported):
    """Also: a loop's FLOPs are those of all its trips."""
    model = exported("stacked_lstm")
    graph, _ = read_model(read_saved_model(model), model, batch_size=BATCH)
    loops = sorted(op for op, a in graph.ops.items() if a["op_type"] == "While")
    unstacks = sorted(op for op, a in graph.ops.items()
                      if a["op_type"] == "TensorListFromTensor")
    assert len(loops) == 2 and len(unstacks) == 2
    # the first layer's input list holds the whole sequence, and the loop reads all of it
    first_input = tensor_bytes((SEQ, BATCH, FEATURES), "float32")
    assert sum(tensor_bytes(*out) for out in graph.ops[unstacks[0]]["outputs"]) == first_input
    assert graph.edge(unstacks[0], loops[0])["bytes"] == first_input
    # the first layer returns its sequence: a list filled by the loop, one row per step
    assert ((SEQ, BATCH, UNITS), "float32") in graph.ops[loops[0]]["outputs"]
    # x[t] @ kernel for every step in flight (12 < parallel_iterations), beside one trip
    projection = tensor_bytes((BATCH, 4 * UNITS), "float32")
    for loop in loops:
        assert graph.ops[loop]["body_bytes"] >= SEQ * projection
        assert graph.ops[loop]["body_bytes"] < 3 * SEQ * projection
        # and its time is every trip's: the two matmuls of the cell, twelve times
        cell = 2 * BATCH * 4 * UNITS * (UNITS + (FEATURES if loop == loops[0] else UNITS))
        assert graph.ops[loop]["flops"] >= SEQ * cell


def test_ops_tensorflow_prunes_cost_nothing_and_receive_nothing(exported):
    """Keras computes one LSTM cell step outside each loop, to learn its output shapes;
    nothing reads it, so TensorFlow never runs it."""
    model = exported("stacked_lstm")
    graph, _ = read_model(read_saved_model(model), model, batch_size=BATCH)
    outside = [op for op, a in graph.ops.items() if a["op_type"] == "MatMul"
               and "/lstm_cell_1/" in op and "/while/" not in op]
    assert len(outside) == 4  # two per layer
    for op in outside:
        assert graph.ops[op]["flops"] == 0 and graph.ops[op]["outputs"] == []
        assert all(edge["control"] for edge in graph.in_edges(op).values())
    heads = [op for op, a in graph.ops.items() if a["op_type"] == "MatMul" and "dense" in op]
    assert heads and all(graph.ops[op]["flops"] > 0 for op in heads)  # what the outputs need
