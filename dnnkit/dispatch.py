"""Running an op: ``public_op`` (the decorator of every public op function) and ``dispatch``.

A call of a public op checks its arguments (the decorated body), picks the backend
(dnnkit/policy.py), makes the device of its arrays current (dnnkit/placement.py) and runs the
registered implementation (dnnkit/registry.py); a cuDNN NOT_SUPPORTED status at run time falls
back to Numba under ``auto``. Around the run: the profiler (dnnkit/profile.py), traces
(dnnkit/tracing.py) and ``dnn.crosscheck`` (dnnkit/crosscheck.py). A repeated call of one
signature skips all of that and runs its memoised runner (dnnkit/fastpath.py).
"""

import functools
from typing import Any, Callable

from .log import debug_enabled
from . import arrays, config, fastpath, foreign, placement, tensor_calls
from .autograd import PUBLIC
from .crosscheck import crosscheck
from .device import device_id
from .errors import CudnnError
from .hints import OpParams, PublicOp, op_doc, with_backend
from .policy import choose, log_decision, policy
from .profile import active as active_profile, profile_state
from .registry import OPS, PREPARE, bound
from .tensors import Tensor
from .tracing import record, trace_state



def public_op(name: str, memo: bool | Callable[[tuple, dict], bool] = True
              ) -> Callable[[Callable[OpParams, Any]], PublicOp[OpParams]]:
    """Decorator for an op's public function. The decorated body validates the user's
    arguments and returns the (device) arguments the implementations take, a NamedTuple of
    the family's own; the returned wrapper adds ``backend=`` and dispatches.
    ``select_backend`` reuses the body. ``memo=False`` for an op whose body is not a function
    of the call's signature (dropout draws a fresh seed): its calls always take the full path
    (dnnkit/fastpath.py); a function ``memo(args, kw) -> bool`` decides per call (a cuDNN
    support check that depends on earlier calls, such as an RNN's explicit dropout seed). A
    call with a ``dnnkit.Tensor`` among its arguments runs the same way on the Tensors' arrays
    and is recorded for autograd (dnnkit/tensor_calls.py)."""
    def deco(prepare):
        when = memo if callable(memo) else None

        def call(args, kw, backend):
            """(output, the backend that ran it)."""
            if backend is not None and type(backend) is not str:
                policy(name, backend)      # raises the clear error before anything hashes it
            sig, entry = _fast_find(name, args, backend, kw) \
                if memo is True or (when is not None and when(args, kw)) else (None, None)
            if entry is not None and (entry[4] is None or fastpath.usable(entry, args, kw)):
                # a memoised call: its runner on these arrays
                runner, prepared, subs, ran_on, _ = entry
                fastpath.stats["hits"] += 1
                if subs:
                    prepared = list(prepared)
                    for i, j, k in subs:
                        prepared[i] = args[j] if k is None else kw[k]
                try:
                    return runner(*prepared), ran_on
                except CudnnError as e:   # the full path decides: fall back or raise
                    if not e.not_supported:
                        raise
                    fastpath.drop(sig)
            elif sig is None or sig is fastpath.FOREIGN:
                # PyTorch/CuPy/DLPack arrays: the call again on Numba views of them, on the
                # stream the interop rule picks (dnnkit/foreign.py); None: there are none
                res = foreign.call(call, args, kw, backend)
                if res is not None:
                    return res
                sig = None
            prepared = prepare(*args, **kw)
            out, runner, ran_on = run(name, prepared, backend,
                                      keep=sig is not None and fastpath.keeping())
            if sig is not None and runner is not None:
                fastpath.store(sig, args, kw, prepared, runner, ran_on)
            return out, ran_on

        @functools.wraps(prepare)
        def wrapper(*args, backend=None, **kw):
            for a in args:
                if isinstance(a, Tensor):
                    return tensor_calls.call(name, call, args, kw, backend)
            if kw:              # (a loop, not any() over a generator: every call runs this)
                for a in kw.values():
                    if isinstance(a, Tensor):
                        return tensor_calls.call(name, call, args, kw, backend)
            return call(args, kw, backend)[0]
        PREPARE[name] = prepare
        PUBLIC[name] = wrapper
        wrapper.op_name = name
        # help(): the body's parameters + backend=, its docstring + what every op shares
        wrapper.__signature__, wrapper.__doc__ = with_backend(prepare), op_doc(prepare.__doc__)
        return wrapper
    return deco


def _fast_find(op, args, backend, kw):
    """(the call's memo signature, its memoised entry) (dnnkit/fastpath.py); (None, None) when
    this call must take the full path: inside a trace or the profiler, with DEBUG logging, or,
    on a machine with several GPUs, when an array is on another device than the current one
    (the full path switches to it; placement.memo_device). The thread-locals are read through
    __dict__: getattr of an attribute a thread never set raises and catches AttributeError
    inside, 0.35 us of a memoised call's ~1.5 us of dispatch (measured on the CI machine)."""
    if trace_state.__dict__.get("traces") or profile_state.__dict__.get("stack") or \
            debug_enabled():
        return None, None
    if placement.one_device or placement.single_device():
        return fastpath.find(op, args, backend, kw)
    dev = placement.memo_device(args, kw)
    if dev is None:
        return None, None
    return fastpath.find(op, args, backend, kw, dev)


def dispatch(op, *args, backend=None, **kw):
    """Run ``op`` on the backend the policy picks, on the device that holds its arrays;
    returns what the implementation returns."""
    return run(op, args, backend, kw)[0]


def run(op, args, backend, kw=None, keep=False):
    """(output, the runner a repeat of this call may reuse or None, the backend that ran).
    ``keep``: the caller keeps the runner (registry.bound)."""
    kw = kw or {}
    dev = placement.call_device(op, args)
    if dev is not None and dev != device_id():
        with placement.on_device(dev):
            return _run_here(op, args, backend, kw, keep)
    return _run_here(op, args, backend, kw, keep)


def _run_here(op, args, backend, kw, keep=False):
    """``run`` on the current device."""
    chosen, reason, mode, from_library = choose(op, args, kw, backend)
    log_decision(op, chosen, reason, from_library)
    # (a runner is kept only for a call of no keywords, outside verbose logging and cross-checks)
    keep = keep and not kw and not config.get("dnn.verbose") and not (
        config.get("dnn.crosscheck") and OPS[op].crosscheck)
    trace_state.algo = None
    prof = active_profile()
    token = prof.begin(args) if prof is not None else None
    checked = args
    if OPS[op].updates and config.get("dnn.crosscheck") and OPS[op].crosscheck:
        checked = _before_update(op, args)
    try:
        runner = bound(op, chosen, args, kw, keep)
        out = runner(*args, **kw)
    except CudnnError as e:
        if chosen != "cudnn" or mode != "auto" or not e.not_supported:
            raise
        chosen, reason = "numba", f"cuDNN returned {e.status_name} at run time"
        log_decision(op, chosen, reason)
        trace_state.algo = None
        runner = bound(op, chosen, args, kw, keep)
        out = runner(*args, **kw)
    if prof is not None:
        prof.end(token, op, chosen)
    if getattr(trace_state, "traces", None):
        record(op, chosen, trace_state.algo, args, reason)
    if config.get("dnn.crosscheck") and OPS[op].crosscheck:
        crosscheck(op, chosen, out, checked, kw)
        runner = None
    return out, (None if kw or config.get("dnn.verbose") else runner), chosen


def _before_update(op, args):
    """``args`` with the fields the op updates in place replaced by device copies taken now:
    the cross-check's run on the other backend starts from the state this call started from."""
    copies, s = {}, getattr(args, "stream", 0)
    for f in OPS[op].updates:
        a = getattr(args, f)
        if a is not None:
            copies[f] = arrays.copy_into(arrays.cuda_empty(a.shape, a.dtype, s), a, s)
    return args._replace(**copies)
