"""The one exception family of tfpart.

Every error a user can cause (bad model, bad cluster file, infeasible placement) is a
:class:`TfpartError`. The CLI prints it as one line, ``tfpart: <file>: <problem>``, and
exits with code 2; anything else escaping is a bug.

Examples
--------
>>> err = ClusterError("cluster.json", "devices[1].memory: must be positive")
>>> str(err)
'cluster.json: devices[1].memory: must be positive'
>>> import pickle
>>> pickle.loads(pickle.dumps(err)).problem
'devices[1].memory: must be positive'
"""
import re
from contextlib import contextmanager


class TfpartError(Exception):
    """Base class; ``path`` names the file at fault (may be empty)."""

    def __init__(self, path, problem):
        self.path = str(path) if path else ""
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self):  # pickled by its fields (a forked planner sends it back)
        return type(self), (self.path, self.problem)


class ModelError(TfpartError):
    """The SavedModel is missing, unreadable, or uses something tfpart cannot place."""


class ClusterError(TfpartError):
    """cluster.json is missing, malformed or inconsistent."""


class ProfileError(TfpartError):
    """A device-kind profile is missing, malformed or inconsistent."""


class PlacementError(TfpartError):
    """No valid placement exists (memory, kernels) or a plan violates a constraint."""


class VerificationError(TfpartError):
    """A compiled model's outputs differ from the original's, or its ops ran elsewhere
    than planned."""


class OutputError(TfpartError):
    """The output location cannot be written (exists without --force, ...)."""


MAX_CAUSE_CHARS = 200  # of the cause in a one-line error, beside the op's name

_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_NODE_MARKER = re.compile(r"\[\[\{\{node ([^}]+)\}\}\]\]")  # \t [[{{node MatMul}}]]
_QUOTED_NODE_DEF = re.compile(r"(?: for)? '\{\{node ([^}]+)\}\} = ([^\[(' ]+)[^']*'")
_ROOT_ERROR = re.compile(r"^\(\d+\) [A-Z_]+:\s*")  # (0) INVALID_ARGUMENT: ...
_ERROR_TYPE = re.compile(r"^[A-Za-z_.]*(?:Error|Exception): ")
_UNREGISTERED_OP = re.compile(r"Op type not registered '([^']+)'")
_TRACE_LINES = ("Graph execution error:", "Detected at node", "File \"", "Node: ",
                "<stack traces unavailable>", "Hint:", "Original stack trace", "in user code:")


def unregistered_op(text):
    """The op type a TensorFlow error says is not registered in this process, or None.

    >>> unregistered_op("Op type not registered 'TFText>Tokenize' in binary running on vm.")
    'TFText>Tokenize'
    >>> unregistered_op("Matrix size-incompatible") is None
    True
    """
    found = _UNREGISTERED_OP.search(str(text))
    return found.group(1) if found else None


def tensorflow_cause(text):
    """``(op, cause)`` of TensorFlow's multi-line error ``text``: the op that failed (None
    where it names none) and the line that says what failed, not the
    ``Graph execution error:`` or ``in user code:`` line it starts with nor the stack
    trace after; None if ``text`` is not such an error. The cause of a runtime error is
    the line before its ``[[{{node NAME}}]]`` line; of an error at tracing, its last line,
    with the op's NodeDef taken out of it.

    >>> tensorflow_cause("Graph execution error:\\n\\nDetected at node GatherV2 defined at "
    ...                  "(most recent call last):\\n  File \\"m.py\\", line 3, in h\\n\\n"
    ...                  "indices[0] = 5 is not in [0, 3)\\n\\t [[{{node GatherV2}}]] [Op:f]")
    ('GatherV2', 'indices[0] = 5 is not in [0, 3)')
    >>> tensorflow_cause("in user code:\\n\\n    File \\"m.py\\", line 4, in f  *\\n"
    ...                  "        return tf.matmul(a, b)\\n\\n    ValueError: Dimensions "
    ...                  "must be equal, but are 3 and 4 for '{{node MatMul}} = "
    ...                  "MatMul[T=DT_FLOAT](a, b)' with input shapes: [2,3], [4,5].")
    ('MatMul', 'Dimensions must be equal, but are 3 and 4 with input shapes: [2,3], [4,5].')
    >>> tensorflow_cause("bad value") is None
    True
    """
    lines = [_FUNCTION_NODE.sub("", line).strip() for line in str(text).splitlines()]
    said = [line for line in lines if line]
    if len(said) < 2:
        return None
    marked = next((k for k, line in enumerate(lines) if _NODE_MARKER.match(line)), None)
    before = [line for line in lines[:marked] if line] if marked is not None else []
    if before and not before[-1].startswith(_TRACE_LINES):
        return _NODE_MARKER.match(lines[marked]).group(1), _ROOT_ERROR.sub("", before[-1])
    if said[0] == "in user code:":
        cause = _ERROR_TYPE.sub("", said[-1])
        node_def = _QUOTED_NODE_DEF.search(cause)
        return (node_def.group(1) if node_def else None), _QUOTED_NODE_DEF.sub("", cause)
    if said[0] == "Graph execution error:":
        detected = next((re.match(r"Detected at node '?([^' ]+)", line) for line in said
                         if line.startswith("Detected at node")), None)
        cause = next((line for line in said[1:] if not line.startswith(_TRACE_LINES)),
                     said[0])
        return (detected.group(1) if detected else None), _ROOT_ERROR.sub("", cause)
    return None


def shortened(text, limit=MAX_CAUSE_CHARS):
    """``text`` if it has at most ``limit`` characters, else as many of its first
    sentences as fit, else its words that fit and `` …``: never cut inside a word.

    >>> shortened("Op X is not registered. Make sure the Op and Kernel are.", 30)
    'Op X is not registered.'
    >>> shortened("OOM when allocating tensor with shape[65536,65536]", 30)
    'OOM when allocating tensor …'
    """
    if len(text) <= limit:
        return text
    kept = ""
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if len(f"{kept} {sentence}".strip()) > limit:
            break
        kept = f"{kept} {sentence}".strip()
    if kept:
        return kept
    words = text[:limit - 1].rsplit(" ", 1)[0] if " " in text[:limit - 1] else \
        text[:limit - 2]
    return words.rstrip(" ,;:") + " …"


def first_line(exc, limit=MAX_CAUSE_CHARS):
    """The gist of an exception's message, on one line: from TensorFlow's multi-line
    errors the op that failed and the line that says what failed
    (:func:`tensorflow_cause`), not the first line; of an unregistered op, its type;
    else the first line, without TensorFlow's ``{{function_node ...}}`` prefixes. The
    cause is :func:`shortened` to ``limit`` characters, the op's name kept whole.

    >>> first_line(ValueError("{{function_node f}} bad value\\nmore"))
    'bad value'
    >>> first_line(RuntimeError("Graph execution error:\\n\\nDetected at node MatMul "
    ...     "defined at (most recent call last):\\n<stack traces unavailable>\\n"
    ...     "Matrix size-incompatible: In[0]: [2,3], In[1]: [4,5]\\n"
    ...     "\\t [[{{node MatMul}}]] [Op:__inference_f_12]"))
    'op MatMul: Matrix size-incompatible: In[0]: [2,3], In[1]: [4,5]'
    >>> first_line(LookupError("Op type not registered 'TFText>Tokenize' in binary "
    ...                        "running on vm. Make sure the Op and Kernel are registered."))
    'op type TFText>Tokenize is not registered'
    """
    text = str(exc).strip()
    op_type = unregistered_op(text)
    if op_type is not None:
        return f"op type {op_type} is not registered"
    found = tensorflow_cause(text)
    if found is not None:
        op, cause = found
        return (f"op {op}: " if op else "") + shortened(cause or type(exc).__name__, limit)
    text = _FUNCTION_NODE.sub("", text).strip()
    return shortened((text.splitlines() or [""])[0].strip() or type(exc).__name__, limit)


@contextmanager
def model_errors(path, doing, passing=()):
    """Turn any error raised while loading or running the SavedModel at ``path`` (a
    corrupt file shows up as TensorFlow errors, IndexError, KeyError, ...) into a
    one-line ModelError; ``passing`` exception types go through unchanged."""
    try:
        yield
    except (TfpartError, KeyboardInterrupt, *passing):
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt model can raise anything
        raise ModelError(path, f"cannot {doing}: {first_line(exc)}") from None
