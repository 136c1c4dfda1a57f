"""The one line of an error says what failed: from TensorFlow's real multi-line errors
(run here, not copied) the op and the line with the cause, never cut inside a word;
and a failure of tfpart's own batch-mixing probe is worded as the probe's."""
import pytest

from tfpart.core.errors import MAX_CAUSE_CHARS, first_line, model_errors, shortened


def raised(function, *args):
    """The exception ``function(*args)`` raises."""
    with pytest.raises(Exception) as caught:
        function(*args)
    return caught.value


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_runtime_error_gives_the_op_and_the_shapes(tf):
    @tf.function(input_signature=[tf.TensorSpec([None, None])] * 2)
    def product(a, b):
        return tf.matmul(a, b)

    error = raised(product, tf.ones([2, 3]), tf.ones([4, 5]))
    assert str(error).startswith("Graph execution error:")  # what the first line was
    assert first_line(error) == ("op MatMul: Matrix size-incompatible: In[0]: [2,3], "
                                 "In[1]: [4,5]")


@pytest.mark.slow
@pytest.mark.any_onednn
def test_an_error_at_tracing_gives_the_op_and_the_shapes(tf):
    error = raised(tf.function(lambda: tf.matmul(tf.ones([2, 3]), tf.ones([4, 5]))))
    assert str(error).startswith("in user code:")
    assert first_line(error) == ("op MatMul: Dimensions must be equal, but are 3 and 4 with "
                                 "input shapes: [2,3], [4,5].")


@pytest.mark.slow
@pytest.mark.any_onednn
def test_an_unregistered_op_on_import_gives_its_type(tf):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.add(name="tokens", op="Tfpart>NoSuchOp")

    def import_it():
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    error = raised(import_it)
    assert isinstance(error, tf.errors.NotFoundError) and len(str(error)) > MAX_CAUSE_CHARS
    assert first_line(error) == "op type Tfpart>NoSuchOp is not registered"


def test_a_long_cause_is_shortened_at_a_word_and_keeps_the_op():
    op = "model/" * 30 + "MatMul"
    cause = " ".join(f"word{k}" for k in range(100))
    error = RuntimeError(f"Graph execution error:\n\n{cause}\n\t [[{{{{node {op}}}}}]]")
    line = first_line(error)
    assert line.startswith(f"op {op}: word0 ") and line.endswith(" …")
    kept = line.removeprefix(f"op {op}: ").removesuffix(" …")
    assert len(kept) <= MAX_CAUSE_CHARS and cause.startswith(kept + " ")


def test_shortening_keeps_whole_sentences_when_one_fits():
    text = "Op X is not registered in this binary. " + "Make sure it is. " * 20
    short = shortened(text)
    assert text.startswith(short + " ") and short.endswith(" Make sure it is.")
    assert MAX_CAUSE_CHARS - len(" Make sure it is.") < len(short) <= MAX_CAUSE_CHARS


def mixed_by_log(path):
    """A SavedModel whose signature takes the logarithm of its input and checks it is a
    number (so negative inputs fail), then a dense layer."""
    import numpy as np
    import tensorflow as tf

    class Logarithm(tf.Module):
        def __init__(self):
            super().__init__()
            self.dense = tf.Variable(np.ones((4, 2), np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.matmul(tf.debugging.check_numerics(tf.math.log(x), "log(x)"),
                                   self.dense)}

    module = Logarithm()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


@pytest.mark.slow
@pytest.mark.any_onednn
def test_errors_of_the_model_and_of_tfparts_probe_say_whose_and_the_cause(tf, tmp_path,
                                                                          capsys):
    """Run by the user's inputs, the model's failure is named as the model's, with the
    op and the cause; run by tfpart's probe on its random inputs (some negative), the
    same failure is worded as the probe's, never as the model's."""
    from tfpart.cli import main

    model = mixed_by_log(tmp_path / "log")
    with pytest.raises(Exception) as caught, model_errors(model, "run it"):
        tf.saved_model.load(str(model)).signatures["serving_default"](x=-tf.ones([2, 4]))
    assert str(caught.value) == (f"{model}: cannot run it: op CheckNumerics: log(x) : Tensor "
                                 "had NaN values")
    code = main(["compile", str(model), "-o", str(tmp_path / "out"), "--batch-size", "4",
                 "--strategy", "pipeline", "--microbatches", "2"])
    line = capsys.readouterr().err.strip()
    assert code == 2 and len(line.splitlines()) == 1, line
    assert line.startswith(f"tfpart: error: {model}: tfpart's probe for ops that mix a "
                           "batch's samples failed running the signature on 3 rows of its "
                           "own random inputs: op "), line
    assert line.endswith("CheckNumerics: log(x) : Tensor had NaN values"), line
    assert "cannot load and run it" not in line and "Graph execution error" not in line
