"""Everything that reads or writes TensorFlow protos.

Import order matters for start-up time only: TensorFlow is imported lazily through
:func:`rewriters.tf_import.tensorflow`.
"""
