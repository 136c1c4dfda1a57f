"""Run a compiled training step in this process only and print, as JSON, how far its
peak resident memory rose above the memory held once the model was loaded
(``python -m tests.memory_peak OUT STEPS``): what tests/e2e/test_training.py compares
between pipeline schedules."""
import json
import sys
from pathlib import Path


def resident(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field}")


def main(out, steps):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    from tfpart.runtime import load, random_inputs, runnable

    with runnable(out, None, False) as (plan, _, local_dir, _):
        step = load(local_dir).signatures[plan.context["signature"]]
        inputs = random_inputs(step, plan.context["batch_size"], 0)
        loaded = resident("VmRSS")
        for _ in range(int(steps)):
            step(**inputs)["loss"].numpy()
        print(json.dumps({"growth_bytes": resident("VmHWM") - loaded}))


if __name__ == "__main__":
    main(*sys.argv[1:])
