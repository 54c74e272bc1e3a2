"""Containers: ``Sequential`` (modules applied in order) and ``ModuleList`` (modules held and
registered, called by the owner's own forward)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NoReturn, TypeVar, overload

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
    """Modules applied in order: ``Sequential(a, b, c)(x) == c(b(a(x)))``."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x
