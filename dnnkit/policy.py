"""The backend policy and the choice of a backend per call; the only reader of ``dnn.enabled``.

Per call: ``backend=None`` follows the ``dnn.enabled`` flag; ``"auto"``, ``"cudnn"`` (forced
for this call) and ``"numba"`` (disabled for this call) override it.

- auto: cuDNN when it is available and the op's ``supports()`` accepts the arguments, else
  Numba (logged with the reason); a cuDNN NOT_SUPPORTED status at run time also falls back
  (dnnkit/dispatch.py).
- forced: cuDNN, or ``CudnnUnavailableError`` naming the op and the reason.
- disabled: Numba; cuDNN is never loaded.
"""


from .log import DEBUG, INFO, debug_enabled, log
from . import config
from .cudnn import loader
from .errors import CudnnUnavailableError
from .registry import OPS, PREPARE, REGISTRY, NoCudnnCall


_POLICY_OF_BACKEND = {None: None, "auto": "auto", "cudnn": "forced", "numba": "disabled"}

# what has been logged once per process (reasons cuDNN is not used, ops not cross-checked)
announced = set()


def policy(op, backend):
    """(auto | forced | disabled, where it comes from) for a call with ``backend=``."""
    if backend is None:
        return config.get("dnn.enabled"), "dnn.enabled"
    if not isinstance(backend, str) or backend not in _POLICY_OF_BACKEND:
        raise ValueError(f"{op}: backend must be None, 'auto', 'cudnn' or 'numba'; got {backend!r}")
    return _POLICY_OF_BACKEND[backend], f"backend={backend!r}"


def cudnn_status():
    """The loader's CudnnStatus (loads and probes cuDNN on first use)."""
    return loader.status()


def cudnn_reason(op, args, kw):
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


def choose(op, args, kw, backend):
    """(backend, reason, policy, whether the reason is the library's state) for a call; raises
    CudnnUnavailableError under forced."""
    if op not in REGISTRY:
        raise ValueError(f"unknown op {op!r}; registered: {', '.join(sorted(REGISTRY))}")
    mode, origin = policy(op, backend)
    if mode == "disabled":
        return "numba", f"{origin}={mode}" if origin == "dnn.enabled" else origin, mode, False
    only = OPS[op].numba_only
    if only:
        return "numba", f"cuDNN has no call for it ({only})", mode, False
    reason, from_library = cudnn_reason(op, args, kw)
    if reason is None:
        return "cudnn", "cuDNN available and supports the arguments", mode, False
    if isinstance(reason, NoCudnnCall):
        return "numba", f"cuDNN has no call for it ({reason})", mode, False
    if mode == "forced":
        what = "dnn.enabled=forced" if origin == "dnn.enabled" else origin
        raise CudnnUnavailableError(
            f"{op}: cuDNN is required ({what}) but cannot be used: {reason}", op=op, reason=reason)
    return "numba", reason, mode, from_library


def select_backend(op: str, *args: object, backend: "str | None" = None, explain: bool = False,
                   **kw: object) -> "str | tuple[str, str]":
    """Which backend ``op`` would run on for these arguments (as the public function takes
    them: ``select_backend("softmax", x, algo="log")``), without running it. Host inputs are
    copied to the device to validate them. With ``explain=True`` returns ``(backend, reason)``.
    Raises what the call would raise (bad arguments, or CudnnUnavailableError when forced)."""
    if op not in PREPARE:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(sorted(PREPARE))}")
    chosen, reason, _, _ = choose(op, PREPARE[op](*args, **kw), {}, backend)
    return (chosen, reason) if explain else chosen


def log_decision(op, chosen, reason, from_library=False):
    if from_library and reason not in announced:
        announced.add(reason)   # say why cuDNN is not used once, at INFO
        log.info("cuDNN not used (%s); ops run on the Numba kernels", reason)
    verbose = config.get("dnn.verbose")
    if verbose or debug_enabled():
        log.log(INFO if verbose else DEBUG, "%s: %s backend (%s)", op, chosen,
                reason)
