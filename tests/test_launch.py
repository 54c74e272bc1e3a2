"""dnnkit.launch's fast path: the packing plan of every argument kind, the exact bytes each
kernel parameter pointer points at (checked with a recording cuLaunchKernel, so this runs in
CI without a GPU), At offsets, and on a GPU that the fast path gives Numba's results."""

import ctypes

import numpy as np
import pytest

from dnnkit import launch as L


class FakeArray:
    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim, self.size = len(shape), int(np.prod(shape))
        self.strides = tuple(np.empty(shape, self.dtype).strides)
        self.device_ctypes_pointer = ctypes.c_void_p(ptr)

    def __getitem__(self, sl):
        return ("view", self, sl.start)


class FakeOverload:
    entry_name = "fake_kernel"

    class _codelibrary:
        @staticmethod
        def get_cufunc():
            class F:
                handle = 0xF00
            return F


def _types():
    from numba.cuda import types
    return types


def _read(params, fmts):
    """The values behind the kernelParams pointer array, one per format code."""
    ptrs = (ctypes.c_void_p * len(fmts)).from_address(params)
    ctype = {"q": ctypes.c_int64, "Q": ctypes.c_uint64, "P": ctypes.c_uint64,
             "i": ctypes.c_int32, "I": ctypes.c_uint32, "f": ctypes.c_float,
             "d": ctypes.c_double, "h": ctypes.c_int16, "b": ctypes.c_int8}
    return [ctype[f].from_address(p).value for f, p in zip(fmts, ptrs)]


def test_plan_formats():
    t = _types()
    assert L._plan(t.Array(t.float32, 1, "C"), "v")[0] == "PPqqPqq"
    assert L._plan(t.Array(t.float64, 3, "C"), "v")[0] == "PPqqP" + "qqq" + "qqq"
    assert L._plan(t.UniTuple(t.int64, 3), "v")[0] == "qqq"
    assert L._plan(t.Tuple((t.int32, t.float32, t.uint64)), "v")[0] == "ifQ"
    assert L._plan(t.float32, "v") == ("f", "v") and L._plan(t.float64, "v")[0] == "d"
    for bad in (t.float16, t.boolean, t.complex64):
        with pytest.raises(NotImplementedError):
            L._plan(bad, "v")


def test_packed_parameters(monkeypatch):
    t = _types()
    argtypes = (t.Array(t.float32, 1, "C"), t.Array(t.float64, 2, "C"),
                t.Tuple((t.int64, t.int32)), t.float32, t.float64, t.Array(t.float32, 1, "C"))
    a = FakeArray((10,), "float32", 0x1000)
    b = FakeArray((3, 4), "float64", 0x2000)
    base = FakeArray((100,), "float32", 0x3000)
    calls = []
    from cuda.bindings import driver
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda *c: (calls.append(c), (0,))[1],
                        raising=False)
    launcher = L._Launcher("fake_kernel", argtypes, lambda: 0xF00)   # binds cuLaunchKernel
    launcher((5, 2), 64, 0x5EA, (a, b, (7, -3), np.float32(1.5), 2.25, L.At(base, 30)), 96)
    (c,) = calls
    assert c[:9] == (0xF00, 5, 2, 1, 64, 1, 1, 96, 0x5EA) and c[10] == 0
    fmts = list(launcher.format[1:])
    got = _read(c[9], fmts)
    assert got == [0, 0, 10, 4, 0x1000, 10, 4,
                   0, 0, 12, 8, 0x2000, 3, 4, 32, 8,
                   7, -3, 1.5, 2.25,
                   0, 0, 70, 4, 0x3000 + 30 * 4, 70, 4]


def test_at():
    base = FakeArray((100,), "float32", 0x3000)
    x = L.At(L.At(base, 10), 5)
    assert x.base is base and x.offset == 15 and x.size == 85 and x.dtype == np.float32
    assert x.view() == ("view", base, 15)
    assert L.at(base, 0) is base


def test_at_of_a_base_of_any_rank_reads_it_as_flat():
    """An optimizer's gradients: At of a 2-D array packs its pointer and size, keyed as the
    1-D C array Numba's first launch saw (its flat view); At inside tuples is made a view on
    Numba's path."""
    t = _types()
    flat, grid = FakeArray((100,), "float32", 0x3000), FakeArray((4, 25), "float32", 0x4000)
    flat._numba_type_, grid._numba_type_ = t.Array(t.float32, 1, "C"), t.Array(t.float32, 2, "C")
    y = L.At(grid, 3)
    assert y.size == 97 and L._arr(y) == (0, 0, 97, 4, 0x4000 + 3 * 4, 97, 4)
    assert L._types((y,)) == L._types((L.At(flat, 0),)) == L._types(((flat,),))[0]
    assert L._types((L.At(grid, 0),)) != L._types((grid,))
    assert L._has_at((1, (flat, y))) and not L._has_at((1, (flat, grid)))
    assert L.flat(flat) is flat and (L.flat(grid).base, L.flat(grid).offset) == (grid, 0)
    assert L._views((1, (L.At(flat, 2), flat), L.At(flat, 0))) == \
        (1, (("view", flat, 2), flat), flat)


def test_unpackable_arguments_stay_on_numbas_path():
    t = _types()

    class K:
        overloads = {(t.float16,): FakeOverload, (t.float32,): FakeOverload}

        def typeof_pyval(self, v):
            return t.float16 if isinstance(v, np.float16) else t.float32
    k = K()
    L._learn(k, (np.float16(1),))           # compiled, but float16 scalars are not packed
    assert (id(k), L._types((np.float16(1),))) not in L._fast
    L._learn(k, (np.float32(1),))
    assert isinstance(L._fast.pop((id(k), L._types((np.float32(1),)))), L._Launcher)


@pytest.mark.gpu
def test_fast_path_matches_numba(monkeypatch):
    from numba import cuda
    from dnnkit.ops import gemm as G
    rng = np.random.default_rng(0)
    m, n, k = 70, 90, 33
    a = cuda.to_device(rng.standard_normal(m * k).astype(np.float32))
    b = cuda.to_device(rng.standard_normal(k * n + 5).astype(np.float32))
    want = (a.copy_to_host().reshape(m, k).astype(np.float64)
            @ b.copy_to_host()[5:].reshape(k, n))
    used = []
    orig = L._Launcher.__call__
    monkeypatch.setattr(L._Launcher, "__call__",
                        lambda self, *r: (used.append(1), orig(self, *r))[1])
    outs = []
    for _ in range(3):          # the first through Numba, then the fast path
        c = cuda.device_array(m * n, np.float32)
        G.gemm("00", a, L.At(b, 5), c, (m, n, k), (k, n, n), G.PLAIN * 3, G.NO_BATCH,
               stream=cuda.default_stream())
        outs.append(c.copy_to_host())
    assert len(used) >= 2
    for o in outs:
        assert np.abs(o.reshape(m, n) - want).max() / np.abs(want).max() < 1e-5
    assert np.array_equal(outs[0], outs[2])


def test_stream_objects_with_handle_zero_mean_the_default_stream():
    """A PyTorch/CuPy stream object of the default stream (handle 0) is the default stream,
    not 'no handle'."""
    from dnnkit import arrays

    class TorchLike:
        cuda_stream = 0

    class CupyLike:
        ptr = 0
    default = arrays.as_stream(None)
    assert arrays.as_stream(TorchLike()) is default and arrays.as_stream(CupyLike()) is default


def test_a_site_learns_once_then_launches_fast(monkeypatch):
    """launch.Site: the first call goes through launch() (which compiles and learns); later
    calls with the same kernel and stream object use the learned launcher directly; another
    kernel or stream goes through launch() again."""
    calls = []
    kernel, other, stream = object(), object(), object()

    def fast(grid, block, sp, args, shared):
        calls.append(("fast", grid, sp, args))
    monkeypatch.setattr(L, "simulator", lambda: False)
    monkeypatch.setattr(L, "stream_pointer", lambda s: 0xABC)
    monkeypatch.setattr(L, "launch", lambda k, g, b, s, a, sh=0: calls.append(("slow", k, a)))
    monkeypatch.setattr(L, "_types", lambda args: ("key",))
    monkeypatch.setattr(L, "_fast", {(id(kernel), ("key",)): fast})
    site = L.Site()
    site(kernel, 4, 64, stream, (1, 2))
    site(kernel, 4, 64, stream, (3, 4))
    site(other, 4, 64, stream, (5,))
    assert calls == [("slow", kernel, (1, 2)), ("fast", 4, 0xABC, (3, 4)), ("slow", other, (5,))]


class Device(FakeArray):
    """What launch.Prepared takes for a device array (it never reads one back)."""

    def copy_to_host(self):
        raise AssertionError("not read")


def _learned(monkeypatch, argtypes, cu_launch, slow):
    """(kernel, launcher): a fast launcher of ``argtypes`` as launch() would have learned it,
    launching through ``cu_launch``; the slow path's launches are appended to ``slow``."""
    launcher = L._Launcher("fake_kernel", argtypes, lambda: 0xF00)
    launcher.cu_launch = cu_launch
    monkeypatch.setattr(launcher, "_function", lambda: 0xF00)
    monkeypatch.setattr(L, "simulator", lambda: False)
    monkeypatch.setattr(L, "stream_pointer", lambda s: 0xABC)
    monkeypatch.setattr(L, "launch", lambda k, g, b, s, a, sh=0: slow.append(a))
    monkeypatch.setattr(L, "_types", lambda args: ("key",))
    kernel = object()
    monkeypatch.setattr(L, "_fast", {(id(kernel), ("key",)): launcher})
    return kernel, launcher


def test_a_prepared_launch_packs_once_then_only_what_was_set(monkeypatch):
    """launch.Prepared: the first call goes through launch() and packs every argument into
    its own buffer; set() and set_flat() re-pack one argument's bytes (a
    tuple member, an array given as flat, a scalar), and the bytes behind kernelParams at the
    next launch are those of a whole packing of the new arguments."""
    t = _types()
    f1 = t.Array(t.float32, 1, "C")
    argtypes = (t.UniTuple(f1, 2), f1, t.UniTuple(t.int64, 2), t.int64, t.float32)
    seen, slow = [], []
    fmts = L._Launcher("fake_kernel", argtypes, lambda: 0xF00).format[1:]

    def cu_launch(fn, gx, gy, gz, bx, by, bz, shared, sp, params, extra):
        seen.append(((fn, gx, bx, sp), _read(params, fmts)))
        return (0,)
    kernel, _ = _learned(monkeypatch, argtypes, cu_launch, slow)
    a, b, c = (Device((8,), "float32", 0x1000 * k) for k in (1, 2, 3))
    p = L.Prepared(kernel, 5, 64, ((a, b), c, (3, 4), 7, 1.5))
    p("stream")
    assert slow == [((a, b), c, (3, 4), 7, 1.5)] and not seen
    d, e = Device((8,), "float32", 0x4000), Device((2, 3), "float32", 0x5000)
    p.set((0, 1), d)
    p.set_flat(1, e)
    p.set((2, 0), 9)
    p.set(4, -2.0)
    p("stream")
    want = ((a, d), L.At(e, 0), (9, 4), 7, -2.0)
    ref = L._Launcher("fake_kernel", argtypes, lambda: 0xF00)
    buf = ref._buffer()[0]
    ref.pack(want)
    import struct
    assert seen == [((0xF00, 5, 64, 0xABC), list(struct.unpack_from(ref.format, buf)))]
    assert seen[0][1][7 + 4] == 0x4000 and seen[0][1][14 + 2] == 6     # d's data, e's size
    # the arrays set after packing are let go (a runner in the memo would keep them alive);
    # the one never set (a, such as a constant table) is kept: its address is packed
    assert len(slow) == 1 and p.args == [[a, None], None, [9, 4], 7, -2.0]


def test_a_prepared_launch_lets_go_of_the_first_calls_own_arrays(monkeypatch):
    """Arrays given before the first call (set, or built in as ``transient``) are a call's
    own: once packed they are let go, so a runner kept in the memo holds no step's arrays;
    an array built in and never given again (a constant table) is kept."""
    t = _types()
    f1 = t.Array(t.float32, 1, "C")
    kernel, _ = _learned(monkeypatch, (t.UniTuple(f1, 2), f1, t.int64), lambda *a: (0,), [])
    table, a, b, c = (Device((8,), "float32", 0x1000 * k) for k in (1, 2, 3, 4))
    p = L.Prepared(kernel, 1, 32, ((table, a), b, 5), transient=[(0, 1)])
    p.set_flat(1, c)
    p("stream")
    assert p.args == [[table, None], None, 5]


def test_through_numba_bypasses_every_fast_and_packed_launch(monkeypatch):
    """While ``through_numba`` (dnnkit.warmup's recordings) a prepared launch, a Site and
    launch() itself go through Numba's launch with the call's own arguments, so a recorder
    replacing Numba's launch sees each one; an array set meanwhile is let go after its launch;
    afterwards the packed launch carries on with what was set."""
    t = _types()
    f1 = t.Array(t.float32, 1, "C")
    fast, slow = [], []
    kernel, _ = _learned(monkeypatch, (f1, f1, t.int64), lambda *a: (fast.append(a), (0,))[1],
                         slow)
    a, b, c, d = (Device((8,), "float32", 0x1000 * k) for k in (1, 2, 3, 4))
    p = L.Prepared(kernel, 1, 32, (a, b, 5))
    p("stream")                                  # packs; a and b are the call's to keep
    p.set_flat(1, c)
    p("stream")
    assert len(slow) == 1 and len(fast) == 1
    site = L.Site()
    site(kernel, 1, 32, "stream", (a, b, 5))     # through launch(), then learns
    monkeypatch.setattr(L, "through_numba", True)
    p.set_flat(1, d)
    p("stream")
    site(kernel, 1, 32, "stream", (a, c, 6))
    assert slow[1:] == [(a, b, 5), (a, d, 5), (a, c, 6)] and len(fast) == 1
    assert p.args[1] is None                     # d let go after its launch
    monkeypatch.setattr(L, "through_numba", False)
    p.set_flat(1, c)
    p("stream")
    assert len(slow) == 4 and len(fast) == 2
    # launch() itself: a learned launcher is bypassed too
    monkeypatch.undo()
    calls = []

    class Configured:
        def __call__(self, *args):
            calls.append(args)
    monkeypatch.setattr(L, "simulator", lambda: False)
    monkeypatch.setattr(L, "stream_pointer", lambda s: 0)
    monkeypatch.setattr(L, "_types", lambda args: ("key",))
    monkeypatch.setattr(L, "_configure", lambda *a: Configured())
    monkeypatch.setattr(L, "_learn", lambda k, a: None)
    k2 = object()
    monkeypatch.setattr(L, "_fast", {(id(k2), ("key",)): lambda *a: calls.append("fast")})
    monkeypatch.setattr(L, "_cache", {})
    L.launch(k2, 1, 32, None, (1,))
    monkeypatch.setattr(L, "through_numba", True)
    L.launch(k2, 1, 32, None, (2,))
    assert calls == ["fast", (2,)]


def test_a_packed_launch_keeps_its_arrays_for_a_recording_on_its_own_thread(monkeypatch):
    """While this thread records an op call for replays (``launch.watch`` with its thread id),
    a packed launch goes through launch() with the arrays just set, not the None it keeps
    between calls; another thread's recording leaves this thread's packed launches alone."""
    import threading
    t = _types()
    f1 = t.Array(t.float32, 1, "C")
    fast, slow = [], []
    kernel, _ = _learned(monkeypatch, (f1, f1, t.int64), lambda *a: (fast.append(a), (0,))[1],
                         slow)
    a, b, c = (Device((8,), "float32", 0x1000 * k) for k in (1, 2, 3))
    p = L.Prepared(kernel, 1, 32, (a, b, 5))
    p("stream")                                  # packs
    assert len(slow) == 1

    class Watch:
        tid = threading.get_ident()
    monkeypatch.setattr(L, "watch", Watch())
    p.set_flat(1, c)
    p("stream")
    assert slow[1] == (a, c, 5) and not fast and p.args[1] is None
    Watch.tid = -1                               # another thread records
    p.set_flat(1, b)
    p("stream")
    assert len(slow) == 2 and len(fast) == 1
