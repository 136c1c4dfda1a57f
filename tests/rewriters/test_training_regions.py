"""Regions of a training step, from hand-made op lists: what runs per micro-batch, what
is accumulated, what runs once, and what makes micro-batching wrong."""
from rewriters.training_regions import classify

BATCHED = {"x:0", "h:0", "l:0", "centred:0"}


def ops_of_a_step(loss_ops, update_inputs=("dw:0",)):
    """x -> h = x.w -> per-sample losses l -> ``loss_ops``; dw from x; an SGD update."""
    return [("x", "Placeholder", [], [], ["x:0"]),
            ("w", "VarHandleOp", [], [], ["w:0"]),
            ("read", "ReadVariableOp", ["w:0"], [], ["read:0"]),
            ("h", "MatMul", ["x:0", "read:0"], [], ["h:0"]),
            ("l", "Square", ["h:0"], [], ["l:0"]),
            *loss_ops,
            ("seed", "Fill", [], [], ["seed:0"]),
            ("dw", "MatMul", ["x:0", "seed:0"], [], ["dw:0"]),
            ("update", "AssignSubVariableOp", ["w:0", *update_inputs], ["read"], []),
            ("noop", "NoOp", [], ["update"], []),
            ("out", "Identity", ["loss:0"], ["noop"], ["out:0"])]


def test_a_loss_written_as_a_sum_over_a_count_is_accumulated_whole():
    """Sum and Size of a micro-batch are not means: the division joins the
    per-micro-batch ops, so only the micro-batch's mean loss is accumulated."""
    regions = classify(ops_of_a_step([("sum", "Sum", ["l:0"], [], ["sum:0"]),
                                      ("size", "Size", ["l:0"], [], ["size:0"]),
                                      ("loss", "RealDiv", ["sum:0", "size:0"], [],
                                       ["loss:0"])]), BATCHED, ["out:0"])
    assert regions.phase["loss"] == "forward"
    assert regions.boundary == {"loss:0", "dw:0"}
    assert regions.phase["update"] == regions.phase["out"] == "update"
    assert regions.is_training and regions.nonlinear == [] and regions.misplaced_writes == []


def test_batch_statistics_feeding_the_samples_again_are_named():
    regions = classify(ops_of_a_step([("mean", "Mean", ["h:0"], [], ["mean:0"]),
                                      ("centred", "Sub", ["h:0", "mean:0"], [],
                                       ["centred:0"]),
                                      ("loss", "Mean", ["centred:0"], [], ["loss:0"])]),
                       BATCHED, ["out:0"])
    assert regions.nonlinear == ["mean"]  # not the loss, not the weight gradient


def test_a_write_the_forward_pass_waits_for_is_reported():
    ops = ops_of_a_step([("loss", "Mean", ["l:0"], [], ["loss:0"])])
    ops.insert(2, ("reset", "AssignVariableOp", ["w:0", "seed:0"], [], []))
    ops = [(n, t, i, [*c, "reset"] if n == "read" else c, o) for n, t, i, c, o in ops]
    ops.insert(2, ops.pop(next(k for k, op in enumerate(ops) if op[0] == "seed")))
    regions = classify(ops, BATCHED, ["out:0"])
    assert regions.misplaced_writes == ["reset"]


def test_a_signature_without_writes_is_not_a_training_step():
    ops = [("x", "Placeholder", [], [], ["x:0"]), ("y", "Relu", ["x:0"], [], ["y:0"])]
    regions = classify(ops, {"x:0", "y:0"}, ["y:0"])
    assert not regions.is_training and regions.phase == {"x": "forward", "y": "forward"}
