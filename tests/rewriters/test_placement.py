"""The placement rewriter on a hand-made proto (tests/rewriters/protos.py)."""
from rewriters.placement import place_devices
from tests.rewriters.protos import (D0, D1, HOST, nodes_of, resources_of, table, two_calls,
                                    variables_of)
from tfpart.core.plan import Plan

SPLIT = {"read": D1, "left/relu": D0, "right/relu": D1, "add": D0, "sum": D1,
         "variables/1/v": D1}


def plan_of(assignment):
    return Plan(assignment=assignment, context={"unread_variables": {"device": HOST}})


def test_every_planned_op_gets_its_device():
    placed = place_devices(two_calls(), plan_of(SPLIT), default_device=D0)
    f = nodes_of(placed, "f")
    assert {name: f[name].device for name in ("read", "add", "sum")} == \
        {"read": D1, "add": D0, "sum": D1}


def test_a_function_called_with_two_placements_is_cloned_once_per_placement():
    placed = place_devices(two_calls(), plan_of(SPLIT), default_device=D0)
    f = nodes_of(placed, "f")
    left, right = (f[name].attr["f"].func.name for name in ("left", "right"))
    assert left != right
    assert nodes_of(placed, left)["relu"].device == D0
    assert nodes_of(placed, right)["relu"].device == D1
    # the signature's own call sites run where its caller is, their bodies as planned
    assert (f["left"].device, f["right"].device) == ("", "")


def test_one_placement_needs_no_clone():
    same = dict(SPLIT, **{"right/relu": D0})
    placed = place_devices(two_calls(), plan_of(same), default_device=D0)
    f = nodes_of(placed, "f")
    assert f["left"].attr["f"].func.name == f["right"].attr["f"].func.name == "g"
    assert len(placed.meta_graphs[0].graph_def.library.function) == 2


def test_variables_get_their_planned_device_and_unread_ones_the_host():
    placed = place_devices(two_calls(), plan_of(SPLIT), default_device=D0)
    assert variables_of(placed) == {"v": D1, "w": HOST}


def test_colocation_is_kept_only_where_both_ends_share_a_device():
    placed = place_devices(two_calls(), plan_of(SPLIT), default_device=D0)
    f = nodes_of(placed, "f")
    assert "_class" not in f["add"].attr  # add on D0, read on D1
    assert list(f["sum"].attr["_class"].list.s) == [b"loc:@read"]  # both on D1


def test_ops_the_plan_does_not_name_go_to_the_default_device():
    partial = {name: device for name, device in SPLIT.items() if name != "sum"}
    placed = place_devices(two_calls(), plan_of(partial), default_device=HOST)
    assert nodes_of(placed, "f")["sum"].device == HOST


def test_the_input_proto_is_not_modified():
    original = two_calls()
    before = original.SerializeToString(deterministic=True)
    place_devices(original, plan_of(SPLIT), default_device=D0)
    assert original.SerializeToString(deterministic=True) == before


def test_a_table_lives_where_its_lookups_run_and_is_made_there():
    plan = plan_of({"resources/1": D1, "find": D1})
    placed = place_devices(table(), plan, default_device=D0)
    assert resources_of(placed) == [D1]
    assert nodes_of(placed, "f")["find"].device == D1
    assert nodes_of(placed, "create")["table"].device == D1
    top = {node.name: node.device for node in placed.meta_graphs[0].graph_def.node}
    assert top["hash_table"] == D1 and top["call"] == D1


def test_a_table_the_plan_does_not_name_stays_on_the_host():
    placed = place_devices(table(), plan_of({"find": D0}), default_device=D0)
    assert resources_of(placed) == [HOST]
    assert nodes_of(placed, "create")["table"].device == HOST
