"""Tensors and define-by-run automatic differentiation.

A :class:`Tensor` is a device array with a gradient record. A public op called with Tensors
(dnnkit/dispatch.py ``public_op``) runs on its plain arrays as any call does, then — when
gradients are on and an input requires one — records a :class:`Node`: the op, the backend its
forward ran on, the call's arguments and outputs, and the op's gradient rule. Rules live
beside each op in its family file, registered with :func:`gradient`; a rule calls the op's
backward ops on the backend the forward ran on.

``Tensor.backward()`` walks the nodes that lead to the tensor, newest first (a node is always
made after the nodes of its inputs, so creation order is a topological order), calls each
rule once with the sum of the gradients that reached each of its outputs, and adds the
gradients of leaf tensors (those made by the user, such as parameters) into ``grad``. A node
releases what it saved as soon as its rule has run, unless ``retain_graph=True``. A leaf's
post-accumulate hooks (``Tensor.register_post_accumulate_grad_hook``) run once per backward,
as soon as the last node that can send it a gradient has run: dnnkit.distributed starts the
all-reduce of a bucket of gradients from them while the rest of backward is still queued.

Nothing here reads the device: gradients are summed by the ``add`` op on the device, and the
implicit gradient of a scalar is a cached device constant. Only ``item()`` and ``numpy()``
copy to the host.
"""

import contextlib
import itertools
import operator
import threading
from collections.abc import Iterator

from .autograd_hooks import HookedLeaves, settle_roots

GRADIENTS = {}     # op -> Rule
PUBLIC = {}        # op -> its public function (filled by dispatch.public_op)

_seq = itertools.count()
_SEQ = operator.attrgetter("seq")
_mode = threading.local()     # per thread: gradients off (depth of no_grad), module scope


def is_grad_enabled() -> bool:
    """Whether ops called with Tensors record a graph on this thread."""
    return not _mode.__dict__.get("off")


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Ops inside record nothing (inference, optimizer updates): their Tensor outputs do not
    require grad."""
    d = _mode.__dict__
    d["off"] = d.get("off", 0) + 1
    try:
        yield
    finally:
        d["off"] -= 1


@contextlib.contextmanager
def enable_grad() -> Iterator[None]:
    """Record again inside a ``no_grad`` block."""
    d = _mode.__dict__
    saved, d["off"] = d.get("off", 0), 0
    try:
        yield
    finally:
        d["off"] = saved


class module_scope:
    """``with module_scope(module):`` — nodes made inside are attributed to ``module``
    (nn.Module.__call__ enters it), so that a comparison of backends can name the layer an op
    belongs to. A plain class, not a generator: it runs once per module call."""

    __slots__ = ("module", "stack")

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        stack = self.stack = _mode.__dict__.get("scope")
        if stack is None:
            stack = self.stack = _mode.scope = []
        stack.append(self.module)
        return self.module

    def __exit__(self, *exc):
        self.stack.pop()
        return False


def current_module():
    stack = _mode.__dict__.get("scope")
    return stack[-1] if stack else None


@contextlib.contextmanager
def recording(callback):
    """Call ``callback(phase, op, backend, module, args, results)`` for every op called with
    Tensors on this thread (phase "forward"; ``args``: the call's arguments by name) and every
    gradient rule run by backward (phase "backward"; ``results``: {input name: gradient}).
    dnnkit.testing.compare_backends records two runs this way."""
    d = _mode.__dict__
    saved, d["recorder"] = d.get("recorder"), callback
    try:
        yield
    finally:
        d["recorder"] = saved


def recorder():
    return _mode.__dict__.get("recorder")


def thread_mode():
    """This thread's mode as a dict (read-only for callers): ``"off"`` (no_grad depth),
    ``"recorder"``, ``"scope"``; one call for what is_grad_enabled() and recorder() each read
    (dnnkit/tensor_calls.py reads both on every op call)."""
    return _mode.__dict__


def set_location(phase, op, module):
    """Where the thread is (compare_backends reads it when an op's cross-check fails)."""
    _mode.location = (phase, op, module)


def location():
    return _mode.__dict__.get("location")


# ---------------------------------------------------------------- rules

class Rule:
    __slots__ = ("fn", "outputs", "inputs", "reads_out")

    def __init__(self, fn, outputs, inputs, reads_out):
        self.fn = fn
        self.outputs = outputs                 # differentiable output indices (None: all)
        self.inputs = inputs                   # names that may get a gradient (None: any)
        self.reads_out = reads_out             # outputs whose values g.out gives (None: all)


def gradient(op, *, outputs=None, inputs=None, reads_out=None):
    """Decorator: the gradient rule of public op ``op``, written beside the op in its family
    file. ``outputs``: which outputs are differentiable when the op returns several (default:
    every array output); ``inputs``: the parameter names a gradient can flow to (default:
    every Tensor argument); ``reads_out``: the indices of the outputs whose values the rule
    reads through ``g.out`` (default: every array output; ``()`` for none; or a function of
    the call's arguments by name returning them), the ones whose change in place makes
    backward refuse. The rule is called as ``fn(g, *grads)`` with one
    gradient array per differentiable output (None where no gradient reached it) and returns
    ``{parameter name: gradient array}`` for the inputs that need one (``g.needs(name)``);
    ``g`` reads the forward call (:class:`GradContext`)."""
    def deco(fn):
        GRADIENTS[op] = Rule(fn, outputs, inputs, reads_out)
        return fn
    return deco


def modified(op, what, shape, saved, now):
    return RuntimeError(
        f"{op}: its {what} (shape {shape}) was changed in place after the forward call "
        f"(version {saved}, now {now}): one of the values needed for gradient computation "
        f"was modified by an in-place operation; clone it before changing it, or run the "
        f"in-place op out of place")


class GradContext:
    """What a rule sees of the forward call: its arguments by name (``g.x``, Tensors as their
    arrays), ``g.out`` (the op's return value, arrays), ``g.backend`` (where the forward ran:
    pass it to the backward ops), ``g.needs(name)`` and ``g.wrote_into(name)``. Reading a
    Tensor argument or ``g.out`` checks that its array was not changed in place since the
    forward call (one integer compare): a rule that never reads a value does not need it."""

    __slots__ = ("_node",)

    def __init__(self, node):
        self._node = node

    def __getattr__(self, name):
        node = self._node
        try:
            value = node.args[name]
        except KeyError:
            raise AttributeError(f"{node.op}: the gradient rule reads {name!r}, which is not a "
                                 f"parameter of {node.op} ({', '.join(node.args)})") from None
        t = node.tensors.get(name)
        if t is not None and t.counter[0] != node.versions[name]:
            raise modified(node.op, f"input {name!r}", t.shape, node.versions[name], t.version)
        return value

    @property
    def out(self):
        node = self._node
        for i, counter, saved in node.saved_out:
            if counter[0] != saved:
                outs = node.out if isinstance(node.out, tuple) else (node.out,)
                raise modified(node.op, f"output {i}", tuple(outs[i].shape), saved, counter[0])
        return node.out

    @property
    def backend(self):
        return self._node.backend

    @property
    def op(self):
        return self._node.op

    def needs(self, name):
        node = self._node
        t = node.tensors.get(name)
        return t is not None and node.edge(name, t)[2]

    def follow(self, name):
        """``backend=`` for a view's backward: pin() of the node that made input ``name``."""
        node = self._node
        t = node.tensors.get(name)
        return None if t is None else pin(node.edge(name, t)[0])

    def wrote_into(self, name):
        """Whether the forward call wrote its result over argument ``name`` (``out=`` that
        array): its value is gone, only the output's is left."""
        args = self._node.args
        dest = args.get("out")
        return dest is not None and dest is args.get(name)


# ---------------------------------------------------------------- nodes

class Node:
    """One recorded op call. ``args``: the call's arguments by parameter name (Tensors as their
    arrays, defaults filled in); ``tensors``: {parameter name: the Tensor passed};
    ``versions``: their version counters when the call was made, and ``saved_out`` those of
    the outputs the rule reads [(index, counter, version)]: a value changed in place before
    backward reads it is an error, not a silently wrong gradient (GradContext)."""

    __slots__ = ("op", "backend", "rule", "args", "out", "tensors", "versions", "saved_out",
                 "n_out", "seq", "module", "released")

    def __init__(self, op, backend, rule, args, out, tensors, n_out):
        self.op, self.backend, self.rule = op, backend, rule
        self.args, self.out = args, out          # args: {parameter name: value}
        self.tensors = tensors
        self.versions = {n: t.counter[0] for n, t in tensors.items()}
        self.saved_out = ()                      # set by the recorder once outputs exist
        self.n_out = n_out
        self.seq = next(_seq)
        stack = _mode.__dict__.get("scope")      # current_module(), inlined: one per op call
        self.module = stack[-1] if stack else None
        self.released = False

    @property
    def name(self):
        return self.op

    def edge(self, name, t):
        """(grad_fn, output_nr, requires_grad) of input ``t`` as they were when this node was
        recorded. An op that wrote into ``t`` in place since gave ``t`` a new history
        (``rebase``); the history it replaced is kept on ``t`` with the version it ended
        at."""
        h = t.history
        if h is not None:
            v = self.versions[name]
            for changed, fn, nr, rg in h:
                if changed > v:
                    return fn, nr, rg
        return t.grad_fn, t.output_nr, t.requires_grad

    def inputs(self):
        """{parameter name: (Tensor, grad_fn, output_nr)} of the inputs that require a
        gradient, as recorded."""
        allowed = self.rule.inputs
        res = {}
        for n, t in self.tensors.items():
            fn, nr, rg = self.edge(n, t)
            if rg and (allowed is None or n in allowed):
                res[n] = (t, fn, nr)
        return res

    def apply(self, grads):
        if self.released:
            raise RuntimeError(
                f"backward through {self.op} a second time: its saved arrays were freed by the "
                f"first backward(); call backward(retain_graph=True) the first time to keep them")
        return self.rule.fn(GradContext(self), *grads) or {}

    def release(self):
        """Drop what the node saved (the arrays, and the input Tensors with theirs): memory
        goes back to the pool as soon as backward has used it."""
        self.args = self.out = None
        self.tensors, self.versions, self.saved_out = {}, {}, ()
        self.released = True

    def __repr__(self):
        return f"<Node {self.op} on {self.backend}>"


# ---------------------------------------------------------------- in-place writes

def check_destination(op, dest, inputs_require_grad):
    """Refuse an in-place write (``out=dest``) whose history change cannot be followed: into
    a leaf that requires grad, or, when a gradient is involved, into an array other Tensors
    view (a reshape, an index, a detach: their histories would go stale without an error)."""
    if dest.requires_grad and dest.grad_fn is None:
        raise RuntimeError(
            f"{op}(out=...): out is a leaf Tensor that requires grad (a parameter, say): "
            f"writing into it in place would lose the value its gradient is taken at; "
            f"write into another array, or inside dnnkit.no_grad()")
    if dest.counter[1] > 1 and (dest.requires_grad or inputs_require_grad):
        raise RuntimeError(
            f"{op}(out=...): out shares its array with another Tensor (a view made by "
            f"reshape, indexing or detach()); an in-place write through one would leave the "
            f"other's gradient history stale: write into a copy, or run it out of place")


def rebase(t, node, output_nr):
    """``t``'s array was just overwritten in place by an op call: bump its version and, when
    the call was recorded (``node``), make ``t`` that node's output (PyTorch's rebase of an
    in-place op's history). The history it had is kept on ``t`` under the new version, so
    nodes recorded before resolve their edge to ``t`` as it was (Node.edge). Recorded with no
    input requiring grad while gradients are on, the value is a constant of the graph now;
    inside no_grad, ``t`` keeps its history (as PyTorch's in-place ops under no_grad)."""
    t.bump_version()
    if node is None and (not is_grad_enabled() or (t.grad_fn is None and not t.requires_grad)):
        return
    if t.history is None:
        t.history = []
    t.history.append((t.counter[0], t.grad_fn, t.output_nr, t.requires_grad))
    t.grad_fn, t.output_nr, t.requires_grad = node, output_nr, node is not None


# ---------------------------------------------------------------- backward

def _sum(a, b, node=None):
    """Two gradients of one tensor, added on the device (never in place: a gradient array
    may be shared by several consumers of one upstream gradient); ``node`` made ``b``."""
    return PUBLIC["add"](a, b, backend=pin(node))


def pin(node):
    """The backend a gradient sum or accumulation follows: "numba" after a node that ran on
    Numba (every op has a Numba kernel), else the policy's choice."""
    return "numba" if node is not None and node.backend == "numba" else None


def run_backward(roots, retain_graph, accumulate):
    """Backpropagate ``[(tensor, gradient array)]``; ``accumulate(leaf, gradient array,
    shared, node)`` adds a leaf's gradient (made by ``node``, None for a root's) into its
    ``grad`` (dnnkit/tensors.py). ``shared``: the
    array was already handed to another leaf or is the caller's (a rule may return one array
    for several inputs: add's gradient is dy for both), so the leaf must get a copy."""
    pending = {}          # node -> [gradient per differentiable output]
    stack = []
    handed = {id(g) for _, g in roots}
    for t, g in roots:
        if t.grad_fn is None:
            if t.requires_grad:
                accumulate(t, g, True, None)
            continue
        slot = pending.setdefault(t.grad_fn, [None] * t.grad_fn.n_out)
        k = t.output_nr
        slot[k] = g if slot[k] is None else _sum(slot[k], g)
        stack.append(t.grad_fn)
    nodes = {}                          # node -> its inputs(), as recorded (edges read once)
    hooked = HookedLeaves()             # leaves with post-accumulate hooks, and who feeds them
    while stack:                        # every node a gradient can reach
        n = stack.pop()
        if n in nodes:
            continue
        allowed = n.rule.inputs
        inputs = nodes[n] = {}
        for name, t in n.tensors.items():
            if t.history is None:       # (Node.edge's common case, inlined)
                fn, nr, rg = t.grad_fn, t.output_nr, t.requires_grad
            else:
                fn, nr, rg = n.edge(name, t)
            if not rg:
                continue
            if allowed is None or name in allowed:
                inputs[name] = (t, fn, nr)
            if fn is not None:
                if fn not in nodes:
                    stack.append(fn)
            elif t.post_accumulate_grad_hooks:
                hooked.expect(n, t)
    settle_roots(hooked, roots)
    with no_grad():
        for n in sorted(nodes, key=_SEQ, reverse=True):
            # popped at once: the edges hold the input Tensors, whose arrays go back to the
            # pool when the node releases them (not at the end of backward)
            inputs = nodes.pop(n)
            grads = pending.pop(n, None)
            if grads is None:
                if hooked:
                    hooked.settle(n)
                continue                # on no path from a root: its outputs feed nothing used
            rec = _mode.__dict__.get("recorder")
            if rec is not None:
                _mode.location = ("backward", n.op, n.module)
            got = n.apply(grads)
            if rec is not None:
                rec("backward", n.op, n.backend, n.module, n.args, got)
            if not retain_graph:
                n.release()
            for name, g in got.items():
                edge = inputs.get(name)
                if g is None or edge is None:
                    continue
                if hasattr(g, "grad_fn"):    # a rule may return a Tensor: its array
                    g = g.data
                t, fn, k = edge
                if fn is None:
                    accumulate(t, g, id(g) in handed, n)
                    handed.add(id(g))
                    if hooked:
                        hooked.got(t)
                else:
                    slot = pending.setdefault(fn, [None] * fn.n_out)
                    slot[k] = g if slot[k] is None else _sum(slot[k], g, n)
            if hooked:
                hooked.settle(n)
