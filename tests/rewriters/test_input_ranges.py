"""Integer inputs that index a table are drawn over all its rows, and inputs looked up
in a table over its keys (issue 36: verify drew ids 0 and 1 and the string "tfpart"
only)."""
import numpy as np
import pytest

from rewriters.input_ranges import InputDomain, input_domains
from rewriters.savedmodel_io import read_saved_model
from tfpart.runtime import random_inputs


@pytest.fixture(scope="module")
def two_tables(tmp_path_factory):
    """An embedding variable of 1000 rows (``ResourceGather``) and a 37-row constant
    table (``GatherV2``), each indexed by an integer input after a cast or a reshape; a
    third integer input indexes nothing."""
    import tensorflow as tf

    class Tables(tf.Module):
        def __init__(self):
            super().__init__()
            self.embedding = tf.Variable(tf.random.stateless_normal([1000, 8], seed=[2, 2]))
            self.table = tf.random.stateless_normal([37, 8], seed=[1, 1])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids"),
                                      tf.TensorSpec([None], tf.int32, name="item"),
                                      tf.TensorSpec([None], tf.int32, name="flag")])
        def __call__(self, ids, item, flag):
            pooled = tf.reduce_mean(tf.nn.embedding_lookup(self.embedding, ids), axis=1)
            picked = tf.gather(self.table, tf.reshape(tf.cast(item, tf.int64), [-1]))
            return {"y": pooled + picked * tf.cast(flag, tf.float32)[:, None]}

    module = Tables()
    path = tmp_path_factory.mktemp("tables") / "m"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


def test_each_id_input_ranges_over_its_table(two_tables):
    domains = input_domains(read_saved_model(two_tables), two_tables)
    assert domains == {"ids": InputDomain(rows=1000), "item": InputDomain(rows=37)}


def test_random_inputs_reach_the_last_row(two_tables):
    import tensorflow as tf

    signature = tf.saved_model.load(str(two_tables)).signatures["serving_default"]
    drawn = random_inputs(signature, 64, seed=3, domains={"ids": InputDomain(rows=1000),
                                                      "item": InputDomain(rows=37)})
    ids, item, flag = (drawn[k].numpy() for k in ("ids", "item", "flag"))
    assert ids.max() == 999 and ids.min() >= 0 and len(np.unique(ids)) > 100
    assert item.max() == 36 and set(np.unique(flag)) <= {0, 1}


@pytest.mark.parametrize("export", ["export_text_vectorization", "export_preprocessing",
                                    "export_tf1_per_sample"])
def test_looked_up_inputs_are_drawn_from_the_vocabulary(tmp_path, export):
    """A ``TextVectorization``'s sentences are made of its adapted words, a
    ``StringLookup``'s and an ``IntegerLookup``'s values are their vocabularies, a TF1
    ``StaticHashTable``'s its keys; the first value of each is out of vocabulary."""
    import tensorflow as tf

    from examples import models

    path = getattr(models, export)(tmp_path / "m")
    root = tf.saved_model.load(str(path))
    domains = input_domains(read_saved_model(path), path, root=root)
    assert domains, "no input found looked up"
    drawn = random_inputs(root.signatures["serving_default"], 32, seed=1, domains=domains)
    for key, domain in domains.items():
        values = drawn[key].numpy().ravel().tolist()
        keys = set(domain.keys)
        assert values[0] not in keys
        if domain.words:
            words = [w for v in values[1:] for w in v.split(b" ")]
            assert set(words) <= keys and len(set(words)) > 5
        else:
            assert set(values[1:]) <= keys and len(set(values[1:])) > 1
    expected = {"export_text_vectorization": {"text": True},
                "export_preprocessing": {"word": False, "ident": False},
                "export_tf1_per_sample": {"ids": False}}[export]
    assert {key: d.words for key, d in domains.items() if d.keys} == expected
