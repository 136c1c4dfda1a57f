"""A compiled model is a drop-in replacement whatever the strategy (issue 36): every
signature and every method of the original is in the output, with the original's input
and output structure, and gives the original's results; plan.json says how the ones
tfpart did not optimise run."""
import json

import numpy as np
import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR
from tfpart.compile import compile_model

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]

STRATEGIES = {"greedy": {}, "pipeline": {"pipeline": True, "microbatches": 2},
              "data_parallel": {"algorithm": "data_parallel", "options": {"replicas": 2}},
              "filter_split": {"algorithm": "filter_split"}}


def _structure(function):
    """Input names, shapes and dtypes, and the output structure of a signature."""
    import tensorflow as tf

    inputs = {k: (s.shape.as_list(), s.dtype.name)
              for k, s in function.structured_input_signature[1].items()}
    outputs = tf.nest.map_structure(lambda s: (s.shape.as_list(), s.dtype.name),
                                    function.structured_outputs)
    return inputs, outputs


def _assert_drop_in(original_dir, out, calls):
    import tensorflow as tf

    from tfpart.runtime import load

    original, compiled = tf.saved_model.load(str(original_dir)), load(out)
    assert sorted(compiled.signatures) == sorted(original.signatures)
    for name in original.signatures:
        assert _structure(compiled.signatures[name]) == _structure(original.signatures[name])
    for call in calls:
        want, got = call(original), call(compiled)
        assert tf.nest.map_structure(lambda t: t.shape, got) == \
            tf.nest.map_structure(lambda t: t.shape, want)
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def _devices_run(call, out, **inputs):
    """The devices TensorFlow ran ``call(model, **inputs)``'s ops on, the compiled
    model ``out`` loaded with its devices."""
    from tfpart.runtime import load
    from tfpart.verification import run_with_placement

    model = load(out)
    _, placed, _ = run_with_placement(lambda **feed: call(model, **feed), inputs)
    return set(placed.values())


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_two_signature_module_keeps_both_and_its_methods(strategy, exported, tmp_path):
    import tensorflow as tf

    model, out = exported("two_signature_module"), tmp_path / "out"
    result = compile_model(model, DEFAULT_CLUSTER_FILE, out, batch_size=4, verify=True,
                           **STRATEGIES[strategy])
    assert result.verification.other_signatures == {"embed": "equal"}
    x = tf.constant(np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32))
    _assert_drop_in(model, out, [lambda m: m.signatures["serving_default"](x=x),
                                 lambda m: m.signatures["embed"](x=x),
                                 lambda m: m.embed(x), lambda m: m(x)])
    if result.plan.reimported:
        kept = json.loads((out / "plan.json").read_text())["context"]["kept"]
        assert kept["signatures"] == ["embed"] and kept["endpoints"] == ["embed"]
        assert kept["compiled_endpoints"] == ["__call__"]
        assert len(_devices_run(lambda m, x: m(x), out, x=x)) > 1


@pytest.mark.parametrize("strategy", ["pipeline", "data_parallel"])
def test_xla_compiled_signatures_and_methods_are_kept_running_without_xla(strategy, exported,
                                                                           tmp_path):
    """Regression: signatures and methods that call a ``jit_compile`` function were
    dropped from pipelined and replicated outputs (XLA reads variables only on its own
    device). They are kept, run without XLA, and plan.json says so."""
    import tensorflow as tf

    model, out = exported("xla_module"), tmp_path / "out"
    result = compile_model(model, DEFAULT_CLUSTER_FILE, out, batch_size=4, verify=True,
                           **STRATEGIES[strategy])
    assert result.verification.other_signatures == {"features": "equal"}
    kept = json.loads((out / "plan.json").read_text())["context"]["kept"]
    assert kept["endpoints"] == ["block", "features"] and kept["compiled_endpoints"] == ["__call__"]
    assert sorted(kept["without_xla"]) == ["block", "features"]
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((5, 16)).astype(np.float32))
    h = tf.constant(rng.standard_normal((5, 64)).astype(np.float32))
    _assert_drop_in(model, out, [lambda m: m.signatures["features"](x=x), lambda m: m(x),
                                 lambda m: m.features(x), lambda m: m.block(h)])


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_keras_model_keeps_serve(strategy, tmp_path):
    import tensorflow as tf

    out = tmp_path / "out"
    result = compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, out, batch_size=4,
                           **STRATEGIES[strategy])
    x = tf.constant(np.random.default_rng(2).standard_normal((5, 32, 32, 3)).astype(np.float32))
    _assert_drop_in(DEFAULT_MODEL_DIR, out, [lambda m: m.serve(x),
                                             lambda m: m.signatures["serve"](image=x)])
    if not result.plan.reimported:  # placed in place: every function is the original's
        return
    # Keras's serve and its serve signature are the compiled signature's own function
    kept = json.loads((out / "plan.json").read_text())["context"]["kept"]
    assert kept["compiled_signatures"] == ["serve"] and kept["compiled_endpoints"] == ["serve"]
    compiled_devices = _devices_run(lambda m, image: m.serve(image), out, image=x)
    assert compiled_devices == _devices_run(
        lambda m, image: m.signatures["serving_default"](image=image), out, image=x)
    assert len(compiled_devices) > 1


def test_a_model_run_before_leaves_nothing_in_the_next_verification(exported, tmp_path):
    """Regression: TensorFlow reported a data-parallel output's function, run here
    before at a new batch size, with the next run's metadata, so the verification of a
    placement of the same model found its ops on the replica's device."""
    import tensorflow as tf

    from tfpart.runtime import load

    model = exported("two_signature_module")
    compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "dp", batch_size=4, verify=True,
                  **STRATEGIES["data_parallel"])
    load(tmp_path / "dp").signatures["serving_default"](x=tf.ones((3, 16)))
    result = compile_model(model, DEFAULT_CLUSTER_FILE, tmp_path / "placed", batch_size=4,
                           verify=True)
    assert result.verification.op_mismatches == [] and result.verification.ops_checked > 0
