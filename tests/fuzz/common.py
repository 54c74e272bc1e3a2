"""The fuzzer's machinery: settings, the case counter, input presentations, the mistakes every
op shares, the expected-outcome check and the comparison with the float64 reference.

A family module (tests/fuzz/cases_*.py) turns one hypothesis ``data`` object into a ``Case``:
either valid (it must match the reference: ``check(result)`` asserts) or invalid (a mistake
from the family's catalogue, or an input the op must refuse, such as a non-contiguous device
view: the call must raise ValueError or TypeError whose message names the op). Anything else
(another exception, a wrong result, NaN where the reference has none) fails the test.
"""

import collections
import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

DTYPES = ("float16", "float32", "float64")
REL_TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-13}   # tests/conftest.py
# DNNKIT_FUZZ_EXAMPLES multiplies every test's example count (1 here; 10 or more on a GPU).
SCALE = float(os.environ.get("DNNKIT_FUZZ_EXAMPLES", "1") or 1)
# DNNKIT_FUZZ_SHRINK=0: report the first failing example as drawn (a GPU run's minutes go to
# finding failures in every family, not to shrinking one)
SHRINK = os.environ.get("DNNKIT_FUZZ_SHRINK", "1") != "0"

COUNTS = collections.defaultdict(collections.Counter)   # op -> {"valid": n, "invalid": n}


def fuzz_settings(n):
    """Deterministic, small: ``n`` examples here, ``n * DNNKIT_FUZZ_EXAMPLES`` on a GPU run."""
    phases = tuple(p for p in Phase if SHRINK or p is not Phase.shrink)
    return settings(max_examples=max(1, int(round(n * SCALE))), deadline=None, phases=phases,
                    derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def summary():
    valid = sum(c["valid"] for c in COUNTS.values())
    invalid = sum(c["invalid"] for c in COUNTS.values())
    ops = sorted(op for op, c in COUNTS.items() if sum(c.values()))
    head = f"fuzz: {valid + invalid} cases ({valid} valid, {invalid} invalid) over {len(ops)} ops"
    rows = [f"  {op}: {COUNTS[op]['valid']} valid, {COUNTS[op]['invalid']} invalid"
            for op in ops]
    return head, rows


# ---------------------------------------------------------------- drawing

def seed_rng(data):
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))


def draw_dtype(data):
    return data.draw(st.sampled_from(DTYPES), label="dtype")


def draw_size(data, lo, hi, label="size", zero_pct=12):
    """An int in [lo, hi]; when lo == 0, zero about ``zero_pct`` percent of the time (hypothesis
    would otherwise favour the boundary) and at least 1 in the simplest example."""
    if lo == 0:
        if data.draw(st.integers(0, 99), label=f"{label}: zero?") >= 100 - zero_pct:
            return 0
        lo = 1
    return data.draw(st.integers(lo, max(lo, hi)), label=label)


def draw_dims(data, rank, lo=0, hi=4, label="shape"):
    return tuple(draw_size(data, lo, hi, label) for _ in range(rank))


def normal(rng, shape, dtype, scale=1.0):
    return np.asarray(rng.standard_normal(shape) * scale).astype(dtype)


def inject_nonfinite(rng, a, frac=0.25):
    """NaN, +Inf and -Inf at random positions of a copy of ``a``."""
    a = a.copy()
    if a.size:
        hit = rng.random(a.shape) < frac
        a[hit] = rng.choice(np.array([np.nan, np.inf, -np.inf], a.dtype), size=int(hit.sum()))
    return a


# ---------------------------------------------------------------- presenting inputs

LAYOUTS = ("host", "host_view", "device", "device_offset", "device_view")


class Presenter:
    """Hands an array to the op as a host array, a non-contiguous host view, a device array, a
    contiguous device view at an offset, or a non-contiguous device view. The last one must be
    refused (ValueError naming the op) unless it happens to be contiguous; ``bad`` lists those."""

    def __init__(self, data):
        self.data, self.bad = data, []

    def __call__(self, a, name):
        from numba import cuda
        if not isinstance(a, np.ndarray):   # a device array or a non-array: as it is
            return a
        how = self.data.draw(st.sampled_from(LAYOUTS), label=f"{name} layout")
        if how == "host" or a.ndim == 0:
            return a
        if how == "host_view":
            kind = self.data.draw(st.sampled_from(["step", "fortran", "reversed"]),
                                  label=f"{name} view")
            if kind == "fortran":
                return np.asfortranarray(a)
            if kind == "reversed":
                return np.flip(np.flip(a, 0).copy(), 0)
            big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
            big[..., ::2] = a
            return big[..., ::2]
        a = np.ascontiguousarray(a)
        if how == "device" or a.size == 0:
            # an empty allocation is a null pointer, and Numba refuses any view of it
            # ("non-empty slice into empty slice", real GPU only): offsets and steps mean nothing
            # for it anyway
            return cuda.to_device(a)
        if how == "device_offset":   # a contiguous view that does not start at its allocation
            big = np.concatenate([np.zeros((1,) + a.shape[1:], a.dtype), a], axis=0)
            return cuda.to_device(big)[1:]
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        # real Numba device arrays take no Ellipsis: spell every leading axis out
        v = cuda.to_device(big)[(slice(None),) * (a.ndim - 1) + (slice(None, None, 2),)]
        if not v.is_c_contiguous():
            self.bad.append(f"{name} is a non-contiguous device view")
        return v


def host(a):
    if a is None:
        return None
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


# ---------------------------------------------------------------- outcomes

@dataclasses.dataclass
class Case:
    op: str                     # counted under this name
    call: object                # () -> result
    check: object = None        # result -> None (asserts); None: the call must raise
    names: tuple = ()           # the error message must contain one of these (default: op)
    why: str = ""               # the mistake, for the failure message


def expect(op, call, check, mistake, bad, names=()):
    """A Case: invalid when a mistake was drawn or an input must be refused."""
    why = mistake or "; ".join(bad)
    return Case(op, call, None if why else check, tuple(names) or (op,), why)


def run(case):
    if case.check is None:
        COUNTS[case.op]["invalid"] += 1
        with pytest.raises((ValueError, TypeError)) as info:
            case.call()
        msg = str(info.value)
        assert any(n in msg for n in case.names), \
            f"{case.op} ({case.why}): the message does not name the op: {msg!r}"
        return
    COUNTS[case.op]["valid"] += 1
    case.check(case.call())


def compare(what, got, ref, tol, *, floor=0.0, dtype=None):
    """``got`` (device or host) against the float64 ``ref``: same shape (and dtype), NaN at
    the same places, the same infinities, and max|got - ref| <= tol * max(max|ref|, floor)
    over the finite elements (norm-wise, as the per-op tests)."""
    g = host(got)
    assert g.shape == np.shape(ref), f"{what}: shape {g.shape}, expected {np.shape(ref)}"
    if dtype is not None:
        assert g.dtype == np.dtype(dtype), f"{what}: dtype {g.dtype}, expected {dtype}"
    g, r = g.astype(np.float64), np.asarray(ref, np.float64)
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    assert np.array_equal(nan_g, nan_r), \
        f"{what}: NaN at {np.argwhere(nan_g != nan_r)[:5].tolist()} (got NaN: {nan_g.sum()}, " \
        f"reference NaN: {nan_r.sum()})"
    inf_g, inf_r = np.isinf(g), np.isinf(r)
    assert np.array_equal(inf_g, inf_r) and np.array_equal(g[inf_g], r[inf_r]), \
        f"{what}: infinities differ at {np.argwhere((inf_g != inf_r))[:5].tolist()}"
    fin = np.isfinite(r)
    if not fin.any():
        return
    scale = max(float(np.abs(r[fin]).max()), floor)
    err = float(np.abs(g[fin] - r[fin]).max())
    assert err <= tol * scale or err == 0.0, \
        f"{what}: max abs error {err:.3g} > {tol:g} * {scale:.3g}"


def bad_dtype_array(rng, shape, kind):
    """An array of a dtype no op takes."""
    if kind == "int":
        return rng.integers(-3, 3, shape).astype(np.int32)
    if kind == "bool":
        return rng.random(shape) < 0.5
    return (rng.standard_normal(shape) + 1j).astype(np.complex64)


NOT_ARRAYS = ("a string", None, object(), ["a", "b"])


def pick(data, seq, label="choice"):
    """One of ``seq`` (any objects), drawn so that hypothesis reports it."""
    return seq[data.draw(st.integers(0, len(seq) - 1), label=label)]


# ---------------------------------------------------------------- mistakes every op shares

COMMON = ("int dtype", "not an array", "bad backend")


def common_mistake(data, mistake, rng, shape, backend):
    """((x replacement,) or None, backend) for the mistakes every op shares."""
    if mistake == "int dtype":
        return (bad_dtype_array(rng, shape, pick(data, ["int", "bool", "complex"])),), backend
    if mistake == "not an array":
        return (pick(data, NOT_ARRAYS),), backend
    if mistake == "bad backend":
        return None, pick(data, ["gpu", "CUDNN", 1, "numba "])
    return None, backend


def draw_mistake(data, catalogue):
    """None (a valid call) 60% of the time, else one of ``catalogue``."""
    if data.draw(st.integers(0, 99), label="invalid?") < 60:   # 40% mistakes
        return None
    return data.draw(st.sampled_from(catalogue), label="mistake")
