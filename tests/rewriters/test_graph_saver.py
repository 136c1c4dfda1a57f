"""The saver_def written as NodeDefs (rewriters.graph_saver) restores each checkpoint
key into the handle TensorFlow's own traced saver restores it into, and refuses what
it cannot match."""
import pytest

from rewriters.graph_saver import add_graph_saver, holds_only_variables
from rewriters.savedmodel_io import read_saved_model

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]


def _saved(module, folder, skip_saver):
    import tensorflow as tf

    tf.saved_model.save(module, str(folder), options=tf.saved_model.SaveOptions(
        experimental_skip_saver=skip_saver))
    return read_saved_model(folder).meta_graphs[0]


def _traced_restores(meta):
    """Checkpoint key -> the graph's handle op that TensorFlow's traced restore
    function assigns it to (read from the function's RestoreV2 and assignments)."""
    call = next(node for node in meta.graph_def.node
                if node.name == meta.saver_def.restore_op_name)
    function = next(f for f in meta.graph_def.library.function
                    if f.signature.name == call.attr["f"].func.name)
    handle_of = dict(zip((arg.name for arg in function.signature.input_arg),
                         (source.split(":")[0] for source in call.input)))
    nodes = {node.name: node for node in function.node_def}

    def source(tensor):  # through Identity ops, to a RestoreV2 output
        while nodes[tensor.split(":")[0]].op == "Identity":
            tensor = nodes[tensor.split(":")[0]].input[0]
        return nodes[tensor.split(":")[0]], int(tensor.split(":")[-1])

    found = {}
    for node in function.node_def:
        if node.op == "AssignVariableOp":
            restore, index = source(node.input[1])
            keys = nodes[restore.input[1].split(":")[0]].attr["value"].tensor.string_val
            found[keys[index].decode()] = handle_of[node.input[0]]
    return found


def test_variables_of_one_name_are_restored_where_tensorflow_restores_them(tmp_path):
    import tensorflow as tf

    module = tf.Module()
    module.first = [tf.Variable(float(i), name=name) for i, name in enumerate("aAa")]
    module.inner = tf.Module()
    module.inner.more = [tf.Variable([1.0, 2.0], name="a"), tf.Variable(3, name="a_1")]
    module.shared = module.first[1]
    traced = _traced_restores(_saved(module, tmp_path / "traced", False))
    meta = _saved(module, tmp_path / "nodes", True)
    assert add_graph_saver(meta, tmp_path / "nodes" / "variables" / "variables")
    nodes = {node.name: node for node in meta.graph_def.node}
    restore = nodes["tfpart_saver/restore/RestoreV2"]
    keys = [key.decode() for key in
            nodes[restore.input[1]].attr["value"].tensor.string_val]
    restored = {key: nodes[f"tfpart_saver/restore/assign_{i}"].input[0]
                for i, key in enumerate(keys)}
    assert len(restored) == 5 and restored == traced
    assert holds_only_variables(tmp_path / "nodes" / "variables" / "variables")


def test_a_table_with_contents_is_left_to_tensorflows_saver(tmp_path):
    import tensorflow as tf

    module = tf.Module()
    module.v = tf.Variable(1.0)
    module.table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1)
    meta = _saved(module, tmp_path, True)
    before = meta.SerializeToString()
    assert not holds_only_variables(tmp_path / "variables" / "variables")
    assert not add_graph_saver(meta, tmp_path / "variables" / "variables")
    assert meta.SerializeToString() == before


def test_a_model_without_variables_loads_under_the_tf1_loader(tmp_path):
    """Regression: RestoreV2 takes one tensor or more, so a saver over no variable
    restores nothing, and saves the object graph alone."""
    import tensorflow as tf

    module = tf.Module()
    module.f = tf.function(lambda x: {"y": x * 2.0},
                           input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "model"),
                        signatures={"serving_default": module.f.get_concrete_function()},
                        options=tf.saved_model.SaveOptions(experimental_skip_saver=True))
    proto = read_saved_model(tmp_path / "model")
    assert add_graph_saver(proto.meta_graphs[0], tmp_path / "model" / "variables" / "variables")
    (tmp_path / "model" / "saved_model.pb").write_bytes(proto.SerializeToString())
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(tmp_path / "model"))
        signature = meta.signature_def["serving_default"]
        assert session.run(signature.outputs["y"].name,
                           {signature.inputs["x"].name: [1.5]}).tolist() == [3.0]
        session.run(meta.saver_def.save_tensor_name,
                    {meta.saver_def.filename_tensor_name: str(tmp_path / "saved")})
    assert list(tf.train.load_checkpoint(str(tmp_path / "saved")).get_variable_to_dtype_map()) \
        == ["_CHECKPOINTABLE_OBJECT_GRAPH"]
