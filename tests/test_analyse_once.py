"""A compile reads the signature as few times as it can: each flattening (every
function inlined into one graph, :mod:`rewriters.flatten`) is counted."""
from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR


def test_a_pipelined_compile_flattens_the_signature_three_times_at_most(tmp_path,
                                                                          monkeypatch):
    import rewriters.flatten as flatten
    from tfpart.compile import compile_model

    flattened = []
    check_size = flatten._Inliner._check_size  # once per flattening, before inlining

    def counted(inliner, function):
        flattened.append(function)
        return check_size(inliner, function)

    monkeypatch.setattr(flatten._Inliner, "_check_size", counted)
    result = compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, tmp_path / "out",
                           batch_size=8, strategy="pipeline")
    assert result.plan.stages
    # reading it, the batch-mixing probe (at its own batch size), the pipeline pass;
    # four before the pass took the tables' devices from its own flattening
    assert 1 <= len(flattened) <= 3, flattened
