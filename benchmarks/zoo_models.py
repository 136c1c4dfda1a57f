"""The model zoo's models from other Keras families, built from configs with random
weights (nothing is downloaded) and exported as SavedModels.

- ``keras-hub``: a BERT and a GPT-2 backbone (2 layers, hidden size 128, 2 heads, a
  vocabulary of 1,000), exported by Keras 3's ``model.export`` with 32-token inputs.
- ``tf-keras``: a small residual CNN of Keras 2 (``tf_keras``), saved by its
  ``model.save(..., save_format="tf")``.
- ``tfrs``: TF Recommenders on string ids: a two-tower retrieval model (``StringLookup``
  and ``Embedding`` towers, a ``BruteForce`` top-10 index) and a deep-and-cross ranking
  model, saved by ``tf.saved_model.save`` with a signature of string ids.

TF Recommenders needs Keras 2 as ``tf.keras``: its exporters run with
``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported (:func:`environment`), so
each export runs in a fresh process. The packages are in
``benchmarks/requirements-zoo.txt``.

>>> sorted(FAMILIES)
['keras-hub', 'tf-keras', 'tfrs']
>>> environment("tfrs")
{'TF_USE_LEGACY_KERAS': '1'}
"""

SEQUENCE = 32  # tokens of the keras-hub backbones' inputs
USERS = [f"user_{i}" for i in range(200)]
ITEMS = [f"item_{i}" for i in range(500)]


def export_bert_backbone(path):
    """A 2-layer ``keras_hub.models.BertBackbone``: ``token_ids``, ``segment_ids`` and
    ``padding_mask`` of 32 tokens in, ``sequence_output`` and ``pooled_output`` out."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=128,
        intermediate_dim=256, max_sequence_length=SEQUENCE)
    return _export_backbone(backbone, path)


def export_gpt2_backbone(path):
    """A 2-layer ``keras_hub.models.GPT2Backbone`` (causal attention): ``token_ids`` and
    ``padding_mask`` of 32 tokens in, the sequence's hidden states out."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=128,
        intermediate_dim=256, max_sequence_length=SEQUENCE)
    return _export_backbone(backbone, path)


def _export_backbone(backbone, path):
    """Export ``backbone`` with each of its inputs fixed at ``SEQUENCE`` tokens (the
    backbones take any length; the batch stays free)."""
    import tensorflow as tf

    signature = {tensor.name: tf.TensorSpec((None, SEQUENCE), tensor.dtype, name=tensor.name)
                 for tensor in backbone.inputs}
    backbone.export(str(path), verbose=False, input_signature=[signature])
    return path


def export_residual_cnn(path):
    """A Keras 2 (``tf_keras``) functional CNN on 32 x 32 x 3 images: two convolutions
    with batch normalization, a residual addition, pooling, dropout and a 10-way
    softmax, saved in the SavedModel format by ``tf_keras``."""
    import tf_keras

    layers = tf_keras.layers
    image = tf_keras.Input((32, 32, 3), name="image")
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(image)
    branch = layers.BatchNormalization()(layers.Conv2D(16, 3, padding="same")(x))
    x = layers.MaxPooling2D()(layers.ReLU()(layers.Add()([x, branch])))
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.Dropout(0.1)(layers.GlobalAveragePooling2D()(x))
    model = tf_keras.Model(image, layers.Dense(10, activation="softmax")(x))
    model.save(str(path), save_format="tf")
    return path


def _tower(vocabulary, name, width=32):
    """A TF Recommenders tower: string ids through a ``StringLookup`` and an
    ``Embedding`` (row 0 for unknown ids) to a dense projection."""
    import tf_keras

    layers = tf_keras.layers
    return tf_keras.Sequential([
        layers.StringLookup(vocabulary=vocabulary, name=f"{name}_lookup"),
        layers.Embedding(len(vocabulary) + 1, width, name=f"{name}_embedding"),
        layers.Dense(16, name=f"{name}_projection")], name=name)


def export_two_tower_retrieval(path):
    """A ``tfrs.models.Model`` two-tower retrieval model on string user and item ids,
    its items indexed by a ``BruteForce`` top-10 layer. The signature takes
    ``user_id`` and ``item_id`` (strings) and gives each user's 10 best items with
    their scores, and the score of the given pair."""
    import tensorflow as tf
    import tensorflow_recommenders as tfrs

    class TwoTower(tfrs.models.Model):
        def __init__(self):
            super().__init__()
            self.user_model = _tower(USERS, "user")
            self.item_model = _tower(ITEMS, "item")
            self.task = tfrs.tasks.Retrieval()

        def compute_loss(self, features, training=False):
            return self.task(self.user_model(features["user_id"]),
                             self.item_model(features["item_id"]))

    model = TwoTower()
    index = tfrs.layers.factorized_top_k.BruteForce(model.user_model, k=10)
    index.index_from_dataset(tf.data.Dataset.from_tensor_slices(ITEMS).batch(100).map(
        lambda items: (items, model.item_model(items))))
    ids = [tf.TensorSpec([None], tf.string, name="user_id"),
           tf.TensorSpec([None], tf.string, name="item_id")]

    class Serving(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.index = model, index

        @tf.function(input_signature=ids)
        def serve(self, user_id, item_id):
            scores, items = self.index(user_id)
            pair = tf.reduce_sum(self.model.user_model(user_id)
                                 * self.model.item_model(item_id), axis=1)
            return {"top_scores": scores, "top_items": items, "score": pair}

    serving = Serving()
    tf.saved_model.save(serving, str(path), signatures={"serving_default": serving.serve})
    return path


def export_dcn_ranking(path):
    """A ``tfrs.models.Model`` ranking model on string user and item ids: the two
    towers' embeddings concatenated, a ``tfrs.layers.dcn.Cross`` layer, a dense layer
    and a rating. The signature takes ``user_id`` and ``item_id`` (strings)."""
    import tensorflow as tf
    import tensorflow_recommenders as tfrs
    import tf_keras

    class Ranking(tfrs.models.Model):
        def __init__(self):
            super().__init__()
            self.user_model = _tower(USERS, "user")
            self.item_model = _tower(ITEMS, "item")
            self.cross = tfrs.layers.dcn.Cross(projection_dim=8)
            self.deep = tf_keras.layers.Dense(32, activation="relu")
            self.rating = tf_keras.layers.Dense(1)
            self.task = tfrs.tasks.Ranking(loss=tf_keras.losses.MeanSquaredError())

        def call(self, features):
            x = tf.concat([self.user_model(features["user_id"]),
                           self.item_model(features["item_id"])], axis=1)
            return self.rating(self.deep(self.cross(x)))

        def compute_loss(self, features, training=False):
            return self.task(labels=features["rating"], predictions=self(features))

    model = Ranking()
    ids = [tf.TensorSpec([None], tf.string, name="user_id"),
           tf.TensorSpec([None], tf.string, name="item_id")]

    @tf.function(input_signature=ids)
    def serve(user_id, item_id):
        return {"rating": model({"user_id": user_id, "item_id": item_id})}

    model({"user_id": tf.constant(USERS[:2]), "item_id": tf.constant(ITEMS[:2])})
    tf.saved_model.save(model, str(path), signatures={"serving_default": serve})
    return path


FAMILIES = {
    "keras-hub": {"BertBackbone": export_bert_backbone, "GPT2Backbone": export_gpt2_backbone},
    "tf-keras": {"ResidualCNN": export_residual_cnn},
    "tfrs": {"TwoTowerRetrieval": export_two_tower_retrieval,
             "DCNRanking": export_dcn_ranking},
}
INPUTS = {"keras-hub": f"{SEQUENCE} tokens", "tf-keras": "32", "tfrs": "string ids"}


def environment(family):
    """The variables a family's export needs set before TensorFlow is imported."""
    return {"TF_USE_LEGACY_KERAS": "1"} if family == "tfrs" else {}


def export_model(family, name, path, seed=0):
    """Export the model ``name`` of ``family`` to ``path`` with the random weights of
    ``seed``; run it in a process whose environment has :func:`environment`'s
    variables."""
    if family == "keras-hub":
        import keras
    else:
        import tf_keras as keras
    keras.utils.set_random_seed(seed)
    return FAMILIES[family][name](path)
