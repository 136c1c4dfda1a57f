"""Small hand-made SavedModel protos for the rewriters' unit tests, written as text so
each test shows exactly what the rewriter sees.

The model computes ``y = g(x) + g(read(v))`` in function ``f``, where ``g`` is one
function called from two call sites (``left``, ``right``) and ``v`` a variable; the
signature ``serving_default`` is the call node ``call`` of the top-level graph, and
object-graph node 1 is the variable (OpGraph name ``variables/1/v``), node 2 a
variable the signature never reads.
"""
from google.protobuf import text_format

D0 = "/job:localhost/replica:0/task:0/device:CPU:0"
D1 = "/job:localhost/replica:0/task:0/device:CPU:1"
HOST = "/job:localhost/replica:0/task:0/device:CPU:2"

TWO_CALLS = """
meta_graphs {
  graph_def {
    node { name: "x" op: "Placeholder" }
    node { name: "v" op: "VarHandleOp" }
    node { name: "call" op: "StatefulPartitionedCall" input: "x" input: "v"
           attr { key: "f" value { func { name: "f" } } } }
    library {
      function {
        signature { name: "f"
                    input_arg { name: "x" type: DT_FLOAT }
                    input_arg { name: "v" type: DT_RESOURCE }
                    output_arg { name: "y" type: DT_FLOAT } }
        node_def { name: "read" op: "ReadVariableOp" input: "v" }
        node_def { name: "left" op: "PartitionedCall" input: "x"
                   attr { key: "f" value { func { name: "g" } } } }
        node_def { name: "right" op: "PartitionedCall" input: "read:value:0"
                   attr { key: "f" value { func { name: "g" } } } }
        node_def { name: "add" op: "AddV2" input: "left:output:0" input: "right:output:0"
                   attr { key: "_class" value { list { s: "loc:@read" } } } }
        node_def { name: "sum" op: "AddV2" input: "add:z:0" input: "read:value:0"
                   attr { key: "_class" value { list { s: "loc:@read" } } } }
        ret { key: "y" value: "sum:z:0" }
      }
      function {
        signature { name: "g"
                    input_arg { name: "a" type: DT_FLOAT }
                    output_arg { name: "b" type: DT_FLOAT } }
        node_def { name: "relu" op: "Relu" input: "a" }
        ret { key: "b" value: "relu:activations:0" }
      }
    }
  }
  signature_def { key: "serving_default"
                  value { outputs { key: "y" value { name: "call:0" } } } }
  object_graph_def {
    nodes { children { node_id: 1 local_name: "v" } children { node_id: 2 local_name: "w" } }
    nodes { variable { name: "v" dtype: DT_FLOAT } }
    nodes { variable { name: "w" dtype: DT_FLOAT } }
  }
}
"""


def two_calls():
    """A fresh SavedModel proto of :data:`TWO_CALLS`."""
    from tensorflow.core.protobuf import saved_model_pb2

    return text_format.Parse(TWO_CALLS, saved_model_pb2.SavedModel())


def nodes_of(proto, function):
    """``{node name: NodeDef}`` of ``function`` in ``proto``'s library."""
    for fdef in proto.meta_graphs[0].graph_def.library.function:
        if fdef.signature.name == function:
            return {node.name: node for node in fdef.node_def}
    raise KeyError(function)


def variables_of(proto):
    """``{variable name: device}`` from the object graph."""
    return {obj.variable.name: obj.variable.device
            for obj in proto.meta_graphs[0].object_graph_def.nodes
            if obj.HasField("variable")}


TABLE = """
meta_graphs {
  graph_def {
    node { name: "keys" op: "Placeholder" }
    node { name: "hash_table" op: "HashTableV2" }
    node { name: "Const" op: "Const" }
    node { name: "call" op: "StatefulPartitionedCall" input: "keys" input: "hash_table"
           input: "Const" attr { key: "f" value { func { name: "f" } } } }
    library {
      function {
        signature { name: "f"
                    input_arg { name: "keys" type: DT_STRING }
                    input_arg { name: "table" type: DT_RESOURCE }
                    input_arg { name: "default" type: DT_INT64 }
                    output_arg { name: "ids" type: DT_INT64 } }
        node_def { name: "find" op: "LookupTableFindV2" input: "table" input: "keys"
                   input: "default" }
        ret { key: "ids" value: "find:values:0" }
      }
      function {
        signature { name: "create" output_arg { name: "handle" type: DT_RESOURCE } }
        node_def { name: "table" op: "HashTableV2" }
        ret { key: "handle" value: "table:table_handle:0" }
      }
    }
  }
  signature_def { key: "serving_default"
                  value { outputs { key: "ids" value { name: "call:0" } } } }
  object_graph_def {
    nodes { children { node_id: 1 local_name: "table" } }
    nodes { resource { } children { node_id: 3 local_name: "_create_resource" } }
    nodes { constant { operation: "Const" } }
    nodes { bare_concrete_function { concrete_function_name: "create" } }
    concrete_functions { key: "f" value { bound_inputs: 1 bound_inputs: 2 } }
    concrete_functions { key: "create" value { } }
  }
}
"""


def table():
    """A fresh SavedModel proto of :data:`TABLE`: ``ids = lookup(table, keys)`` in
    function ``f``, the table (object 1, OpGraph name ``resources/1``) made by function
    ``create``, its default value a captured constant (object 2)."""
    from tensorflow.core.protobuf import saved_model_pb2

    return text_format.Parse(TABLE, saved_model_pb2.SavedModel())


def resources_of(proto):
    """``[device]`` of each resource of the object graph, in order."""
    return [obj.resource.device for obj in proto.meta_graphs[0].object_graph_def.nodes
            if obj.HasField("resource")]
