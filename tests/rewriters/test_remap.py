"""The device-remapping rewriter on a hand-made proto (tests/rewriters/protos.py)."""
from rewriters.placement import place_devices
from rewriters.remap import local_device_map, remap_devices
from tests.rewriters.protos import (D0, D1, HOST, nodes_of, resources_of, table, two_calls,
                                    variables_of)
from tfpart.core.plan import Plan

GPU = "/job:worker/replica:0/task:1/device:GPU:0"


def test_every_node_and_variable_moves_by_the_map_and_others_stay():
    plan = Plan(assignment={"read": GPU, "left/relu": GPU, "right/relu": GPU, "add": GPU,
                            "sum": D1, "variables/1/v": GPU},
                context={"unread_variables": {"device": HOST}})
    placed = place_devices(two_calls(), plan, default_device=GPU)
    remapped = remap_devices(placed, {GPU: D0})
    f = nodes_of(remapped, "f")
    assert (f["read"].device, f["add"].device, f["sum"].device) == (D0, D0, D1)
    assert variables_of(remapped) == {"v": D0, "w": HOST}
    assert nodes_of(placed, "f")["read"].device == GPU  # the input is left alone


def test_local_map_sends_device_i_to_logical_cpu_i():
    mapping = local_device_map([GPU, D1])
    assert mapping == {GPU: D0, D1: D1}


def test_tables_move_by_the_map_too():
    placed = place_devices(table(), Plan(assignment={"resources/1": GPU, "find": GPU}),
                           default_device=GPU)
    remapped = remap_devices(placed, {GPU: D1})
    assert resources_of(remapped) == [D1]
    assert nodes_of(remapped, "create")["table"].device == D1
