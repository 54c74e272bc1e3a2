"""``compare(model, *inputs)``: PyTorch's kernels against dnnkit's, layer by layer.

One forward and backward of a deep copy of the model with PyTorch's own modules (the
reference), then one per dnnkit backend (Numba, and cuDNN through dnnkit where it is
available) of another deep copy converted to it: the same parameters, buffers and inputs. Hooks
record, by module path, every leaf module's output (forward hook) and the gradient of the loss
wrt its inputs (full backward hook), then each parameter's gradient. The report names the
first difference beyond tolerance: the first module in execution order whose output differs;
else the first in backward order (nearest the loss) whose input gradient differs; else the
first parameter whose gradient differs -- the layer where the two diverge, not the many after
it that inherit the difference.

Tolerance per recorded tensor: it differs when ``max|a - r| > atol + rtol * max|r|`` (r the
reference, a the backend's; the error is scaled by the tensor's largest value, so a gradient
of small magnitude is judged as strictly as a large one). Defaults per dtype: float16 rtol
1e-2, float32 1e-3, float64 1e-9, and atol 1e-6 / 1e-9 / 1e-12 (for tensors of zeros).

Made comparable: TF32 is turned off in PyTorch for the run (dnnkit computes float32 in
float32); in-place activations run out of place (``inplace=False`` on the copies: a backward
hook cannot wrap an output that is then modified in place); dropout stays PyTorch's in every
run and PyTorch's generator is seeded alike before each, so every run draws the same masks.
The model given is not changed (its copies run); its training flag is kept.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import numpy as np
import torch
from torch import nn

from .. import cudnn
from .convert import convert

TOLERANCES = {"float16": (1e-2, 1e-6), "float32": (1e-3, 1e-9), "float64": (1e-9, 1e-12)}


@dataclasses.dataclass
class Difference:
    """One recorded tensor that differs: ``path`` (module path, "" the model), ``kind``
    ("output", "input gradient", "parameter gradient"), ``backend``, the largest absolute
    difference, it over the reference's largest magnitude (``relative``), the tolerance it
    broke, the shape and the index of the largest difference."""

    backend: str
    path: str
    kind: str
    max_abs: float
    relative: float
    allowed: float
    shape: tuple
    index: tuple

    def __str__(self):
        return (f"{self.backend}: {self.kind} of {self.path or '(model)'} differs: max "
                f"|difference| {self.max_abs:.3g} at {self.index} (shape {self.shape}), "
                f"{self.relative:.3g} of the reference's largest value; allowed {self.allowed:.3g}")


class ComparisonError(AssertionError):
    """Raised by :meth:`Comparison.raise_if_different` (an AssertionError for test suites)."""


@dataclasses.dataclass
class Comparison:
    """The result of :func:`compare`: ``differences`` {backend: first Difference or None},
    ``checked`` {backend: number of tensors compared}; ``ok`` when none differs."""

    differences: dict
    checked: dict

    @property
    def ok(self):
        return all(d is None for d in self.differences.values())

    def __bool__(self):
        return self.ok

    def __str__(self):
        lines = []
        for b, d in self.differences.items():
            lines.append(f"{b}: {self.checked[b]} tensors match PyTorch" if d is None
                         else str(d))
        return "\n".join(lines)

    def raise_if_different(self):
        """Raise :class:`ComparisonError` (an AssertionError) naming the first differing layer
        of each backend; return self when every backend matches."""
        if not self.ok:
            raise ComparisonError("dnnkit.torch.compare: dnnkit differs from PyTorch\n" +
                                  str(self))
        return self


# ---------------------------------------------------------------- the judgement (host arrays)

def tolerance(dtype, rtol=None, atol=None):
    r, a = TOLERANCES.get(np.dtype(dtype).name, TOLERANCES["float32"])
    return (r if rtol is None else rtol), (a if atol is None else atol)


def differs(ref, got, rtol, atol):
    """(max |got - ref|, its index, the reference's largest magnitude, allowed) when ``got``
    differs from ``ref`` beyond ``atol + rtol * max|ref|`` (or in shape, or where one is NaN and
    the other not); None when they match. Host arrays."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if ref.shape != got.shape:
        return np.inf, (), 0.0, 0.0
    if ref.size == 0:
        return None
    scale = float(np.nanmax(np.abs(ref))) if np.isfinite(ref).any() else 0.0
    allowed = atol + rtol * scale
    diff = np.abs(got - ref)
    same_nan = np.isnan(ref) & np.isnan(got)
    diff = np.where(same_nan, 0.0, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)
    i = int(np.argmax(diff))
    worst = float(diff.flat[i])
    if worst <= allowed:
        return None
    return worst, tuple(int(v) for v in np.unravel_index(i, ref.shape)), scale, allowed


def first_difference(backend, ref, got, rtol=None, atol=None):
    """The first :class:`Difference` of record ``got`` against record ``ref``, or None; a
    record is {"output": [(path, array)], "input gradient": [...], "parameter gradient":
    [...]}, each list in the order to search (module docstring). A tensor the reference has
    and the backend lacks counts as different."""
    for kind in ("output", "input gradient", "parameter gradient"):
        theirs = dict(got.get(kind, []))
        for path, r in ref.get(kind, []):
            a = theirs.get(path)
            rt, at = tolerance(np.asarray(r).dtype, rtol, atol)
            if a is None:
                return Difference(backend, path, kind, np.inf, np.inf, at, tuple(np.shape(r)),
                                  ())
            d = differs(r, a, rt, at)
            if d is not None:
                worst, index, scale, allowed = d
                return Difference(backend, path, kind, worst,
                                  worst / scale if scale else np.inf, allowed,
                                  tuple(np.shape(r)), index)
    return None


def count(record):
    return sum(len(v) for v in record.values())


# ---------------------------------------------------------------- the runs

def _tensors(value, prefix=""):
    """[(suffix, tensor)] of a module's output (a tensor, or tuples/lists of them)."""
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, (tuple, list)):
        out = []
        for i, v in enumerate(value):
            out += _tensors(v, f"{prefix}[{i}]")
        return out
    return []


def _host(t):
    return t.detach().to("cpu", copy=True).numpy()


def _default_loss(output):
    """sum(output * w) over every output tensor, w fixed pseudo-random (the same in every
    run): gradients that differ per element."""
    total = 0
    g = torch.Generator().manual_seed(1234)
    for _, t in _tensors(output):
        if t.is_floating_point():
            w = torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
            total = total + (t * w).sum()
    return total


@contextlib.contextmanager
def _no_tf32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def run(model, inputs, loss_fn, seed):
    """One forward and backward of ``model`` on copies of ``inputs``; the record (see
    :func:`first_difference`)."""
    rec = {"output": [], "input gradient": [], "parameter gradient": []}
    hooks = []
    leaves = [(p, m) for p, m in model.named_modules() if not any(True for _ in m.children())]
    if not leaves or leaves[0][1] is not model:
        leaves.append(("", model))
    calls = {}

    def label(kind, path):
        """``path``, or "path (call n)" for a module's n-th call (a module used twice)."""
        n = calls[kind, path] = calls.get((kind, path), 0) + 1
        return path if n == 1 else f"{path} (call {n})"

    for path, m in leaves:
        def fwd(mod, args, out, path=path):
            at = label("output", path)
            rec["output"] += [(at + s, _host(t)) for s, t in _tensors(out)]

        def bwd(mod, grad_in, grad_out, path=path):
            at = label("input gradient", path)
            rec["input gradient"] += [(f"{at}[{i}]", _host(g)) for i, g in enumerate(grad_in)
                                      if g is not None]
        hooks.append(m.register_forward_hook(fwd))
        hooks.append(m.register_full_backward_hook(bwd))
    xs = [x.detach().clone().requires_grad_(x.is_floating_point())
          if isinstance(x, torch.Tensor) else x for x in inputs]
    devices = sorted({x.device.index or 0 for x in xs
                      if isinstance(x, torch.Tensor) and x.is_cuda})
    try:
        with torch.random.fork_rng(devices=devices), _no_tf32():
            torch.manual_seed(seed)
            out = model(*xs)
            loss = (loss_fn or _default_loss)(out)
            model.zero_grad(set_to_none=True)
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    rec["parameter gradient"] = [(name, _host(p.grad)) for name, p in model.named_parameters()
                                 if p.grad is not None]
    return rec


def _copy(model):
    m = copy.deepcopy(model)
    convert(m, "torch")
    for sub in m.modules():
        if getattr(sub, "inplace", False) is True:
            sub.inplace = False
    return m


def default_backends():
    """("numba", "cudnn"), without "cudnn" where dnnkit's cuDNN backend cannot run."""
    return ("numba", "cudnn") if cudnn.is_available() else ("numba",)


def compare(model, *inputs, loss_fn=None, backends=None, rtol=None, atol=None, seed=0,
            exclude=None, check=False):
    """Run ``model`` on ``inputs`` with PyTorch's kernels and with dnnkit's (each backend of
    ``backends``, default Numba and, where available, cuDNN), forward and backward, and return
    a :class:`Comparison` naming, per backend, the first module path whose output or gradient
    differs beyond tolerance, and by how much (module docstring).

    ``loss_fn(output) -> scalar tensor``: the loss to differentiate (default: the outputs
    weighted by fixed pseudo-random numbers). ``rtol``, ``atol``: override the per-dtype
    tolerances. ``seed``: PyTorch's generator seed before each run. ``exclude(module) ->
    bool``: modules to keep PyTorch's in every run. ``check=True`` raises ComparisonError (an
    AssertionError) on a difference -- or call ``.raise_if_different()``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"dnnkit.torch.compare: model must be a torch.nn.Module; got "
                        f"{type(model).__name__}")
    backends = tuple(default_backends() if backends is None else backends)
    for b in backends:
        if b not in ("numba", "cudnn", "auto"):
            raise ValueError(f"dnnkit.torch.compare: backends must be among numba, cudnn, auto; "
                             f"got {b!r}")
    ref = run(_copy(model), inputs, loss_fn, seed)

    def keep(m):
        return isinstance(m, nn.Dropout) or (exclude is not None and exclude(m))
    differences, checked = {}, {}
    for b in backends:
        m = _copy(model)
        convert(m, b, exclude=keep)
        got = run(m, inputs, loss_fn, seed)
        differences[b] = first_difference(b, ref, got, rtol, atol)
        checked[b] = count(ref)
    result = Comparison(differences, checked)
    if check:
        result.raise_if_different()
    return result
