"""Cross-checking two backends: ``compare`` (the tolerance test) and ``crosscheck`` (the
``dnn.crosscheck`` flag's second run of a call on the other backend)."""


import numpy as np

from .log import log
from . import policy
from .arrays import to_host
from .errors import CrosscheckError
from .registry import OPS, REGISTRY, OpInfo



def crosscheck(op, chosen, out, args, kw):
    """Run the call again on the backend other than ``chosen`` and ``compare`` the outputs; a
    warning (once per op) when that backend cannot run it here."""
    if getattr(args, "out", None) is not None:
        return      # written into out= (perhaps over an input): a rerun would write it again
    skip = OPS[op].crosscheck_skip
    if skip is not None and skip(args, kw):
        return
    other = "numba" if chosen == "cudnn" else "cudnn"
    if other == "cudnn" and policy.cudnn_reason(op, args, kw)[0] is not None:
        key = ("crosscheck", op)
        if key not in policy.announced:
            policy.announced.add(key)
            log.warning("dnn.crosscheck: %s cannot run on %s here; not cross-checked", op, other)
        return
    ref = REGISTRY[op][other].fn(*args, **kw)
    compare(op, out, ref, labels=(chosen, other))


def _is_array(a):
    """A result array (NumPy or device), not another result object such as an RNN's training
    state, which may carry a ``shape`` of its own."""
    return isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__") \
        or hasattr(a, "copy_to_host")


def outputs(x):
    """The arrays of a result (one array or a tuple), as NumPy arrays."""
    items = x if isinstance(x, (tuple, list)) else (x,)
    return [to_host(a) for a in items if a is not None and _is_array(a)]


def compare(op, got, expected, *, labels=("a", "b"), rtol=None, atol=None):
    """Raise CrosscheckError unless every output agrees within the op's tolerance:
    ``max|a - b| <= atol + rtol * max|b|`` over the finite elements (norm-wise, not element by
    element: an element of a long reduction that cancels to near zero carries the rounding of
    the large terms that made it, so a per-element relative test would reject two correct
    backends). NaN must match NaN at the same place (IEEE propagation); infinities must match.
    """
    got, expected = outputs(got), outputs(expected)
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
