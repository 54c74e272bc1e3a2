"""Kernel launches.

Numba warns about every grid of fewer than 128 blocks: noise for a library (small tensors need
small grids), so small launches build their configuration with that one warning silenced.
Configurations (``kernel[grid, block, stream, shared]``, tens of microseconds in Numba) are
cached by (kernel, grid, block, stream, shared), in a bounded cache emptied when full.

The fast path (a real GPU). Numba's call of a configured kernel types and marshals every
argument: ~20-60 us of host time per launch, the whole cost of a small op. So the first launch
with given kernel and argument types goes through Numba (compiling if needed); it yields the
overload and a packing plan: the kernel's C parameters (an array is meminfo, parent, nitems,
itemsize, data, shape..., strides...; a tuple its members; scalars by their Numba type) as one
``struct`` format. Later launches pack into a per-thread buffer (the driver copies parameters
during the call) and call cuLaunchKernel. ``At(array, offset)`` passes a flat array from an
element offset without a Numba view object. A signature an earlier process compiled is launched
from its stored cubin, without Numba's dispatcher (dnnkit.cubins); a learned one is stored, and
a cold cache's first compile starts the step's others alongside (dnnkit.compile_ahead).
"""

import ctypes
import math
import struct
import threading
import warnings

from . import compile_ahead, cubins
from .launch_args import At, at, flat, pow2_at_most  # noqa: F401 (launch's API)
from .device import device_id, driver, simulator, stream_pointer
from .errors import DnnkitError
from .log import log

_QUIET_BELOW = 128
_CACHE_MAX = 1024
_cache = {}
_lock = threading.Lock()


def _blocks(grid):
    return grid if isinstance(grid, int) else math.prod(grid)


def _views(args):
    """``args`` with every ``At`` (tuple members too) replaced by its Numba view."""
    return tuple(a.view() if type(a) is At else _views(a) if type(a) is tuple else a
                 for a in args)


def _has_at(args):
    return any(type(a) is At or (type(a) is tuple and _has_at(a)) for a in args)


def launch(kernel, grid, block, stream, args, shared=0):
    """``kernel[grid, block, stream, shared](*args)`` without Numba's small-grid warning."""
    if watch is not None:
        watch.launch(kernel, grid, block, stream, args, shared)
    sp, key = stream_pointer(stream), None
    if not simulator() and not through_numba:
        key = (id(kernel), _types(args))
        fast = _fast.get(key)
        if fast is not None:
            fast(grid, block, sp, args, shared)
            return
    if _has_at(args):
        args = _views(args)
    if key is not None and key not in _no_disk:     # looked up once a signature and process
        fast = _from_disk(kernel, args, key)
        if fast is not None:
            fast(grid, block, sp, args, shared)
            return
        _no_disk.add(key)
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


class Site:
    """One launch site of a loop whose arguments keep their Numba types from call to call (an
    RNN's per-step launches). The first call goes through ``launch`` and keeps the fast
    launcher; later calls with the same kernel and stream skip typing the arguments (~10 us a
    launch on an H100's host): the packing follows the first call's types."""
    __slots__ = ("fast", "kernel", "stream", "sp")

    def __init__(self):
        self.fast = self.kernel = self.stream = None

    def __call__(self, kernel, grid, block, stream, args, shared=0):
        if (self.fast is not None and kernel is self.kernel and stream is self.stream
                and not _numba_path()):
            self.fast(grid, block, self.sp, args, shared)
            return
        launch(kernel, grid, block, stream, args, shared)
        if not simulator() and not through_numba:
            self.fast = _fast.get((id(kernel), _types(args)))
            self.kernel, self.stream, self.sp = kernel, stream, stream_pointer(stream)


# ---------------------------------------------------------------- the fast path
_fast = {}        # (id(kernel), argument type key) -> _Launcher
_no_disk = set()  # those keys with no stored cubin (a launch that is never learned: not again)
# While a list (dnnkit.warmup): each launch Numba made appends (kernel, its Numba argument
# types). While through_numba (warmup's recordings), every launch goes through Numba's own (a
# recorder sees each one, a signature launched before included): no learned launcher (launch,
# Site) nor packed launch (Prepared) is used. While watch is not None (dnnkit.replay's record
# of an op call, by thread watch.tid): told of every launch; that thread's Site and Prepared
# launches go through launch().
first_launches, through_numba, watch = None, False, None


def _numba_path():
    return through_numba or (watch is not None and watch.tid == threading.get_ident())


_PLAIN = frozenset((int, float, bool))


def _types(args):
    """A hashable key of the arguments' Numba types, cheaply: Numba interns its types, so an
    array's (cached ``_numba_type_``) is keyed by ``id`` (hashing the type itself costs ~0.5 us
    each); the ids stay valid because the launcher keeps its overload, which holds the types.
    At: its base's; tuples: their members'; Python and NumPy scalars: their class."""
    out = []
    for a in args:
        t = type(a)
        if t is At:
            out.append(_flat_type(a.base._numba_type_))
        elif t is tuple:
            ts = tuple(map(type, a))     # a geometry tuple of plain numbers: the common case
            out.append(ts if _PLAIN.issuperset(ts) else _types(a))
        elif t is int or t is float or t is bool:
            out.append(t)
        else:
            nt = getattr(a, "_numba_type_", None)
            out.append(t if nt is None else id(nt))
    return tuple(out)


# id(Numba array type) -> (id of its 1-D C form, the type, that form): the types are kept
# alive here, so their ids stay theirs
_flat_types = {}


def _flat_type(nt):
    """The key of the 1-D C array type an ``At`` of a base of Numba type ``nt`` stands for."""
    e = _flat_types.get(id(nt))
    if e is None:
        one = nt if nt.ndim == 1 and nt.layout == "C" else nt.copy(ndim=1, layout="C")
        e = _flat_types[id(nt)] = (id(one), nt, one)
    return e[0]


def _learn(kernel, args):
    """After Numba launched ``kernel`` with ``args``: remember a fast launcher for their
    types, or nothing when a type is one the packer does not know."""
    key = (id(kernel), _types(args))
    if key in _fast and first_launches is None:
        return
    try:
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        if first_launches is not None:
            first_launches.append((kernel, argtypes))
            if key in _fast:
                return
        overload = kernel.overloads[argtypes]         # KeyError: no overload
        launcher = _Launcher(overload.entry_name, argtypes,
                             lambda: int(overload._codelibrary.get_cufunc().handle))
    except (NotImplementedError, TypeError, ValueError, KeyError, AttributeError):
        return
    if _keep(key, launcher, args):
        cubins.store(kernel, argtypes, overload)
    if not through_numba:       # a cold cache: the step's other kernels compile alongside
        compile_ahead.after_compile(kernel, argtypes)


def _keep(key, launcher, args):
    try:
        launcher.pack(args)        # a dry run: every value of these arguments packs
    except (AttributeError, TypeError, struct.error):
        return False
    with _lock:
        _fast[key] = launcher
    return True


def _from_disk(kernel, args, key):
    """A launcher of the kernel's cubin stored by an earlier process or compiled ahead, kept as
    the learned one of ``key`` (``launch``'s); None when there is none (Numba's launch follows).
    A failure of this path is never the launch's: Numba's then runs (an unexpected one logged)."""
    try:
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        found = cubins.find(kernel, argtypes) or compile_ahead.wait(kernel, argtypes)
        if found is None:
            return None
        launcher = _Launcher(found[0], argtypes, found[1])
        launcher._function()           # loaded into this context now, or the fallback raises
    except (NotImplementedError, TypeError, ValueError, KeyError, OSError):
        return None                    # an argument Numba types differently; an unread file
    except Exception as e:
        log.warning("launch: the stored cubin of %s was not used (%s: %s)",
                    getattr(kernel, "__name__", kernel), type(e).__name__, e)
        return None
    if not _keep(key, launcher, args):
        return None
    if first_launches is not None:
        first_launches.append((kernel, argtypes))
    return launcher


def _plan(t, v):
    """(struct format, Python expression of its values) of one argument of Numba type ``t``
    held in the variable ``v``."""
    # imported here, as every numba import of dnnkit: `import dnnkit` does not load numba
    from numba.cuda import types
    if isinstance(t, types.Array):
        return "PPqqP" + "q" * (2 * t.ndim), f"*_arr({v})"
    if isinstance(t, types.BaseTuple):
        subs = [_plan(m, f"{v}[{i}]") for i, m in enumerate(t)]
        return "".join(f for f, _ in subs), ", ".join(e for _, e in subs)
    if isinstance(t, types.Integer):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[t.bitwidth]
        return (code if t.signed else code.upper()), v
    if t == types.float32:
        return "f", v
    if t == types.float64:
        return "d", v
    raise NotImplementedError(t)


def _ptr(a):
    """A device array's address: a pooled array carries it (memory.py); Numba's
    device_ctypes_pointer makes a ctypes object per read."""
    return a.__dict__.get("_dnnkit_ptr") or a.device_ctypes_pointer.value or 0


def _arr(a):
    """The kernel parameters of a device array or At: meminfo, parent, nitems, itemsize, data,
    shape..., strides... An array's are constant for the life of the object: kept on it."""
    if type(a) is At:
        b = a.base
        base = b.__dict__.get("_dnnkit_params") or _arr(b)
        n, item = base[2] - a.offset, base[3]
        return (0, 0, n, item, base[4] + a.offset * item, n, item)
    p = a.__dict__.get("_dnnkit_params")
    if p is None:
        p = (0, 0, a.size, a.dtype.itemsize, _ptr(a)) + tuple(a.shape) + tuple(a.strides)
        a._dnnkit_params = p
    return p


class _Launcher:
    """cuLaunchKernel of one compiled kernel with arguments packed by a fixed plan. ``load()``
    gives the kernel's handle in the current context. ``argtypes`` keeps the Numba types
    whose ids ``_types`` keys alive."""

    def __init__(self, entry_name, argtypes, load):
        self.entry_name, self.argtypes, self._load = entry_name, argtypes, load
        names = [f"a{i}" for i in range(len(argtypes))]
        plan = [_plan(t, v) for t, v in zip(argtypes, names)]
        fmts = "".join(f for f, _ in plan)
        # each parameter at its natural alignment, as the kernel's parameter space lays them
        self.format = "@" + fmts
        self.offsets = [struct.calcsize("@" + fmts[:i + 1]) - struct.calcsize(fmts[i])
                        for i in range(len(fmts))]
        self.size = max(8, struct.calcsize(self.format))
        # one generated function per argument list: straight-line unpacking into pack_into
        src = (f"def pack(args, buf):\n    {', '.join(names) or '_'}"
               f"{',' if len(names) == 1 else ''} = args\n    pack_into({self.format!r}, buf, 0, "
               f"{', '.join(e for _, e in plan)})\n")
        scope = {"pack_into": struct.pack_into, "_arr": _arr}
        exec(src, scope)               # noqa: S102 (source built here from Numba types only)
        self._pack = scope["pack"]
        self.ctypes = ctypes
        self.cu_launch = driver().cuLaunchKernel
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
        dev = device_id()
        f = self.functions.get(dev)
        if f is None:
            f = self.functions[dev] = self._load()
        return f

    def pack(self, args):
        """Pack ``args`` into this thread's buffer; returns the address of kernelParams."""
        buf, _, params = self._buffer()
        self._pack(args, buf)
        return params

    def __call__(self, grid, block, stream_ptr, args, shared):
        params = self.pack(args)
        gx, gy, gz = _dim3(grid)
        bx, by, bz = _dim3(block)
        (err,) = self.cu_launch(self._function(), gx, gy, gz, bx, by, bz, shared, stream_ptr,
                                params, 0)
        if int(err) != 0:
            raise DnnkitError(f"cuLaunchKernel of {self.entry_name} failed with {err} "
                              f"(grid {grid}, block {block}, {shared} bytes shared)")


class Prepared:
    """One launch packed once, for a call site that repeats it with some arguments changing.
    ``set(where, value)`` replaces argument ``where`` (an index, or (index, member) of a tuple)
    and packs only its bytes; ``set_flat`` likewise with a C-contiguous array of any rank read
    as flat; ``prepared(stream)`` launches. A value keeps the Numba type of the one it replaces.
    The first call, and every call on the simulator, goes through ``launch``. Arrays set, and
    those of ``transient`` places, are let go after each launch (a memo's runner would keep a
    step's activations alive): a caller gives them again before each call. The others are kept
    (constant tables: the packed address must stay theirs). One object per site and thread."""
    __slots__ = ("kernel", "grid", "block", "shared", "args", "launcher", "buf", "params",
                 "slots", "dims", "runs", "transient")

    def __init__(self, kernel, grid, block, args, shared=0, transient=()):
        self.kernel, self.grid, self.block, self.shared = kernel, grid, block, shared
        self.args = [list(a) if type(a) is tuple else a for a in args]
        self.launcher = self.buf = self.params = self.slots = None
        self.dims, self.runs = _dim3(grid) + _dim3(block), False
        self.transient = set(transient)

    def _current(self):
        return tuple(tuple(a) if type(a) is list else a for a in self.args)

    def _store(self, where, value):
        if type(where) is int:
            self.args[where] = value
        else:                   # a member of a tuple argument
            self.args[where[0]][where[1]] = value

    def set(self, where, value):
        if type(where) is int and type(self.args[where]) is list:
            for j, v in enumerate(value):       # a tuple argument: member by member
                self.set((where, j), v)
            return
        slot = None if self.buf is None else self.slots.get(where)
        if slot is None:
            self._store(where, value)
            if self.buf is not None:    # its bytes are not one run: pack the whole list
                self.launcher._pack(self._current(), self.buf)
            elif type(value) is At or hasattr(value, "copy_to_host"):     # a device array
                self.transient.add(where)
        elif slot[1]:
            struct.pack_into(slot[2], self.buf, slot[0], *_arr(value))
            self._keep(where, value)
        else:
            struct.pack_into(slot[2], self.buf, slot[0], value)
            self._store(where, value)

    def set_flat(self, where, array):
        slot = None if self.buf is None else self.slots.get(where)
        if slot is None or not slot[1]:
            self.set(where, array if array.ndim == 1 else At(array, 0))
            return
        n, item = array.size, array.dtype.itemsize     # a 1-D C array's parameters
        struct.pack_into(slot[2], self.buf, slot[0], 0, 0, n, item, _ptr(array), n, item)
        self._keep(where, array if array.ndim == 1 else At(array, 0))

    def _keep(self, where, array):
        # packed into its slot: not kept when every argument has one (class docstring), but
        # while this thread's launches go through launch() the next call needs it
        if not self.runs:
            self._store(where, array)
        elif _numba_path():
            self._store(where, array)
            self.transient.add(where)
        else:
            self._store(where, None)

    def _prepare(self, args):
        """After the first launch: the fast launcher, an own packed buffer, the offsets."""
        launcher = _fast.get((id(self.kernel), _types(args)))
        if launcher is None:
            return
        from numba.cuda import types
        slots, field, offsets = {}, 0, launcher.offsets

        def place(where, t):
            nonlocal field
            fmt = _plan(t, "v")[0]
            start = offsets[field]
            # one run of bytes when each field sits right after the one before
            if all(offsets[field + k] == start + struct.calcsize("@" + fmt[:k])
                   for k in range(len(fmt))):
                slots[where] = (start, isinstance(t, types.Array), "@" + fmt)
            field += len(fmt)

        for i, t in enumerate(launcher.argtypes):
            if isinstance(t, types.BaseTuple):
                for j, m in enumerate(t):
                    place((i, j), m)
            else:
                place(i, t)
        buf = ctypes.create_string_buffer(launcher.size)
        base = ctypes.addressof(buf)
        ptrs = (ctypes.c_void_p * max(1, len(offsets)))(*[base + o for o in offsets])
        launcher._pack(args, buf)
        self.launcher, self.buf, self.slots = launcher, buf, slots
        self.params = (ptrs, ctypes.addressof(ptrs))
        # every argument its own run: the list is never packed whole again (``set``)
        self.runs = all(k in slots for k in self._places())

    def _places(self):
        for i, a in enumerate(self.args):     # an argument, or each member of a tuple
            yield from ([(i, j) for j in range(len(a))] if type(a) is list else (i,))

    def __call__(self, stream):
        if self.buf is None or _numba_path():
            args = self._current()
            launch(self.kernel, self.grid, self.block, stream, args, self.shared)
            if self.buf is None and not simulator() and not through_numba:
                self._prepare(args)
            if self.buf is None or self.runs:   # the call's own arrays: let go (docstring)
                for where in self.transient:
                    self._store(where, None)
            return
        L = self.launcher
        (err,) = L.cu_launch(L._function(), *self.dims, self.shared, stream_pointer(stream),
                             self.params[1], 0)
        if int(err) != 0:
            raise DnnkitError(f"cuLaunchKernel of {L.entry_name} failed with {err} "
                              f"(grid {self.grid}, block {self.block})")


def _dim3(d):
    return (d, 1, 1) if isinstance(d, int) else (tuple(d) + (1, 1))[:3]


def _configure(kernel, grid, block, stream, shared):
    if _blocks(grid) >= _QUIET_BELOW:
        return kernel[grid, block, stream, shared]
    with warnings.catch_warnings():
        # Matched by message alone: numba-cuda raises its own copy of NumbaPerformanceWarning
        # (not numba.core.errors'), wrapped in terminal colour codes, hence the leading ".*".
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU "
                                "under-utilization")
        return kernel[grid, block, stream, shared]
