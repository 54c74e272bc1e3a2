"""The registry of op implementations: ``{op: {backend: Impl}}``, each op's ``OpInfo`` and the
argument checks of its public function (``PREPARE``).

An op family registers one function per backend with ``register`` (and, where it can prepare
a call's work once per signature, a ``bind`` with ``binder``); ``dispatch.public_op`` records
the family's argument checks in ``PREPARE``.
"""

import dataclasses

from . import fastpath, replay

BACKENDS = ("cudnn", "numba")
DEFAULT_TOLERANCE = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12)}


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
    # fn(args, kw) -> True for a call whose result depends on its backend by design (an RNN's
    # dropout masks come from each backend's own generator): dnn.crosscheck leaves it alone
    crosscheck_skip: object = None
    # names of checked-argument fields the implementations update in place (batch norm's
    # running statistics): dnn.crosscheck runs the other backend on copies taken before the
    # call, so that both start from the same state and neither update is applied twice
    updates: tuple = ()
    # why cuDNN offers nothing for this op (optimizer updates, embedding, loss reductions):
    # it runs its Numba kernel under every policy, ``forced`` included (docs/backends.md)
    numba_only: str = ""


class NoCudnnCall(str):
    """A ``supports()`` reason saying that cuDNN has no call at all for these arguments (not
    that it refuses these options): the call runs on Numba under every policy, ``forced``
    included, and the trace shows the reason. (cuDNN 9's matmul has no float64 engine, and
    its float32 one computes in TF32.)"""


REGISTRY = {}   # op -> {backend: Impl}
OPS = {}        # op -> OpInfo
PREPARE = {}    # op -> fn(public args) -> the implementation's arguments (validated)


def register(op, backend, *, supports=None, tolerance=None, crosscheck=True, numba_only="",
             crosscheck_skip=None, updates=()):
    """Decorator: register ``fn`` as ``op``'s implementation on ``backend``. ``numba_only``:
    for an op cuDNN has no call for, the reason (a sentence); the op then runs on Numba under
    every policy and is never cross-checked. ``crosscheck_skip(args, kw)``: true for the calls
    of the op that ``dnn.crosscheck`` must not repeat on the other backend. ``updates``: the
    fields of the checked arguments the implementation updates in place."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    info = OPS.setdefault(op, OpInfo())
    if tolerance:
        info.tolerance.update(tolerance)
    info.crosscheck = info.crosscheck and crosscheck and not numba_only
    if numba_only:
        info.numba_only = numba_only
    if crosscheck_skip is not None:
        info.crosscheck_skip = crosscheck_skip
    if updates:
        info.updates = tuple(updates)

    def deco(fn):
        REGISTRY.setdefault(op, {})[backend] = Impl(fn, supports)
        fastpath.invalidate()
        return fn
    return deco


def binder(op, backend):
    """Decorator: ``bind`` for ``op``'s implementation on ``backend`` (registered first)."""
    def deco(bind):
        REGISTRY[op][backend].bind = bind
        fastpath.invalidate()
        return bind
    return deco


def bound(op, backend, args, kw, keep=False):
    """The implementation's runner for these arguments (bound once where it can be).
    ``keep``: the memo will keep it for repeated calls, so a Numba implementation without a
    runner of its own for these arguments is recorded for replays (dnnkit/replay.py)."""
    impl = REGISTRY[op][backend]
    run = impl.bind(*args, **kw) if impl.bind is not None else None
    if run is None and keep and backend == "numba" and not kw:
        run = replay.bind(impl.fn, args)
    return run or impl.fn
