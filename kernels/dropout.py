"""Dropout with a counter-based random number generator.

Element i is kept when the top 32 bits of ``mix64(key + (i + 1) * GAMMA)`` are >= ``thr``, with
``thr = round(p * 2**32)``, so it is kept with probability 1 - p (to 2**-32). That is SplitMix64
(Steele, Lea and Flood 2014; Vigna's variant-13 finaliser) evaluated at position i + 1 of the
stream that starts at ``key``: every element's bit is a pure function of (key, i), so no state
is stored or advanced, any thread can compute any element, and the same key gives the same mask
whatever the launch configuration. The op derives ``key`` from the user's seed on the host
(``mask_key``), so neighbouring seeds start at unrelated points of the 2**64 cycle.

    y[i] = x[i] * scale   if element i is kept,   else 0        (scale = 1 / (1 - p))

Dropped elements are written as 0 (a select, not a multiply by 0), so a NaN or inf that is
dropped does not leak into y. The backward pass is the same map applied to dy with the same key
(dx = dy * mask * scale), so ``dropout_backward`` launches this kernel too; the mask is never
materialised. All integer arithmetic is uint64 with uint64 constants (mixing in a signed
integer would make Numba promote to float64).

Thread mapping: grid-stride loop, one element per thread per iteration, consecutive threads on
consecutive elements (coalesced). Memory traffic: reads x, writes y (2 passes); the hash costs
~20 integer instructions per element, well under the memory time on sm_80+.
"""

import numpy as np
from numba import cuda, uint64

GAMMA = np.uint64(0x9E3779B97F4A7C15)   # 2**64 / golden ratio, odd: a full-period Weyl step
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)
_MASK64 = (1 << 64) - 1


@cuda.jit(device=True, inline=True)
def _mix64(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@cuda.jit
def dropout_fwd_kernel(x, y, key, thr, scale, acc):
    """y = x * mask * scale on flat arrays (also dx from dy: see the module docstring)."""
    zero = acc[0]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        h = _mix64(key + uint64(i + 1) * GAMMA)
        if (h >> _S32) >= thr:
            y[i] = (x[i] + zero) * scale
        else:
            y[i] = zero


def mix64_host(z):
    """The same finaliser on Python ints (for the key and for tests)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * int(_M1)) & _MASK64
    z = ((z ^ (z >> 27)) * int(_M2)) & _MASK64
    return z ^ (z >> 31)


def mask_key(seed):
    """The kernel's ``key`` for a user seed (any int in [0, 2**64))."""
    return np.uint64(mix64_host(seed ^ 0x5851F42D4C957F2D))


def keep_mask_host(key, thr, n):
    """The kernel's keep mask (bool) of the first ``n`` elements, computed on the host with
    NumPy: the same arithmetic (for tests)."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(1, n + 1, dtype=np.uint64) * GAMMA)
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        z = z ^ (z >> _S31)
    return (z >> _S32) >= np.uint64(thr)


def SIGNATURES(t, acc):
    a, z = t[::1], acc[::1]
    return {"dropout_fwd_kernel": (a, a, uint64, uint64, acc, z)}
