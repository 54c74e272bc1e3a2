"""The dispatcher: one registry ``{op: {backend: Impl}}`` and the only reader of the policy.

Policy, per call: ``backend=None`` follows the ``dnn.enabled`` flag; ``"auto"``, ``"cudnn"``
(forced for this call) and ``"numba"`` (disabled for this call) override it.

- auto: cuDNN when it is available and the op's ``supports()`` accepts the arguments, else
  Numba (logged with the reason); a cuDNN NOT_SUPPORTED status at run time also falls back.
- forced: cuDNN, or ``CudnnUnavailableError`` naming the op and the reason.
- disabled: Numba; cuDNN is never loaded.
"""

import contextlib
import dataclasses
import functools
import logging
import threading

import numpy as np

from . import config, fastpath
from . import profile as profiling
from .cudnn import loader
from .errors import CrosscheckError, CudnnError, CudnnUnavailableError

log = logging.getLogger("dnnkit")

BACKENDS = ("cudnn", "numba")
_POLICY_OF_BACKEND = {None: None, "auto": "auto", "cudnn": "forced", "numba": "disabled"}


@dataclasses.dataclass
class Impl:
    fn: object
    supports: object = None   # fn(*args, **kw) -> None when supported, else the reason (str)
    # bind(*args, **kw) -> a function of the same arguments doing fn's work with everything
    # that depends only on the call's signature prepared once (dnnkit/fastpath.py)
    bind: object = None


@dataclasses.dataclass
class OpInfo:
    # max allowed |a - b| <= atol + rtol * |b| between two backends, per dtype
    tolerance: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_TOLERANCE))
    crosscheck: bool = True


DEFAULT_TOLERANCE = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12)}

REGISTRY = {}   # op -> {backend: Impl}
OPS = {}        # op -> OpInfo
PREPARE = {}    # op -> fn(public args) -> tuple of implementation args (validated)


def public_op(name, memo=True):
    """Decorator for an op's public function. The decorated body validates the user's
    arguments and returns the tuple of (device) arguments the implementations take; the
    returned wrapper adds ``backend=`` and dispatches. ``select_backend`` reuses the body.
    ``memo=False`` for an op whose body is not a function of the call's signature (dropout
    draws a fresh seed): its calls always take the full path (dnnkit/fastpath.py)."""
    def deco(prepare):
        @functools.wraps(prepare)
        def wrapper(*args, backend=None, **kw):
            sig, entry = _fast_find(name, args, backend, kw) if memo else (None, None)
            if entry is not None:          # a memoised call: its runner on these arrays
                runner, prepared, subs = entry
                fastpath.stats["hits"] += 1
                if subs:
                    prepared = list(prepared)
                    for i, j, k in subs:
                        prepared[i] = args[j] if k is None else kw[k]
                try:
                    return runner(*prepared)
                except CudnnError as e:   # the full path decides: fall back or raise
                    if not e.not_supported:
                        raise
                    fastpath.drop(sig)
            prepared = prepare(*args, **kw)
            out, runner = _run(name, prepared, backend)
            if sig is not None and runner is not None:
                fastpath.store(sig, args, kw, prepared, runner)
            return out
        PREPARE[name] = prepare
        wrapper.op_name = name
        return wrapper
    return deco


def binder(op, backend):
    """Decorator: ``bind`` for ``op``'s implementation on ``backend`` (registered first)."""
    def deco(bind):
        REGISTRY[op][backend].bind = bind
        fastpath.invalidate()
        return bind
    return deco


def _fast_find(op, args, backend, kw):
    """(the call's memo signature, its memoised entry) (dnnkit/fastpath.py); (None, None) when
    this call must take the full path: inside a trace or the profiler, with DEBUG logging, or
    with several devices (the full path picks the device). The thread-locals are read through
    __dict__: getattr of an attribute a thread never set raises and catches AttributeError
    inside, 0.35 us of a memoised call's ~1.5 us of dispatch (measured on the CI machine)."""
    if _local.__dict__.get("traces") or profiling._local.__dict__.get("stack") or \
            not (_one_device or _single_device()) or log.isEnabledFor(logging.DEBUG):
        return None, None
    return fastpath.find(op, args, backend, kw)


def register(op, backend, *, supports=None, tolerance=None, crosscheck=True):
    """Decorator: register ``fn`` as ``op``'s implementation on ``backend``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    info = OPS.setdefault(op, OpInfo())
    if tolerance:
        info.tolerance.update(tolerance)
    info.crosscheck = info.crosscheck and crosscheck

    def deco(fn):
        REGISTRY.setdefault(op, {})[backend] = Impl(fn, supports)
        fastpath.invalidate()
        return fn
    return deco


# ---------------------------------------------------------------- tracing

@dataclasses.dataclass(frozen=True)
class TraceEntry:
    op: str
    backend: str
    algo: object
    shapes: tuple
    dtype: str
    reason: str = ""


class Trace(list):
    """The op calls made inside ``with dnnkit.trace() as t:`` (on this thread)."""

    def backends(self, op=None):
        return [e.backend for e in self if op is None or e.op == op]

    def ops(self):
        return [e.op for e in self]


_local = threading.local()


@contextlib.contextmanager
def trace():
    t = Trace()
    stack = _local.__dict__.setdefault("traces", [])
    stack.append(t)
    try:
        yield t
    finally:
        _remove_identical(stack, t)


def _remove_identical(stack, item):
    """Remove ``item`` itself (not an equal one: two traces can hold the same entries)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is item:
            del stack[i]
            return


def note_algo(algo):
    """Called by an implementation to record the algorithm it chose for the current call."""
    _local.algo = algo


def _describe_args(args):
    arrays = [a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
    shapes = tuple(tuple(a.shape) for a in arrays)
    dtype = str(np.dtype(arrays[0].dtype)) if arrays else ""
    return shapes, dtype


def _record(op, backend, algo, args, reason):
    stack = getattr(_local, "traces", None)
    if stack:
        shapes, dtype = _describe_args(args)
        entry = TraceEntry(op, backend, algo, shapes, dtype, reason)
        for t in stack:
            t.append(entry)


# ---------------------------------------------------------------- choosing

_announced = set()


def _policy(op, backend):
    if backend is None:
        return config.get("dnn.enabled"), "dnn.enabled"
    if not isinstance(backend, str) or backend not in _POLICY_OF_BACKEND:
        raise ValueError(f"{op}: backend must be None, 'auto', 'cudnn' or 'numba'; got {backend!r}")
    return _POLICY_OF_BACKEND[backend], f"backend={backend!r}"


def cudnn_status():
    """The loader's CudnnStatus (loads and probes cuDNN on first use)."""
    return loader.status()


def _cudnn_reason(op, args, kw):
    """(None, False) when cuDNN can run this call, else (why not, whether the reason is the
    library's own state rather than these arguments)."""
    impl = REGISTRY[op].get("cudnn")
    if impl is None:
        return "dnnkit has no cuDNN implementation of this op", False
    # The arguments first: that needs no library, and it is the more specific answer.
    reason = impl.supports(*args, **kw) if impl.supports else None
    if reason is not None:
        return reason, False
    st = cudnn_status()
    return (None, False) if st.available else (st.describe(), True)


def _choose(op, args, kw, backend):
    """(backend, reason, policy, whether the reason is the library's state) for a call; raises
    CudnnUnavailableError under forced."""
    if op not in REGISTRY:
        raise ValueError(f"unknown op {op!r}; registered: {', '.join(sorted(REGISTRY))}")
    policy, origin = _policy(op, backend)
    if policy == "disabled":
        return "numba", f"{origin}={policy}" if origin == "dnn.enabled" else origin, policy, False
    reason, from_library = _cudnn_reason(op, args, kw)
    if reason is None:
        return "cudnn", "cuDNN available and supports the arguments", policy, False
    if policy == "forced":
        what = "dnn.enabled=forced" if origin == "dnn.enabled" else origin
        raise CudnnUnavailableError(
            f"{op}: cuDNN is required ({what}) but cannot be used: {reason}", op=op, reason=reason)
    return "numba", reason, policy, from_library


def select_backend(op, *args, backend=None, explain=False, **kw):
    """Which backend ``op`` would run on for these arguments (as the public function takes
    them: ``select_backend("softmax", x, algo="log")``), without running it. Host inputs are
    copied to the device to validate them. With ``explain=True`` returns ``(backend, reason)``.
    Raises what the call would raise (bad arguments, or CudnnUnavailableError when forced)."""
    if op not in PREPARE:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(sorted(PREPARE))}")
    chosen, reason, _, _ = _choose(op, PREPARE[op](*args, **kw), {}, backend)
    return (chosen, reason) if explain else chosen


def _log_decision(op, chosen, reason, from_library=False):
    if from_library and reason not in _announced:
        _announced.add(reason)   # say why cuDNN is not used once, at INFO
        log.info("cuDNN not used (%s); ops run on the Numba kernels", reason)
    verbose = config.get("dnn.verbose")
    if verbose or log.isEnabledFor(logging.DEBUG):
        log.log(logging.INFO if verbose else logging.DEBUG, "%s: %s backend (%s)", op, chosen,
                reason)


# ---------------------------------------------------------------- running

_array_types = {}    # type -> NUMBA, FOREIGN or None (asked once per type)
NUMBA, FOREIGN = 1, 2


def _array_kind(t):
    """NUMBA for a Numba device array type, FOREIGN for another type exporting
    ``__cuda_array_interface__`` (PyTorch, CuPy), None for anything else."""
    known = _array_types.get(t, 0)
    if known == 0:
        if any(c.__name__ == "DeviceNDArrayBase" for c in t.__mro__):
            known = NUMBA
        elif hasattr(t, "__cuda_array_interface__"):
            known = FOREIGN
        else:
            known = None
        _array_types[t] = known
    return known


def _device_of_arg(a, kind):
    """The device holding argument ``a`` of ``kind`` (None: unknown). A foreign array's
    device is asked of the driver from its address: Numba would tie its view to the current
    device whatever device holds the memory."""
    from .device import device_of, foreign_device
    return device_of(a) if kind == NUMBA else foreign_device(a)


def call_device(op, args):
    """The device that holds the call's device arrays (Numba's or foreign ones): None when
    there are none (or on the simulator, whose arrays have no device). Arrays on two devices
    are an error."""
    if _single_device():
        return None
    dev, first = None, None
    for i, a in enumerate(args):
        kind = _array_kind(type(a))
        if kind is not None:
            d = _device_of_arg(a, kind)
            if d is None:
                continue
            if dev is None:
                dev, first = d, i
            elif d != dev:
                raise ValueError(
                    f"{op}: its arrays are on different devices (argument {first} on device "
                    f"{dev}, argument {i} on device {d}); host inputs are copied to the "
                    f"current device: pass device arrays of one device, or make that device "
                    f"current (with numba.cuda.gpus[{d}]: ...)")
    return dev


_one_device = None


def _single_device():
    """One GPU (or the simulator, or no driver): every array is on it, nothing to check or
    switch. CUDA does not add devices to a running process."""
    global _one_device
    if _one_device is None:
        from .device import device_count
        n = device_count()
        if not n:
            return True      # no driver (yet): ask again next time
        _one_device = n <= 1
    return _one_device


@contextlib.contextmanager
def _on_device(dev):
    """Make ``dev`` current for the call (its context, its cuDNN handle, its kernels)."""
    from numba import cuda
    with cuda.gpus[dev]:
        yield


def dispatch(op, *args, backend=None, **kw):
    """Run ``op`` on the backend the policy picks, on the device that holds its arrays;
    returns what the implementation returns."""
    return _run(op, args, backend, kw)[0]


def _run(op, args, backend, kw=None):
    """(output, the runner a repeat of this call may reuse, or None)."""
    kw = kw or {}
    dev = call_device(op, args)
    if dev is not None:
        from .device import device_id
        if dev != device_id():
            with _on_device(dev):
                return _dispatch(op, args, backend, kw)
    return _dispatch(op, args, backend, kw)


def _bound(op, backend, args, kw):
    """The implementation's runner for these arguments (bound once where it can be)."""
    impl = REGISTRY[op][backend]
    return (impl.bind(*args, **kw) if impl.bind is not None else None) or impl.fn


def _dispatch(op, args, backend, kw):
    chosen, reason, policy, from_library = _choose(op, args, kw, backend)
    _log_decision(op, chosen, reason, from_library)
    _local.algo = None
    prof = profiling.active()
    token = prof.begin(args) if prof is not None else None
    try:
        runner = _bound(op, chosen, args, kw)
        out = runner(*args, **kw)
    except CudnnError as e:
        if chosen != "cudnn" or policy != "auto" or not e.not_supported:
            raise
        chosen, reason = "numba", f"cuDNN returned {e.status_name} at run time"
        _log_decision(op, chosen, reason)
        _local.algo = None
        runner = _bound(op, chosen, args, kw)
        out = runner(*args, **kw)
    if prof is not None:
        prof.end(token, op, chosen)
    if getattr(_local, "traces", None):
        _record(op, chosen, _local.algo, args, reason)
    if config.get("dnn.crosscheck") and OPS[op].crosscheck:
        _crosscheck(op, chosen, out, args, kw)
        runner = None
    return out, (None if kw or config.get("dnn.verbose") else runner)


def _other_backend_ok(op, other, args, kw):
    if other == "numba":
        return True
    return _cudnn_reason(op, args, kw)[0] is None


def _crosscheck(op, chosen, out, args, kw):
    other = "numba" if chosen == "cudnn" else "cudnn"
    if not _other_backend_ok(op, other, args, kw):
        key = ("crosscheck", op)
        if key not in _announced:
            _announced.add(key)
            log.warning("dnn.crosscheck: %s cannot run on %s here; not cross-checked", op, other)
        return
    ref = REGISTRY[op][other].fn(*args, **kw)
    compare(op, out, ref, labels=(chosen, other))


def _is_array(a):
    """A result array (NumPy or device), not another result object such as an RNN's training
    state, which may carry a ``shape`` of its own."""
    import numpy as np
    return isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__") \
        or hasattr(a, "copy_to_host")


def _outputs(x):
    from .arrays import to_host
    items = x if isinstance(x, (tuple, list)) else (x,)
    return [to_host(a) for a in items if a is not None and _is_array(a)]


def compare(op, got, expected, *, labels=("a", "b"), rtol=None, atol=None):
    """Raise CrosscheckError unless every output agrees within the op's tolerance:
    ``max|a - b| <= atol + rtol * max|b|`` over the finite elements (norm-wise, not element by
    element: an element of a long reduction that cancels to near zero carries the rounding of
    the large terms that made it, so a per-element relative test would reject two correct
    backends). NaN must match NaN at the same place (IEEE propagation); infinities must match.
    """
    got, expected = _outputs(got), _outputs(expected)
    if len(got) != len(expected):
        raise CrosscheckError(f"{op}: {labels[0]} returned {len(got)} outputs, "
                              f"{labels[1]} {len(expected)}", op=op)
    for i, (a, b) in enumerate(zip(got, expected)):
        tol = OPS.get(op, OpInfo()).tolerance.get(np.dtype(a.dtype).name, (1e-5, 1e-5))
        r, t = (rtol if rtol is not None else tol[0]), (atol if atol is not None else tol[1])
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        finite = np.isfinite(a64) & np.isfinite(b64)
        with np.errstate(invalid="ignore"):   # inf - inf where both are inf
            diff = np.abs(a64 - b64)
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        scale = float(np.abs(b64[finite]).max()) if finite.any() else 0.0
        max_rel = max_abs / scale if scale > 0 else max_abs
        inf_ok = np.array_equal(np.where(finite | nan_a, 0, a64), np.where(finite | nan_b, 0, b64))
        if not np.array_equal(nan_a, nan_b) or not inf_ok or max_abs > t + r * scale:
            raise CrosscheckError(
                f"{op}: backends disagree on output {i} (shape {a.shape}, {a.dtype}): "
                f"{labels[0]} vs {labels[1]} max abs error {max_abs:.3g}, max rel error "
                f"{max_rel:.3g} (of max|{labels[1]}| = {scale:.3g}), tolerance rtol={r:g} "
                f"atol={t:g}, NaN positions "
                f"{'match' if np.array_equal(nan_a, nan_b) else 'differ'}",
                op=op, max_abs=max_abs, max_rel=max_rel)
