"""dnnkit.memory: the caching allocator's size classes and pool (pure parts on any machine),
and on a GPU that blocks come back per stream, are reused, and hold correct data."""

import threading

import numpy as np
import pytest

from dnnkit import config, memory, memory_fill


def test_size_classes():
    assert [memory.rounded(n) for n in (1, 512, 513, 1 << 20)] == [512, 512, 1024, 1 << 20]
    assert memory.rounded((1 << 20) + 1) == 2 << 20
    assert memory.rounded((4 << 20) + 1) == 6 << 20


def test_pool_gives_back_per_key():
    pool = memory._Pool()
    key_a, key_b = (0, 0, 512), (0, 7, 512)
    assert pool.take(key_a) is None
    pool.give(key_a, "block", addr=4096)
    assert pool.cached_bytes == 512
    assert pool.take(key_b) is None            # another stream never gets it
    assert pool.take(key_a) == "block" and pool.take(key_a) is None
    assert (pool.hits, pool.misses, pool.cached_bytes) == (1, 3, 0)


def test_flag_values():
    assert config.get("dnn.allocator") == "caching"
    with pytest.raises(ValueError, match="allowed: caching, numba"):
        config.set("dnn.allocator", "pool")


@pytest.mark.gpu
def test_blocks_are_reused_per_stream_and_keep_data():
    from numba import cuda
    memory.empty_cache()
    s1, s2 = cuda.stream(), cuda.stream()
    a = memory.device_array((1000,), np.float32, s1)
    ptr = a.device_ctypes_pointer.value
    del a
    b = memory.device_array((999,), np.float32, s1)      # same size class, same stream
    assert b.device_ctypes_pointer.value == ptr
    c = memory.device_array((1000,), np.float32, s2)     # other stream: a new block
    assert c.device_ctypes_pointer.value != ptr
    host = np.random.default_rng(0).standard_normal(999).astype(np.float32)
    b.copy_to_device(host, stream=s1)
    np.testing.assert_array_equal(b.copy_to_host(stream=s1), host)
    assert memory.stats()["hits"] >= 1
    del b, c
    assert memory.stats()["cached_blocks"] >= 2
    memory.empty_cache()
    assert memory.stats()["cached_bytes"] == 0
    with config.change_flags(**{"dnn.allocator": "numba"}):
        d = memory.device_array((10,), np.float32, s1)
    assert d.shape == (10,)


@pytest.mark.gpu
def test_a_bound_allocator_reuses_blocks_also_after_the_cache_is_emptied():
    """memory.allocator (the memoised calls' allocation): the same pool as device_array,
    views of a block keep it lent, and emptying the cache does not cut it off the pool."""
    from numba import cuda
    s = cuda.stream()
    alloc = memory.allocator((256,), np.float32, s)
    a = alloc()
    ptr = a.device_ctypes_pointer.value
    assert a.__dict__["_dnnkit_ptr"] == ptr and a.shape == (256,)
    view = a[10:]                      # a view holds the block: not given back yet
    del a
    other = alloc()                    # held, so that ptr is the only free block below
    assert other.device_ctypes_pointer.value != ptr
    del view
    b = alloc()
    assert b.device_ctypes_pointer.value == ptr
    del other
    host = np.arange(256, dtype=np.float32)
    b.copy_to_device(host, stream=s)
    np.testing.assert_array_equal(b.copy_to_host(stream=s), host)
    del b
    memory.empty_cache()
    c = alloc()
    del c
    hits = memory.stats()["hits"]
    alloc()
    assert memory.stats()["hits"] == hits + 1


def test_pool_blocks_are_lent_to_arrays_and_come_back_when_the_last_view_dies(monkeypatch):
    """memory._new's bookkeeping, with stand-ins for Numba's classes (the GPU tests above run
    the real ones): the array gets the block's address and a pointer that owns nothing; the
    block returns to the pool once the array and its views are gone, and is handed out again."""
    import gc

    class Pointer:                      # stands for numba's MemoryPointer
        @property
        def owner(self):
            return self if self._owner is None else self._owner

    class Array:                        # stands for numba's DeviceNDArray
        pass

    class Block:                        # stands for a block from cuMemAlloc (OwnedPointer)
        context, device_pointer = "ctx", 4096

    pool, made = memory._Pool(), []
    monkeypatch.setattr(memory, "_pool", pool)
    monkeypatch.setattr(memory, "_MemoryPointer", Pointer)
    monkeypatch.setattr(memory, "_DeviceNDArray", Array)
    monkeypatch.setattr(memory, "_Lent", None)
    monkeypatch.setattr(memory, "_context", lambda: None)
    monkeypatch.setattr(memory, "_raw_alloc", lambda ctx, size: made.append(Block()) or made[-1])
    key = (0, 0, 1024)
    a = memory._new(key, {"shape": (256,)}, "s")
    assert (a.shape, a.stream, a._dnnkit_ptr) == ((256,), "s", 4096)
    mem = a.gpu_data
    assert (mem.size, mem.device_pointer, mem.owner, mem.refct) == (1024, 4096, mem, 1)
    view = mem.owner                    # what a view of the array holds on to
    del a, mem
    gc.collect()
    assert pool.cached_bytes == 0       # the view still holds the block
    del view
    gc.collect()
    assert pool.cached_bytes == 1024
    b = memory._new(key, {"shape": (256,)}, "s")
    assert len(made) == 1 and pool.hits == 1 and b._dnnkit_ptr == 4096
    b.gpu_data.free()                   # an explicit free gives it back once
    b.gpu_data.free()
    assert pool.cached_bytes == 1024


def test_the_pool_hands_out_the_lowest_free_address_so_a_repeated_step_gets_its_addresses():
    """Blocks of one size come back in any order; the next requests get the lowest addresses
    first, so a step that allocates and frees in the same order every step gets the same
    address for each array every step (cuDNN's variant packs are kept by address)."""
    class Block:
        def __init__(self, addr):
            self.device_pointer = addr

    pool, key = memory._Pool(), (0, 0, 1024)
    blocks = {a: Block(a) for a in (4096, 8192, 12288, 16384)}
    for a in (12288, 4096, 16384, 8192):            # freed in a scrambled order
        pool.give(key, blocks[a])
    assert [memory.address(pool.take(key)) for _ in range(2)] == [4096, 8192]
    pool.give_back(key, 1)                          # nothing lent there: a no-op
    pool.lent[4096] = blocks[4096]
    pool.give_back(key, 4096)
    assert [pool.take(key) for _ in range(3)] == [blocks[4096], blocks[12288], blocks[16384]]
    assert pool.take(key) is None and pool.cached_bytes == 0


def steps_addresses(pool, key, steps):
    """The addresses a toy training step gets, step after step: it takes three blocks
    (activations), frees them in reverse (backward), with a gradient block in between."""
    seen = []
    for _ in range(steps):
        acts = [pool.take(key) for _ in range(3)]
        grad = pool.take(key)
        for a in reversed(acts):
            pool.give(key, a)
        pool.give(key, grad)
        seen.append(tuple(memory.address(b) for b in (*acts, grad)))
    return seen


def test_a_repeated_step_gets_the_same_addresses_every_step():
    class Block:
        def __init__(self, addr):
            self.device_pointer = addr

    pool, key = memory._Pool(), (0, 0, 1024)
    for a in (20480, 4096, 12288, 16384, 8192):
        pool.give(key, Block(a))
    seen = steps_addresses(pool, key, 4)
    assert len(set(seen)) == 1 and seen[0] == (4096, 8192, 12288, 16384)


def test_a_block_lent_to_an_array_that_dies_in_a_reference_cycle_is_not_freed(monkeypatch):
    """An array caught in a reference cycle (an exception's traceback holds its frame) is
    collected with everything only it reaches; weakref callbacks run before ``__del__``. If
    the array's pointer held its block, the collector would run the block's free (Numba's
    weakref.finalize) and then the pointer's ``__del__`` would return the freed block to the
    pool (real GPU, the fuzzer: the next array of that size got invalid memory). The pool
    holds lent blocks itself, so the block survives and comes back usable."""
    import gc
    import weakref

    class Pointer:                      # stands for numba's MemoryPointer
        pass

    class Array:                        # stands for numba's DeviceNDArray
        pass

    freed = []

    class Block:                        # stands for cuMemAlloc's block, freed by a finalizer
        context, device_pointer = "ctx", 8192

        def __init__(self):
            weakref.finalize(self, freed.append, "cuMemFree")

    pool = memory._Pool()
    monkeypatch.setattr(memory, "_pool", pool)
    monkeypatch.setattr(memory, "_MemoryPointer", Pointer)
    monkeypatch.setattr(memory, "_DeviceNDArray", Array)
    monkeypatch.setattr(memory, "_Lent", None)
    monkeypatch.setattr(memory, "_context", lambda: None)
    monkeypatch.setattr(memory, "_raw_alloc", lambda ctx, size: Block())
    key = (0, 0, 512)

    a = memory._new(key, {"shape": (128,)}, 0)
    a.cycle = [a]                       # as a traceback's frame holding the array would
    gc.disable()                        # collected below, not at a random allocation
    try:
        del a
    finally:
        gc.enable()
    gc.collect()
    assert freed == [] and pool.cached_bytes == 512 and not pool.lent
    b = memory._new(key, {"shape": (128,)}, 0)
    assert pool.hits == 1 and b._dnnkit_ptr == 8192 and freed == []


@pytest.mark.gpu
def test_reshaped_views_share_memory_and_match_numba():
    """memory.reshaped (the template-built reshape): the same memory, shape, strides and
    Numba type as Numba's reshape; the view keeps a pool block lent; a strided array goes
    through Numba's reshape."""
    from numba import cuda
    memory.empty_cache()
    host = np.arange(24, dtype=np.float32)
    a = memory.device_array((2, 3, 4), np.float32, 0)
    a.copy_to_device(host.reshape(2, 3, 4))
    for shape in ((24,), (6, 4), (1, 2, 3, 4, 1)):
        v, ref = memory.reshaped(a, shape), a.reshape(*shape)
        assert (v.shape, v.strides, v.dtype) == (ref.shape, ref.strides, ref.dtype)
        assert v._numba_type_ == ref._numba_type_
        assert v.device_ctypes_pointer.value == a.device_ctypes_pointer.value
        np.testing.assert_array_equal(v.copy_to_host().ravel(), host)
    ptr, flat = a.device_ctypes_pointer.value, memory.reshaped(a, (24,))
    del a
    assert memory.device_array((2, 3, 4), np.float32, 0).device_ctypes_pointer.value != ptr
    np.testing.assert_array_equal(flat.copy_to_host(), host)    # still lent, still intact
    strided = cuda.to_device(host.reshape(6, 4))[:, ::2]
    with pytest.raises(NotImplementedError):                     # Numba's own answer
        memory.reshaped(strided, (12,))


# ------------------------------------------- dnn.debug.fill_uninitialized

def test_fill_flag_values():
    assert config.get("dnn.debug.fill_uninitialized") == "off"
    config.set("dnn.debug.fill_uninitialized", " NaN ")
    assert config.get("dnn.debug.fill_uninitialized") == "nan"
    for bad in ("zero", True, ["nan"], None):
        with pytest.raises(ValueError, match="fill_uninitialized.*allowed: off, nan"):
            config.set("dnn.debug.fill_uninitialized", bad)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "uint8", "int32"])
def test_fill_nan_fills_every_new_array_of_both_allocation_paths(dtype):
    """Every byte 0xFF: NaN in each float dtype, -1 / the largest value in the integer ones;
    device_array (a call's allocations) and allocator() (the memo's) alike, on an array
    whose block held finite data before (the pool hands it out again on a GPU)."""
    from numba import cuda
    shape, stream = (3, 5), cuda.default_stream()
    old = memory.device_array(shape, dtype, stream)
    old.copy_to_device(np.ones(shape, dtype), stream=stream)
    del old
    with config.change_flags({"dnn.debug.fill_uninitialized": "nan"}):
        arrays = [memory.device_array(shape, dtype, stream),
                  memory.allocator(shape, dtype, stream)(),
                  memory.device_array(shape, dtype, 0)]     # a raw cudaStream_t
    for a in arrays:
        got = a.copy_to_host()
        assert got.shape == shape and got.dtype == np.dtype(dtype)
        assert (got.view(np.uint8) == memory_fill.FILL_BYTE).all()
        if got.dtype.kind == "f":
            assert np.isnan(got).all()
    empty = memory.device_array((0, 4), dtype, stream)
    assert empty.shape == (0, 4)


def test_fill_off_is_the_default_and_writes_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "fill", lambda a, s: calls.append(a) or a)
    memory.device_array((4,), np.float32, 0)
    memory.allocator((4,), np.float32, 0)()
    assert calls == []
    with config.change_flags({"dnn.debug.fill_uninitialized": "nan"}):
        memory.device_array((4,), np.float32, 0)
        memory.allocator((4,), np.float32, 0)()
    assert len(calls) == 2


def test_repeated_allocations_work_out_their_pool_key_once_per_flags(monkeypatch):
    """device_array keeps _pooled()'s answer per (shape, dtype, stream, device) for the flags
    it was made under: a change of flags (or a change_flags block) asks again."""
    asked = []

    def pooled(shape, dtype, stream):
        asked.append((shape, dtype, stream))
        return (0, 0, 512), {"shape": shape}, stream
    monkeypatch.setattr(memory, "_pooled", pooled)
    monkeypatch.setattr(memory, "_new", lambda key, attrs, stream: ("array", key, stream))
    monkeypatch.setattr(memory, "_fast", __import__("threading").local())
    config.get("dnn.allocator")                  # the flags merged
    for _ in range(3):
        assert memory.device_array((4, 2), np.float32, 7) == ("array", (0, 0, 512), 7)
    memory.device_array([4, 2], np.float32, 7)   # the same shape as a list
    memory.device_array((4, 2), np.float32, 8)   # another stream: another key
    assert asked == [((4, 2), np.float32, 7), ((4, 2), np.float32, 8)]
    with config.change_flags({"dnn.debug.fill_uninitialized": "off"}):
        memory.device_array((4, 2), np.float32, 7)
    assert len(asked) == 3


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_each_threads_per_thread_default_stream_has_its_own_blocks(monkeypatch):
    """CU_STREAM_PER_THREAD's handle (2) names each thread's own per-thread default stream: the
    pool keys its blocks by thread there (a block one thread's stream gave back, reused by
    another thread's unordered stream, would be written while still read), and by the handle
    alone for every other stream."""
    from dnnkit import device
    monkeypatch.setattr(memory, "simulator", lambda: False)
    monkeypatch.setattr(memory, "device_id", lambda: 0)
    monkeypatch.setitem(memory._templates, ((4,), np.dtype(np.float32)), (16, {"shape": (4,)}))
    monkeypatch.setattr(memory, "_block", lambda key: (memory._pool, None))

    def keys():
        return (memory._pooled((4,), np.dtype(np.float32), device.PER_THREAD)[0],
                memory._pooled((4,), np.dtype(np.float32), 0x5000)[0],
                memory.scratch(100, device.PER_THREAD).key)

    mine = keys()
    # threads one after another: Python hands an ended thread's ident to the next one, whose
    # per-thread stream is another all the same
    others = [_in_thread(keys) for _ in range(8)]
    assert len({k[0] for k in [mine] + others}) == 9
    assert len({k[2] for k in [mine] + others}) == 9
    assert all(k[1] == mine[1] == (0, 0x5000, memory.rounded(16)) for k in others)
    assert mine == keys()                                     # stable within a thread
    assert device.key_stream(mine[0][1]) == device.PER_THREAD
    assert device.key_stream(mine[1][1]) == 0x5000


def test_an_ended_threads_per_thread_stream_keeps_no_blocks(monkeypatch):
    """Blocks of a thread's per-thread default stream serve only that thread, and go back to
    the device when it ends, also those it lent that come back later (stand-in classes for
    Numba's, as above)."""
    import gc

    from dnnkit import device

    class Pointer:
        pass

    class Array:
        pass

    class Block:
        context = "ctx"

        def __init__(self):
            self.device_pointer = 4096 * (len(made) + 1)

    pool, made = memory._Pool(), []
    monkeypatch.setattr(memory, "_pool", pool)
    monkeypatch.setattr(memory, "simulator", lambda: False)
    monkeypatch.setattr(memory, "device_id", lambda: 0)
    monkeypatch.setitem(memory._templates, ((256,), np.dtype(np.float32)),
                        (1024, {"shape": (256,)}))
    monkeypatch.setattr(memory, "_MemoryPointer", Pointer)
    monkeypatch.setattr(memory, "_DeviceNDArray", Array)
    monkeypatch.setattr(memory, "_Lent", None)
    monkeypatch.setattr(memory, "_context", lambda: None)
    monkeypatch.setattr(memory, "_raw_alloc", lambda ctx, size: made.append(Block()) or made[-1])
    monkeypatch.setattr(memory, "refuse_foreign_capture", lambda stream: None)

    def new():
        return memory._new(*memory._pooled((256,), np.dtype(np.float32), device.PER_THREAD))

    kept = []

    def first():
        a = new()
        kept.append(new())          # lent while the thread ends, back after it
        del a
        gc.collect()
        assert pool.cached_bytes == 1024          # cached for this thread's stream
        return new()._dnnkit_ptr                  # and taken again by this thread

    assert _in_thread(first) == 4096 and len(made) == 2
    assert pool.cached_bytes == 0 and not pool.free   # the thread ended: its cache went
    b = new()                                     # this thread: a block of its own
    assert len(made) == 3 and b._dnnkit_ptr == 4096 * 3
    kept.clear()
    gc.collect()
    assert pool.cached_bytes == 0                 # the ended stream's block was not cached
    del b
    gc.collect()
    assert pool.cached_bytes == 1024              # this thread's own is


def test_a_thread_end_is_told_with_its_per_thread_stream_key():
    from dnnkit import device
    told = []
    device.on_thread_end(told.append)
    try:
        key = _in_thread(lambda: device.stream_key(device.PER_THREAD))
        assert told == [key]
        assert _in_thread(lambda: device.stream_key(0x5000)) == 0x5000
        assert told == [key]                      # a thread that asked for no such key
    finally:
        device._ended_hooks.remove(told.append)


def test_a_thread_end_seen_from_another_thread_frees_nothing():
    """Where another thread drops an ended thread's state (daemon threads at exit, the other
    threads in a forked child) that thread may have died holding the pool's lock: the hooks
    are not run there (they would wait for it forever), but the key is no longer alive, and
    a block coming back under it is not cached."""
    from dnnkit import device
    told = []
    device.on_thread_end(told.append)
    try:
        def grab():
            key = device.stream_key(device.PER_THREAD)
            return key, device._thread_serial.__dict__["end"]     # outlives its thread

        key, end = _in_thread(grab)
        assert told == [] and device.thread_alive(key)
        del end                                  # dropped here, in another thread
        assert told == [] and not device.thread_alive(key)
    finally:
        device._ended_hooks.remove(told.append)
    private = memory.new_pool()
    private.give((0, key, 512), object(), addr=4096)
    assert private.cached_bytes == 512           # a graph's pool keeps its blocks


def test_a_block_back_under_an_ended_key_is_not_cached(monkeypatch):
    from dnnkit import device
    pool = memory._Pool()
    monkeypatch.setattr(memory, "_pool", pool)
    key = _in_thread(lambda: device.stream_key(device.PER_THREAD))
    pool.give((0, key, 512), object(), addr=4096)
    assert pool.cached_bytes == 0 and not pool.free
    mine = device.stream_key(device.PER_THREAD)
    pool.give((0, mine, 512), object(), addr=4096)
    assert pool.cached_bytes == 512
