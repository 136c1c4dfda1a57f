"""Import TensorFlow once, quietly (its C++ start-up logging is noise for a CLI)."""
import os


def tensorflow():
    """The ``tensorflow`` module, with C++ info and warning logs silenced."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("GLOG_minloglevel", "2")  # absl's start-up INFO lines
    import tensorflow as tf  # noqa: PLC0415 - deliberately lazy: 2-5 s start-up

    return tf
