"""NodeDefs built by hand for the rewrites made in a flat GraphDef (filter splits, row
shards): a node with attributes, an integer constant, and attribute values (types,
integers, booleans, strings, shapes).

Examples
--------
>>> node = make_node("y", "Reshape", ["x", "shape"], T=type_attr("float32"))
>>> node.op, list(node.input), node.attr["T"].type
('Reshape', ['x', 'shape'], 1)
>>> int_constant("s", [2, 3]).attr["value"].tensor.tensor_shape.dim[0].size
2
"""
from __future__ import annotations

from rewriters.tf_import import tensorflow


def make_node(name, op, inputs, **attrs):
    """A NodeDef ``name`` of type ``op`` reading ``inputs``, with AttrValue ``attrs``."""
    tf = tensorflow()
    node = tf.compat.v1.NodeDef(name=name, op=op, input=inputs)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def int_constant(name, value, dtype="int32"):
    """A ``Const`` of the integers ``value`` (a number or a nested list)."""
    tf = tensorflow()
    return make_node(name, "Const", [], dtype=type_attr(dtype), value=tf.compat.v1.AttrValue(
        tensor=tf.make_tensor_proto(value, tf.as_dtype(dtype))))


def type_attr(name):
    """The AttrValue of dtype ``name``."""
    tf = tensorflow()
    return tf.compat.v1.AttrValue(type=tf.as_dtype(name).as_datatype_enum)


def int_attr(value):
    """The AttrValue of the integer ``value``."""
    tf = tensorflow()
    return tf.compat.v1.AttrValue(i=value)


def bool_attr(value):
    """The AttrValue of the boolean ``value``."""
    return tensorflow().compat.v1.AttrValue(b=value)


def string_attr(text):
    """The AttrValue of the string ``text``."""
    return tensorflow().compat.v1.AttrValue(s=text.encode())


def shape_attr(dims):
    """The AttrValue of the shape ``dims``."""
    tf = tensorflow()
    return tf.compat.v1.AttrValue(shape=tf.TensorShape(dims).as_proto())


__all__ = ["bool_attr", "int_attr", "int_constant", "make_node", "shape_attr", "string_attr",
           "type_attr"]
