"""Helpers for users' own test suites: one op on both backends (``assert_backends_agree``) and
a whole model or training step on both backends (``compare_backends``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import autograd, config
from .arrays import to_host
from .crosscheck import compare, outputs
from .errors import CrosscheckError, CudnnUnavailableError
from .hints import Backend
from .tensors import Tensor

if TYPE_CHECKING:
    from .nn import Module


def assert_backends_agree(fn: Callable[..., Any], *args: Any, rtol: float | None = None,
                          atol: float | None = None, **kw: Any) -> Any:
    """Call the dnnkit op ``fn`` once with ``backend="numba"`` and once with
    ``backend="cudnn"`` and raise ``CrosscheckError`` (with the max abs/rel error) when the
    outputs differ beyond the op's tolerance (or ``rtol``/``atol``). Raises
    ``CudnnUnavailableError`` when cuDNN cannot run the call. Returns the cuDNN result."""
    if "backend" in kw:
        raise TypeError("assert_backends_agree chooses the backends itself; drop backend=")
    op = getattr(fn, "op_name", None) or getattr(fn, "__name__", str(fn))
    got = fn(*args, backend="cudnn", **kw)
    ref = fn(*args, backend="numba", **kw)
    compare(op, got, ref, labels=("cudnn", "numba"), rtol=rtol, atol=atol)
    return got


_POLICY = {"cudnn": "forced", "numba": "disabled", "auto": "auto"}


@dataclasses.dataclass
class OpRecord:
    """One op call (phase "forward") or one gradient rule (phase "backward") of a run."""
    phase: str
    op: str
    backend: str
    where: str           # the module path ("" outside any module)
    args: str            # the call's non-array arguments and array shapes, for messages
    results: list[npt.NDArray[Any]]   # host copies of the outputs (forward) or gradients
    names: list[str]     # "output 0", ... or the input names of the gradients


@dataclasses.dataclass
class Comparison:
    """What ``compare_backends`` found: the records of both runs and the worst relative error
    per record (``errors[i]`` for ``records[backends[0]][i]``)."""
    backends: tuple[str, str]
    records: dict[str, list[OpRecord]]
    errors: list[float]

    @property
    def max_error(self) -> float:
        return max(self.errors, default=0.0)

    def summary(self) -> str:
        lines = [f"{len(self.errors)} records compared ({self.backends[0]} vs "
                 f"{self.backends[1]}), max rel error {self.max_error:.3g}"]
        for r, e in zip(self.records[self.backends[0]], self.errors):
            lines.append(f"  {r.phase:8s} {r.where or '-':30s} {r.op:28s} {e:.3g}")
        return "\n".join(lines)


def _describe(args):
    pos, kw = args if isinstance(args, tuple) and len(args) == 2 else (args, {})
    items = list(pos) if not isinstance(pos, dict) else list(pos.items())
    items += list(kw.items()) if isinstance(kw, dict) else []
    out = []
    for it in items:
        name, v = it if isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], str) \
            else (None, it)
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            v = f"array{tuple(v.shape)} {np.dtype(v.dtype).name}"
        elif v is None or name == "stream":
            continue
        else:
            v = repr(v)
        out.append(f"{name}={v}" if name else v)
    return ", ".join(out)


def _array_of(v):
    return v.data if isinstance(v, Tensor) else v


def _snapshot(params):
    return [to_host(_array_of(p)) for p in params]


def _restore(params, saved):
    """Parameters and buffers (running statistics) back to their saved values."""
    for p, h in zip(params, saved):
        _array_of(p).copy_to_device(h)
        if isinstance(p, Tensor):
            p.grad = None
            p.bump_version()


def _run(fn, inputs, backend, params, names, per_op=False):
    records = []

    def record(phase, op, ran_on, module, args, results):
        if phase == "forward":
            res = outputs(results)
            labels = [f"output {i}" for i in range(len(res))]
        else:
            labels = [k for k, v in results.items() if v is not None]
            res = [to_host(getattr(results[k], "data", results[k])) for k in labels]
        records.append(OpRecord(phase, op, ran_on, names.get(id(module), ""),
                                _describe(args), res, labels))
    flags = {"dnn.enabled": _POLICY[backend], "dnn.crosscheck": bool(per_op)}
    with config.change_flags(flags), autograd.recording(record):
        try:
            out = fn(*inputs)
        except CrosscheckError as e:        # an op disagrees with itself on the same inputs
            phase, op, module = autograd.location() or ("", "", None)
            where = names.get(id(module), "") or "no module"
            raise CrosscheckError(f"{where}: {op} {phase} (the same inputs on both backends): "
                                  f"{e}", op=e.op, max_abs=e.max_abs,
                                  max_rel=e.max_rel) from e
    final = outputs(out.data if isinstance(out, Tensor) else out) if out is not None else []
    records.append(OpRecord("result", "fn", backend, "", "", final,
                            [f"return {i}" for i in range(len(final))]))
    for name, p in params:
        got = [to_host(p.data)] + ([to_host(p.grad.data)] if p.grad is not None else [])
        records.append(OpRecord("parameter", name, backend, name, "", got,
                                ["value", "grad"][:len(got)]))
    return records


def compare_backends(fn: Callable[..., Any], *inputs: Any,
                     model: Module | Iterable[Tensor] | None = None,
                     backends: Sequence[Backend] = ("cudnn", "numba"),
                     rtol: float | None = None) -> Comparison:
    """Run ``fn(*inputs)`` — a training step, or any function of Tensors — on two backends
    from the same parameters and find the first op that disagrees.

    1. **Per op** (localizes): ``fn`` runs with every op on ``backends[0]`` ("cudnn":
       ``dnn.enabled=forced``, "numba": ``disabled``, "auto") and ``dnn.crosscheck`` on: every
       op call, forward and backward, runs again on the other backend with the *same* inputs
       and is compared with the op's own tolerance (dnnkit.registry.OPS). The first that
       disagrees raises ``CrosscheckError`` naming the module path, the op and the phase,
       e.g. ``layer2.0.conv1: conv2d backward (the same inputs on both backends): ...``.
    2. **End to end** (measures the drift): ``fn`` runs again wholly on ``backends[1]``; every
       op's forward outputs, every gradient of the backward pass, ``fn``'s return value and
       (with ``model``) every parameter and gradient at the end are compared record by
       record with run 1. Small differences grow along a model (and a ReLU's gradient flips
       where its input crosses 0), so these errors are reported in the returned
       :class:`Comparison`, not raised — except a divergence of the runs (another op, NaN
       where the other has a number), or any record over ``rtol`` when you pass one.

    ``model``: a ``dnnkit.nn.Module`` (or a list of parameters) whose parameters ``fn`` uses:
    its parameters and buffers (running statistics) are saved before the first run, restored
    before the second and after it (the comparison leaves no trace), and named in messages.
    ``fn`` must be deterministic given the same parameters (seed dropout). Ops cuDNN has no
    call for run on Numba in both runs."""
    for b in backends:
        if b not in _POLICY:
            raise ValueError(f"compare_backends: backends must be two of {', '.join(_POLICY)}; "
                             f"got {backends!r}")
    if len(backends) != 2:
        raise ValueError(f"compare_backends: backends must be a pair; got {backends!r}")
    names, params, buffers = {}, [], []
    if model is not None:
        if hasattr(model, "named_modules"):
            names = {id(m): n for n, m in model.named_modules()}
            params = list(model.named_parameters())
            buffers = [b for _, b in model.named_buffers()]
        else:
            params = [(f"param{i}", p) for i, p in enumerate(model)]
    plist = [p for _, p in params] + buffers
    saved = _snapshot(plist)
    runs = {}
    try:
        for k, b in enumerate(backends):
            _restore(plist, saved)
            runs[b] = _run(fn, inputs, b, params, names, per_op=(k == 0))
    finally:
        _restore(plist, saved)
    a, b = runs[backends[0]], runs[backends[1]]
    errors = []
    for i, (ra, rb) in enumerate(zip(a, b)):
        if (ra.phase, ra.op, ra.names) != (rb.phase, rb.op, rb.names):
            raise CrosscheckError(
                f"compare_backends: the two runs diverge at record {i}: {backends[0]} ran "
                f"{ra.phase} {ra.op} ({ra.where or 'no module'}), {backends[1]} ran {rb.phase} "
                f"{rb.op} ({rb.where or 'no module'})", op=ra.op)
        worst = 0.0
        for name, x, y in zip(ra.names, ra.results, rb.results):
            err = _rel_error(x, y)
            if not err <= (rtol if rtol is not None else float("inf")):
                what = f"{ra.op} {ra.phase}" + (f" ({name})" if ra.phase != "forward" or
                                                 len(ra.names) > 1 else "")
                raise CrosscheckError(
                    f"{ra.where or 'no module'}: {what}, max rel error {err:.3g} > "
                    f"{rtol if rtol is not None else 'inf'} end to end ({backends[0]} on "
                    f"{ra.backend} vs {backends[1]} on {rb.backend}; arguments: "
                    f"{ra.args or '-'})", op=ra.op, max_rel=err)
            worst = max(worst, err)
        errors.append(worst)
    if len(a) != len(b):
        raise CrosscheckError(f"compare_backends: {backends[0]} made {len(a)} records, "
                              f"{backends[1]} {len(b)}")
    return Comparison(tuple(backends), runs, errors)


def _rel_error(x, y):
    """max|x - y| / max|y| over the elements, NaN where the NaN positions differ."""
    if x.shape != y.shape:
        return float("inf")
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    nx, ny = np.isnan(x64), np.isnan(y64)
    if not np.array_equal(nx, ny):
        return float("nan")
    ok = ~nx
    if not ok.any():
        return 0.0
    scale = float(np.abs(y64[ok]).max())
    diff = float(np.abs(x64[ok] - y64[ok]).max())
    return diff / scale if scale > 0 else diff


__all__ = ["assert_backends_agree", "compare_backends", "Comparison", "OpRecord",
           "CudnnUnavailableError"]
