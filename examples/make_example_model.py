"""Export the shipped example model: a small Keras CNN with a residual branch.

Run from the repository root: ``python examples/make_example_model.py``.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from profiles import DEFAULT_MODEL_DIR  # noqa: E402


def residual_cnn(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 3), name="image")
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    for width in (32, 64):
        shortcut = keras.layers.Conv2D(width, 1, padding="same")(x)
        y = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        y = keras.layers.Conv2D(width, 3, padding="same")(y)
        x = keras.layers.Activation("relu")(keras.layers.Add()([shortcut, y]))
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs, name="residual_cnn")


if __name__ == "__main__":
    residual_cnn().export(str(DEFAULT_MODEL_DIR))
