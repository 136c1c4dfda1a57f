"""The one op taxonomy: what kind of work each TensorFlow op type does.

Every layer reads these sets from here (the cost model's efficiency classes, the FLOP
counter, memory accounting, coarsening, the readers and rewriters of TF protos), so an
op type is classified once.

Examples
--------
>>> op_class("Conv2D"), op_class("Relu"), op_class("Mean"), op_class("ConcatV2")
('matmul', 'elementwise', 'reduction', 'data_movement')
>>> kernel_class("Conv2D"), kernel_class("Conv2DBackpropFilter"), kernel_class("Einsum")
('conv', 'conv_backprop_filter', 'gemm')
>>> kernel_class("Relu")  # the coarse class where there is no finer one
'elementwise'
>>> class_lineage("conv_backprop_input")
('conv_backprop_input', 'matmul')
>>> "ReadVariableOp" in ALIASING_OPS and "ReadVariableOp" in WEIGHT_OPS
True
"""

GEMM_OPS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
            "_FusedMatMul"}
CONV_OPS = {"Conv2D", "Conv3D", "DepthwiseConv2dNative", "_FusedConv2D", "Conv"}
CONV_BACKPROP_INPUT_OPS = {"Conv2DBackpropInput", "Conv3DBackpropInputV2",
                           "DepthwiseConv2dNativeBackpropInput"}
CONV_BACKPROP_FILTER_OPS = {"Conv2DBackpropFilter", "Conv3DBackpropFilterV2",
                            "DepthwiseConv2dNativeBackpropFilter"}
# Ops that run on matrix units (tensor cores): their peak follows the precision.
MATMUL_OPS = GEMM_OPS | CONV_OPS | CONV_BACKPROP_INPUT_OPS | CONV_BACKPROP_FILTER_OPS
# Reductions along axes: one FLOP per input element.
AXIS_REDUCTION_OPS = {"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any",
                      "L2Loss", "BiasAddGrad"}
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
# Ops whose outputs depend on their inputs' shapes only, never their values.
SHAPE_ONLY_OPS = {"Shape", "ShapeN", "Size", "Rank", "TensorListLength", "VariableShape",
                  "TensorListElementShape"}
# Ops whose output shares their input's buffer (no new memory on their device).
ALIASING_OPS = {"ReadVariableOp", "Identity", "IdentityN", "Reshape", "Squeeze",
                "ExpandDims", "StopGradient", "Snapshot", "EnsureShape", "PreventGradient"}
# Element-wise kernels that write their output into an input's buffer when they are
# its last reader and the sizes match (TensorFlow's forward_input_or_allocate_output).
FORWARDING_OPS = {
    "Abs", "Neg", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Exp",
    "Expm1", "Log", "Log1p", "Sqrt", "Rsqrt", "Square", "Reciprocal", "Inv", "Softplus",
    "Softsign", "Erf", "Erfc", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Softmax",
    "LogSoftmax", "BiasAdd", "Add", "AddV2", "Sub", "Mul", "Div", "RealDiv", "DivNoNan",
    "MulNoNan", "Maximum", "Minimum", "Pow", "SquaredDifference", "FloorDiv", "FloorMod",
    "AddN", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad",
    "SigmoidGrad", "TanhGrad", "SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "SoftplusGrad"}
# Kernels that copy their data inputs into scratch buffers held while they run
# (Einsum transposes its operands into the layout of a batched matmul).
INPUT_COPYING_OPS = {"Einsum"}
IDENTITY_OPS = {"Identity", "IdentityN"}
# Ops that write a variable through its resource handle (optimizer updates among them).
RESOURCE_WRITE_OPS = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                      "ResourceApplyGradientDescent", "ResourceApplyMomentum",
                      "ResourceApplyKerasMomentum", "ResourceApplyAdam",
                      "ResourceApplyAdagradV2", "ResourceApplyRMSProp",
                      "ResourceScatterAdd", "ResourceScatterUpdate"}
# Ops that write a legacy ref variable (TF1's VariableV2); its optimizers' ``Apply*``
# ops are told by their names (:func:`writes_state`).
REF_WRITE_OPS = {"Assign", "AssignAdd", "AssignSub", "ScatterUpdate", "ScatterAdd",
                 "ScatterSub", "ScatterMul", "ScatterDiv", "ScatterNdUpdate", "ScatterNdAdd",
                 "CountUpTo"}
# Where weights come from: variables, their reads, constants.
WEIGHT_OPS = {"VarHandleOp", "ReadVariableOp", "Const", "VariableV2"}
VARIABLE_OPS = {"VarHandleOp", "VariableV2"}  # the variables themselves
# Lookup tables (Keras StringLookup, IntegerLookup, TextVectorization) and their ops:
# TensorFlow registers their kernels for the CPU only.
TABLE_CREATORS = {"HashTable", "HashTableV2", "MutableHashTable", "MutableHashTableV2",
                  "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2",
                  "MutableDenseHashTable", "MutableDenseHashTableV2", "AnonymousHashTable",
                  "AnonymousMutableHashTable", "AnonymousMutableHashTableOfTensors",
                  "AnonymousMutableDenseHashTable"}
TABLE_OPS = TABLE_CREATORS | {
             "LookupTableFind", "LookupTableFindV2",
             "LookupTableInsert", "LookupTableInsertV2", "LookupTableRemoveV2",
             "LookupTableImport", "LookupTableImportV2", "LookupTableExport",
             "LookupTableExportV2", "LookupTableSize", "LookupTableSizeV2",
             "InitializeTable", "InitializeTableV2", "InitializeTableFromTextFile",
             "InitializeTableFromTextFileV2", "InitializeTableFromDataset"}
# Kernels that exist only on the host CPU (Python callbacks, I/O, strings, tables,
# ragged-tensor conversions). Any op with a string input or output is host-only too.
HOST_ONLY_OPS = {"PyFunc", "EagerPyFunc", "PyFuncStateless", "PrintV2", "Print",
                 "SaveV2", "RestoreV2", "MergeV2Checkpoints", "ShardedFilename",
                 "ReadFile", "WriteFile", "DecodeJpeg", "DecodePng", "DecodeImage",
                 "EncodeJpeg", "EncodePng", "ParseExample", "ParseExampleV2",
                 "ParseSingleExample", "RaggedTensorToTensor", "RaggedTensorToSparse",
                 "RaggedTensorToVariant", "RaggedTensorFromVariant", "RaggedGather",
                 "RaggedRange", "RaggedCross", "RaggedBincount", "SparseBincount",
                 *TABLE_OPS}
# Ops that own state which every micro-batch and replica shares: variables and tables.
STATE_OPS = VARIABLE_OPS | TABLE_CREATORS
CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}
CONTROL_FLOW_OPS = {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"}
# tf.compat.v1.while_loop (control flow v1): a cycle entered by Enter, closed by
# NextIteration's back edge, left by Exit.
LOOP_ENTRY_OPS = {"Enter", "RefEnter"}
LOOP_EXIT_OPS = {"Exit", "RefExit"}
LOOP_BACK_OPS = {"NextIteration", "RefNextIteration"}


def writes_state(op_type):
    """Whether ops of ``op_type`` write a variable (through a handle or a ref) or a
    table.

    >>> writes_state("ApplyAdam"), writes_state("Assign"), writes_state("LookupTableFindV2")
    (True, True, False)
    """
    return (op_type in RESOURCE_WRITE_OPS or op_type in REF_WRITE_OPS
            or op_type.startswith(("Apply", "SparseApply", "ResourceApply",
                                   "ResourceSparseApply", "ResourceScatter", "LookupTableInsert",
                                   "LookupTableRemove", "LookupTableImport", "InitializeTable")))


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


# Kernel classes: op_class split where measured kernels differ (cuDNN's backward
# convolutions run far below its forward ones). A kind's efficiency table may give a
# kernel class or only its coarse class; lookups walk class_lineage.
_KERNEL_CLASSES = [(CONV_OPS, "conv"), (CONV_BACKPROP_INPUT_OPS, "conv_backprop_input"),
                   (CONV_BACKPROP_FILTER_OPS, "conv_backprop_filter"), (GEMM_OPS, "gemm")]
KERNEL_CLASSES = ("conv", "conv_backprop_input", "conv_backprop_filter", "gemm",
                  "elementwise", "reduction", "data_movement")
COARSE_CLASSES = ("matmul", "elementwise", "reduction", "data_movement")


def kernel_class(op_type):
    """The finest efficiency class of an op type (one of :data:`KERNEL_CLASSES`)."""
    for ops, name in _KERNEL_CLASSES:
        if op_type in ops:
            return name
    return op_class(op_type)


def class_lineage(kernel_class_name):
    """A kernel class, then the coarse class it refines (if different)."""
    coarse = "matmul" if kernel_class_name in ("conv", "conv_backprop_input",
                                               "conv_backprop_filter", "gemm") \
        else kernel_class_name
    return (kernel_class_name,) if coarse == kernel_class_name else (kernel_class_name, coarse)
