"""Which loops and branches mix the samples of a batch, read from the graph alone.

Micro-batches and replicas are exact only when every output row depends on its own
input row alone. A loop or a branch breaks that where no probe may see it: a
``tf.while_loop`` that stops when the largest value of the batch passes a bound runs as
many trips for every sample as the worst sample needs, and a ``tf.cond`` on the batch's
mean takes one branch for all of them; run on a part of the batch, both may decide
otherwise. :mod:`rewriters.batch_check` runs the graph on two batches, which shows such
a loop only when the two happen to differ; this module proves it from the graph.

Each tensor of the flat graph (and of every loop body, condition, branch and function
it calls) is given a role (:mod:`rewriters.batch_roles`), starting from the signature's
inputs, whose axis 0 is the batch: ``static``, ``size`` (the batch's size), ``rows``
(each sample's own values), ``sample`` (the one sample a loop over the batch reads on
this trip), ``mixed`` (several samples' values, with the op where they met) and lists
of these. A tensor is reported only where it decides control flow, and only where the
analysis can show that it combines samples: from a batch input through ops it knows to
an op known to combine rows (a reduction over the batch, a slice that picks some of
its rows, …). What it cannot read (an op the role table does not list, such as a
custom op's; a rank or an axis it cannot tell) proves nothing, and is left to the
random probe. It is reported:

- a loop (``While``, ``StatelessWhile``; a ``tf.compat.v1`` frame's ``LoopCond``) whose
  stop condition reads values of the batch, directly or through the values it carries
  (a carried value is the join of its start and of what the body makes of it, to a
  fixed point);
- a loop whose number of trips is the batch size and that changes the per-sample
  values it carries on every trip (each row then depends on how many samples share
  its batch); ``tf.map_fn`` over the batch is not one: it reads sample ``i`` (a list's
  element, or ``tf.gather(x, i)``, at the loop's counter) and writes slot ``i`` of a
  list on trip ``i``, so its output is rows;
- a branch (``If``, ``StatelessIf``, ``Case``, ``StatelessCase``, a
  ``tf.compat.v1.cond``'s ``Switch``) taken on a predicate that reads values of the
  batch. A predicate on one sample inside a loop over the batch (``tf.cond`` in the
  function of a ``tf.map_fn``) is that sample's own. A branch whose only effect is an
  assertion changes no values and is not one: an ``AssertGuard`` (what
  ``tf.debugging.assert_*`` and ``tf.debugging.Assert`` build), or any branch that runs
  no stateful op but assertions and prints and either gives the same values whichever
  way it goes or gives values that only control edges wait for.

A loop whose trip count is fixed, or is a dimension of an input other than the batch
(``tf.shape(x)[1]``: a Keras RNN's time steps), is not reported, nor is a branch on a
weight. A branch on the batch size alone is not reported either (its branches may well
compute the same rows); it only makes what it returns depend on the batch size. A
``tf.compat.v1`` loop is reported for its stop condition only, and what a signature
keeps in variables or tables between calls counts as static.

Examples
--------
>>> carried(Role("sample", loop="map/while"), "map/while").why
'loop map/while, which carries values of one sample into the next'
>>> carried(Role("rows", axis=0), "map/while")
Role(kind='rows', axis=0)
"""
from __future__ import annotations

from rewriters.batch_roles import (STATIC, Role, constant_of, join, maybe_mixed, mixed,
                                   op_roles, proves_mixing, steered)
from rewriters.functions import library_index
from rewriters.tf_import import tensorflow
from tfpart.core.ops import CALL_OPS, LOOP_BACK_OPS, LOOP_EXIT_OPS

LOOPS = {"While", "StatelessWhile"}
BRANCHES = {"If", "StatelessIf", "Case", "StatelessCase"}
SWITCHES = {"Switch", "RefSwitch"}
DECIDING_OPS = LOOPS | BRANCHES | SWITCHES | {"LoopCond"}
CHECKS = {"Assert", "Print", "PrintV2"}  # stateful ops whose only effect is no value
MAX_PASSES = 8  # rounds of a loop's fixed point; a loop that needs more is mixed


def carried(role, loop):
    """A loop variable's next value, as the loop ``loop`` carries it to the next trip:
    a value of the trip's own sample becomes one of several samples."""
    why = f"loop {loop}, which carries values of one sample into the next"
    if role.kind == "sample" and role.loop == loop:
        return mixed(why)
    if role.kind == "list" and role.elem.kind == "sample" and role.elem.loop == loop:
        return Role("list", elem=mixed(why))
    return role


def batch_flow_mixing(graph_def, batch_inputs):
    """The loops and branches of ``graph_def`` (a GraphDef with its function library)
    that mix the samples of a batch (see the module docstring), each as ``(op,
    reason)`` in the graph's order; an op of a function a loop, branch or call runs is
    named after that op (``outer/inner``). ``batch_inputs``: the placeholders whose
    axis 0 is the batch.

    Examples
    --------
    >>> import tensorflow as tf
    >>> @tf.function(input_signature=[tf.TensorSpec([None, 4])])
    ... def halve(x):  # until the batch's largest value is at most 1
    ...     return tf.while_loop(lambda h: tf.reduce_max(h) > 1.0, lambda h: h / 2, [x])
    >>> batch_flow_mixing(halve.get_concrete_function().graph.as_graph_def(), ["x"])
    [('while', 'its stop condition depends on Max over the batch at op while/while/Max')]
    """
    tf = tensorflow()
    if not _decides(graph_def):
        return []
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return _mixing(graph, graph_def.library, batch_inputs)


def signature_mixing(flat, path=""):
    """:func:`batch_flow_mixing` of a flattened signature
    (:class:`rewriters.flat_signature.FlatSignature`) of the model at ``path``, every
    input with a dimension batched along its first.

    Raises
    ------
    tfpart.core.errors.ModelError
        If the flat graph cannot be imported."""
    from rewriters.flat_signature import import_flat

    if not _decides(flat.graph_def):
        return []
    batched = [placeholder for placeholder, shape, _ in flat.inputs.values() if shape]
    return _mixing(import_flat(flat, path), flat.graph_def.library, batched)


def _mixing(graph, library, batch_inputs):
    seeds = {f"{name}:0": Role("rows", axis=0) for name in batch_inputs}
    analysis = _Analysis(library_index(library))
    analysis.walk(graph, seeds, "", record=True)
    return list(analysis.findings.items())


def _decides(graph_def):
    """Whether the graph or its library has an op that steers control flow."""
    if any(node.op in DECIDING_OPS for node in graph_def.node):
        return True
    return any(node.op in DECIDING_OPS for function in graph_def.library.function
               for node in function.node_def)


class _Analysis:
    """One walk over a graph and the functions it runs, gathering findings."""

    def __init__(self, functions):
        self.functions = functions
        self.findings = {}
        self._graphs = {}
        self._judged = set()  # predicates of tf.compat.v1 conds already judged
        self._waited_for = {}  # graph -> names of the ops control edges wait for
        self._check_only_functions = {}  # function name -> whether it only checks
        self._no_effect = {}  # (graph, op name) -> whether the branch only checks

    # graphs

    def walk(self, graph, seeds, prefix, record):
        """Roles of every tensor of ``graph`` by name, from ``seeds`` (tensor name ->
        role; other placeholders are static); ``prefix`` names the call site."""
        ops = graph.get_operations()
        cyclic = any(op.type in LOOP_BACK_OPS for op in ops)
        roles = dict(seeds)
        for rounds in range(MAX_PASSES + 1 if cyclic else 1):
            before = dict(roles)
            last = not cyclic or rounds == MAX_PASSES
            for op in ops:
                self._visit(op, roles, prefix, record and last)
            if cyclic and not last and roles == before:
                for op in ops:  # converged: once more to report
                    self._visit(op, roles, prefix, record)
                break
        return roles

    def _visit(self, op, roles, prefix, record):
        if op.type in ("Placeholder", "PlaceholderWithDefault") and f"{op.name}:0" in roles:
            return
        inputs = [roles.get(t.name) for t in op.inputs]
        name = f"{prefix}{op.name}"
        if op.type == "Merge":  # a back edge not yet seen stays None
            outputs = [_join_all(inputs, f"Merge at op {name}"), STATIC]
        elif op.type in LOOP_EXIT_OPS:
            outputs = [_exit_role(op, inputs[0], roles, name)]
        else:
            inputs = [STATIC if r is None else r for r in inputs]
            outputs = self._outputs(op, inputs, prefix, record)
        for tensor, role in zip(op.outputs, outputs):
            roles[tensor.name] = role

    def _function(self, name, shapes):
        """The graph of library function ``name``, its inputs of ``shapes``."""
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        tf = tensorflow()
        key = (name, tuple(str(s) for s in shapes))
        if key not in self._graphs:
            fdef = self.functions[name]
            count = len(fdef.signature.input_arg)
            fixed = (list(shapes) + [tf.TensorShape(None)] * count)[:count]
            try:
                self._graphs[key] = function_def_to_graph(fdef, input_shapes=fixed)
            except (ValueError, tf.errors.OpError):
                self._graphs[key] = function_def_to_graph(fdef)
        return self._graphs[key]

    def call(self, name, roles, shapes, prefix, record):
        """Roles of the outputs of function ``name`` on inputs of ``roles``."""
        graph = self._function(name, shapes)
        seeds = {t.name: r for t, r in zip(graph.inputs, roles)}
        found = self.walk(graph, seeds, prefix, record)
        return [found.get(t.name, STATIC) for t in graph.outputs]

    # ops

    def _outputs(self, op, inputs, prefix, record):
        name = f"{prefix}{op.name}"
        if op.type in LOOPS:
            return self._loop(op, inputs, name, record)
        if op.type in BRANCHES:
            return self._branch(op, inputs, name, record)
        if op.type in SWITCHES:
            return self._switch(op, inputs, name, record)
        if op.type == "LoopCond" and record and _decides_for_all(inputs[0]):
            self._found(name, f"its stop condition depends on {_reads(inputs[0], name)}")
        function = op.get_attr("f").name if op.type in CALL_OPS else \
            op.type if op.type in self.functions else None
        if function is not None:
            shapes = [t.shape for t in op.inputs]
            return self.call(function, inputs, shapes, f"{name}/", record)
        return op_roles(op, inputs, name)

    def _found(self, name, reason):
        self.findings.setdefault(name, reason)

    def _loop(self, op, inputs, name, record):
        shapes = [tensorflow().TensorShape(s) for s in op.get_attr("output_shapes")] or \
            [t.shape for t in op.inputs]
        body_name, cond_name = op.get_attr("body").name, op.get_attr("cond").name
        body = self._function(body_name, shapes)
        counters = _counters(op, body)
        kept = _passed_through(body)
        roles = list(inputs)
        for _ in range(MAX_PASSES):
            after = self.call(body_name, _seeded(roles, counters, name), shapes,
                              f"{name}/", record=False)
            new = [join(r, carried(a, name), f"loop {name}")
                   for r, a in zip(roles, after)]
            if new == roles:
                break
            roles = new
        else:
            roles = [r if k in kept else maybe_mixed(f"loop {name}, too deep to follow")
                     for k, r in enumerate(roles)]
        seeds = _seeded(roles, counters, name)
        if record:
            self.call(body_name, seeds, shapes, f"{name}/", record=True)
        trips = self.call(cond_name, seeds, shapes, f"{name}/", record)[0]
        if record:
            self._judge_loop(name, trips, roles, kept)
        return [role if k in kept else steered(role, trips, f"loop {name}")
                for k, role in enumerate(roles)]

    def _judge_loop(self, name, trips, roles, kept):
        if _decides_for_all(trips):
            self._found(name, f"its stop condition depends on {_reads(trips, name)}")
        elif trips.kind == "size":
            changed = [r for k, r in enumerate(roles) if k not in kept and
                       r.kind in ("rows", "sample", "mixed")]
            if changed:
                self._found(name, "its trip count is the batch size (from "
                            f"{trips.why}) and each trip changes the per-sample values it "
                            "carries")

    def _branch(self, op, inputs, name, record):
        predicate, arguments = inputs[0], inputs[1:]
        if op.type in ("If", "StatelessIf"):
            branches = [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
        else:
            branches = [f.name for f in op.get_attr("branches")]
        shapes = [t.shape for t in op.inputs[1:]]
        results = [self.call(branch, arguments, shapes, f"{name}/", record)
                   for branch in branches]
        outputs = [_join_all(list(each), f"branch {name}") for each in zip(*results)]
        if predicate.kind != "static" and self._changes_no_values(op, branches):
            return outputs
        if record and _decides_for_all(predicate):
            self._found(name, f"its predicate depends on {_reads(predicate, name)}")
        return [steered(role, predicate, f"branch {name}") for role in outputs]

    def _switch(self, op, inputs, name, record):
        data, predicate = inputs
        if op.inputs[1].op.type == "LoopCond":
            return [data, data]
        decider = _source(op.inputs[1]).name  # one cond has a Switch per tensor it takes
        if record and _decides_for_all(predicate) and decider not in self._judged:
            self._judged.add(decider)
            if not self._only_checks_switched(op.graph, decider):
                self._found(name, f"its predicate depends on {_reads(predicate, name)}")
        role = steered(data, predicate, f"branch {name}")
        return [role, role]

    # branches whose only effect is a check

    def _changes_no_values(self, op, branches):
        """Whether the branch ``op``, running the functions ``branches``, has no effect
        but checks: they run no other stateful op, and either return the same arguments
        or return values that only control edges wait for (an ``AssertGuard``)."""
        key = (op.graph, op.name)
        if key not in self._no_effect:
            definitions = [self.functions[branch] for branch in branches]
            self._no_effect[key] = all(map(self._only_checks, definitions)) and (
                _same_arguments_returned(definitions) or self._unread([op]))
        return self._no_effect[key]

    def _unread(self, ops):
        """Whether only control edges wait for the outputs of ``ops`` (of one graph):
        what reads them, and so on, runs no stateful op but checks, and ends in ops that
        have no outputs or that control edges wait for (one whose outputs nothing reads
        or waits for may be fetched)."""
        if not ops:
            return True
        graph = ops[0].graph
        fetched = {t.name for t in getattr(graph, "outputs", None) or ()}
        waited_for = self._waited(graph)
        seen, stack = {op.name for op in ops}, list(ops)
        while stack:
            op = stack.pop()
            readers = [reader for t in op.outputs for reader in t.consumers()]
            if any(t.name in fetched for t in op.outputs) or \
                    op.outputs and not readers and op.name not in waited_for:
                return False
            for reader in readers:
                if reader.name not in seen:
                    if not self._checks_only(reader.type, reader.node_def.attr):
                        return False
                    seen.add(reader.name)
                    stack.append(reader)
        return True

    def _waited(self, graph):
        if graph not in self._waited_for:
            names = {c.name for op in graph.get_operations() for c in op.control_inputs}
            names |= {op.name for op in getattr(graph, "control_outputs", None) or ()}
            self._waited_for[graph] = names
        return self._waited_for[graph]

    def _only_checks_switched(self, graph, decider):
        """Whether a ``tf.compat.v1`` cond on ``decider`` (a tensor's name) is one whose
        only effect is a check: what its ``Switch``es give is read only as
        :meth:`_unread` says."""
        return self._unread([op for op in graph.get_operations() if op.type in SWITCHES
                             and op.inputs[1].op.type != "LoopCond"
                             and _source(op.inputs[1]).name == decider])

    def _checks_only(self, op_type, attrs):
        """Whether an op of ``op_type`` (its NodeDef's ``attrs``) has no effect but its
        outputs and checks; a branch or a call, where the functions it runs have
        none."""
        from tensorflow.python.framework import op_def_registry

        if op_type in CHECKS:
            return True
        if op_type in BRANCHES or op_type in CALL_OPS:
            names = [attrs[key].func.name for key in ("then_branch", "else_branch", "f")
                     if key in attrs]
            names += [f.name for f in attrs["branches"].list.func] if "branches" in attrs \
                else []
            return all(name in self.functions and self._only_checks(self.functions[name])
                       for name in names)
        op_def = op_def_registry.get(op_type)
        return op_def is not None and not op_def.is_stateful

    def _only_checks(self, fdef):
        """Whether the function ``fdef`` (a FunctionDef) has no effect but its outputs
        and checks."""
        name = fdef.signature.name
        if name not in self._check_only_functions:
            self._check_only_functions[name] = False  # a function that calls itself
            self._check_only_functions[name] = all(
                self._checks_only(node.op, node.attr) for node in fdef.node_def)
        return self._check_only_functions[name]


def _decides_for_all(role):
    """Whether a deciding value of ``role`` decides for several samples at once, as far
    as the graph shows: the batch's rows read whole, or values known to mix them."""
    return role.kind == "rows" or proves_mixing(role)


def _returned_argument(fdef, output):
    """The index of the argument that ``fdef`` returns as ``output`` (through
    ``Identity``), else None."""
    nodes = {node.name: node for node in fdef.node_def}
    arguments = [arg.name for arg in fdef.signature.input_arg]
    value = fdef.ret[output.name]
    while True:
        name = value.split(":")[0]
        if name not in nodes:
            return arguments.index(name) if name in arguments else None
        node = nodes[name]
        if node.op not in ("Identity", "Snapshot") or not node.input:
            return None
        value = node.input[0]


def _same_arguments_returned(fdefs):
    """Whether every branch of ``fdefs`` returns, as each output, the same argument."""
    returned = [[_returned_argument(fdef, output) for output in fdef.signature.output_arg]
                for fdef in fdefs]
    return all(None not in each and each == returned[0] for each in returned)


def _join_all(roles, why):
    role = None
    for each in roles:
        role = join(role, each, why)
    return STATIC if role is None else role


def _reads(role, name):
    """What a deciding value of ``role`` reads, for a finding's reason."""
    return role.why if role.kind == "mixed" and role.why else \
        f"the batch's rows, read whole at op {name} (one decision for all its samples)"


def _exit_role(op, role, roles, name):
    """A ``tf.compat.v1`` loop variable leaving its frame, after as many trips as the
    frame's ``LoopCond`` decides."""
    switch = op.inputs[0].op
    if role is None or switch.type not in SWITCHES or switch.inputs[1].op.type != "LoopCond":
        return STATIC if role is None else role
    trips = roles.get(switch.inputs[1].name, STATIC)
    prefix = name[:len(name) - len(op.name)]
    return steered(role, trips, f"loop {prefix}{switch.inputs[1].op.name}")


def _seeded(roles, counters, loop):
    return [Role("static", loop=loop) if k in counters and r.kind == "static" else r
            for k, r in enumerate(roles)]


def _source(tensor):
    while tensor.op.type in ("Identity", "Snapshot") and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def _passed_through(body):
    """Indices of the loop variables the body returns unchanged."""
    return {k for k, (arg, result) in enumerate(zip(body.inputs, body.outputs))
            if _source(result) is arg or _source(result).name == arg.name}


def _counters(op, body):
    """Indices of the loop variables that count trips from 0: they start at a constant 0
    and the body adds 1."""
    found = set()
    for k, (arg, result) in enumerate(zip(body.inputs, body.outputs)):
        step = _source(result).op
        if step.type not in ("Add", "AddV2") or k >= len(op.inputs):
            continue
        terms = [_source(t) for t in step.inputs]
        names = [t.name for t in terms]
        if arg.name in names and constant_of(terms[1 - names.index(arg.name)]) == 1 and \
                constant_of(_source(op.inputs[k])) == 0:
            found.add(k)
    return found


__all__ = ["batch_flow_mixing", "carried", "signature_mixing"]
