"""The TF1 placement rewriter on a hand-made TF1 SavedModel proto: a graph with a ref
variable, its initializer and saver, and a control-flow v2 ``If`` whose branches are
library functions."""
from google.protobuf import text_format

from rewriters.tf1_placement import place_tf1_devices
from tests.rewriters.protos import D0, D1, HOST, nodes_of
from tfpart.core.plan import Plan

SAVER = "/device:CPU:0"
TF1 = f"""
meta_graphs {{
  graph_def {{
    node {{ name: "x" op: "Placeholder" }}
    node {{ name: "w" op: "VariableV2" attr {{ key: "_class" value {{ list {{ s: "loc:@w" }} }} }} }}
    node {{ name: "w/Assign" op: "Assign" input: "w" input: "w/init"
           attr {{ key: "_class" value {{ list {{ s: "loc:@w" }} }} }} }}
    node {{ name: "w/init" op: "Const" attr {{ key: "_class" value {{ list {{ s: "loc:@w" }} }} }} }}
    node {{ name: "w/read" op: "Identity" input: "w"
           attr {{ key: "_class" value {{ list {{ s: "loc:@w" }} }} }} }}
    node {{ name: "unread" op: "VariableV2" }}
    node {{ name: "MatMul" op: "MatMul" input: "x" input: "w/read" }}
    node {{ name: "cond" op: "StatelessIf" input: "p" input: "MatMul"
           attr {{ key: "then_branch" value {{ func {{ name: "double" }} }} }}
           attr {{ key: "else_branch" value {{ func {{ name: "double" }} }} }} }}
    node {{ name: "p" op: "Placeholder" }}
    node {{ name: "save/SaveV2" op: "SaveV2" input: "w" device: "{SAVER}" }}
    node {{ name: "save/Assign" op: "Assign" input: "w" input: "save/SaveV2"
           attr {{ key: "_class" value {{ list {{ s: "loc:@w" }} }} }} }}
    node {{ name: "init" op: "NoOp" input: "^w/Assign" }}
    library {{
      function {{
        signature {{ name: "double" input_arg {{ name: "a" type: DT_FLOAT }}
                    output_arg {{ name: "b" type: DT_FLOAT }} }}
        node_def {{ name: "add" op: "AddV2" input: "a" input: "a" }}
        ret {{ key: "b" value: "add:z:0" }}
      }}
    }}
  }}
  signature_def {{ key: "serving_default"
                  value {{ outputs {{ key: "y" value {{ name: "cond:0" }} }} }} }}
}}
"""


def tf1_model():
    from tensorflow.core.protobuf import saved_model_pb2

    return text_format.Parse(TF1, saved_model_pb2.SavedModel())


def devices(proto):
    return {node.name: node.device for node in proto.meta_graphs[0].graph_def.node}


PLAN = Plan(assignment={"x": D0, "w": D1, "w/read": D1, "MatMul": D0, "p": D0, "cond": D0},
            context={"unread_variables": {"device": HOST}})


def test_planned_nodes_get_their_device_and_a_variable_takes_its_initializer_along():
    placed = devices(place_tf1_devices(tf1_model(), PLAN, D0))
    assert (placed["w"], placed["w/read"], placed["MatMul"], placed["cond"]) == (D1, D1, D0, D0)
    assert placed["w/Assign"] == placed["w/init"] == placed["save/Assign"] == D1
    assert placed["unread"] == HOST
    assert placed["save/SaveV2"] == SAVER  # the saver's ops stay on the host CPU
    assert placed["init"] == D0


def test_control_flow_bodies_run_on_their_op_device():
    placed = place_tf1_devices(tf1_model(), PLAN, D0)
    assert nodes_of(placed, "double")["add"].device == D0


def test_the_input_is_left_alone():
    model = tf1_model()
    place_tf1_devices(model, PLAN, D0)
    assert set(devices(model).values()) == {"", SAVER}
