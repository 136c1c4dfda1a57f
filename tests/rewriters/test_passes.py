"""The ordered list of rewriters: which passes run for which plan, in order."""
from pathlib import Path

from rewriters.passes import REWRITERS, Rewriter, run_rewriters
from rewriters.savedmodel_io import SavedModelParts
from tests.rewriters.protos import D0, D1, HOST, nodes_of, two_calls
from tfpart.core.plan import Plan


def test_a_placement_plan_runs_the_placement_pass_only(tmp_path):
    plan = Plan(assignment={"read": D1, "left/relu": D0, "right/relu": D0, "add": D0,
                            "sum": D0, "variables/1/v": D1},
                context={"devices": [D0, D1], "unread_variables": {"device": HOST}})
    ran = []
    model = SavedModelParts(two_calls(), Path("model"))
    result = run_rewriters(model, plan, tmp_path, progress=ran.append)
    assert ran == ["device placement"]
    assert result.directory == Path("model")  # variables are the input's own
    assert nodes_of(result.proto, "f")["read"].device == D1
    assert list(tmp_path.iterdir()) == []  # the placement pass writes no files


def test_passes_run_in_list_order_and_feed_each_other(tmp_path):
    def tag(label):
        def rewrite(model, plan, workdir):
            proto = type(model.proto)()
            proto.CopyFrom(model.proto)
            proto.meta_graphs[0].meta_info_def.tags.append(label)
            return SavedModelParts(proto, model.directory)
        return Rewriter(label, lambda plan: True, rewrite)

    skipped = Rewriter("never", lambda plan: False, None)
    model = SavedModelParts(two_calls(), Path("model"))
    result = run_rewriters(model, Plan(assignment={}), tmp_path,
                           [tag("first"), skipped, tag("second")])
    assert list(result.proto.meta_graphs[0].meta_info_def.tags) == ["first", "second"]
    assert list(model.proto.meta_graphs[0].meta_info_def.tags) == []


def test_pipeline_stages_come_before_placement_and_exclude_it():
    names = [r.name for r in REWRITERS]
    assert names.index("pipeline stages") < names.index("device placement")
    staged = Plan(assignment={"a": D0}, stages={"a": 0})
    assert [r.name for r in REWRITERS if r.applies(staged)] == ["pipeline stages"]
