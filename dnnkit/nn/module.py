"""The layer base class: parameters, buffers, children, modes, state, and the backend record.

A module's ``forward(x)`` runs ops and keeps what its ``backward(grad_out)`` needs;
``backward`` returns the gradient wrt the input and accumulates parameter gradients into
``Parameter.grad``. Every op a module runs goes through :meth:`Module.run`, which passes the
module's pinned backend (``module.backend``: None follows ``dnn.enabled``; "auto", "cudnn" or
"numba" pin it, as :func:`dnnkit.nn.convert` sets) and records in ``module.used`` the backend
each op actually ran on; backward passes the forward's backend to the gradient ops, so a
forward that fell back to Numba is differentiated on Numba too.
"""

import numpy as np

from .. import arrays
from ..tracing import trace
from .parameter import Parameter

BACKENDS = (None, "auto", "cudnn", "numba")


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_buffers", {})
        self.training = True
        self.backend = None
        self.used = {}

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif value is None and name in self.__dict__.get("_parameters", ()):
            del self._parameters[name]
        elif name in self.__dict__.get("_buffers", ()):
            self._buffers[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name, array):
        """A device array saved in the state (e.g. running statistics), not trained."""
        self._buffers[name] = array
        object.__setattr__(self, name, array)

    # ---------------------------------------------------------------- running ops

    def run(self, fn, *args, **kw):
        """``fn(*args, **kw)`` on this module's backend; records which backend ran."""
        if self.backend is not None:
            kw["backend"] = self.backend
        return self._traced(fn, args, kw)

    def run_as(self, forward_op, fn, *args, **kw):
        """A gradient op ``fn`` on the backend that ran ``forward_op`` in the last forward
        (the module's own backend when that op has not run)."""
        be = self.used.get(forward_op, self.backend)
        if be is not None:
            kw["backend"] = be
        return self._traced(fn, args, kw)

    def _traced(self, fn, args, kw):
        with trace() as t:
            out = fn(*args, **kw)
        if len(t):
            self.used[t[-1].op] = t[-1].backend
        return out

    # ---------------------------------------------------------------- interface

    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, grad_out):
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def __call__(self, *args, **kw):
        return self.forward(*args, **kw)

    # ---------------------------------------------------------------- structure

    def children(self):
        return list(self._modules.values())

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return [m for _, m in self.named_modules()]

    def _named(self, attr, prefix):
        """(dotted name, item) of this module's ``attr`` dict, then its children's."""
        for name, item in getattr(self, attr).items():
            yield (f"{prefix}.{name}" if prefix else name), item
        for name, m in self._modules.items():
            yield from m._named(attr, f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, prefix=""):
        return self._named("_parameters", prefix)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix=""):
        return self._named("_buffers", prefix)

    def zero_grad(self):
        for p in self.parameters():
            p.zero_grad()

    def train(self, mode=True):
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    # ---------------------------------------------------------------- state

    def state_dict(self):
        """{name: host NumPy copy} of every parameter and buffer."""
        out = {n: p.data.copy_to_host() for n, p in self.named_parameters()}
        out.update({n: b.copy_to_host() for n, b in self.named_buffers()})
        return out

    def load_state_dict(self, state, strict=True):
        """Copy arrays into the existing parameters and buffers (shapes must match)."""
        targets = {n: p.data for n, p in self.named_parameters()}
        targets.update(dict(self.named_buffers()))
        missing = sorted(set(targets) - set(state))
        extra = sorted(set(state) - set(targets))
        if strict and (missing or extra):
            raise ValueError(f"{type(self).__name__}.load_state_dict: missing {missing}, "
                             f"unexpected {extra}")
        for name, dst in targets.items():
            if name not in state:
                continue
            src = np.asarray(state[name])
            if src.shape != tuple(dst.shape):
                raise ValueError(f"{type(self).__name__}.load_state_dict: {name} has shape "
                                 f"{src.shape}, the module's is {tuple(dst.shape)}")
            dst.copy_to_device(arrays.host_contiguous(src.astype(dst.dtype, copy=False)))

    def save(self, path):
        """The state as an .npz file."""
        np.savez(path, **self.state_dict())

    def load(self, path, strict=True):
        with np.load(path) as f:
            self.load_state_dict({k: f[k] for k in f.files}, strict=strict)
        return self

    # ---------------------------------------------------------------- printing

    def extra_repr(self):
        return ""

    def _head(self):
        extra = self.extra_repr()
        pin = f"backend={self.backend}" if self.backend is not None else ""
        return f"{type(self).__name__}({', '.join(v for v in (extra, pin) if v)}"

    def __repr__(self):
        if not self._modules:
            return self._head() + ")"
        lines = [self._head()]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return "\n".join(lines) + "\n)"


class Sequential(Module):
    """Modules applied in order; backward in reverse."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: item {i} is a {type(m).__name__}, not a Module")
            setattr(self, str(i), m)

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def forward(self, x):
        for m in self._modules.values():
            x = m.forward(x)
        return x

    def backward(self, grad_out):
        for m in reversed(list(self._modules.values())):
            grad_out = m.backward(grad_out)
        return grad_out


def convert(model, backend, exclude=None):
    """Pin every module of ``model`` (or those for which ``exclude(module)`` is false) to
    ``backend``: "cudnn", "numba", or "auto"/None to follow ``dnn.enabled`` again. In place;
    returns the model (cudnn.torch's ``cudnn.convert``)."""
    if backend not in BACKENDS:
        raise ValueError(f"convert: backend must be one of 'auto', 'cudnn', 'numba' or None; "
                         f"got {backend!r}")
    for m in model.modules():
        if exclude is None or not exclude(m):
            m.backend = None if backend == "auto" else backend
    return model
