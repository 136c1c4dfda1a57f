"""Never a traceback from any strategy on any model: random Keras models, built from a
grammar of layers (recurrent, attention, embedding, depthwise convolutions,
normalization, string preprocessing, dense, convolutions, pooling, branches joined by
Add or Concatenate), each exported once and compiled with every strategy the command
line offers. Each compile exits 0 with a written output, or 2 with one line on stderr
and no output folder.

A recipe is plain data (what Hypothesis prints when a case fails): one or two
inputs, each through blocks of layers that keep the tensor's kind (a sequence, an
image) and its last dimension and a layer that reduces it to a vector, the vectors
joined, and a dense head.
"""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles import CLUSTERS_DIR
from tfpart.cli import main
from tfpart.strategy_request import STRATEGY_CHOICES

pytestmark = pytest.mark.slow

STEPS, WIDTH, SIDE, VOCABULARY = 4, 8, 6, ["red", "green", "blue", "cyan"]
# the default (three CPUs), and GPUs of two kinds on two hosts beside a CPU (host ops)
CLUSTERS = ["local_3cpu.json", "hetero_2v100_2t4.json"]

# the kind of tensor each input gives, after its embedding
INPUTS = {"sequence": "sequence", "image": "image", "tokens": "sequence",
          "masked_tokens": "sequence", "string_lookup": "sequence", "hashing": "sequence",
          "text_vectorization": "sequence"}
# layers that keep a tensor's kind and shape (branches are made of these)
KEEPING = {
    "sequence": ["lstm", "gru", "simple_rnn", "attention", "layer_norm", "batch_norm",
                 "conv1d", "dense"],
    "image": ["conv2d", "depthwise", "batch_norm", "layer_norm", "dense"],
    "vector": ["dense", "batch_norm", "layer_norm"],
}
POOLING = {"sequence": ["max_pool1d", "average_pool1d"],
           "image": ["max_pool2d", "average_pool2d"], "vector": []}
REDUCING = {"sequence": ["lstm_last", "gru_last", "simple_rnn_last", "global_average1d",
                         "global_max1d", "flatten"],
            "image": ["global_average2d", "global_max2d", "flatten"]}


@st.composite
def trunks(draw):
    """One input's part of a model: ``{"input", "blocks", "reduce"}``; a block is a
    layer name or ``["add" | "concat", [layers], [layers]]`` (two branches joined)."""
    source = draw(st.sampled_from(sorted(INPUTS)))
    kind = INPUTS[source]
    blocks = []
    for _ in range(draw(st.integers(1, 2))):
        shape = draw(st.sampled_from(["layer", "layer", "pool", "branches"]))
        if shape == "branches":
            blocks.append([draw(st.sampled_from(["add", "concat"])), draw(chains(kind)),
                           draw(chains(kind))])
        elif shape == "pool" and POOLING[kind]:
            blocks.append(draw(st.sampled_from(POOLING[kind])))
        else:
            blocks.append(draw(st.sampled_from(KEEPING[kind])))
    return {"input": source, "blocks": blocks,
            "reduce": draw(st.sampled_from(REDUCING[kind]))}


def chains(kind):
    """One or two layers that keep a tensor of ``kind`` as it is."""
    return st.lists(st.sampled_from(KEEPING[kind]), min_size=1, max_size=2)


def recipes():
    """A model's recipe: ``{"trunks", "head"}``, one or two inputs each reduced to a
    vector, joined, and a dense head."""
    return st.fixed_dictionaries({
        "trunks": st.lists(trunks(), min_size=1, max_size=2,
                           unique_by=lambda trunk: trunk["input"]),
        "head": st.one_of(st.just([]), chains("vector"))})


def build(recipe):
    """The Keras model of ``recipe`` (every layer as wide as its input)."""
    import keras

    keras.utils.set_random_seed(0)
    inputs, vectors = zip(*map(_trunk, recipe["trunks"]))
    x = keras.layers.Concatenate()(list(vectors)) if len(vectors) > 1 else vectors[0]
    return keras.Model(list(inputs), keras.layers.Dense(3)(_chain(recipe["head"], x)))


def _trunk(recipe):
    """One input of the model and the vector its blocks reduce it to."""
    import keras

    inputs, x = _input(recipe["input"], keras, keras.layers)
    for block in recipe["blocks"]:
        if isinstance(block, str):
            x = _layer(block, x)
        else:
            join, left, right = block
            merge = keras.layers.Add() if join == "add" else keras.layers.Concatenate()
            x = merge([_chain(left, x), _chain(right, x)])
    return inputs, _layer(recipe["reduce"], x)


def _chain(names, x):
    for name in names:
        x = _layer(name, x)
    return x


def _layer(name, x):
    """Layer ``name`` (as wide as ``x``) applied to ``x``."""
    from keras import layers

    width = x.shape[-1]
    if name == "attention":
        return layers.MultiHeadAttention(num_heads=2, key_dim=4)(x, x)
    made = {
        "lstm": lambda: layers.LSTM(width, return_sequences=True),
        "gru": lambda: layers.GRU(width, return_sequences=True),
        "simple_rnn": lambda: layers.SimpleRNN(width, return_sequences=True),
        "lstm_last": lambda: layers.LSTM(width),
        "gru_last": lambda: layers.GRU(width),
        "simple_rnn_last": lambda: layers.SimpleRNN(width),
        "layer_norm": layers.LayerNormalization,
        "batch_norm": layers.BatchNormalization,
        "conv1d": lambda: layers.Conv1D(width, 3, padding="same", activation="relu"),
        "conv2d": lambda: layers.Conv2D(width, 3, padding="same", activation="relu"),
        "depthwise": lambda: layers.DepthwiseConv2D(3, padding="same"),
        "dense": lambda: layers.Dense(width, activation="relu"),
        "max_pool1d": lambda: layers.MaxPooling1D(2, padding="same"),
        "average_pool1d": lambda: layers.AveragePooling1D(2, padding="same"),
        "max_pool2d": lambda: layers.MaxPooling2D(2, padding="same"),
        "average_pool2d": lambda: layers.AveragePooling2D(2, padding="same"),
        "global_average1d": layers.GlobalAveragePooling1D,
        "global_max1d": layers.GlobalMaxPooling1D,
        "global_average2d": layers.GlobalAveragePooling2D,
        "global_max2d": layers.GlobalMaxPooling2D,
        "flatten": layers.Flatten,
    }
    return made[name]()(x)


def _input(source, keras, layers):
    """The model's input and the tensor it gives (strings and ids embedded)."""
    if source == "sequence":
        inputs = keras.Input((STEPS, WIDTH), name=f"{source}_input")
        return inputs, inputs
    if source == "image":
        inputs = keras.Input((SIDE, SIDE, WIDTH), name=f"{source}_input")
        return inputs, inputs
    if source in ("tokens", "masked_tokens"):  # id 0 masked: recurrent layers skip it
        inputs = keras.Input((STEPS,), dtype="int32", name=f"{source}_input")
        masked = source == "masked_tokens"
        return inputs, layers.Embedding(16, WIDTH, mask_zero=masked)(inputs)
    if source == "text_vectorization":
        inputs = keras.Input((1,), dtype="string", name=f"{source}_input")
        ids = layers.TextVectorization(output_sequence_length=STEPS,
                                       vocabulary=VOCABULARY)(inputs)
        return inputs, layers.Embedding(len(VOCABULARY) + 2, WIDTH)(ids)
    inputs = keras.Input((STEPS,), dtype="string", name=f"{source}_input")
    if source == "string_lookup":
        ids = layers.StringLookup(vocabulary=VOCABULARY)(inputs)
        return inputs, layers.Embedding(len(VOCABULARY) + 1, WIDTH)(ids)
    return inputs, layers.Embedding(16, WIDTH)(layers.Hashing(num_bins=16)(inputs))


def compile_argv(model, out, strategy, batch_size, cluster):
    """``tfpart compile``'s arguments for ``strategy``; a forced greedy placement
    searches less than its default (``auto`` cannot be told to), to save CI time."""
    fewer = {"placement": ["refine_evaluations=100"],
             "filter_split": ["greedy.refine_evaluations=100"]}.get(strategy, [])
    return ["compile", str(model), "-o", str(out), "--strategy", strategy,
            "--batch-size", str(batch_size), "--cluster", str(CLUSTERS_DIR / cluster),
            *(arg for option in fewer for arg in ("--option", option))]


@settings(max_examples=2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(recipe=recipes(), batch_size=st.sampled_from([4, 1]), cluster=st.sampled_from(CLUSTERS))
def test_every_strategy_on_random_keras_models_ends_cleanly(recipe, batch_size, cluster,
                                                            tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("random")
    model = folder / "model"
    build(recipe).export(str(model), verbose=False)
    capsys.readouterr()
    for strategy in STRATEGY_CHOICES:
        out = folder / strategy
        code = main(compile_argv(model, out, strategy, batch_size, cluster))
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code in (0, 2), (strategy, code, err[-2000:])
        if code == 0:
            assert json.loads((out / "plan.json").read_text())["assignment"], strategy
        else:
            assert len(lines) == 1 and lines[0].startswith("tfpart: error: "), (strategy, err)
            assert not out.exists(), strategy
            assert strategy != "auto", err  # an op placement always has a plan here
