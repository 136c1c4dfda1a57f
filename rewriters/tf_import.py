"""Import TensorFlow once, quietly (the package ``__init__`` silences its C++ logs)."""


def tensorflow():
    """The ``tensorflow`` module (imported on first use: 2-5 s of start-up)."""
    import tensorflow as tf  # noqa: PLC0415 - deliberately lazy

    return tf
