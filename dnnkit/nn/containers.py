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

    Fusion: a module whose ``fused_activations`` holds "relu" (the BatchNorm layers) followed
    by a ``ReLU`` is called as ``a(x, activation="relu")`` and the ReLU module is skipped: one
    op call instead of two each way, the same result. Not where either module has a forward
    hook (a hook sees each module's own output), the two are pinned to different backends,
    or a subclass overrides the forward without declaring ``fused_activations`` again."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        items = list(self._modules.values())
        last, i = len(items) - 1, 0
        while i <= last:
            m = items[i]
            if i < last and _fuses(m, items[i + 1]):
                x = m(x, activation="relu")
                i += 2
                continue
            x = m(x)
            i += 1
        return x


def _fuses(m, nxt):
    # the exact ReLU class: a subclass may compute something else in its forward
    return (type(nxt) is ReLU and "relu" in _takes(type(m)) and not m._forward_hooks
            and not nxt._forward_hooks and m.backend == nxt.backend)


_TAKES: dict[type, tuple[str, ...]] = {}


def _takes(cls):
    """``cls.fused_activations`` where the class declaring it also defines (or inherits) the
    forward that runs: a subclass that overrides forward (SyncBatchNorm) takes none until it
    declares them again."""
    out = _TAKES.get(cls)
    if out is None:
        mro = cls.__mro__
        fwd = next(c for c in mro if "forward" in c.__dict__)
        decl = next((c for c in mro if "fused_activations" in c.__dict__), None)
        out = _TAKES[cls] = (decl.__dict__["fused_activations"]
                             if decl is not None and issubclass(decl, fwd) else ())
    return out
