"""Containers: ``Sequential`` (modules applied in order) and ``ModuleList`` (modules held and
registered, called by the owner's own forward)."""

from .module import Module


def _check(cls, i, m):
    if not isinstance(m, Module):
        raise TypeError(f"{cls}: item {i} is a {type(m).__name__}, not a dnnkit.nn.Module")
    return m


class ModuleList(Module):
    """A list of modules whose parameters belong to the owner (``len``, indexing, iteration,
    ``append``, ``extend``)."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self._modules)), _check(type(self).__name__, len(self), module))
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def __getitem__(self, i):
        items = list(self._modules.values())
        if isinstance(i, slice):
            return type(self)(items[i]) if type(self) is ModuleList else \
                Sequential(*items[i])
        return items[i]

    def forward(self, *args, **kw):
        raise TypeError("ModuleList is not callable: iterate over it in your module's forward")


class Sequential(ModuleList):
    """Modules applied in order: ``Sequential(a, b, c)(x) == c(b(a(x)))``."""

    def __init__(self, *modules):
        super().__init__(modules)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x
