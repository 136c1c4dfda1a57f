"""Loading compiled models with stock TensorFlow, and making them runnable here.

``load`` is the Python API's front door; in plain TensorFlow it is::

    tf.saved_model.load(path, options=tf.saved_model.LoadOptions(
        experimental_variable_policy=
            tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES))

:func:`runnable` gives a compiled model's plan and a folder to load, either as it is
(connected to its cluster's servers, :mod:`tfpart.servers`) or with its devices mapped
onto local logical CPUs. :mod:`tfpart.verification` and :mod:`tfpart.timing` run it.
"""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rewriters.tf_import import tensorflow
from tfpart.checkpoints import check_saved_model_variables
from tfpart.core.errors import ModelError, TfpartError
from tfpart.core.plan import Plan
from tfpart.servers import connect

def load(path):
    """Load a compiled SavedModel with its variables on the devices it names."""
    tf = tensorflow()
    options = tf.saved_model.LoadOptions(
        experimental_variable_policy=tf.saved_model.experimental.VariablePolicy
        .SAVE_VARIABLE_DEVICES)
    return tf.saved_model.load(str(path), options=options)

class SessionSignature:
    """One signature of a TF1 SavedModel, run in a ``tf.compat.v1`` session: the loader
    that honours every node's device, its variables' included (``tf.saved_model.load``
    lifts a TF1 model's resource variables onto the default device). Called like a TF2
    signature, with keyword tensors, it returns a dict of numpy arrays.

    Parameters
    ----------
    path : str or pathlib.Path
        A TF1 SavedModel (:func:`rewriters.tf1_reader.is_tf1`).
    signature : str
    cpus : int
        Logical CPU devices the session makes (one per cluster device, as
        :func:`rewriters.remap.local_device_map` maps them).
    """

    def __init__(self, path, signature, cpus=1):
        tf = tensorflow()
        from rewriters.savedmodel_io import read_saved_model

        tags = list(read_saved_model(path).meta_graphs[0].meta_info_def.tags)
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph, config=tf.compat.v1.ConfigProto(
            device_count={"CPU": max(cpus, 1)}, allow_soft_placement=False))
        meta = tf.compat.v1.saved_model.load(self.session, tags, str(path))
        found = meta.signature_def[signature]
        self.feeds = {key: info.name for key, info in found.inputs.items()}
        self.fetches = {key: info.name for key, info in found.outputs.items()}
        specs = {key: tf.TensorSpec(self.graph.get_tensor_by_name(name).shape,
                                    self.graph.get_tensor_by_name(name).dtype, name=key)
                 for key, name in self.feeds.items()}
        self.structured_input_signature = ((), specs)

    def __call__(self, options=None, run_metadata=None, **inputs):
        feed = {self.feeds[key]: np.asarray(value) for key, value in inputs.items()}
        return self.session.run(self.fetches, feed, options=options,
                                run_metadata=run_metadata)

    def run_with_placement(self, inputs):
        """(outputs, {node: device}, {node: op type}) of one call, from the session's
        partition graphs (the nodes it really ran, and where)."""
        tf = tensorflow()
        options = tf.compat.v1.RunOptions(output_partition_graphs=True)
        metadata = tf.compat.v1.RunMetadata()
        outputs = self(options=options, run_metadata=metadata, **inputs)
        nodes = [node for graph in metadata.partition_graphs for node in graph.node
                 if not node.op.startswith("_")]
        return (outputs, {node.name: node.device for node in nodes},
                {node.name: node.op for node in nodes})


def ensure_local_cpus(count):
    """Make at least ``count`` logical CPU devices, if TensorFlow has not started yet;
    an error if fewer exist."""
    tf = tensorflow()
    add_local_cpus(count)
    have = len(tf.config.list_logical_devices("CPU"))
    if have < count:
        raise TfpartError("", f"the plan needs {count} devices but only {have} logical CPU "
                          "devices exist in this process (TensorFlow started before tfpart "
                          "could add more)")


def add_local_cpus(count):
    """Make at least ``count`` logical CPU devices if TensorFlow has not started yet
    (then running a plan of ``count`` devices here later needs nothing more)."""
    tf = tensorflow()
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        current = tf.config.get_logical_device_configuration(cpu) or [None]
        if len(current) < count:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # already initialised: use what exists

def random_inputs(signature_fn, batch_size, seed=0, domains=None, composites=()):
    """Random tensors matching a signature's inputs, unknown dims set to batch_size.

    An input named in ``domains`` (key -> :class:`rewriters.input_ranges.InputDomain`)
    takes ids over all its table's rows, the last one included, or keys of its lookup
    table (sentences of 1 to 4 of them for ``words``), the first value out of the
    vocabulary; other integers are 0 or 1, other strings ``b"tfpart"``. The components
    of a ragged or sparse input (``composites``:
    :func:`rewriters.composite_inputs.composite_inputs`) are a valid value of its spec
    with ``batch_size`` rows, its values drawn so.
    """
    from rewriters.composite_inputs import composite_value

    tf = tensorflow()
    rng = np.random.default_rng(seed)
    specs = signature_fn.structured_input_signature[1]

    def draw(name, shape):
        spec, domain = specs[name], (domains or {}).get(name)
        if domain is not None and domain.keys:
            return _drawn_keys(rng, domain, shape)
        if spec.dtype.is_floating:
            return rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)
        if spec.dtype.is_integer:
            high = domain.rows if domain is not None else 2
            value = rng.integers(0, high, size=shape).astype(spec.dtype.as_numpy_dtype)
            if value.size and high > 2:
                value.flat[0] = high - 1
            return value
        if spec.dtype == tf.bool:
            return rng.integers(0, 2, size=shape).astype(bool)
        return np.full(shape, b"tfpart", dtype=object)

    values = {}
    for composite in composites:
        values.update(composite_value(composite, batch_size, rng, draw))
    for name, spec in specs.items():
        if name not in values:
            values[name] = draw(name, [batch_size if d is None else d
                                       for d in spec.shape.as_list()])
    return {name: tf.constant(values[name], dtype=spec.dtype) for name, spec in specs.items()}


def given_feed(signature_fn, given, batch_size, start=0):
    """``batch_size`` rows of the user's inputs ``given``
    (:class:`rewriters.given_inputs.GivenInputs`), from row ``start`` on and round
    again, as tensors of ``signature_fn``'s inputs."""
    from rewriters.given_inputs import cycled, given_rows

    tf = tensorflow()
    specs = signature_fn.structured_input_signature[1]
    return {key: tf.constant(value, dtype=specs[key].dtype)
            for key, value in given_rows(given, cycled(given, batch_size, start)).items()}


def compiled_inputs(plan, proto, signature_fn, batch_size, seed=0, inputs=None):
    """Inputs of ``batch_size`` rows for ``signature_fn``, the signature of a compiled
    model (its ``plan`` and SavedModel ``proto``, as :func:`runnable` gives them): the
    rows of the ``.npz`` file ``inputs`` taken in turn (:mod:`rewriters.given_inputs`),
    else :func:`random_inputs`. A ragged or sparse input gets a valid value of its spec,
    as plan.json records it (a model the pipeline pass rebuilt takes its components as
    plain tensors), else as ``proto`` says."""
    from rewriters.composite_inputs import composite_inputs, recorded_composites
    from rewriters.given_inputs import read_given_inputs

    meta, signature = proto.meta_graphs[0], plan.context["signature"]
    composites = recorded_composites(plan.context.get("composite_inputs")) or \
        composite_inputs(meta, signature)
    if inputs is None:
        return random_inputs(signature_fn, batch_size, seed, composites=composites)
    return given_feed(signature_fn, read_given_inputs(inputs, meta, signature, composites),
                      batch_size)

def _drawn_keys(rng, domain, shape):
    """An array of ``shape`` of keys of ``domain`` (or sentences of them), its first
    value a key the table does not hold.

    >>> from rewriters.input_ranges import InputDomain
    >>> _drawn_keys(np.random.default_rng(0), InputDomain(keys=(3, 5)), [4]).tolist()
    [6, 5, 5, 3]
    """
    keys = np.array(domain.keys, dtype=object)
    if domain.words:
        value = np.array([b" ".join(rng.choice(keys, int(rng.integers(1, 5))))
                          for _ in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    else:
        value = rng.choice(keys, size=shape)
    if value.size:
        value.flat[0] = max(domain.keys) + 1 if isinstance(domain.keys[0], int) else \
            b"tfpart" + max(domain.keys)
    return value

@dataclass(frozen=True)
class RunnableModel:
    """A compiled model made runnable here, by :func:`runnable`.

    Attributes
    ----------
    plan : tfpart.core.plan.Plan
        Its plan (plan.json).
    proto : tensorflow SavedModel proto
        The SavedModel in ``directory``.
    directory : pathlib.Path
        The folder to load (:func:`load`): the compiled model itself, connected to its
        cluster, or a temporary copy with its devices mapped onto local logical CPUs.
    device_map : dict
        Each device of the plan -> the device it runs on here.
    """

    plan: Plan
    proto: object = field(repr=False)
    directory: Path
    device_map: dict


def _compiled_plan(compiled_dir):
    """The plan of the compiled model in ``compiled_dir`` and its file."""
    plan_file = Path(compiled_dir) / "plan.json"
    if not plan_file.is_file():
        raise ModelError(compiled_dir, "not a tfpart output (plan.json is missing)")
    return Plan.load(plan_file), plan_file


def on_connected_cluster(compiled_dir, cluster, plan=None):
    """A compiled model of ``cluster``, to which this process is connected already (by
    :func:`runnable` or :func:`tfpart.servers.connect`), as it is: connecting again
    would reset TensorFlow's context and with it every model loaded so far. ``plan``:
    its plan, read and held to ``cluster`` already (else read and checked here)."""
    from rewriters.savedmodel_io import read_saved_model

    compiled_dir = Path(compiled_dir)
    if plan is None:
        plan, plan_file = _compiled_plan(compiled_dir)
        _check_plan_devices(plan, cluster, plan_file)
    devices = plan.context.get("devices") or sorted(set(plan.assignment.values()))
    return RunnableModel(plan, read_saved_model(compiled_dir), compiled_dir,
                         {d: d for d in devices})


@contextmanager
def runnable(compiled_dir, cluster=None, watch=False, op_libraries=()):
    """A compiled model made runnable here, for the length of the ``with`` block.

    Parameters
    ----------
    compiled_dir : str or pathlib.Path
        A folder ``compile_model`` or ``tfpart compile`` wrote.
    cluster : tfpart.core.cluster.Cluster, optional
        Its cluster: this process connects to its tasks (:func:`tfpart.servers.connect`,
        ``watch`` them) and the model runs as it is. Without, its devices are mapped
        onto local logical CPUs in a temporary copy, removed when the block ends.
    op_libraries : sequence, optional
        Loaded first (:func:`tfpart.op_libraries.load_op_libraries`), after those its
        plan names (:attr:`~tfpart.core.plan.Plan.op_libraries`).

    Yields
    ------
    RunnableModel
        Its plan, the folder to load and the device each planned device runs on.

    Examples
    --------
    >>> import tempfile, tfpart
    >>> out = tfpart.compile_model(tfpart.examples.saved_model("residual_cnn"),
    ...                            tfpart.clusters.load("local_3cpu"),
    ...                            tempfile.mkdtemp() + "/compiled").out
    >>> with tfpart.runnable(out) as here:
    ...     model = tfpart.load(here.directory)
    ...     print(sorted(set(here.device_map.values()))[0])
    /job:localhost/replica:0/task:0/device:CPU:0
    """
    from rewriters.remap import local_device_map, remap_devices
    from rewriters.savedmodel_io import read_saved_model, write_saved_model
    from tfpart.op_libraries import load_op_libraries

    compiled_dir = Path(compiled_dir)
    plan, plan_file = _compiled_plan(compiled_dir)
    load_op_libraries(plan.op_libraries, plan_file)
    load_op_libraries(op_libraries)
    devices = plan.context.get("devices") or sorted(set(plan.assignment.values()))
    if cluster is not None:
        _check_plan_devices(plan, cluster, plan_file)
        connect(cluster, watch=watch)
        with _naming_a_broken_checkpoint(compiled_dir):
            yield on_connected_cluster(compiled_dir, cluster, plan)
        return
    device_map = local_device_map(devices)
    host = plan.context.get("unread_variables", {}).get("device")
    if host and host not in device_map:  # the host CPU of the first device
        device_map[host] = device_map[devices[0]]
    ensure_local_cpus(len(devices))
    proto = remap_devices(read_saved_model(compiled_dir), device_map)
    with tempfile.TemporaryDirectory(prefix="tfpart-local-") as tmp, \
            _naming_a_broken_checkpoint(compiled_dir):
        yield RunnableModel(plan, proto, Path(write_saved_model(
            proto, compiled_dir, Path(tmp) / "local")), device_map)

@contextmanager
def _naming_a_broken_checkpoint(compiled_dir):
    """Where the block fails (loading the model, say, as a fault of the cluster or of
    the temporary copy run here), raise instead the error that names the compiled
    model's checkpoint file, when it is what cannot be read: checked only then, since
    it reads every variable."""
    try:
        yield
    except Exception:
        check_saved_model_variables(compiled_dir)
        raise

def _check_plan_devices(plan, cluster, plan_file):
    names = {canonical_device(d) for d in cluster.device_names}
    unknown = [d for d in plan.devices_used() if canonical_device(d) not in names]
    if unknown:
        raise TfpartError(cluster.source, f"has no device {unknown[0]}, which "
                          f"{plan_file} places ops on")

def canonical_device(device):
    from tfpart.core.cluster import normalize_device_name

    return normalize_device_name(device) or device

def same_device(a, b):
    return canonical_device(a) == canonical_device(b)
