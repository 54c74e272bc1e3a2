"""Containers: ``Sequential`` (modules applied in order) and ``ModuleList`` (modules held and
registered, called by the owner's own forward)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NoReturn, TypeVar, overload

from .activation import ReLU
from .module import Module

_L = TypeVar("_L", bound="ModuleList")


def _check(cls, i, m):
    if not isinstance(m, Module):
        raise TypeError(f"{cls}: item {i} is a {type(m).__name__}, not a dnnkit.nn.Module")
    return m


class ModuleList(Module):
    """A list of modules whose parameters belong to the owner (``len``, indexing, iteration,
    ``append``, ``extend``)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self: _L, module: Module) -> _L:
        setattr(self, str(len(self._modules)), _check(type(self).__name__, len(self), module))
        return self

    def extend(self: _L, modules: Iterable[Module]) -> _L:
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    @overload
    def __getitem__(self, i: int) -> Module: ...

    @overload
    def __getitem__(self, i: slice) -> ModuleList: ...

    def __getitem__(self, i: int | slice) -> Module | ModuleList:
        items = list(self._modules.values())
        if isinstance(i, slice):
            return type(self)(items[i]) if type(self) is ModuleList else \
                Sequential(*items[i])
        return items[i]

    def forward(self, *args: Any, **kw: Any) -> NoReturn:
        raise TypeError("ModuleList is not callable: iterate over it in your module's forward")


class Sequential(ModuleList):
    """Modules applied in order: ``Sequential(a, b, c)(x) == c(b(a(x)))``.

    Fusion: a module followed by a ``ReLU`` that :func:`fuses` allows (a BatchNorm, a Conv2d,
    a Conv3d or a Linear) is called as ``a(x, activation="relu")`` and the ReLU module is
    skipped: one op call instead of two forward (and, for a BatchNorm, backward), the same
    result."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        items = list(self._modules.values())
        last, i = len(items) - 1, 0
        while i <= last:
            m = items[i]
            if i < last and fuses(m, items[i + 1]):
                x = m(x, activation="relu")
                i += 2
                continue
            x = m(x)
            i += 1
        return x


def fuses(m: Module, relu: Module) -> bool:
    """Whether ``relu(m(x))`` may run as ``m(x, activation="relu")``: ``relu`` is a plain
    ``ReLU`` (not a subclass, whose forward may compute something else), ``m``'s class declares
    "relu" in ``fused_activations`` for the forward that runs (a subclass overriding forward,
    as SyncBatchNorm, takes none until it declares them again), neither module has a forward
    hook (a hook sees its own module's output) or a forward set on the instance, and both are
    pinned to the same backend."""
    return (type(relu) is ReLU and not m._forward_hooks and not relu._forward_hooks
            and m.backend == relu.backend and "forward" not in m.__dict__
            and "forward" not in relu.__dict__ and "relu" in _takes(type(m)))


def norm_relu(norm: Module, relu: Module, x: Any, residual: Any = None) -> Any:
    """``relu(norm(x) + residual)`` (residual None: ``relu(norm(x))``) as one op call,
    ``norm(x, activation="relu", residual=residual)``, where :func:`fuses` allows it and (with
    a residual) ``norm``'s class takes one (``fused_residual``: the batch-norm layers); else
    the modules' own calls. A residual block's end: dnnkit.models' ResNet calls it."""
    if fuses(norm, relu):
        if residual is None:
            return norm(x, activation="relu")
        if _takes(type(norm), "fused_residual"):
            return norm(x, activation="relu", residual=residual)
    y = norm(x)
    return relu(y if residual is None else y + residual)


_TAKES: dict[tuple, Any] = {}


def _takes(cls, attr="fused_activations"):
    """``cls.<attr>`` (``fused_activations`` or ``fused_residual``) where the class declaring
    it also defines (or inherits) the forward that runs; Module's default (none) otherwise.
    Answered once per class, forward and declaration (the key: a forward or declaration
    patched onto the class later is a new key), not by an MRO walk on every forward call."""
    key = (cls, cls.forward, attr, getattr(cls, attr))
    out = _TAKES.get(key)
    if out is None:
        mro = cls.__mro__
        fwd = next(c for c in mro if "forward" in c.__dict__)
        decl = next((c for c in mro if attr in c.__dict__), None)
        out = _TAKES[key] = (decl.__dict__[attr] if decl is not None and issubclass(decl, fwd)
                             else Module.__dict__[attr])
    return out
