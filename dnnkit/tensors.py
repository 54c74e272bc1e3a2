"""``dnnkit.Tensor``: a device array with a gradient record, and the recording of op calls.

A public op called with a Tensor anywhere in its arguments (dnnkit/dispatch.py) comes here:
the op runs on the Tensors' arrays as any call does (the memo, the policy and the backends
are the same), its array outputs come back as Tensors, and when gradients are on and an input
requires one, a node of the graph is recorded (dnnkit/autograd.py). Plain arrays in, plain
arrays out: a call without Tensors never reaches this module.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import arrays, device, dlpack, foreign
from .autograd import (GRADIENTS, PUBLIC, HookHandle, Node, check_destination, current_module,
                       is_grad_enabled, no_grad, pin, rebase, recorder, run_backward,
                       set_location)

class Tensor:
    """A device array (``data``, a Numba device array) with a gradient record.

    ``requires_grad``: whether gradients are computed for it; ``grad``: its accumulated
    gradient (a Tensor) after ``backward()``; ``grad_fn``: the node that made it (None for a
    leaf). Operators ``+ - * /`` (with broadcasting), ``@``, ``reshape`` and indexing of the
    first dimension run dnnkit ops. ``__cuda_array_interface__`` exports the array without a
    copy (CuPy, PyTorch, Numba read it)."""

    __slots__ = ("data", "requires_grad", "grad", "grad_fn", "output_nr", "counter", "history",
                 "post_accumulate_grad_hooks", "__weakref__")
    data: Any
    requires_grad: bool
    grad: Optional[Tensor]
    grad_fn: Optional[Node]
    output_nr: int
    counter: list[int]
    history: Optional[list[tuple[int, Optional[Node], int, bool]]]
    post_accumulate_grad_hooks: Optional[dict[int, Callable[[Tensor], None]]]
    __array_priority__ = 1000        # NumPy scalars and arrays defer to Tensor's operators

    def __init__(self, data: Any, requires_grad: bool = False, *,
                 grad_fn: Optional[Node] = None, output_nr: int = 0) -> None:
        self.data = data
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self.grad_fn = grad_fn
        self.output_nr = output_nr
        # [version, Tensors sharing it]: one list shared by the Tensors that view one array
        # (detach(), reshape, indexing), so a change through any of them is seen by all
        self.counter = [0, 1]
        self.history = None       # what rebase() replaced: [(version, grad_fn, nr, rg)]
        self.post_accumulate_grad_hooks = None      # {id: hook}, made by the first register

    # ------------------------------------------------------------ what it holds

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.data.__cuda_array_interface__

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the array, no copy (``torch.from_dlpack(t)``,
        ``cupy.from_dlpack(t)``; dnnkit/dlpack.py): ``stream``, the consumer's stream, waits
        for the stream that made the array; the array stays alive until the consumer is done."""
        return dlpack.export(self.data, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.device_of_array(self.data)

    def __len__(self) -> int:
        if not self.data.shape:
            raise TypeError("len() of a 0-d Tensor")
        return self.data.shape[0]

    def __repr__(self) -> str:
        extra = f", grad_fn={self.grad_fn.op}" if self.grad_fn is not None else \
            (", requires_grad=True" if self.requires_grad else "")
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{extra})"

    def item(self) -> "float | int | bool":
        """The value of a one-element tensor as a Python number (waits for the GPU: the one
        place a training loop should synchronise, every N steps)."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor of one element, this one has shape "
                             f"{self.shape}")
        device.refuse_in_capture("Tensor.item()", "it copies to the host and waits for the GPU")
        return self.data.copy_to_host().reshape(()).item()

    def numpy(self) -> np.ndarray:
        """A host copy (waits for the GPU)."""
        device.refuse_in_capture("Tensor.numpy()", "it copies to the host and waits for the GPU")
        return self.data.copy_to_host()

    def detach(self) -> "Tensor":
        """The same array, cut from the graph (no copy); it shares the version counter, so a
        change in place through either is seen by a graph that saved the other."""
        t = Tensor(self.data)
        t.counter = self.counter
        self.counter[1] += 1
        return t

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        if not self.is_leaf and not flag:
            raise RuntimeError("requires_grad_(False) on a tensor made by an op: use detach()")
        self.requires_grad = bool(flag)
        return self

    @property
    def version(self) -> int:
        """How many times the array was changed in place (a node of the graph saves it and
        refuses to differentiate a value changed since)."""
        return self.counter[0]

    def bump_version(self) -> None:
        """Mark ``data`` changed in place (optimizers and in-place ops call it)."""
        self.counter[0] += 1

    # ------------------------------------------------------------ gradients

    def backward(self, grad: object = None, *, retain_graph: bool = False) -> None:
        """Compute the gradient of this tensor with respect to every leaf that requires one
        and add it into their ``grad``. ``grad``: the gradient of some scalar with respect
        to this tensor (its shape), needed unless the tensor has one element."""
        run_backward([(self, self.root_gradient(grad))], retain_graph, _accumulate)

    def register_post_accumulate_grad_hook(self, hook: object) -> HookHandle:
        """``hook(tensor)`` runs during each ``backward()`` that gives this leaf a gradient,
        once, after the last contribution of that backward was added into ``grad`` (PyTorch's
        name and meaning); the rest of backward may still be queued. Returns a handle whose
        ``remove()`` unregisters it. dnnkit.distributed.DataParallel starts the all-reduce of
        a bucket of gradients this way."""
        if not callable(hook):
            raise TypeError(f"register_post_accumulate_grad_hook: hook must be callable; got "
                            f"{hook!r}")
        if not self.is_leaf:
            raise RuntimeError(
                f"register_post_accumulate_grad_hook on a tensor made by {self.grad_fn.op}: only "
                f"a leaf (a parameter, a tensor made by the user) accumulates a gradient")
        hooks = self.post_accumulate_grad_hooks
        if hooks is None:
            hooks = self.post_accumulate_grad_hooks = {}
        handle = HookHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def root_gradient(self, grad):
        """The device array ``backward`` starts from: ``grad`` checked against this tensor,
        or 1 for a one-element tensor."""
        if not self.requires_grad:
            raise RuntimeError(
                f"backward() on a tensor (shape {self.shape}) that does not require grad: no "
                f"input of the ops that made it requires grad, or it was made under no_grad()")
        if grad is None:
            if self.size != 1:
                raise RuntimeError(
                    f"backward() without grad on a tensor of shape {self.shape}: only a tensor "
                    f"of one element has the implicit gradient 1; pass grad= of its shape")
            grad = arrays.constant(np.ones(self.shape), self.dtype)
        else:
            grad = unwrap(grad)
            if not arrays.is_device_array(grad):
                grad = arrays.device_input("backward", "grad", grad, arrays.as_stream(None))
            if tuple(grad.shape) != self.shape:
                raise ValueError(f"backward(): grad has shape {tuple(grad.shape)}, the tensor "
                                 f"{self.shape}")
            if np.dtype(grad.dtype) != self.dtype:
                raise TypeError(f"backward(): grad is {np.dtype(grad.dtype)}, the tensor "
                                f"{self.dtype}")
        return grad

    # ------------------------------------------------------------ operators

    def __add__(self, other: object) -> "Tensor":
        return PUBLIC["add"](self, other)

    def __radd__(self, other: object) -> "Tensor":
        return PUBLIC["add"](other, self)

    def __sub__(self, other: object) -> "Tensor":
        return PUBLIC["subtract"](self, other)

    def __rsub__(self, other: object) -> "Tensor":
        return PUBLIC["subtract"](other, self)

    def __mul__(self, other: object) -> "Tensor":
        return PUBLIC["multiply"](self, other)

    def __rmul__(self, other: object) -> "Tensor":
        return PUBLIC["multiply"](other, self)

    def __truediv__(self, other: object) -> "Tensor":
        return PUBLIC["divide"](self, other)

    def __rtruediv__(self, other: object) -> "Tensor":
        return PUBLIC["divide"](other, self)

    def __neg__(self) -> "Tensor":
        return PUBLIC["multiply"](self, -1.0)

    def __matmul__(self, other: object) -> "Tensor":
        return PUBLIC["matmul"](self, other)

    def __rmatmul__(self, other: object) -> "Tensor":
        return PUBLIC["matmul"](other, self)

    def reshape(self, *shape: "int | tuple[int, ...]") -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return PUBLIC["reshape"](self, shape)

    def sum(self, axis: "int | tuple[int, ...] | None" = None,
            keepdims: bool = False) -> "Tensor":
        return PUBLIC["sum"](self, axis, keepdims=keepdims)

    def mean(self, axis: "int | tuple[int, ...] | None" = None,
             keepdims: bool = False) -> "Tensor":
        return PUBLIC["mean"](self, axis, keepdims=keepdims)

    def __getitem__(self, index: "int | slice") -> "Tensor":
        return PUBLIC["take_batch"](self, index)


def tensor(array: object, requires_grad: bool = False, *, dtype: object = None) -> Tensor:
    """A Tensor from a NumPy array (copied to the device), or a Numba, CuPy or PyTorch device
    array (no copy: anything with ``__cuda_array_interface__`` or ``__dlpack__``; the current
    stream waits for the producer's, see docs/interop.md). Integer arrays are accepted
    (class labels, token ids); ``requires_grad`` needs a floating-point array."""
    if isinstance(array, Tensor):
        data = array.data
    elif arrays.is_device_array(array):
        data = array
    elif arrays.is_device_array(view := foreign.as_array(array)):
        data = view       # PyTorch, CuPy, DLPack: a view, no copy (dnnkit/foreign.py)
    else:
        h = np.asarray(array, dtype=dtype)
        if h.dtype == np.float64 and dtype is None and not isinstance(array, np.ndarray):
            h = h.astype(np.float32)        # Python floats and lists: float32, as the layers
        data = device.numba_cuda().to_device(arrays.host_contiguous(h))
    if dtype is not None and np.dtype(data.dtype) != np.dtype(dtype):
        raise TypeError(f"tensor(): the array is {np.dtype(data.dtype)}, dtype={np.dtype(dtype)} "
                        f"asked; convert it first (a device array is not copied here)")
    if requires_grad and np.dtype(data.dtype).kind != "f":
        raise TypeError(f"tensor(): requires_grad needs a floating-point array, got "
                        f"{np.dtype(data.dtype)}")
    return Tensor(data, requires_grad)


def unwrap(a):
    return a.data if isinstance(a, Tensor) else a


# ---------------------------------------------------------------- recording (dispatch calls it)

def call(op, plain, args, kw, backend):
    """Run public op ``op`` on the arrays of the Tensors among ``args``/``kw`` (``plain(args,
    kw, backend)`` returns the output and the backend that ran it) and record a node when a
    gradient can flow. Array outputs come back as Tensors; a Tensor passed as ``out=`` (the op
    wrote its result into that array) comes back itself, changed in place (``rebase``)."""
    dest = kw.get("out") if kw else None
    if dest is not None:
        if not isinstance(dest, Tensor):
            dest = None
        else:
            kw = dict(kw)
            del kw["out"]           # written, not read: no gradient flows to it
            if is_grad_enabled():
                check_destination(op, dest, _wants_grad(args, kw))
    plain_args = [_plain(a) for a in args]
    plain_kw = {k: (a.data if isinstance(a, Tensor) else a) for k, a in kw.items()} if kw else kw
    if dest is not None:
        plain_kw["out"] = dest.data
    rec = recorder()
    if rec is not None:
        set_location("forward", op, current_module())
    out, ran_on = plain(plain_args, plain_kw, backend)
    if rec is not None:
        rec("forward", op, ran_on, current_module(), (plain_args, plain_kw), out)
    node = diff = None
    if is_grad_enabled() and _wants_grad(args, kw):
        node, diff = _record(op, out, ran_on, plain_args, plain_kw, args, kw)
    res = _wrap(out, node, diff)
    if op in VIEWS and isinstance(args[0], Tensor) and isinstance(res, Tensor):
        res.counter = args[0].counter      # one array: one version counter
        res.counter[1] += 1
    if dest is not None:
        res = _into(dest, res)
    if node is not None:
        _save_outputs(node, res)
    return res


VIEWS = ("reshape", "take_batch")   # ops whose output views their first argument's array


def _wants_grad(args, kw):
    """Whether a Tensor among the arguments (or inside a list or tuple argument) requires
    grad: ``any(t.requires_grad for _, t in _named(...))`` without the generators."""
    for a in (args, kw.values()) if kw else (args,):
        for v in a:
            if isinstance(v, Tensor):
                if v.requires_grad:
                    return True
            elif type(v) in (list, tuple):
                for w in v:
                    if isinstance(w, Tensor) and w.requires_grad:
                        return True
    return False


def _record(op, out, ran_on, plain_args, plain_kw, args, kw):
    """(the node of this call, its differentiable output indices), or (None, None) when no
    input a gradient can flow to requires one."""
    rule = GRADIENTS.get(op)
    if rule is None:
        raise RuntimeError(
            f"{op} has no gradient rule (it is itself a gradient, or not differentiable): call "
            f"it on arrays or detached tensors, or inside dnnkit.no_grad()")
    names, defaults = _signature(op)
    bound = dict(defaults)
    bound.update(zip(names, plain_args))
    tensors = dict(_named(zip(names, args)))
    if kw:
        bound.update(plain_kw)
        tensors.update((k, a) for k, a in kw.items() if isinstance(a, Tensor))
    if rule.inputs is not None and not any(
            tensors[n].requires_grad for n in rule.inputs if n in tensors):
        return None, None
    outputs = out if isinstance(out, tuple) else (out,)
    diff = rule.outputs if rule.outputs is not None else \
        tuple(i for i, o in enumerate(outputs) if arrays.is_device_array(o))
    return Node(op, ran_on, rule, bound, out, tensors, len(diff)), diff


def _save_outputs(node, res):
    """Record the version of each output the rule reads (after an in-place write's bump)."""
    outs = res if isinstance(res, tuple) else (res,)
    which = node.rule.reads_out
    node.saved_out = tuple((i, outs[i].counter, outs[i].counter[0])
                           for i in (range(len(outs)) if which is None else which)
                           if isinstance(outs[i], Tensor))


def _into(dest, res):
    """``res`` with the Tensor made for ``dest``'s array replaced by ``dest`` itself, rebased."""
    if isinstance(res, tuple):
        parts = [_into(dest, r) if isinstance(r, Tensor) else r for r in res]
        return tuple(parts) if type(res) is tuple else type(res)(*parts)
    if isinstance(res, Tensor) and res.data is dest.data:
        rebase(dest, res.grad_fn, res.output_nr)
        return dest
    return res


def _plain(a):
    """A Tensor's array; a list or tuple holding Tensors (concatenate's ``arrays``) as a list
    of arrays."""
    if isinstance(a, Tensor):
        return a.data
    if type(a) in (list, tuple) and any(isinstance(v, Tensor) for v in a):
        return [v.data if isinstance(v, Tensor) else v for v in a]
    return a


def _named(pairs):
    """(name, Tensor) for each Tensor argument; a Tensor inside a list or tuple argument is
    named ``"arrays[i]"`` (its rule returns its gradient under that name)."""
    for n, a in pairs:
        if isinstance(a, Tensor):
            yield n, a
        elif type(a) in (list, tuple):
            for i, v in enumerate(a):
                if isinstance(v, Tensor):
                    yield f"{n}[{i}]", v


_signatures = {}      # op -> (parameter names in order, {name: default})


def _signature(op):
    sig = _signatures.get(op)
    if sig is None:
        params = inspect.signature(PUBLIC[op]).parameters.values()
        sig = _signatures[op] = (
            tuple(p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)),
            {p.name: p.default for p in params if p.default is not p.empty})
    return sig


def _wrap(out, node, diff):
    """Array outputs as Tensors; the differentiable ones carry ``node``."""
    if isinstance(out, tuple):
        res = []
        for i, o in enumerate(out):
            if arrays.is_device_array(o):
                k = diff.index(i) if node is not None and i in diff else None
                res.append(Tensor(o, k is not None, grad_fn=node if k is not None else None,
                                  output_nr=k or 0))
            else:
                res.append(o)
        return tuple(res) if type(out) is tuple else type(out)(*res)
    if arrays.is_device_array(out):
        if node is not None:
            return Tensor(out, True, grad_fn=node, output_nr=0)
        return Tensor(out)
    return out


def _accumulate(t, g, shared, node=None):
    """Add gradient array ``g`` (made by ``node``) into leaf ``t.grad``: a new array each time
    (``g`` may feed another consumer), copied on the device when ``shared``."""
    if t.grad is None:
        if shared:
            s = arrays.as_stream(None)
            g = arrays.copy_into(arrays.empty_like(g, s), g, s)
        t.grad = Tensor(g)
    else:
        with no_grad():
            t.grad = Tensor(PUBLIC["add"](t.grad.data, g, backend=pin(node)))


def backward(tensors: Sequence[Tensor], grads: Optional[Sequence[Any]] = None, *,
             retain_graph: bool = False) -> None:
    """Backpropagate from several tensors at once (a model with two outputs, two losses):
    the gradients that reach a shared part of the graph are summed, and each node runs once.
    ``grads``: one gradient per tensor (None for a one-element tensor: 1)."""
    tensors = list(tensors)
    grads = [None] * len(tensors) if grads is None else list(grads)
    if len(grads) != len(tensors):
        raise ValueError(f"backward(): {len(tensors)} tensors but {len(grads)} gradients")
    roots = []
    for t, g in zip(tensors, grads):
        if not isinstance(t, Tensor):
            raise TypeError(f"backward(): expected Tensors, got {type(t).__name__}")
        roots.append((t, t.root_gradient(g)))
    run_backward(roots, retain_graph, _accumulate)
