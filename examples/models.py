"""Real models exported by TensorFlow/Keras: the shipped example, and the models the
end-to-end tests and the benchmarks compile."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def export_mlp_module(path):
    """A tf.Module MLP with two towers (wide and deep) joined at the end."""
    import tensorflow as tf

    class TwoTowerMLP(tf.Module):
        def __init__(self):
            super().__init__()
            rng = tf.random.Generator.from_seed(1)
            self.deep = [tf.Variable(rng.normal([64, 256]) * 0.1),
                         tf.Variable(rng.normal([256, 256]) * 0.1),
                         tf.Variable(rng.normal([256, 32]) * 0.1)]
            self.wide = tf.Variable(rng.normal([64, 32]) * 0.1)
            self.bias = tf.Variable(tf.zeros([32]))

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
        def __call__(self, x):
            h = x
            for w in self.deep[:-1]:
                h = tf.nn.relu(tf.matmul(h, w))
            deep = tf.matmul(h, self.deep[-1])
            wide = tf.matmul(x, self.wide)
            return {"logits": deep + wide + self.bias}

    module = TwoTowerMLP()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_two_signature_module(path):
    """A tf.Module with two signatures over one weight, each also a method:
    ``serving_default`` (``__call__``, a dict of logits) and ``embed`` (``embed``, a
    bare tensor)."""
    import tensorflow as tf

    class TwoSignatures(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([16, 16], seed=[7, 8]) * 0.3)
            self.head = tf.Variable(tf.random.stateless_normal([16, 4], seed=[9, 1]))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def embed(self, x):
            return tf.tanh(tf.matmul(x, self.w))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def __call__(self, x):
            return {"logits": tf.matmul(tf.nn.relu(tf.matmul(tf.tanh(tf.matmul(
                x, self.w)), self.w)), self.head)}

    module = TwoSignatures()
    tf.saved_model.save(module, str(path), signatures={
        "serving_default": module.__call__, "embed": module.embed})
    return path


def export_xla_module(path):
    """A tf.Module whose two signatures (``serving_default``, ``__call__``; ``features``,
    ``features``) both call a block compiled by XLA (``jit_compile=True``) between two
    plain matrix products."""
    import tensorflow as tf

    class XlaBlocks(tf.Module):
        def __init__(self):
            super().__init__()
            self.w0 = tf.Variable(tf.random.stateless_normal([16, 64], seed=[1, 2]) * 0.3)
            self.w1 = tf.Variable(tf.random.stateless_normal([64, 64], seed=[3, 4]) * 0.2)
            self.w2 = tf.Variable(tf.random.stateless_normal([64, 4], seed=[5, 6]))

        @tf.function(jit_compile=True)
        def block(self, h):
            return tf.tanh(tf.matmul(h, self.w1))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def features(self, x):
            return self.block(tf.nn.relu(tf.matmul(x, self.w0)))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def __call__(self, x):
            return {"logits": tf.matmul(self.features(x), self.w2)}

    module = XlaBlocks()
    tf.saved_model.save(module, str(path), signatures={
        "serving_default": module.__call__, "features": module.features})
    return path


def residual_cnn(seed=0):
    """A small Keras CNN with two residual blocks (the shipped example model)."""
    import keras

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


def export_residual_cnn(path, seed=3):
    residual_cnn(seed=seed).export(str(path), verbose=False)
    return path


def transformer_encoder(seq=16, dim=32, heads=4, seed=2):
    """One Keras transformer encoder block over ``seq`` tokens of width ``dim``."""
    import keras

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((seq, dim), name="tokens")
    attention = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)
    x = keras.layers.LayerNormalization()(tokens + attention(tokens, tokens))
    ff = keras.layers.Dense(4 * dim, activation="gelu")(x)
    ff = keras.layers.Dense(dim)(ff)
    x = keras.layers.LayerNormalization()(x + ff)
    outputs = keras.layers.Dense(8)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(tokens, outputs, name="transformer_encoder")


def transformer_stack(blocks=4, seq=32, dim=64, heads=4, seed=2):
    """``blocks`` transformer encoder blocks (the training benchmark's transformer)."""
    import keras

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((seq, dim), name="tokens")
    x = tokens
    for _ in range(blocks):
        attention = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)
        x = keras.layers.LayerNormalization()(x + attention(x, x))
        ff = keras.layers.Dense(4 * dim, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(dim)(ff))
    outputs = keras.layers.Dense(8)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(tokens, outputs, name="transformer_stack")


def export_transformer_encoder(path, seq=16, dim=32, heads=4):
    transformer_encoder(seq, dim, heads).export(str(path), verbose=False)
    return path


def export_resnet50(path):
    import keras

    keras.utils.set_random_seed(0)
    keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3)).export(
        str(path), verbose=False)
    return path


def export_while_module(path):
    """A tf.Module whose signature runs a While loop reading a variable."""
    import tensorflow as tf

    class Loop(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.eye(8) * 0.5)

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            def body(i, h):
                return i + 1, tf.tanh(tf.matmul(h, self.w))
            _, h = tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])
            return h

    module = Loop()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_cond_module(path):
    """A tf.Module whose signature branches (an If op) on its input's sign."""
    import tensorflow as tf

    class Branch(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([8, 8], seed=[1, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            side = tf.matmul(x, tf.ones([8, 8]))
            branch = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, self.w),
                             lambda: tf.nn.relu(x) - 1.0)
            return branch + side

    module = Branch()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_batch_mixing(path, kind):
    """A ``tf.Module`` that mixes its batch's samples where no shape shows it (each
    output has the batch's rows): ``loop_then_mean``, a ``tf.while_loop`` then a
    ``tf.cond`` on the batch's mean; ``batch_size_loop``, a loop run once per sample
    (its trip count from ``tf.shape``); ``position``, each row's index in the batch
    (``tf.range``) added to it; ``per_sample``, none of these (a loop and a cond on a
    weight)."""
    import tensorflow as tf

    class Mixing(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([8, 8], seed=[3, 4]) * 0.3)

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            def body(i, h):
                return i + 1, tf.tanh(tf.matmul(h, self.w))
            trips = tf.shape(x)[0] if kind == "batch_size_loop" else 3
            _, h = tf.while_loop(lambda i, h: i < trips, body, [tf.constant(0), x])
            if kind == "position":
                return h + tf.cast(tf.range(tf.shape(x)[0]), tf.float32)[:, None]
            if kind in ("loop_then_mean", "per_sample"):
                statistic = tf.reduce_mean(h) if kind == "loop_then_mean" else \
                    tf.reduce_sum(self.w)
                return tf.cond(statistic > 0, lambda: h * 2.0, lambda: h - 1.0)
            return h

    module = Mixing()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_loop_then_mean(path):
    return export_batch_mixing(path, "loop_then_mean")


def export_batch_size_loop(path):
    return export_batch_mixing(path, "batch_size_loop")


def export_position(path):
    return export_batch_mixing(path, "position")


def export_per_sample(path):
    return export_batch_mixing(path, "per_sample")


def export_inception_v3(path):
    import keras

    keras.utils.set_random_seed(0)
    keras.applications.InceptionV3(weights=None, input_shape=(299, 299, 3)).export(
        str(path), verbose=False)
    return path


def conv_tower(layers=9, width=64, size=16, seed=0):
    """A plain tower of 3x3 convolutions (equal layers, small weights, much arithmetic
    per sample): the throughput benchmarks' model."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((size, size, 3), name="image")
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(inputs)
    for _ in range(layers - 1):
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs, name="conv_tower")


def wide_conv_tower(seed=0):
    """:func:`conv_tower` with four layers of 256 filters over 8x8 maps: much arithmetic
    per byte of activation, the layers on which splitting filters across devices can
    pay (the uneven-workers benchmark's second model)."""
    return conv_tower(layers=4, width=256, size=8, seed=seed)


def export_conv_tower(path, layers=9, width=64, size=16, seed=0):
    """:func:`conv_tower` exported for inference."""
    conv_tower(layers, width, size, seed).export(str(path), verbose=False)
    return path


def export_stacked_lstm(path, seq=12, features=16, units=32):
    """Two stacked LSTM layers and a Dense+ReLU head (a recurrent model: While loops)."""
    import keras

    keras.utils.set_random_seed(4)
    inputs = keras.Input((seq, features), name="sequence")
    x = keras.layers.LSTM(units, return_sequences=True)(inputs)
    x = keras.layers.LSTM(units)(x)
    x = keras.layers.Dense(units, activation="relu")(x)
    outputs = keras.layers.Dense(4)(x)
    keras.Model(inputs, outputs, name="stacked_lstm").export(str(path), verbose=False)
    return path


def gru(seq=10, features=8, units=16):
    """A Keras GRU over a sequence and a Dense head (its loop unstacks the time axis
    into a TensorList)."""
    import keras

    keras.utils.set_random_seed(7)
    inputs = keras.Input((seq, features), name="sequence")
    x = keras.layers.GRU(units)(inputs)
    outputs = keras.layers.Dense(3)(x)
    return keras.Model(inputs, outputs, name="gru")


def export_gru(path, seq=10, features=8, units=16):
    """:func:`gru` exported for inference."""
    gru(seq, features, units).export(str(path), verbose=False)
    return path


def export_parallel_dense(path, branches=6, width=128):
    """Parallel Dense+ReLU branches over one input, concatenated (MatMul+BiasAdd+Relu
    patterns that Grappler fuses, with nothing forcing them onto one device)."""
    import keras

    keras.utils.set_random_seed(5)
    inputs = keras.Input((64,), name="features")
    towers = [keras.layers.Dense(width, activation="relu")(
        keras.layers.Dense(width, activation="relu")(inputs)) for _ in range(branches)]
    outputs = keras.layers.Dense(10)(keras.layers.Concatenate()(towers))
    keras.Model(inputs, outputs, name="parallel_dense").export(str(path), verbose=False)
    return path


def export_conv_batchnorm(path):
    """Convolutions each followed by BatchNormalization and ReLU (Conv2D +
    FusedBatchNormV3 + Relu, fused by Grappler at inference), with a residual add."""
    conv_batchnorm().export(str(path), verbose=False)
    return path


def conv_batchnorm(seed=6):
    """The model of :func:`export_conv_batchnorm`."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((24, 24, 3), name="image")
    x = inputs
    for width in (16, 32):
        x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    y = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)(x)
    y = keras.layers.BatchNormalization()(y)
    x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    outputs = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs, name="conv_batchnorm")


def dense_mlp(seed=1):
    """A three-layer Keras MLP (64 -> 128 -> 64 -> 10)."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,), name="features"),
                             keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)], name="dense_mlp")


TRAINABLE = {"mlp": dense_mlp, "cnn": residual_cnn, "cnn_bn": conv_batchnorm,
             "transformer": transformer_encoder, "conv_tower": conv_tower,
             "wide_conv_tower": wide_conv_tower,
             "transformer_stack": transformer_stack, "gru": gru}
OPTIMIZERS = {"sgd_momentum": lambda keras: keras.optimizers.SGD(0.01, momentum=0.9),
              "adam": lambda keras: keras.optimizers.Adam(1e-3)}


def export_training_step(path, model="mlp", optimizer="adam"):
    """The training version of an example model: ``train_step(x, y)`` with a mean
    squared error loss and ``optimizer`` (``sgd_momentum`` or ``adam``), exported by
    :func:`tfpart.training.export_train_step`."""
    import keras

    from tfpart.training import export_train_step

    return export_train_step(TRAINABLE[model](), OPTIMIZERS[optimizer](keras), "mse", path)


def export_classifier_step(path, features=64, classes=10, hidden=64, learning_rate=0.05,
                           momentum=0.0, seed=0, depth=1, batch_norm=False):
    """A classifier's training step (``depth`` hidden layers, each followed by batch
    normalisation if ``batch_norm``, integer labels ``y``, softmax cross-entropy,
    SGD): what ``tfpart train`` runs in every mode (the exported SGD is the ``sync``
    mode's optimizer)."""
    import keras
    import tensorflow as tf

    from tfpart.training import export_train_step

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((features,), name="features"),
                              *(layer for _ in range(depth) for layer in (
                                  keras.layers.Dense(hidden, activation="relu"),
                                  *([keras.layers.BatchNormalization()] if batch_norm
                                    else []))),
                              keras.layers.Dense(classes)], name="classifier")
    return export_train_step(
        model, keras.optimizers.SGD(learning_rate, momentum=momentum),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), path,
        y_spec=tf.TensorSpec([None], tf.int32, name="y"))


def blobs(path, samples=600, features=16, classes=4, seed=0):
    """An ``.npz`` of ``samples`` points around ``classes`` random centres (``x``
    float32, ``y`` int32 labels), for training tests that need no download."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.5, (classes, features))
    y = rng.integers(0, classes, samples)
    x = centres[y] + rng.normal(0, 1.0, (samples, features))
    np.savez(path, x=x.astype(np.float32), y=y.astype(np.int32))
    return path


# -- the model zoo: models users bring that an earlier reader could not read -------------

def export_keras_application(path, name, size=224, classes=1000, seed=0):
    """The ``keras.applications`` model ``name`` with random weights, ``size`` x ``size``
    inputs and ``classes`` outputs, exported by Keras 3's ``model.export``."""
    import keras

    keras.utils.set_random_seed(seed)
    getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                      classes=classes).export(str(path), verbose=False)
    return path


def export_convnext_tiny(path, size=32):
    """Keras ConvNeXtTiny (random weights) at ``size`` x ``size``: captured
    ``Normalization`` constants, and depthwise convolutions Keras compiles with XLA."""
    return export_keras_application(path, "ConvNeXtTiny", size, classes=10, seed=9)


def export_text_vectorization(path, length=8):
    """Strings in, through a ``TextVectorization`` layer (a hash table of its adapted
    vocabulary, ragged splits), an embedding and a dense layer."""
    import keras

    keras.utils.set_random_seed(10)
    vectorize = keras.layers.TextVectorization(max_tokens=40, output_sequence_length=length)
    vectorize.adapt(["the cat sat on the mat", "a dog ran far", "hello world the end"])
    text = keras.Input((), dtype="string", name="text")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(40, 8)(vectorize(text)))
    keras.Model(text, keras.layers.Dense(3)(x)).export(str(path), verbose=False)
    return path


def export_preprocessing(path):
    """Every other Keras preprocessing layer on three inputs: ``StringLookup`` (its
    vocabulary an asset file), ``Hashing`` and ``CategoryEncoding`` on strings,
    ``IntegerLookup`` on ids, ``Discretization``, ``Normalization`` and ``Rescaling`` on
    numbers, then a dense layer."""
    import keras

    keras.utils.set_random_seed(11)
    vocabulary = path.parent / "vocabulary.txt"
    vocabulary.write_text("red\ngreen\nblue\n")
    word = keras.Input((1,), dtype="string", name="word")
    ident = keras.Input((1,), dtype="int64", name="ident")
    number = keras.Input((2,), dtype="float32", name="number")
    encoded = [
        keras.layers.StringLookup(vocabulary=str(vocabulary), output_mode="one_hot")(word),
        keras.layers.CategoryEncoding(num_tokens=5, output_mode="one_hot")(
            keras.layers.Hashing(num_bins=5)(word)),
        keras.layers.IntegerLookup(vocabulary=[3, 5, 7], output_mode="one_hot")(ident),
        keras.layers.CategoryEncoding(num_tokens=3, output_mode="multi_hot")(
            keras.layers.Discretization(bin_boundaries=[-0.5, 0.5])(number)),
        keras.layers.Rescaling(0.5)(keras.layers.Normalization(mean=[0.1, 0.2],
                                                               variance=[1.0, 4.0])(number))]
    flat = keras.layers.Concatenate()([keras.layers.Flatten()(keras.ops.cast(e, "float32"))
                                       for e in encoded])
    keras.Model([word, ident, number], keras.layers.Dense(2)(flat)).export(str(path),
                                                                           verbose=False)
    return path


def export_captured_constant(path):
    """A ``tf.Module`` whose function uses a ``tf.constant`` it captured."""
    import numpy as np
    import tensorflow as tf

    class Scaled(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4))
            self.scale = tf.constant(np.arange(4, dtype=np.float32) + 0.5)

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.matmul(x, self.w) * self.scale}

    module = Scaled()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def export_tf1(path, resource=True, control_flow_v1=False, per_sample=False):
    """A TF1 SavedModel (``tf.compat.v1.saved_model.Builder``): two dense layers of
    ``resource`` or legacy ref variables, a ``tf.compat.v1.cond`` and a
    ``tf.compat.v1.while_loop`` (control flow v1's Switch/Merge/Enter ops with
    ``control_flow_v1``), and a ``saver_def``. The cond tests the batch's sum, unless
    ``per_sample``: then it tests a weight, so every output row depends on its own
    input row alone, and an int64 input ``ids`` scales each row by a value looked up in
    a ``tf.lookup.StaticHashTable`` (filled by the SavedModel's main op)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    was_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = not control_flow_v1
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
            init = tf.compat.v1.random_normal_initializer(seed=12)
            w1 = tf.compat.v1.get_variable("w1", [8, 16], initializer=init,
                                           use_resource=resource)
            b1 = tf.compat.v1.get_variable("b1", [16], initializer=tf.compat.v1.ones_initializer(),
                                           use_resource=resource)
            w2 = tf.compat.v1.get_variable("w2", [16, 16], initializer=init,
                                           use_resource=resource)
            hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
            gated = tf.compat.v1.cond(tf.reduce_sum(w2 if per_sample else hidden) > 0,
                                      lambda: hidden * 2.0, lambda: hidden - 1.0)
            _, out = tf.compat.v1.while_loop(lambda i, h: i < 3,
                                             lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w2))),
                                             [tf.constant(0), gated])
            inputs, main_op = {"x": x}, None
            if per_sample:
                ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
                table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                    tf.constant([0, 1, 2], tf.int64), tf.constant([0.5, 2.0, 3.0])), -1.0)
                out = out * table.lookup(ids)[:, None]
                inputs["ids"], main_op = ids, tf.compat.v1.tables_initializer()
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                builder = tf.compat.v1.saved_model.Builder(str(path))
                builder.add_meta_graph_and_variables(
                    session, ["serve"], main_op=main_op, signature_def_map={
                        "serving_default": tf.compat.v1.saved_model.predict_signature_def(
                            inputs, {"gated": gated, "y": out})})
                builder.save()
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = was_v2
    return path


def export_tf1_resource(path):
    return export_tf1(path, resource=True)


def export_tf1_ref(path):
    """Legacy ref variables (``VariableV2``) and control flow v1."""
    return export_tf1(path, resource=False, control_flow_v1=True)


def export_tf1_per_sample(path):
    """Ref variables, control flow v1 and a lookup table; every row its own (a model
    micro-batches cannot change)."""
    return export_tf1(path, resource=False, control_flow_v1=True, per_sample=True)


# -- embeddings: tables read a few rows at a time ------------------------------------------

def recommender(items=2_000_000, users=1000, dim=64, hidden=64, seed=0):
    """A two-tower recommender: a user id and an item id, each looked up in its table
    (``user_table``: ``users`` x ``dim``; ``item_table``: ``items`` x ``dim``, 512 MB at
    the default 2M x 64), concatenated, through a small MLP to a score."""
    import keras

    keras.utils.set_random_seed(seed)
    user = keras.Input((1,), dtype="int32", name="user")
    item = keras.Input((1,), dtype="int32", name="item")
    rows = [keras.layers.Flatten()(keras.layers.Embedding(count, dim, name=name)(ids))
            for ids, count, name in ((user, users, "user_table"), (item, items, "item_table"))]
    x = keras.layers.Dense(hidden, activation="relu")(keras.layers.Concatenate()(rows))
    score = keras.layers.Dense(1, activation="sigmoid")(x)
    return keras.Model([user, item], score, name="recommender")


def export_recommender(path, items=2_000_000, users=1000, dim=64):
    recommender(items, users, dim).export(str(path), verbose=False)
    return path


def export_small_recommender(path):
    """:func:`recommender` with a 100k x 16 item table (6.4 MB): the tests' size."""
    return export_recommender(path, items=100_000, users=50, dim=16)


def export_table_training(path, rows=100_000, width=16, optimizer="adam", seed=0, tables=1):
    """The training step of a regressor on ids through an embedding table (``rows`` x
    ``width``, 6.4 MB at the default) and a small MLP, as a ``tf.Module`` with one
    signature, ``train_step(x, y)`` (``x``: ``[batch, 2]`` int32 ids; ``y``: ``[batch,
    1]``; mean squared error). ``optimizer``: ``sgd`` (Keras updates the table by
    ``ResourceScatterSub`` of the rows read), ``sgd_momentum`` or ``adam`` (dense
    updates of the table and its slots, from the gradient made dense by
    ``UnsortedSegmentSum``). Nothing else reads the table whole, so tfpart can cut it
    into row shards. With ``tables=2`` each id column has a table of its own."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    ids = keras.Input((2,), dtype="int32", name="ids")
    if tables == 1:
        rows_read = keras.layers.Embedding(rows, width, name="item_table")(ids)
    else:
        rows_read = keras.layers.Concatenate(axis=1)([
            keras.layers.Embedding(rows, width, name=f"table_{k}")(ids[:, k:k + 1])
            for k in range(2)])
    x = keras.layers.Flatten()(rows_read)
    model = keras.Model(ids, keras.layers.Dense(1)(
        keras.layers.Dense(16, activation="relu")(x)), name="table_regressor")
    chosen = {"sgd": lambda: keras.optimizers.SGD(0.1), **{
        name: lambda make=make: make(keras) for name, make in OPTIMIZERS.items()}}[optimizer]()
    chosen.build(model.trainable_variables)
    module = tf.Module()
    module.model, module.optimizer = model, chosen

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32, name="x"),
                                  tf.TensorSpec([None, 1], tf.float32, name="y")])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(y - model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        chosen.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    tf.saved_model.save(module, str(path), signatures={"train_step": train_step})
    return path


def export_table_lookups(path, rows=1000, width=8, whole_read=False):
    """A ``tf.Module`` whose ``serving_default`` looks up rows of a ``rows`` x ``width``
    table for ``ids`` (``[batch, 3]``, -1 for none) three ways: the first id's row
    (``tf.gather``: a ``ResourceGather``), the sum of each sample's rows
    (``tf.sparse.segment_sum`` of the table) and their mean through
    ``tf.nn.safe_embedding_lookup_sparse`` (zeros for a sample with no id). With
    ``whole_read`` a second signature, ``total``, sums the whole table."""
    import tensorflow as tf

    class TableLookups(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(tf.random.stateless_normal((rows, width), seed=(3, 1)))

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids")])
        def lookup(self, ids):
            present = tf.sparse.from_dense(ids + 1)  # the -1s drop out
            sparse_ids = tf.SparseTensor(present.indices, present.values - 1,
                                         present.dense_shape)
            samples = tf.shape(ids, out_type=tf.int64)[0]
            every = tf.reshape(tf.maximum(ids, 0), [-1])
            segments = tf.repeat(tf.range(samples), 3)
            return {"first": tf.gather(self.table, tf.maximum(ids[:, 0], 0)),
                    "sums": tf.sparse.segment_sum(self.table, every, segments,
                                                   num_segments=samples),
                    "means": tf.nn.safe_embedding_lookup_sparse(self.table, sparse_ids,
                                                                combiner="mean")}

    module = TableLookups()
    signatures = {"serving_default": module.lookup}
    if whole_read:
        module.total = tf.function(lambda: {"total": tf.reduce_sum(module.table)},
                                   input_signature=[])
        signatures["total"] = module.total
    tf.saved_model.save(module, str(path), signatures=signatures)
    return path


def export_sparse_reads(path, rows=1000, width=16):
    """A ``tf.Module`` whose signatures address rows of a ``rows`` x ``width`` table:
    ``serving_default`` gathers the rows of ``ids`` from the variable
    (``ResourceGather``), sums them into ``segments`` (``SparseSegmentSum``) and slices
    the first two rows (``StridedSlice``); ``update`` adds ``values`` to the rows of
    ``ids`` in place (``ResourceScatterAdd``)."""
    import tensorflow as tf

    class SparseReads(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(tf.random.stateless_normal((rows, width), seed=(7, 1)))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32, name="ids"),
                                      tf.TensorSpec([None], tf.int32, name="segments")])
        def read(self, ids, segments):
            return {"rows": tf.gather(self.table, ids),
                    "sums": tf.sparse.segment_sum(self.table, ids, segments),
                    "head": self.table[:2]}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32, name="ids"),
                                      tf.TensorSpec([None, width], tf.float32, name="values")])
        def update(self, ids, values):
            self.table.scatter_add(tf.IndexedSlices(values, ids))
            return {"norm": tf.reduce_sum(self.table)}

    module = SparseReads()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.read,
                                                       "update": module.update})
    return path
