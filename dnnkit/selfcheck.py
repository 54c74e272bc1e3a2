"""Cross-check of every registered op on every available backend against float64 NumPy.

``python -m dnnkit check`` prints one row per (op, variant, dtype, backend): the max relative
error ``max|y - ref| / max|ref|`` and the median time of CUDA-event-timed runs after a warm-up
(on the simulator: one host-timed run, only to show it ran).
"""

import dataclasses
import time

import numpy as np

from . import ops, reference
from .backends import numba_status
from .cudnn import loader
from .device import numba_cuda
from .errors import CudnnUnavailableError
from .ops.activation import MODES as ACT_MODES
from .registry import REGISTRY
from .timing import median_ms

# Pass thresholds on the relative error vs float64, per dtype (float16 has an 11-bit mantissa).
THRESHOLD = {"float16": 5e-3, "float32": 1e-5, "float64": 1e-12}
ACT_COEF = {"clipped_relu": 2.0, "elu": 1.0, "swish": 1.5}


@dataclasses.dataclass
class Case:
    op: str
    variant: str
    run: object        # (backend, stream, inputs) -> device result
    ref: object        # inputs (float64 NumPy) -> float64 NumPy
    make: object       # (rng, dtype, big) -> tuple of NumPy inputs
    tol: dict = None   # dtype name -> threshold, where the op's own differs from THRESHOLD


def _x(shape_small, shape_big, scale=3.0):
    def make(rng, dtype, big):
        shape = shape_big if big else shape_small
        return (rng.standard_normal(shape).astype(dtype) * dtype.type(scale),)
    return make


def _act_backward_inputs(mode, coef, small, big):
    def make(rng, dtype, b):
        shape = big if b else small
        x = rng.standard_normal(shape).astype(dtype) * dtype.type(3)
        y = reference.activation(x, mode, coef).astype(dtype)
        return x, y, rng.standard_normal(shape).astype(dtype)
    return make


def _softmax_backward_inputs(algo, mode, small, big):
    def make(rng, dtype, b):
        shape = big if b else small
        x = rng.standard_normal(shape) * 3
        y = reference.softmax(x, algo, mode).astype(dtype)
        return y, rng.standard_normal(shape).astype(dtype)
    return make


def cases():
    out = []
    small, big = (3, 70), (32, 64, 32, 32)
    for mode in ACT_MODES:
        c = ACT_COEF.get(mode, 0.0)
        out.append(Case("activation", mode,
                        lambda b, s, i, m=mode, c=c: ops.activation(i[0], m, c, backend=b, stream=s),
                        lambda i, m=mode, c=c: reference.activation(i[0], m, c),
                        _x(small, big)))
        out.append(Case("activation_backward", mode,
                        lambda b, s, i, m=mode, c=c: ops.activation_backward(
                            i[0], i[1], i[2], m, c, backend=b, stream=s),
                        lambda i, m=mode, c=c: reference.activation_backward(i[0], i[2], m, c),
                        _act_backward_inputs(mode, c, small, big)))
    sm_small, sm_big = (2, 5, 3, 4), (16, 1000, 8, 8)
    for algo in ("accurate", "fast", "log"):
        for mode in ("channel", "instance"):
            out.append(Case("softmax", f"{algo}/{mode}",
                            lambda b, s, i, a=algo, m=mode: ops.softmax(i[0], a, m, backend=b,
                                                                         stream=s),
                            lambda i, a=algo, m=mode: reference.softmax(i[0], a, m),
                            _x(sm_small, sm_big, scale=2.0)))
            out.append(Case("softmax_backward", f"{algo}/{mode}",
                            lambda b, s, i, a=algo, m=mode: ops.softmax_backward(
                                i[0], i[1], a, m, backend=b, stream=s),
                            lambda i, a=algo, m=mode: reference.softmax_backward(i[0], i[1], a, m),
                            _softmax_backward_inputs(algo, mode, sm_small, sm_big)))
    out += _conv_cases()
    for family in ops.FAMILIES:
        if hasattr(family, "selfcheck_cases"):
            out += family.selfcheck_cases(Case)
    missing = set(REGISTRY) - {c.op for c in out}
    if missing:  # every registered op must be cross-checked
        raise RuntimeError(f"selfcheck has no case for {sorted(missing)}")
    return out


# (nd, small x, small w, big x, big w); stride 1, padding 1
_CONV = [(2, (1, 2, 5, 5), (3, 2, 3, 3), (16, 64, 28, 28), (64, 64, 3, 3)),
         (3, (1, 2, 3, 4, 4), (2, 2, 2, 3, 3), (4, 16, 8, 16, 16), (16, 16, 3, 3, 3))]


def _conv_inputs(xs_small, ws_small, xs_big, ws_big, with_dy):
    def make(rng, dtype, big):
        xs, ws = (xs_big, ws_big) if big else (xs_small, ws_small)
        fan_in = int(np.prod(ws[1:]))
        x = rng.standard_normal(xs).astype(dtype)
        w = (rng.standard_normal(ws) / np.sqrt(fan_in)).astype(dtype)
        if not with_dy:
            return x, w
        ys = reference.conv_forward(x[:1, :, ...].astype(np.float64), w.astype(np.float64),
                                    None, (1,) * len(ws[2:]), (1,) * len(ws[2:]),
                                    (1,) * len(ws[2:])).shape
        return x, w, rng.standard_normal((xs[0],) + ys[1:]).astype(dtype)
    return make


def _conv_cases():
    out = []
    for nd, xs, ws, xb, wb in _CONV:
        name = f"conv{nd}d"
        one = (1,) * nd
        kw = dict(stride=1, padding=1)
        fwd, bdata, bfilt = (getattr(ops, name), getattr(ops, name + "_backward_data"),
                             getattr(ops, name + "_backward_filter"))
        out.append(Case(name, "3x3 pad 1" if nd == 2 else "3x3x3 pad 1",
                        lambda b, s, i, f=fwd: f(i[0], i[1], backend=b, stream=s, **kw),
                        lambda i, o=one: reference.conv_forward(i[0], i[1], None, o, o, o),
                        _conv_inputs(xs, ws, xb, wb, False)))
        out.append(Case(name, ("3x3" if nd == 2 else "3x3x3") + " pad 1+relu",
                        lambda b, s, i, f=fwd: f(i[0], i[1], backend=b, stream=s,
                                                 activation="relu", **kw),
                        lambda i, o=one: np.maximum(
                            reference.conv_forward(i[0], i[1], None, o, o, o), 0),
                        _conv_inputs(xs, ws, xb, wb, False)))
        out.append(Case(name + "_backward_data", "pad 1",
                        lambda b, s, i, f=bdata: f(i[2], i[1], i[0].shape, backend=b, stream=s,
                                                   **kw),
                        lambda i, o=one: reference.conv_backward_data(i[2], i[1], i[0].shape,
                                                                      o, o, o),
                        _conv_inputs(xs, ws, xb, wb, True)))
        out.append(Case(name + "_backward_filter", "pad 1",
                        lambda b, s, i, f=bfilt: f(i[0], i[2], i[1].shape, backend=b, stream=s,
                                                   **kw),
                        lambda i, o=one: reference.conv_backward_filter(i[0], i[2], i[1].shape,
                                                                        o, o, o),
                        _conv_inputs(xs, ws, xb, wb, True)))
    out.append(Case("conv_backward_bias", "4-D",
                    lambda b, s, i: ops.conv_backward_bias(i[0], backend=b, stream=s),
                    lambda i: reference.conv_backward_bias(i[0]),
                    _x((2, 3, 4, 5), (32, 64, 28, 28), scale=1.0)))
    return out


def _cudnn_env_reason():
    st = loader.loaded_status()
    return st.describe() if st is not None and not st.available else None


def _time_sim(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run(dtypes=("float16", "float32", "float64"), reps=20, seed=0, simulator=None, ops_=None):
    """Yield result rows (dicts) for every case, dtype and runnable backend."""
    cuda = numba_cuda()
    sim = numba_status().simulator if simulator is None else simulator
    big = not sim
    rng = np.random.default_rng(seed)
    for case in cases():
        if ops_ and case.op not in ops_:
            continue
        for dt in map(np.dtype, dtypes):
            host = case.make(rng, dt, big)
            ref = case.ref([h.astype(np.float64) for h in host])
            dev = [cuda.to_device(h) for h in host]
            for backend in ("numba", "cudnn"):
                row = dict(op=case.op, variant=case.variant, dtype=dt.name, backend=backend,
                           shape=host[0].shape)
                fn = lambda: case.run(backend, None, dev)  # noqa: E731
                try:
                    got = fn().copy_to_host()
                except CudnnUnavailableError as e:
                    env = e.reason == _cudnn_env_reason()
                    row.update(status="skipped", note="cuDNN unavailable" if env else e.reason)
                    yield row
                    continue
                err = reference.rel_error(got, ref)
                ms = _time_sim(fn) if sim else median_ms(lambda i: fn(), reps)
                ok = err <= (case.tol or THRESHOLD).get(dt.name, THRESHOLD[dt.name])
                row.update(status="ok" if ok else "FAIL", rel_err=err, ms=ms)
                yield row


HEADER = (f"{'op':<24} {'variant':<18} {'dtype':<8} {'backend':<7} {'rel err':>9} "
          f"{'ms':>9}  status")


def format_row(r):
    head = f"{r['op']:<24} {r['variant']:<18} {r['dtype']:<8} {r['backend']:<7} "
    if r["status"] == "skipped":
        return head + f"{'-':>9} {'-':>9}  skipped: {r['note']}"
    return head + f"{r['rel_err']:9.2e} {r['ms']:9.4f}  {r['status']}"


def format_table(rows):
    return "\n".join([HEADER, "-" * len(HEADER)] + [format_row(r) for r in rows])
