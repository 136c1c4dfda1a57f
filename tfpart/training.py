"""Training-step SavedModels: one signature that runs a whole training step.

:func:`export_train_step` saves a Keras model with its optimizer and loss so that the
signature ``train_step(x, y)`` runs the forward pass, the gradients (a
``tf.GradientTape`` inside the ``tf.function``) and the optimizer's update of the
variables (its slot variables and iteration counter included), and returns the
step's loss. ``serving_default(x)`` runs the model for inference and ``weights()``
returns every trainable variable, so a caller can compare models after training.
tfpart compiles ``--signature train_step`` like any other signature.

Written by hand, the same is a ``tf.Module``::

    module = tf.Module()
    module.model, module.optimizer = model, optimizer
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[x_spec, y_spec])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    tf.saved_model.save(module, path, signatures={"train_step": train_step})

The optimizer must be built (``optimizer.build``) before tracing, so its slots are
variables of the SavedModel rather than created inside the function.
"""
from __future__ import annotations

from pathlib import Path

from rewriters.tf_import import tensorflow


def export_train_step(model, optimizer, loss, path, *, batch_size=None, y_spec=None):
    """Save ``model``'s training step (and inference and weights signatures) at ``path``.

    Parameters
    ----------
    model : keras.Model
        A built model with one input and one output.
    optimizer : keras.optimizers.Optimizer
        E.g. ``keras.optimizers.SGD(0.01, momentum=0.9)`` or ``keras.optimizers.Adam()``.
    loss : str or callable
        A Keras loss (name or function) of ``(y_true, y_pred)``; the step minimises its
        mean over the batch.
    path : str or pathlib.Path
    batch_size : int, optional
        Fixes the batch dimension of the signatures (default: any).
    y_spec : tf.TensorSpec, optional
        The labels' spec (default: the model output's shape and dtype).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import keras, tempfile
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> out = export_train_step(model, keras.optimizers.SGD(0.1), "mse",
    ...                         tempfile.mkdtemp() + "/step")
    >>> import tensorflow as tf
    >>> step = tf.saved_model.load(str(out)).signatures["train_step"]
    >>> sorted(step.structured_outputs)
    ['loss']
    """
    import keras

    tf = tensorflow()
    x_spec = tf.TensorSpec([batch_size, *model.input_shape[1:]], model.inputs[0].dtype,
                           name="x")
    if y_spec is None:
        y_spec = tf.TensorSpec([batch_size, *model.output_shape[1:]], model.outputs[0].dtype,
                               name="y")
    loss_fn = keras.losses.get(loss)
    optimizer.build(model.trainable_variables)
    module = tf.Module()
    module.model, module.optimizer = model, optimizer
    variables = model.trainable_variables

    @tf.function(input_signature=[x_spec, y_spec])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(value, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return {"loss": value}

    @tf.function(input_signature=[x_spec])
    def serve(x):
        return {"output": model(x, training=False)}

    @tf.function(input_signature=[])
    def weights():
        return {f"w{i:03d}": tf.identity(v) for i, v in enumerate(variables)}

    tf.saved_model.save(module, str(path), signatures={
        "train_step": train_step, "serving_default": serve, "weights": weights})
    return Path(path)
