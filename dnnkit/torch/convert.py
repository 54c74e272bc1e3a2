"""``convert(model, backend)``: run a PyTorch model's layers on dnnkit, in place.

Like cudnn.torch's ``cudnn.convert(net, cudnn)``: every module of a class dnnkit runs
(dnnkit/torch/modules.py ``TABLE``) becomes the dnnkit-backed class -- its ``__class__`` is
changed, so the module object, its Parameters, buffers, hooks and state-dict keys stay the
same -- unless ``exclude(module)`` is true or its options are ones dnnkit cannot honour; those
stay PyTorch's and the returned :class:`Report` says why. ``convert(model, "torch")`` gives
every converted module its PyTorch class back. Converting a converted model again changes the
backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from . import bridge, modules
from .modules import ORIGINAL, TABLE, unsupported

_ATTRS = ("dnnkit_backend", "dnnkit_custom_ops", "_dnnkit_layouts")


@dataclasses.dataclass
class Report:
    """What :func:`convert` did. ``converted``: [(module path, PyTorch class name)];
    ``skipped``: [(module path, reason)] for modules of a class dnnkit runs that stay
    PyTorch's (the reason names the option, or "excluded"); ``restored``: [(path, class name)]
    for ``backend="torch"``. The model itself is "" (printed as "(model)")."""

    backend: str
    converted: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    restored: list = dataclasses.field(default_factory=list)

    def __str__(self):
        lines = [f"dnnkit.torch.convert(backend={self.backend!r}): {len(self.converted)} "
                 f"converted, {len(self.skipped)} left to PyTorch"
                 + (f", {len(self.restored)} restored" if self.restored else "")]
        for title, rows in (("converted", self.converted), ("left to PyTorch", self.skipped),
                            ("restored", self.restored)):
            if rows:
                lines.append(f"  {title}:")
                lines += [f"    {path or '(model)'}: {what}" for path, what in rows]
        return "\n".join(lines)


def convert(model: nn.Module, backend: str = "auto",
            exclude: Callable[[nn.Module], bool] | None = None, *,
            custom_ops: bool | None = None) -> Report:
    """Run ``model``'s supported layers on dnnkit's ``backend`` ("auto": the policy's choice
    per call, ``dnn.enabled``; "cudnn"; "numba"), in place, or give them back to PyTorch
    (``"torch"``). ``exclude(module) -> bool``: modules to leave as they are. Returns a
    :class:`Report` (print it); the model keeps its Parameter and buffer objects.
    ``custom_ops``: None (default) runs the ``torch.library`` custom operators while
    ``torch.compile`` traces the model and the autograd.Functions in eager mode; True always
    the operators; False never (``torch.compile`` then breaks the graph at each converted
    module). Raises ValueError for another backend, TypeError for a model that is not a Module,
    an exclude that is not callable or a custom_ops that is not None or a bool; ImportError for
    custom_ops=True with a PyTorch without ``torch.library.custom_op`` (< 2.4)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"dnnkit.torch.convert: model must be a torch.nn.Module; got "
                        f"{type(model).__name__}")
    if exclude is not None and not callable(exclude):
        raise TypeError(f"dnnkit.torch.convert: exclude must be a callable (module) -> bool or "
                        f"None; got {type(exclude).__name__}")
    if custom_ops is not None and not isinstance(custom_ops, bool):
        raise TypeError(f"dnnkit.torch.convert: custom_ops must be None, True or False; got "
                        f"{custom_ops!r}")
    if custom_ops and modules.library is None:
        raise ImportError(f"dnnkit.torch.convert: custom_ops=True needs torch.library.custom_op "
                          f"(PyTorch >= 2.4); PyTorch {torch.__version__} has none")
    if backend != "torch":
        bridge.check_backend("dnnkit.torch.convert", backend)
    report = Report(backend)
    for path, m in list(model.named_modules()):
        cls = type(m)
        if exclude is not None and exclude(m):
            if cls in TABLE or cls in ORIGINAL:
                report.skipped.append((path, "excluded"))
            continue
        if backend == "torch":
            if cls in ORIGINAL:
                _restore(m)
                report.restored.append((path, ORIGINAL[cls].__name__))
            continue
        if cls in ORIGINAL:                       # converted before: a new backend
            m.dnnkit_backend, m.dnnkit_custom_ops = backend, custom_ops
            report.converted.append((path, ORIGINAL[cls].__name__))
            continue
        if cls not in TABLE:
            continue
        reason = unsupported(m)
        if reason is not None:
            report.skipped.append((path, reason))
            continue
        m.__class__ = TABLE[cls][0]
        m.dnnkit_backend, m.dnnkit_custom_ops = backend, custom_ops
        report.converted.append((path, cls.__name__))
    return report


def _restore(m):
    m.__class__ = ORIGINAL[type(m)]
    for a in _ATTRS:
        m.__dict__.pop(a, None)


def converted(model: nn.Module) -> dict:
    """{module path: backend} of the model's dnnkit-backed modules."""
    return {p: m.dnnkit_backend for p, m in model.named_modules() if type(m) in ORIGINAL}
