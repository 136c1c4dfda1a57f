"""A compile reads the signature once: each flattening (every function inlined into one
graph, :mod:`rewriters.flatten`) is counted. The batch-mixing probe, a training step's
regions (which compare two batch sizes) and the pipeline pass start from the reader's
flattening (``rewriters.flatten.flat_at``) instead of inlining again."""
import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR


@pytest.fixture
def flattenings(monkeypatch):
    import rewriters.flatten as flatten

    counted = []
    check_size = flatten._Inliner._check_size  # once per flattening, before inlining

    def counting(inliner, function):
        counted.append(function)
        return check_size(inliner, function)

    monkeypatch.setattr(flatten._Inliner, "_check_size", counting)
    return counted


def test_a_pipelined_compile_flattens_the_signature_once(tmp_path, flattenings):
    from tfpart.compile import compile_model

    result = compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, tmp_path / "out",
                           batch_size=8, strategy="pipeline")
    assert result.plan.stages and result.plan.microbatches > 1
    # before: reading it, the batch-mixing probe (at its own batch size), the pipeline
    # pass: three (four before the pass took the tables' devices from its flattening)
    assert len(flattenings) == 1, flattenings


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_pipelined_training_step_flattens_it_once(tmp_path, flattenings):
    from examples.models import export_training_step
    from tfpart.compile import compile_model

    model = export_training_step(tmp_path / "model", "mlp", "adam")
    flattenings.clear()
    result = compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "out", batch_size=8,
                           signature="train_step", strategy="pipeline", microbatches=2)
    assert result.plan.stages and result.info.training
    # before: reading it, its regions at two batch sizes, the pipeline pass and its
    # regions again at two batch sizes: six
    assert len(flattenings) == 1, flattenings
