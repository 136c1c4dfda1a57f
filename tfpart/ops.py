"""The one op taxonomy: what kind of work each TensorFlow op type does.

Every layer reads these sets from here (the cost model's efficiency classes, the FLOP
counter, memory accounting, coarsening, the readers and rewriters of TF protos), so an
op type is classified once.

Examples
--------
>>> op_class("Conv2D"), op_class("Relu"), op_class("Mean"), op_class("ConcatV2")
('matmul', 'elementwise', 'reduction', 'data_movement')
>>> "ReadVariableOp" in ALIASING_OPS and "ReadVariableOp" in WEIGHT_OPS
True
"""

MATMUL_OPS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
              "Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
              "Conv3DBackpropInputV2", "_FusedConv2D", "_FusedMatMul", "Conv"}
# Reductions along axes: one FLOP per input element.
AXIS_REDUCTION_OPS = {"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any",
                      "L2Loss"}
REDUCTION_OPS = AXIS_REDUCTION_OPS | {
    "Softmax", "LogSoftmax", "MaxPool", "AvgPool", "MaxPoolV2", "MaxPool3D", "AvgPool3D",
    "FusedBatchNorm", "FusedBatchNormV3", "TopKV2"}
DATA_MOVEMENT_OPS = {"Transpose", "ConcatV2", "Concat", "Pack", "Unpack", "Split", "SplitV",
                     "Slice", "StridedSlice", "Gather", "GatherV2", "GatherNd",
                     "ResourceGather", "Pad", "PadV2", "MirrorPad", "Tile", "Cast",
                     "BroadcastTo", "OneHot", "Fill", "ZerosLike", "OnesLike", "Select",
                     "SelectV2", "ScatterNd", "TensorScatterUpdate", "ReverseV2"}
# Ops that move no data: TensorFlow aliases their buffers or only reads metadata.
FREE_OPS = {"NoOp", "Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp",
            "Identity", "IdentityN", "Shape", "ShapeN", "Size", "Rank", "ReadVariableOp",
            "StopGradient", "Reshape", "Squeeze", "ExpandDims", "_Arg", "_Retval",
            "VarIsInitializedOp", "EnsureShape", "CheckNumerics", "PreventGradient",
            "Snapshot"}
# Ops whose output shares their input's buffer (no new memory on their device).
ALIASING_OPS = {"ReadVariableOp", "Identity", "IdentityN", "Reshape", "Squeeze",
                "ExpandDims", "StopGradient", "Snapshot", "EnsureShape", "PreventGradient"}
IDENTITY_OPS = {"Identity", "IdentityN"}
# Where weights come from: variables, their reads, constants.
WEIGHT_OPS = {"VarHandleOp", "ReadVariableOp", "Const", "VariableV2"}
# Kernels that exist only on the host CPU (Python callbacks, I/O, strings, tables).
HOST_ONLY_OPS = {"PyFunc", "EagerPyFunc", "PyFuncStateless", "PrintV2", "Print",
                 "SaveV2", "RestoreV2", "MergeV2Checkpoints", "ShardedFilename",
                 "ReadFile", "WriteFile", "DecodeJpeg", "DecodePng", "DecodeImage",
                 "EncodeJpeg", "EncodePng", "ParseExample", "ParseExampleV2",
                 "ParseSingleExample", "HashTableV2", "LookupTableFindV2",
                 "LookupTableImportV2", "MutableHashTableV2"}
CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}
CONTROL_FLOW_OPS = {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"}


def op_class(op_type):
    """The efficiency class of an op type: matmul, reduction, data_movement or
    elementwise."""
    if op_type in MATMUL_OPS:
        return "matmul"
    if op_type in REDUCTION_OPS:
        return "reduction"
    if op_type in DATA_MOVEMENT_OPS:
        return "data_movement"
    return "elementwise"
