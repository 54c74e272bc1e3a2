"""The layer base class: parameters, buffers, children, modes, state, hooks and the backend pin.

A module is called on Tensors, ``y = model(x)``: :meth:`Module.__call__` runs ``forward``
inside ``autograd.module_scope(self)`` (every node recorded there knows its module, so a
comparison of backends can name the layer), then the forward hooks. ``forward`` runs dnnkit
ops on Tensors and the graph records itself; there is no module-level backward: training is
``loss.backward()``, which adds each parameter's gradient into ``Parameter.grad``.

Backends: a module passes ``backend=self.backend`` to every op it runs (None follows
``dnn.enabled``; "auto", "cudnn" or "numba" pin it, as :func:`convert` sets). The gradient of
an op runs on the backend its forward ran on (the rules do that), so a forward that fell back
to Numba is differentiated on Numba.

State: every parameter and buffer (and a few host values such as BatchNorm's batch count) is
a *slot* (module ``_state_slots``) with a name, shape, dtype, a reader and a writer; the
recurrent layers map PyTorch's per-matrix names onto their flat buffer this way. ``state_dict``
reads the slots; ``load_state_dict`` checks every key, shape and dtype before it writes any.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from .. import arrays
from ..autograd import module_scope
from ..hints import ArrayLike, Backend, CallsForward
from ..tensors import Tensor, tensor
from . import state as state_io
from .parameter import Parameter

BACKENDS = (None, "auto", "cudnn", "numba")

_M = TypeVar("_M", bound="Module")

#: ``hook(module, inputs, output)``: see :meth:`Module.register_forward_hook`.
ForwardHook = Callable[["Module", tuple[Any, ...], Any], Any]


class Slot(collections.namedtuple("Slot", "shape dtype read write")):
    """One entry of a state dict: its shape, dtype (NumPy), ``read()`` -> host array and
    ``write(host array of that shape and dtype)``."""


def tensor_slot(t: Tensor) -> Slot:
    """The slot of a parameter or buffer Tensor: a host copy in, a device copy out (the
    version bumped, so a graph that saved the old value refuses to differentiate it)."""
    def write(h):
        t.data.copy_to_device(arrays.host_contiguous(h))
        t.bump_version()
    return Slot(t.shape, t.dtype, t.data.copy_to_host, write)


class RemovableHandle:
    """``handle.remove()`` unregisters the hook it was returned for."""

    _ids = itertools.count()

    def __init__(self, hooks: dict[int, ForwardHook]) -> None:
        self.hooks, self.id = hooks, next(self._ids)

    def remove(self) -> None:
        self.hooks.pop(self.id, None)


class Module:
    """The base class of layers and models (module docstring): subclasses set parameters,
    buffers and submodules as attributes in ``__init__`` and define ``forward``."""

    # (set by __init__ through object.__setattr__, which bypasses the registration below)
    _parameters: dict[str, Parameter]
    _modules: dict[str, Module]
    _buffers: dict[str, Tensor | None]
    _forward_hooks: dict[int, ForwardHook]
    #: the activations ``forward(x, activation=...)`` fuses (nn.Sequential reads it; a subclass
    #: overriding forward declares it again); none here
    fused_activations: tuple[str, ...] = ()
    #: whether that forward also takes ``residual=`` (added before the activation:
    #: nn.norm_relu's one call); the batch-norm layers do
    fused_residual: bool = False

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_forward_hooks", {})
        self.training = True
        self.backend: Backend | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError(f"{type(self).__name__}: assign attributes after "
                                 f"Module.__init__() (call super().__init__() first)")
        params, mods, bufs = d["_parameters"], d["_modules"], d["_buffers"]
        if isinstance(value, Parameter):
            mods.pop(name, None)
            bufs.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            bufs.pop(name, None)
            mods[name] = value
        elif name in params or name in mods:
            if value is not None:
                kind = "parameter" if name in params else "submodule"
                raise TypeError(f"{type(self).__name__}: {name} is a {kind}; assign a "
                                f"{'Parameter' if kind == 'parameter' else 'Module'} or None, "
                                f"not a {type(value).__name__}")
            params.pop(name, None)
            mods.pop(name, None)
        elif name in bufs:
            value = _as_buffer(type(self).__name__, name, value)
            bufs[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, value: ArrayLike | None) -> None:
        """A Tensor saved in the state and not trained (running statistics): ``value`` a
        Tensor, a device array or a NumPy array (copied to the device)."""
        value = _as_buffer(type(self).__name__, name, value)
        self._buffers[name] = value
        object.__setattr__(self, name, value)

    # ---------------------------------------------------------------- calling

    def forward(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    if TYPE_CHECKING:
        # to a checker, calling a module is calling its forward (dnnkit/hints.py)
        __call__: CallsForward
    else:
        def __call__(self, *args, **kw):
            with module_scope(self):
                out = self.forward(*args, **kw)
                if self._forward_hooks:
                    for hook in list(self._forward_hooks.values()):
                        res = hook(self, args, out)
                        if res is not None:
                            out = res
            return out

    def register_forward_hook(self, hook: ForwardHook) -> RemovableHandle:
        """``hook(module, inputs, output)`` after every call (a non-None return replaces the
        output); returns a handle whose ``remove()`` unregisters it."""
        if not callable(hook):
            raise TypeError(f"register_forward_hook: hook must be callable; got {hook!r}")
        handle = RemovableHandle(self._forward_hooks)
        self._forward_hooks[handle.id] = hook
        return handle

    # ---------------------------------------------------------------- structure

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return iter(self._modules.items())

    def children(self) -> list[Module]:
        return list(self._modules.values())

    def named_modules(self, prefix: str = "",
                      memo: set[int] | None = None) -> Iterator[tuple[str, Module]]:
        """(dotted name, module) of this module and every descendant, each once (a module
        used at two places is named by its first)."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> list[Module]:
        return [m for _, m in self.named_modules()]

    def _named(self, attr, prefix):
        seen = set()
        for mp, m in self.named_modules(prefix):
            for name, item in getattr(m, attr).items():
                if item is not None and id(item) not in seen:
                    seen.add(id(item))
                    yield (f"{mp}.{name}" if mp else name), item

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter), each parameter once (a shared one by its first name)."""
        return self._named("_parameters", prefix)

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        return self._named("_buffers", prefix)

    def buffers(self) -> list[Tensor]:
        return [b for _, b in self.named_buffers()]

    def apply(self: _M, fn: Callable[[Module], object]) -> _M:
        """``fn(module)`` on every descendant, children before parents, then on this module;
        returns self (e.g. a custom initialisation)."""
        for m in self._modules.values():
            m.apply(fn)
        fn(self)
        return self

    def requires_grad_(self: _M, flag: bool = True) -> _M:
        """Set ``requires_grad`` of every parameter (False freezes them: no gradient is
        computed for them, and optimizers skip them)."""
        for p in self.parameters():
            p.requires_grad_(bool(flag))
        return self

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def train(self: _M, mode: bool = True) -> _M:
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self: _M) -> _M:
        return self.train(False)

    # ---------------------------------------------------------------- state

    def _state_slots(self) -> dict[str, Slot]:
        """{local name: Slot} of this module (not its children): its parameters and buffers.
        Layers override it to add host values or to rename (the recurrent layers)."""
        out = {n: tensor_slot(p) for n, p in self._parameters.items() if p is not None}
        out.update((n, tensor_slot(b)) for n, b in self._buffers.items() if b is not None)
        return out

    def state_slots(self) -> dict[str, Slot]:
        """{dotted name: Slot} of the whole model."""
        out = {}
        for prefix, m in self.named_modules():
            for name, slot in m._state_slots().items():
                out[f"{prefix}.{name}" if prefix else name] = slot
        return out

    def state_dict(self) -> dict[str, npt.NDArray[Any]]:
        """{dotted name: host NumPy copy} of every parameter and buffer, with PyTorch's names
        and layouts (a Conv2d's ``weight`` (out, in/groups, kh, kw), a Linear's (out, in), a
        BatchNorm's ``running_mean``, ``running_var``, ``num_batches_tracked``, an LSTM's
        ``weight_ih_l0``, ...)."""
        return {name: slot.read() for name, slot in self.state_slots().items()}

    def load_state_dict(self: _M, state: Mapping[str, ArrayLike | float],
                        strict: bool = True) -> _M:
        """Copy ``state`` ({name: array}; NumPy, device arrays or Tensors) into the parameters
        and buffers. Every key, shape and dtype is checked before anything is written, so a
        ValueError leaves the module as it was. ``strict``: missing and unexpected keys are
        errors (else they are ignored)."""
        writes = state_io.check_state(type(self).__name__, self.state_slots(), state, strict)
        for slot, h in writes:
            slot.write(h)
        return self

    def save(self, path: str | os.PathLike[str]) -> str:
        """The state as an .npz file (``.npz`` added when ``path`` lacks it, as NumPy does).
        Written whole or not at all: a failed save leaves the previous file as it was."""
        return state_io.save(self.state_dict(), path)

    def load(self: _M, path: str | os.PathLike[str], strict: bool = True) -> _M:
        """Load a file written by :meth:`save` (``path`` with or without ``.npz``). A damaged
        file or a wrong key, shape or dtype raises ValueError naming the file and the key,
        and leaves the module as it was. Returns self."""
        path, state = state_io.load(type(self).__name__, path)
        try:
            return self.load_state_dict(state, strict)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    # ---------------------------------------------------------------- printing

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        pin = f"backend={self.backend}" if self.backend is not None else ""
        head = ", ".join(v for v in (extra, pin) if v)
        if not self._modules:
            return f"{type(self).__name__}({head})"
        lines = [f"{type(self).__name__}("] + ([f"  {head}"] if head else [])
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return "\n".join(lines) + "\n)"


def _as_buffer(cls, name, value):
    if value is None or isinstance(value, Tensor):
        return value
    if arrays.is_device_array(value) or hasattr(value, "__cuda_array_interface__"):
        return tensor(value)
    h = np.asarray(value)
    if h.dtype.kind not in "biuf":
        raise TypeError(f"{cls}: buffer {name} must be a numeric array; got dtype {h.dtype}")
    return tensor(h)


def convert(model: _M, backend: Backend | None,
            exclude: Callable[[Module], bool] | None = None) -> _M:
    """Pin every module of ``model`` (or those for which ``exclude(module)`` is false) to
    ``backend``: "cudnn", "numba", or "auto"/None to follow ``dnn.enabled`` again. In place;
    returns the model (cudnn.torch's ``cudnn.convert``)."""
    if not isinstance(model, Module):
        raise TypeError(f"convert: model must be a dnnkit.nn.Module; got {type(model).__name__}")
    if not (backend is None or isinstance(backend, str)) or backend not in BACKENDS:
        raise ValueError(f"convert: backend must be one of 'auto', 'cudnn', 'numba' or None; "
                         f"got {backend!r}")
    for m in model.modules():
        if exclude is None or not exclude(m):
            m.backend = None if backend == "auto" else backend
    return model
