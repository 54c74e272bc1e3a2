"""Faults that need a GPU and cuDNN: the workspace, run-time errors, recovery.

- Workspace limit 0: every convolution direction, asked for an algorithm that needs a
  workspace (or a runtime choice), runs a zero-workspace one (checked against cuDNN's own
  workspace query) and is right.
- Device memory exhausted (a real allocation holding nearly all free memory): an FFT
  workspace cannot be had, the convolution falls back to the zero-workspace default and is
  right.
- A real cuDNN NOT_SUPPORTED status (FFT forward with stride 2, run without conv.py's retry,
  through a test-only op "fault_conv2d"): forced, it raises CudnnError; under auto the
  dispatcher falls back to Numba (trace); and the next normal call on the same thread
  succeeds with the same handle, the same cached plan (no new descriptor) and an algorithm
  cache hit.

Each test sets up the state it depends on (the out-of-memory test: memory reclaimed, cuDNN's
plan and choice caches emptied, its flags set; ``own_memory_state``), so the file passes in any
order and after any other tests in one process (``pytest -m "gpu or cudnn"``).

Run on a GPU: python -m pytest -q tests/gpu/test_faults.py  (each test takes seconds)
"""

import contextlib
import gc

import numpy as np
import pytest

import dnnkit
from dnnkit import arrays, config, device, dispatch, fastpath, memory, reference, registry
from dnnkit.cudnn import algo_cache, conv, conv_algos, conv_graph, conv_plans, descriptors, handle
from dnnkit.tracing import note_algo
from dnnkit.errors import CudnnError

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]
F32 = np.dtype(np.float32)
TOL = 1e-4                    # max|got - ref| / max|ref| vs float64, float32 data


def _data(rng, xs, ws):
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    return x, w


def _workspace_sizes(direction, op, *args, **kw):
    """cuDNN's workspace size per algorithm name for this convolution (None: NOT_SUPPORTED),
    asked through the same cached plan the op uses."""
    from numba import cuda
    a = registry.PREPARE[op](*args, **kw)
    geom = a[-3]
    shapes = {"fwd": (a[0], a[1], geom.y_shape), "bwd_data": (a[1], a[0], geom.x_shape),
              "bwd_filter": (a[0], a[1], geom.w_shape)}[direction.name]
    out = cuda.device_array(geom.user_shape(shapes[2]), np.float32)
    c = conv_plans.open_call(direction, (shapes[0], shapes[1], out), geom, F32, "float32",
                             conv.math_type(F32, "float32", False), 0)
    sizes = {}
    for name, enum in direction.algos.items():
        try:
            sizes[name] = conv_algos.workspace_size(c, enum)
        except CudnnError:        # NOT_SUPPORTED for this shape (or architecture)
            sizes[name] = None
    return sizes


# (direction, op name, call, reference, algos asked for)
X_SHAPE, W_SHAPE, PAD = (4, 8, 16, 16), (16, 8, 3, 3), 1   # reference: tuples
Y_SHAPE = (4, 16, 16, 16)
CASES = [
    (conv.FWD, "conv2d", lambda x, w, dy, algo: dnnkit.conv2d(x, w, padding=PAD, algo=algo),
     lambda x, w, dy: reference.conv_forward(x, w, None, (1, 1), (PAD, PAD), (1, 1)),
     ("large", "fft", "fft_tiling", "winograd_non_fused", "guess_once", "time_once"),
     lambda x, w, dy: (x, w), {"padding": PAD}),
    (conv.BWD_DATA, "conv2d_backward_data",
     lambda x, w, dy, algo: dnnkit.conv2d_backward_data(dy, w, X_SHAPE, padding=PAD, algo=algo),
     lambda x, w, dy: reference.conv_backward_data(dy, w, X_SHAPE, (1, 1), (PAD, PAD), (1, 1)),
     ("fft", "fft_tiling", "winograd_non_fused", "guess_once", "time_once"),
     lambda x, w, dy: (dy, w, X_SHAPE), {"padding": PAD}),
    (conv.BWD_FILTER, "conv2d_backward_filter",
     lambda x, w, dy, algo: dnnkit.conv2d_backward_filter(x, dy, W_SHAPE, padding=PAD,
                                                           algo=algo),
     lambda x, w, dy: reference.conv_backward_filter(x, dy, W_SHAPE, (1, 1), (PAD, PAD), (1, 1)),
     ("fft", "small", "fft_tiling", "winograd_non_fused", "guess_once", "time_once"),
     lambda x, w, dy: (x, dy, W_SHAPE), {"padding": PAD}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[1])
def test_workspace_limit_zero_runs_a_zero_workspace_algorithm(case, rng):
    direction, op, call, ref, algos, args, kw = case
    x, w = _data(rng, X_SHAPE, W_SHAPE)
    dy = rng.standard_normal(Y_SHAPE).astype(np.float32)
    want = ref(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
    sizes = _workspace_sizes(direction, op, *args(x, w, dy), **kw)
    algo_cache.clear()
    conv_graph.clear()
    for algo in algos:
        with config.change_flags({"dnn.conv.workspace_limit": 0}), dnnkit.trace() as t:
            got = call(x, w, dy, algo).copy_to_host()
        assert t.backends() == ["cudnn"]
        chosen = t[0].algo
        if chosen.startswith("engine"):        # a runtime choice, run through the graph API
            ws = {p.workspace for p, _ in conv_graph.fast_plans().values() if p.name == chosen}
            assert ws == {0}, f"{op} algo={algo} ran {chosen} ({ws} bytes)"
        else:
            assert sizes[chosen] == 0, f"{op} algo={algo} ran {chosen} ({sizes[chosen]} bytes)"
        named = conv_algos.FWD_ALGOS if direction is conv.FWD else (
            conv_algos.BWD_DATA_ALGOS if direction is conv.BWD_DATA else
            conv_algos.BWD_FILTER_ALGOS)
        if algo in named:
            asked = direction.algo_name(named[algo])
            if sizes[asked]:   # it needs a workspace: it must not have run
                assert chosen != asked
        assert reference.rel_error(got, want) <= TOL, (op, algo, chosen)


def _reclaim(cuda):
    """Free device memory once everything reclaimable is given back: arrays in reference
    cycles, dnnkit's cached blocks, Numba's deferred frees (which Numba's own allocator would
    flush on an out-of-memory error and retry)."""
    cuda.synchronize()
    gc.collect()
    memory.empty_cache()
    cuda.current_context().deallocations.clear()
    _trim_pool()
    return cuda.current_context().get_memory_info()[0]


def _trim_pool():
    """Release what the device's stream-ordered memory pool keeps reserved (libraries that
    allocate with cudaMallocAsync leave it there; the driver can hand it to a cuMemAlloc that
    would otherwise fail). Returns the bytes still reserved."""
    from cuda.bindings import driver as drv
    err, pool = drv.cuDeviceGetMemPool(device.device_id())
    if int(err):
        return None
    drv.cuMemPoolTrimTo(pool, 0)
    attr = drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
    err, reserved = drv.cuMemPoolGetAttribute(pool, attr)
    return None if int(err) else int(reserved)


def _exhaust(cuda, margin):
    """Hold all device memory but ``margin`` bytes, until nothing more comes back: neither
    by reclaiming (objects collected later) nor by an allocation's own out-of-memory retry
    (seen on an H100 after a few hundred cuDNN tests: cuMemGetInfo said 15 MB were free, and
    a 683 MB cuMemAlloc that first failed succeeded when Numba retried it). Returns the
    holding arrays and the free bytes left."""
    hogs, free = [], _reclaim(cuda)
    for _ in range(16):
        if free > margin + (8 << 20):
            try:
                hogs.append(cuda.device_array(free - margin, np.uint8))
            except Exception as e:  # noqa: BLE001 - fragmentation: cannot set the fault up
                pytest.skip(f"could not hold {free - margin} bytes: {e}")
            free = _reclaim(cuda)
            continue
        try:            # a request past the margin must fail, retry included
            hogs.append(cuda.device_array(2 * margin, np.uint8))
        except Exception:  # noqa: BLE001 - out of memory: exhausted
            return hogs, _reclaim(cuda)
        free = _reclaim(cuda)
    pytest.skip(f"device memory kept coming back ({free} bytes free after 16 tries)")


@contextlib.contextmanager
def _memory_log(cuda):
    """Record, for the failure message, every allocation of dnnkit's pool and every flush of
    Numba's deferred frees (with what they free) made inside the block."""
    ctx, events = cuda.current_context(), []
    pending, raw_alloc = ctx.deallocations, memory._raw_alloc

    def alloc(c, size):
        events.append(("alloc", size, memory.stats()["cached_bytes"], pending._size,
                       c.get_memory_info()[0], "pool reserved", _trim_pool()))
        try:
            got = raw_alloc(c, size)
        except Exception as e:
            events.append(("failed", type(e).__name__))
            raise
        events.append(("got", int(got.device_pointer), "free after", c.get_memory_info()[0]))
        return got

    def flush(clear=pending.clear):
        events.append(("flush", [(d.__name__, n) for d, _, n in pending._cons]))
        clear()
    memory._raw_alloc, pending.clear = alloc, flush
    try:
        yield events
    finally:
        memory._raw_alloc = raw_alloc
        del pending.clear


@pytest.fixture
def own_memory_state():
    """The out-of-memory test's starting point, whatever ran before it in the process (the
    whole GPU suite, in any order): no memory held by garbage from earlier tests (reference
    cycles, dnnkit's cached blocks, Numba's deferred frees, the stream-ordered pool's
    reserve), and no cuDNN plan, graph plan, algorithm choice or memoised call of theirs;
    the flags it depends on set explicitly. Afterwards the memory it held is given back at
    once, so the next test does not start short of it either."""
    from numba import cuda
    for drop in (algo_cache.clear, conv_graph.clear, conv_plans.clear_plans,
                 fastpath.invalidate):
        drop()
    _reclaim(cuda)
    with config.change_flags({"dnn.allocator": "caching", "dnn.deterministic": False,
                              "dnn.conv.allow_tf32": False, "dnn.memo": True,
                              "dnn.conv.workspace_limit": 1 << 40}):   # the limit allows all
        yield cuda
    _reclaim(cuda)


def test_workspace_that_cannot_be_allocated_falls_back(rng, own_memory_state):
    """A real out-of-memory: nearly all free device memory is held, an FFT-family algorithm's
    workspace (hundreds of MB at this size; GEMM needs none on cuDNN 9.19 / H100) cannot be
    allocated, and the zero-workspace default runs."""
    cuda = own_memory_state
    xh, wh = _data(rng, (16, 64, 64, 64), (64, 64, 3, 3))
    # on the device before memory is exhausted: the call under test allocates only y and the
    # workspace it asks for
    x, w = cuda.to_device(xh), cuda.to_device(wh)
    margin = 48 << 20          # room for y (16 MiB) and cuDNN's small needs
    with dnnkit.trace() as t:   # the default first: its kernels load now, not under OOM
        want = dnnkit.conv2d(x, w, padding=1, algo="none").copy_to_host()
    assert t[0].algo == "implicit_gemm"
    sizes = _workspace_sizes(conv.FWD, "conv2d", x, w, padding=1)
    big = [(a, n) for a, n in (("fft", "fft"), ("fft_tiling", "fft_tiling"),
                               ("winograd_non_fused", "winograd_nonfused"))
           if isinstance(sizes[n], int) and sizes[n] > 2 * margin]
    if not big:
        pytest.skip(f"no algorithm needs more than {2 * margin} bytes here: {sizes}")
    algo, name = big[0]
    free = _reclaim(cuda)
    if free < sizes[name] + 4 * margin:
        pytest.skip(f"{free} bytes free after reclaiming: {algo}'s {sizes[name]}-byte "
                    "workspace does not fit with memory to spare")
    with dnnkit.trace() as t:
        dnnkit.conv2d(x, w, padding=1, algo=algo)
    assert t[0].algo == name, f"{algo} did not run as itself with {free} bytes free"
    hogs, free = _exhaust(cuda, margin)
    try:
        with dnnkit.trace() as t, _memory_log(cuda) as events:
            got = dnnkit.conv2d(x, w, padding=1, algo=algo).copy_to_host()
    finally:
        del hogs
    assert t[0].backend == "cudnn" and t[0].algo == "implicit_gemm", \
        f"{t[0].algo} ran with {free} bytes free before the call (margin {margin}): {events}"
    assert np.array_equal(got, want)   # the same algorithm as the reference run


# ------------------------------------------------ a real NOT_SUPPORTED, then recovery

def _fft_without_retry(x, w, bias, geom, opts, stream):
    """conv2d's cuDNN path, but FFT and no retry: cuDNN's status reaches the dispatcher."""
    y = arrays.cuda_empty(geom.user_shape(geom.y_shape), x.dtype, stream)
    math_t = conv.math_type(x.dtype, opts["compute_dtype"], opts["allow_tf32"])
    c = conv_plans.open_call(conv.FWD, (x, w, y), geom, x.dtype, opts["compute_dtype"], math_t,
                             device.stream_pointer(stream))
    note_algo(conv.FWD.algo_name(conv.execute(c, conv.FWD.algos["fft"], False, None)))
    return y


@pytest.fixture
def fault_op():
    registry.register("fault_conv2d", "numba")(registry.REGISTRY["conv2d"]["numba"].fn)
    registry.register("fault_conv2d", "cudnn")(_fft_without_retry)
    yield
    registry.REGISTRY.pop("fault_conv2d")
    registry.OPS.pop("fault_conv2d")


STRIDE2 = dict(stride=2, padding=1)


def _stride2(rng):
    x, w = _data(rng, (2, 8, 17, 17), (8, 8, 3, 3))
    ref = reference.conv_forward(x.astype(np.float64), w.astype(np.float64), None, (2, 2),
                                 (1, 1), (1, 1))
    return x, w, ref


def test_not_supported_under_auto_falls_back_to_numba(fault_op, rng):
    x, w, want = _stride2(rng)
    args = registry.PREPARE["conv2d"](x, w, **STRIDE2)
    with pytest.raises(CudnnError) as ei:
        dispatch.dispatch("fault_conv2d", *args, backend="cudnn")
    assert ei.value.not_supported, f"expected a NOT_SUPPORTED status: {ei.value}"
    with dnnkit.trace() as t:
        got = dispatch.dispatch("fault_conv2d", *args).copy_to_host()   # auto
    assert t.backends() == ["numba"]
    assert t[0].reason == f"cuDNN returned {ei.value.status_name} at run time"
    assert reference.rel_error(got, want) <= TOL


def test_a_cudnn_error_mid_graph_leaves_handle_plans_and_cache_usable(fault_op, rng):
    x, w, want = _stride2(rng)
    call = dict(STRIDE2, algo="guess_once", backend="cudnn")
    algo_cache.clear()
    with dnnkit.trace() as t0:
        y0 = dnnkit.conv2d(x, w, **call).copy_to_host()
        dnnkit.relu(x, backend="cudnn")
    plans0, h0 = conv_plans.cached_plans(), handle.get(0).value
    graph_plans0 = conv_graph.fast_plans()
    totals0, cache0 = descriptors.total_counts(), algo_cache.stats()

    with pytest.raises(CudnnError) as ei:      # on the same plan (same geometry), mid-graph
        dispatch.dispatch("fault_conv2d", *registry.PREPARE["conv2d"](x, w, **STRIDE2),
                          backend="cudnn")
    assert "algo fft" in str(ei.value)

    with dnnkit.trace() as t1:
        y1 = dnnkit.conv2d(x, w, **call).copy_to_host()
        r1 = dnnkit.relu(x, backend="cudnn").copy_to_host()
    assert t1.backends() == ["cudnn", "cudnn"] and t1[0].algo == t0[0].algo
    assert np.array_equal(y1, y0) and reference.rel_error(y1, want) <= TOL
    assert np.array_equal(r1, np.maximum(x, 0))
    assert handle.get(0).value == h0
    plans1, graph_plans1 = conv_plans.cached_plans(), conv_graph.fast_plans()
    assert all(plans1.get(k) is p for k, p in plans0.items())   # the same plan objects
    assert graph_plans0 and all(graph_plans1.get(k) == p for k, p in graph_plans0.items())
    made = {k: v[0] - totals0.get(k, (0, 0))[0] for k, v in descriptors.total_counts().items()}
    assert made.get("FilterDescriptor", 0) == made.get("ConvolutionDescriptor", 0) == 0
    cache1 = algo_cache.stats()
    assert cache1["hits"] == cache0["hits"] + 1 and cache1["misses"] == cache0["misses"]
