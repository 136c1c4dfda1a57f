"""Training-step SavedModels: one signature that runs a whole training step.

:func:`export_train_step` saves a Keras model with its optimizer and loss so that the
signature ``train_step(x, y)`` runs the forward pass, the gradients (a
``tf.GradientTape`` inside the ``tf.function``) and the optimizer's update of the
variables (its slot variables and iteration counter included), and returns the
step's loss. ``serving_default(x)`` runs the model for inference and ``weights()``
returns every trainable variable, so a caller can compare models after training.
tfpart compiles ``--signature train_step`` like any other signature.

Two more signatures hold no state, for asynchronous training on parameter servers
(:mod:`tfpart.trainer.asynchronous`), where the weights live apart from the model:
``gradients(x, y, w000, w001, …)`` returns the loss and the gradients ``g000, …`` at
the given weights, and ``predict(x, w000, …)`` the model's output at them. Both use
Keras 3's ``stateless_call``; non-trainable state (batch-norm statistics) is frozen
into them at its exported value.

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

    Besides ``train_step``, ``serving_default`` and ``weights``, two stateless
    signatures serve ``tfpart train``'s asynchronous modes: ``gradients(x, y, w…, s…)``
    (the loss, the gradient ``g…`` of every weight, and the model's non-trainable
    state ``s…``, batch normalisation's moving statistics, as the step leaves it) and
    ``predict(x, w…, s…)``; a model with such state also gets a ``states`` signature
    (its values now).

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
    >>> loaded = tf.saved_model.load(str(out))
    >>> w = loaded.signatures["weights"]()
    >>> g = loaded.signatures["gradients"](x=tf.ones([3, 4]), y=tf.zeros([3, 2]), **w)
    >>> sorted(g)
    ['g000', 'g001', 'loss']
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

    w_specs = [tf.TensorSpec(v.shape, v.dtype, name=f"w{i:03d}")
               for i, v in enumerate(variables)]
    states = model.non_trainable_variables
    module.states = list(states)  # some (a seed generator's) are tracked by no layer
    s_specs = [tf.TensorSpec(v.shape, v.dtype, name=f"s{i:03d}")
               for i, v in enumerate(states)]
    count = len(w_specs)

    @tf.function(input_signature=[x_spec, y_spec, *w_specs, *s_specs])
    def gradients(x, y, *ws):
        w, s = list(ws[:count]), list(ws[count:])
        with tf.GradientTape() as tape:
            tape.watch(w)
            output, new_states = model.stateless_call(w, s, x, training=True)
            value = tf.reduce_mean(loss_fn(y, output))
        return {"loss": value, **{f"g{i:03d}": g for i, g in
                                  enumerate(tape.gradient(value, w))},
                **{f"s{i:03d}": tf.identity(n) for i, n in enumerate(new_states)}}

    @tf.function(input_signature=[x_spec, *w_specs, *s_specs])
    def predict(x, *ws):
        return {"output": model.stateless_call(list(ws[:count]), list(ws[count:]), x,
                                               training=False)[0]}

    signatures = {"train_step": train_step, "serving_default": serve, "weights": weights,
                  "gradients": gradients, "predict": predict}
    if states:
        signatures["states"] = tf.function(input_signature=[])(
            lambda: {f"s{i:03d}": tf.identity(v) for i, v in enumerate(states)})
    tf.saved_model.save(module, str(path), signatures=signatures)
    return Path(path)


def weight_variable_ops(model_dir, signature="weights"):
    """The variable op of each output of ``model_dir``'s ``weights`` signature (or
    ``states``), in the order of its keys: a pipelined compile keeps only its compiled
    signature, and its variables by op name (``variables_by_op``).

    Examples
    --------
    >>> import keras, tempfile
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> out = export_train_step(model, keras.optimizers.SGD(0.1), "mse",
    ...                         tempfile.mkdtemp() + "/step")
    >>> len(weight_variable_ops(out))
    2
    """
    from rewriters.flatten import flatten_signature
    from rewriters.savedmodel_io import read_saved_model

    proto = read_saved_model(model_dir)
    flat = flatten_signature(proto, model_dir, None, signature)
    nodes = {node.name: node for node in flat.graph_def.node}
    outputs = flat.outputs_by_key(proto)
    found = []
    for key in sorted(outputs):
        node = nodes[outputs[key].split(":")[0]]
        while node.op != "VarHandleOp":
            node = nodes[node.input[0].split(":")[0]]
        found.append(node.name)
    return found
