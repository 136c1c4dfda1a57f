"""A loop the batch steers is refused micro-batches and replicas from the graph alone
(rewriters/batch_flow.py), where the random probe of rewriters/batch_check.py happens
to see nothing: without ``--verify``, a wrong model would be written."""
import json

import pytest


def _export_batch_max_loop(path):
    """Halves the batch until its largest magnitude is at most 1: every sample takes as
    many trips as the batch's largest needs. On the probe's 3 and 2 rows, whose largest
    magnitude is in the last 2, both runs take the same trips."""
    import tensorflow as tf

    class Halving(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            _, h = tf.while_loop(lambda i, h: tf.reduce_max(tf.abs(h)) > 1.0,
                                 lambda i, h: (i + 1, h * 0.5), [tf.constant(0), x])
            return {"y": h}

    module = Halving()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


@pytest.mark.slow
@pytest.mark.any_onednn
def test_micro_batches_of_a_batch_wide_loop_are_refused_in_one_line(tmp_path, capsys):
    from tests.conftest import local_cluster
    from tfpart.cli import main

    model = _export_batch_max_loop(tmp_path / "model")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(local_cluster(2)))
    out = tmp_path / "out"
    code = main(["compile", str(model), "--batch-size", "4", "--cluster", str(cluster),
                 "--microbatches", "2", "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "op PartitionedCall/while mixes the samples of a batch" in err, err
    assert "stop condition depends on Max over the batch" in err, err
    assert "Traceback" not in err and not out.exists()
