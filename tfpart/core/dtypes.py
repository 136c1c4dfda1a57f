"""Sizes of TensorFlow dtypes, by name, without importing TensorFlow.

>>> tensor_bytes((32, 224, 224, 3), "float32")
19267584
>>> tensor_bytes((), "resource")
0
"""
import math

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1,
               "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
               "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16, "string": 32,
               "resource": 0, "variant": 0, "half": 2, "double": 8, "qint8": 1,
               "quint8": 1, "qint32": 4}


CHUNK = 256  # the BFC allocator's granularity


def tensor_bytes(shape, dtype):
    """Bytes of a dense tensor; strings count 32 bytes each, handles nothing."""
    return math.prod(shape) * DTYPE_BYTES.get(dtype, 4)


def chunk_bytes(nbytes):
    """Bytes an allocator gives a tensor of ``nbytes``: TensorFlow's BFC allocator (on
    GPUs, and on CPUs where it is on) hands out chunks of at least 256 bytes, in
    multiples of 256 (``kMinAllocationSize``). Matters only for tensors of a few
    kilobytes.

    >>> chunk_bytes(0), chunk_bytes(1), chunk_bytes(256), chunk_bytes(257.5)
    (0, 256, 256, 512)
    """
    return -(-math.ceil(nbytes) // CHUNK) * CHUNK
