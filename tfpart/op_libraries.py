"""Op libraries: what registers a model's custom ops (tensorflow-text's tokenizers,
tensorflow-addons' layers, ...) with TensorFlow, loaded before it reads the model
(``--op-library NAME`` on every command that loads one, ``op_libraries=`` in the Python
API), and which library an op that nothing registered comes from.

TensorFlow knows an op only once this process has registered it: by importing the
Python module that wraps it (``import tensorflow_text``) or by loading its shared
object (``tf.load_op_library("my_ops.so")``). Registration is for the whole process and
cannot be undone, so loading a library twice does nothing more.

Examples
--------
>>> library_for("TFText>WhitespaceTokenizeWithOffsetsV2"), library_for("MatMul")
('tensorflow_text', None)
>>> is_shared_object("build/my_ops.so"), is_shared_object("tensorflow_text")
(True, False)
>>> with_library_hint("op type Addons>Resampler is not registered")
'op type Addons>Resampler is not registered: pass --op-library tensorflow_addons'
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from contextlib import contextmanager

from tfpart.core.errors import TfpartError, first_line

# The namespace before ">" of an op type, and the Python module that registers its ops
# (the names their REGISTER_OP calls use).
NAMESPACES = {"TFText": "tensorflow_text", "Addons": "tensorflow_addons",
              "TFRA": "tensorflow_recommenders_addons", "Scann": "scann",
              "IO": "tensorflow_io"}

# tensorflow-text 2.21's ops outside its TFText> namespace (its sentencepiece ops
# among them), as registered by `import tensorflow_text`.
TENSORFLOW_TEXT_OPS = frozenset({
    "CaseFoldUTF8", "ConstrainedSequence", "FastBertNormalize",
    "FastWordpieceTokenizeWithOffsets", "FindSourceOffsets", "MaxSpanningTree",
    "NormalizeUTF8", "NormalizeUTF8WithOffsetsMap", "PhraseTokenize",
    "RegexSplitWithOffsets", "RougeL", "SentenceFragments", "SentenceFragmentsV2",
    "SentencepieceDetokenizeOp", "SentencepieceIdToStringOp", "SentencepieceOp",
    "SentencepieceStringToIdOp", "SentencepieceTokenizeOp",
    "SentencepieceTokenizeWithOffsetsOp", "SentencepieceVocabSizeOp",
    "SplitMergeTokenizeWithOffsets", "TokenizerFromLogits",
    "UnicodeScriptTokenizeWithOffsets", "WhitespaceTokenizeWithOffsets",
    "WordpieceTokenizeWithOffsets"})

_loaded = set()  # the libraries this process loaded, as recorded()


def library_for(op_type):
    """The Python module that registers ``op_type``, when it is one of a known
    library's (by :data:`NAMESPACES` or :data:`TENSORFLOW_TEXT_OPS`), else None.

    >>> library_for("SentencepieceTokenizeOp"), library_for("TFRA>CuckooHashTableFind")
    ('tensorflow_text', 'tensorflow_recommenders_addons')
    """
    if op_type in TENSORFLOW_TEXT_OPS:
        return "tensorflow_text"
    namespace, found, _ = op_type.partition(">")
    return NAMESPACES.get(namespace) if found else None


def is_shared_object(name):
    """Whether an op library's ``name`` is the path of a shared object to load
    (a ``.so`` file, or any path with a folder in it) rather than a module to import.

    >>> is_shared_object("ops.so"), is_shared_object("tensorflow_text.ops")
    (True, False)
    """
    return name.endswith(".so") or "/" in name or os.sep in name


def recorded(names):
    """``names`` as plan.json keeps them: each shared object by its absolute path (so
    that ``verify`` and ``run`` find it from another folder), modules as given, each
    once.

    >>> recorded(["tensorflow_text", "tensorflow_text"])
    ['tensorflow_text']
    """
    return list(dict.fromkeys(os.path.abspath(name) if is_shared_object(name) else name
                              for name in names or ()))


def check_op_libraries(names, source=""):
    """Fail at once, before TensorFlow starts, on an op library that is not there: a
    module no installed package provides, a shared object that is not a file.
    ``source`` names the file that listed them (a plan.json), if not the command line.

    Raises
    ------
    TfpartError
        Naming the library and ``source``, or the shared object.

    >>> check_op_libraries(["no_such_module_of_ops"])
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: op library no_such_module_of_ops: no Python module of that name is installed
    """
    for name in names or ():
        if is_shared_object(name):
            if not os.path.isfile(name):
                raise _library_error(name, source, "no such file")
        elif not _module_found(name):
            raise _library_error(name, source, "no Python module of that name is installed")


def load_op_libraries(names, source=""):
    """Register the ops of each library of ``names`` in this process: import a module,
    load a shared object with ``tf.load_op_library``; each at most once. Call it before
    TensorFlow reads a model that uses them (importing, loading or optimizing its
    graph). ``source`` as in :func:`check_op_libraries`.

    Raises
    ------
    TfpartError
        Naming the library that is missing or fails to load, and why.

    >>> load_op_libraries(["json"])  # any module: what importing it registers
    """
    check_op_libraries(names, source)
    for name in recorded(names):
        if name in _loaded:
            continue
        try:
            if is_shared_object(name):
                from rewriters.tf_import import tensorflow

                tensorflow().load_op_library(name)
            else:
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a library's import can raise anything
            doing = "loading it" if is_shared_object(name) else "importing it"
            raise _library_error(name, source, f"{doing} failed: "
                                 f"{first_line(exc).removeprefix(name + ': ')}") from None
        _loaded.add(name)


def _module_found(name):
    """Whether the top package of module ``name`` is installed (without importing it)."""
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _library_error(name, source, problem):
    if source:
        return TfpartError(source, f"op library {name} it names: {problem}")
    if is_shared_object(name):
        return TfpartError(name, f"op library: {problem}")
    return TfpartError("", f"op library {name}: {problem}")


_UNREGISTERED = re.compile(r"op type (\S+) is not registered(?!: pass)")


def with_library_hint(problem):
    """A one-line ``problem`` that says an op type is not registered
    (:func:`tfpart.core.errors.first_line` of TensorFlow's error), with what registers
    it: its library by :func:`library_for`, or any. An op this process has registered
    was missing in a ``tfpart worker`` it ran on, so the hint is for the workers.

    >>> with_library_hint("cannot read it: op type Custom>Op is not registered")
    'cannot read it: op type Custom>Op is not registered: pass --op-library with the module or .so that registers it'
    >>> with_library_hint("bad value")
    'bad value'
    """
    found = _UNREGISTERED.search(problem)
    if found is None:
        return problem
    op_type = found.group(1)
    library = library_for(op_type) or "with the module or .so that registers it"
    where = " to every tfpart worker" if _registered_here(op_type) else ""
    return (f"{problem[:found.end()]}: pass --op-library {library}{where}"
            f"{problem[found.end():]}")


def _registered_here(op_type):
    """Whether this process has registered ``op_type`` (False before TensorFlow starts)."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type) is not None


@contextmanager
def naming_op_libraries():
    """Errors of the block that say an op type is not registered say what registers it
    too (:func:`with_library_hint`)."""
    try:
        yield
    except TfpartError as exc:
        problem = with_library_hint(exc.problem)
        if problem == exc.problem:
            raise
        raise type(exc)(exc.path, problem) from None
