"""``dnnkit.Tensor``: a device array with a gradient record; ``backward``.

A public op called with a Tensor anywhere in its arguments (dnnkit/dispatch.py) runs through
dnnkit/tensor_calls.py: the op runs on the Tensors' arrays as any call does, its array outputs
come back as Tensors, and when gradients are on and an input requires one, a node of the graph
is recorded (dnnkit/autograd.py). Plain arrays in, plain arrays out: a call without Tensors
never reaches either module.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import arrays, device, dlpack, foreign
from .autograd import PUBLIC, Node, no_grad, pin, run_backward
from .autograd_hooks import HookHandle


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
