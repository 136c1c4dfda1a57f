"""Run a compiled training step in this process only and print, as JSON, how far
TensorFlow's CPU allocator's bytes in use rise during a step above what it holds
between steps (``python -m tests.memory_peak OUT STEPS``): what
tests/e2e/test_training.py compares between pipeline schedules. TensorFlow keeps these
statistics for its BFC allocator, which ``TF_CPU_ALLOCATOR_USE_BFC=true`` selects for
CPUs (set here); two warm-up steps build the functions before the peak is reset.
(A process's resident set, the other measure at hand, moved by ±50 MB between runs of
one model.)"""
import json
import os
import sys


def main(out, steps):
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    from tfpart.runtime import load, random_inputs, runnable

    with runnable(out) as compiled:
        plan = compiled.plan
        step = load(compiled.directory).signatures[plan.context["signature"]]
        inputs = random_inputs(step, plan.context["batch_size"], 0)
        for _ in range(2):
            step(**inputs)["loss"].numpy()
        tf.config.experimental.reset_memory_stats("CPU:0")
        held = tf.config.experimental.get_memory_info("CPU:0")["current"]
        for _ in range(int(steps)):
            step(**inputs)["loss"].numpy()
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        print(json.dumps({"growth_bytes": peak - held}))


if __name__ == "__main__":
    main(*sys.argv[1:])
