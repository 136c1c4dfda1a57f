"""Models bigger than a device: a model compiled for three worker processes that each
hold 0.6 x its predicted single-device peak, as an op placement and as a pipeline, is
verified against the original, and every worker's allocator peak (measured,
:mod:`tfpart.memory_stats`) stays within that worker's memory.

The models are the cases of issue 37 (Keras applications at batch 2, as the model zoo
benchmark builds them, and a stacked LSTM), whose variables make up most of their peak.
The measured peak is held to the memory only where the prediction is close enough for
the 10% the compile keeps free (``tfpart.compile.MEMORY_HEADROOM``): on MobileNetV2 a
worker's allocator holds 1.4 MB (32%) more than its 4.3 MB of variables right after the
model is restored (the BFC allocator leaves chunks of less than twice a request
unsplit); see BENCHMARKS.md. For the LSTM the cost model counts the trips its loops
run ahead, its TensorLists and the allocator's 256-byte chunks (``rewriters.loops``,
``tfpart.core.dtypes.chunk_bytes``), but its workers' peaks vary from run to run.
Where a model's activations dominate (the small example CNNs at any batch), 0.6 x the
peak is below what its largest op needs with its inputs and outputs, and the compile
refuses with that bound (tests/partitioner/test_memory_models.py)."""
import json

import pytest

from benchmarks.memory_accuracy import run_and_measure
from tfpart.core.cluster import normalize_device_name

FRACTION = 0.6
# (exporter in examples.models, its arguments, batch size, the fraction of the peak each
# worker holds, whether the measured peak is held to the memory). The LSTM gets 0.8: its
# second loop alone, with its 33.3 KB of variables and the input projections of the 12
# trips TensorFlow runs ahead, needs 59.0 KB, more than a worker's 55.0 KB at 0.6; its
# placement fits from 0.7, its pipeline's stages from 0.8. Its measured peaks are not
# held to the memory: at a few kilobytes they vary from run to run with how many trips
# run ahead (a pipeline worker measured 65 KB and 84 KB in two runs of one plan).
MODELS = {
    "DenseNet121": ("export_keras_application", ("DenseNet121", 32, 10), 2, FRACTION, True),
    "MobileNetV2": ("export_keras_application", ("MobileNetV2", 32, 10), 2, FRACTION, False),
    "stacked_lstm": ("export_stacked_lstm", (), 2, 0.8, False),
}


def single_device_peak(model, batch):
    """The predicted peak of the model alone on one device of the default cluster, and
    the bytes of the variables its signature never reads (a Keras export's second copy,
    kept on the first device's host: on a CPU cluster, that device)."""
    from profiles import DEFAULT_CLUSTER_FILE
    from tfpart.core.cluster import load_cluster
    from tfpart.compile import plan_model

    plan = plan_model(model, load_cluster(DEFAULT_CLUSTER_FILE), batch_size=batch,
                      algorithm="single")[0]
    unread = plan.context["unread_variables"]["bytes"]
    return sum(d.peak_memory_bytes for d in plan.predicted.devices.values()) - unread, unread


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_fits_three_workers_of_six_tenths_of_its_peak(name, tmp_path):
    import examples.models as models
    from tfpart.compile import compile_model
    from tfpart.local_workers import LocalWorkers

    exporter, args, batch, fraction, measured_fits = MODELS[name]
    model = tmp_path / "model"
    getattr(models, exporter)(model, *args)
    peak, unread = single_device_peak(model, batch)
    memory = int(fraction * peak)
    with LocalWorkers(3, tmp_path, memory_stats=True) as workers:
        cluster = json.loads(workers.path.read_text())
        for device in cluster["devices"]:
            device["memory"] = memory
        cluster["devices"][0]["memory"] += unread  # the host of the unread copy
        cluster_file = tmp_path / "small.json"
        cluster_file.write_text(json.dumps(cluster))
        for strategy, options in {"placement": {}, "pipeline": {"pipeline": True}}.items():
            out = tmp_path / strategy
            result = compile_model(model, cluster_file, out, batch_size=batch,
                                   verify=True, **options)
            report = result.verification
            assert report.outputs_equal and not report.op_mismatches, strategy
            predicted = {name: d.peak_memory_bytes
                         for name, d in result.plan.predicted.devices.items()}
            capacity = {name: d.memory_bytes
                        for name, d in result.plan.predicted.devices.items()}
            assert all(predicted[name] <= capacity[name] for name in predicted)
            assert sum(1 for p in predicted.values() if p > 0) >= 2, predicted  # spread
            _, peaks, _ = run_and_measure(workers, out, 2)
            measured = {normalize_device_name(d): f["peak"] - f["start"]
                        for d, f in peaks.items()}
            print(name, strategy, {d[-18:]: (round(predicted[d] / 1e6, 3),
                                             round(measured[d] / 1e6, 3),
                                             round(capacity[d] / 1e6, 3)) for d in predicted})
            assert all(measured[d] > 0 for d in predicted if predicted[d] > 0), measured
            if measured_fits:
                assert all(measured[d] <= capacity[d] for d in predicted), (strategy, measured)
