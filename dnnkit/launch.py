"""Kernel launches.

Numba warns (NumbaPerformanceWarning) about every grid of fewer than 128 blocks. For a library
that warning is noise: small tensors need small grids, and the user cannot act on it. So small
launches build their launch configuration with that one warning silenced; large launches are
left alone (the filter change is process-wide while it lasts, so keep it short and rare).

Building a launch configuration (``kernel[grid, block, stream, shared]``) costs tens of
microseconds of host time in Numba; configurations are reusable, so they are cached by
(kernel, grid, block, stream, shared). The cache is bounded and simply emptied when full.

The fast path (a real GPU). Numba's call of a configured kernel types every argument, looks up
the overload and marshals each argument through general machinery: ~20-60 us of host time per
launch with our argument lists, which is the whole cost of a small op and of every step of a
recurrent network. So the first launch with a given kernel and argument types goes through
Numba (compiling if needed); it yields the compiled overload and a packing plan: the flat list
of the kernel's C parameters (an array is meminfo, parent, nitems, itemsize, data, shape...,
strides...; a tuple its members; scalars by their Numba type) as one ``struct`` format. Later
launches with the same types pack the values into a per-thread buffer and call cuLaunchKernel
directly (the driver copies the parameters during the call, so the buffer is reused).
``At(array, offset)`` passes a flat array from an element offset without making a view object
(per-step slices of an RNN's buffers would otherwise cost a Numba view each).
"""

import struct
import threading
import warnings

from .errors import DnnkitError

_QUIET_BELOW = 128
_CACHE_MAX = 1024
_cache = {}
_lock = threading.Lock()


def pow2_at_most(v, cap):
    """The smallest power of two >= v, but at most ``cap`` (block-dimension sizing)."""
    p = 1
    while p < v and p < cap:
        p *= 2
    return p


def _blocks(grid):
    if isinstance(grid, int):
        return grid
    n = 1
    for g in grid:
        n *= g
    return n


class At:
    """A flat (1-D, C-contiguous) device array from element ``offset`` on, for kernel
    arguments: the launch adds the offset to the data pointer (no Numba view is built)."""
    __slots__ = ("base", "offset")

    def __init__(self, base, offset):
        if isinstance(base, At):
            base, offset = base.base, base.offset + offset
        if base.ndim != 1:
            raise ValueError(f"At: the base must be a flat device array, got shape {base.shape}")
        self.base, self.offset = base, int(offset)

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def size(self):
        return self.base.size - self.offset

    def view(self):
        """The Numba view this stands for (the simulator's path)."""
        return self.base[self.offset:]


def at(a, offset):
    """``At(a, offset)``, or ``a`` itself for offset 0."""
    return At(a, offset) if offset else a


def launch(kernel, grid, block, stream, args, shared=0):
    """``kernel[grid, block, stream, shared](*args)`` without Numba's small-grid warning."""
    from .arrays import simulator, stream_pointer
    sp = stream_pointer(stream)
    if not simulator():
        fast = _fast.get((id(kernel), _types(args)))
        if fast is not None:
            fast(grid, block, sp, args, shared)
            return
    if any(isinstance(a, At) for a in args):
        args = tuple(a.view() if isinstance(a, At) else a for a in args)
    # By the raw stream handle: Numba hands out a new Stream object for the same stream.
    key = (id(kernel), grid, block, sp, shared)
    configured = _cache.get(key)
    if configured is None:
        configured = _configure(kernel, grid, block, stream, shared)
        if configured is kernel:
            # Numba's simulator configures the kernel object in place and returns it: a cached
            # entry would replay whatever configuration was set last. Never cache those.
            configured(*args)
            return
        with _lock:
            if len(_cache) >= _CACHE_MAX:
                _cache.clear()
            _cache[key] = configured
    configured(*args)
    if not simulator():
        _learn(kernel, args)


# ---------------------------------------------------------------- the fast path

_fast = {}        # (id(kernel), argument type key) -> _Launcher


def _types(args):
    """A hashable key of the arguments' Numba types, cheaply (arrays: their cached
    ``_numba_type_``; At: its base's; tuples: their members')."""
    out = []
    for a in args:
        t = type(a)
        if t is At:
            out.append(a.base._numba_type_)
        elif t is tuple:
            out.append(_types(a))
        elif t is int or t is float or t is bool:
            out.append(t)
        else:
            out.append(getattr(a, "_numba_type_", None) or t)
    return tuple(out)


def _learn(kernel, args):
    """After Numba launched ``kernel`` with ``args``: remember a fast launcher for their
    types, or nothing when a type is one the packer does not know."""
    key = (id(kernel), _types(args))
    if key in _fast:
        return
    try:
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        overload = kernel.overloads.get(argtypes)
        plan = [_plan(t) for t in argtypes]
    except (NotImplementedError, TypeError, ValueError, KeyError, AttributeError):
        return
    if overload is None:
        return
    launcher = _Launcher(overload, plan)
    try:
        launcher.pack(args)        # a dry run: every value of these arguments packs
    except (AttributeError, TypeError, struct.error):
        return
    with _lock:
        _fast[key] = launcher


def _plan(t):
    """(struct format, flattener) of one argument of Numba type ``t``."""
    from numba.cuda import types
    if isinstance(t, types.Array):
        nd = t.ndim
        return "PPqqP" + "q" * (2 * nd), _array_values
    if isinstance(t, types.BaseTuple):
        subs = [_plan(m) for m in t]
        return "".join(f for f, _ in subs), _tuple_values([g for _, g in subs])
    if isinstance(t, types.Integer):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[t.bitwidth]
        return (code if t.signed else code.upper()), _one
    if t == types.float32:
        return "f", _one
    if t == types.float64:
        return "d", _one
    raise NotImplementedError(t)


def _one(v, out):
    out.append(v)


def _array_values(a, out):
    if type(a) is At:
        b = a.base
        item = b.dtype.itemsize
        n = b.size - a.offset
        ptr = (b.device_ctypes_pointer.value or 0) + a.offset * item
        out.extend((0, 0, n, item, ptr, n, item))
        return
    try:
        out.extend(a._dnnkit_params)
    except AttributeError:
        # constant for the life of the array object (its pointer, shape and strides): kept
        # on it, so an array passed to many launches is flattened once
        p = (0, 0, a.size, a.dtype.itemsize, a.device_ctypes_pointer.value or 0) + \
            tuple(a.shape) + tuple(a.strides)
        a._dnnkit_params = p
        out.extend(p)


def _tuple_values(flatteners):
    def values(v, out):
        for g, m in zip(flatteners, v):
            g(m, out)
    return values


class _Launcher:
    """cuLaunchKernel of one compiled overload with arguments packed by a fixed plan."""

    def __init__(self, overload, plan):
        import ctypes
        self.overload = overload
        self.flatteners = [g for _, g in plan]
        fmts = []
        for f, _ in plan:
            fmts.extend(f)
        # each parameter at its natural alignment, as the kernel's parameter space lays them
        self.format = "@" + "".join(fmts)
        self.offsets = [struct.calcsize("@" + "".join(fmts[:i]) + fmts[i])
                        - struct.calcsize(fmts[i]) for i in range(len(fmts))]
        self.size = max(8, struct.calcsize(self.format))
        self.ctypes = ctypes
        self.buffers = {}      # thread id -> (buffer, pointer array)
        self.functions = {}    # device id -> kernel handle (int)

    def _buffer(self):
        tid = threading.get_ident()
        b = self.buffers.get(tid)
        if b is None:
            c = self.ctypes
            buf = c.create_string_buffer(self.size)
            base = c.addressof(buf)
            ptrs = (c.c_void_p * max(1, len(self.offsets)))(*[base + o for o in self.offsets])
            b = self.buffers[tid] = (buf, ptrs, c.addressof(ptrs))
        return b

    def _function(self):
        from .arrays import device_id
        dev = device_id()
        f = self.functions.get(dev)
        if f is None:
            f = self.functions[dev] = int(self.overload._codelibrary.get_cufunc().handle)
        return f

    def pack(self, args):
        """Pack ``args`` into this thread's buffer; returns the address of the pointer array
        (the kernelParams of cuLaunchKernel)."""
        values = []
        for g, a in zip(self.flatteners, args):
            g(a, values)
        buf, _, params = self._buffer()
        struct.pack_into(self.format, buf, 0, *values)
        return params

    def __call__(self, grid, block, stream_ptr, args, shared):
        from cuda.bindings import driver
        params = self.pack(args)
        gx, gy, gz = _dim3(grid)
        bx, by, bz = _dim3(block)
        (err,) = driver.cuLaunchKernel(self._function(), gx, gy, gz, bx, by, bz, shared,
                                       stream_ptr, params, 0)
        if int(err) != 0:
            raise DnnkitError(f"cuLaunchKernel of {self.overload.entry_name} failed with {err} "
                              f"(grid {grid}, block {block}, {shared} bytes shared)")


def _dim3(d):
    if isinstance(d, int):
        return d, 1, 1
    return (tuple(d) + (1, 1))[:3]


def _configure(kernel, grid, block, stream, shared):
    if _blocks(grid) >= _QUIET_BELOW:
        return kernel[grid, block, stream, shared]
    with warnings.catch_warnings():
        # Matched by message alone: numba-cuda raises its own copy of NumbaPerformanceWarning
        # (not numba.core.errors'), wrapped in terminal colour codes, hence the leading ".*".
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU "
                                "under-utilization")
        return kernel[grid, block, stream, shared]
