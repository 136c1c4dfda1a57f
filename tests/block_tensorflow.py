"""A pytest plugin (``-p tests.block_tensorflow``) that makes TensorFlow, Keras and
protobuf unimportable, as in an environment without them (in a hook, so that the
doctest collection, which imports this module, blocks nothing)."""
import sys

BLOCKED = ("tensorflow", "keras", "google.protobuf")


def pytest_configure(config):
    for name in BLOCKED:
        sys.modules[name] = None  # import then raises ModuleNotFoundError
