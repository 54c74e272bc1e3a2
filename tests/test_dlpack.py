"""DLPack (dnnkit/dlpack.py): the capsules a Tensor exports, read back field by field with
ctypes and consumed by numpy.from_dlpack (the simulator's arrays live in host memory and are
exported as kDLCPU), the deleter that keeps the array alive until the consumer is done, and the
import of another library's capsule. tests/gpu/test_interop.py runs PyTorch and CuPy."""

import ctypes
import gc
import weakref

import numpy as np
import pytest

import dnnkit
from dnnkit import dlpack
from tests.conftest import SIMULATOR

_api = ctypes.pythonapi
# NumPy reads only host memory: its round trips run where arrays live there (the simulator)
numpy_reads = pytest.mark.skipif(not SIMULATOR, reason="numpy.from_dlpack reads host memory "
                                 "only (tests/gpu/test_interop.py: PyTorch and CuPy)")


def _struct(capsule):
    """(the managed struct read through ctypes, versioned?) of an unused capsule."""
    for versioned in (True, False):
        name = dlpack.NAMES[versioned]
        if _api.PyCapsule_IsValid(id(capsule), name):
            addr = _api.PyCapsule_GetPointer(id(capsule), name)
            cls = dlpack.DLManagedTensorVersioned if versioned else dlpack.DLManagedTensor
            return cls.from_address(addr), versioned
    raise AssertionError("not an unused DLPack capsule")


@pytest.mark.parametrize("dtype,code,bits", [("float16", 2, 16), ("float32", 2, 32),
                                             ("float64", 2, 64), ("int32", 0, 32),
                                             ("uint8", 1, 8), ("bool", 6, 8)])
@pytest.mark.parametrize("max_version", [None, (1, 0), (1, 3)])
def test_the_capsules_fields(dtype, code, bits, max_version):
    h = np.arange(24).reshape(2, 3, 4).astype(dtype)
    t = dnnkit.tensor(h)
    cap = t.__dlpack__(max_version=max_version)
    m, versioned = _struct(cap)
    assert versioned == (max_version is not None)
    d = m.dl_tensor
    assert d.data == dlpack.address(t.data)                  # the array itself, no copy
    kind = dlpack.CPU if SIMULATOR else dlpack.CUDA
    assert (d.device.device_type, d.device.device_id) == (kind, 0) == t.__dlpack_device__()
    assert d.ndim == 3 and [d.shape[i] for i in range(3)] == [2, 3, 4]
    assert [d.strides[i] for i in range(3)] == [12, 4, 1]       # in elements
    assert (d.dtype.code, d.dtype.bits, d.dtype.lanes) == (code, bits, 1)
    assert d.byte_offset == 0 and m.manager_ctx is None and m.deleter
    if versioned:
        assert (m.version.major, m.version.minor) == (1, 0) and m.flags == 0


@numpy_reads
def test_numpy_reads_a_tensor_without_a_copy_and_the_deleter_runs_when_it_is_done():
    gc.collect()
    before = dlpack.pending()
    t = dnnkit.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = np.from_dlpack(t)                  # NumPy asks for a versioned capsule
    assert dlpack.pending() == before + 1
    np.testing.assert_array_equal(a, [[0, 1, 2], [3, 4, 5]])
    a[1, 2] = 50.0                          # the same memory
    assert t.numpy()[1, 2] == 50.0
    data = weakref.ref(t.data)
    del t
    gc.collect()
    assert data() is not None              # NumPy's array keeps dnnkit's alive
    del a
    gc.collect()
    assert dlpack.pending() == before and data() is None


def test_an_unconsumed_capsule_deletes_itself():
    gc.collect()
    before = dlpack.pending()
    t = dnnkit.tensor(np.ones(4, np.float32))
    caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0)), dnnkit.to_dlpack(t),
            dnnkit.to_dlpack(t.data)]
    assert dlpack.pending() == before + 4
    del caps
    gc.collect()
    assert dlpack.pending() == before


def test_a_consumer_that_renames_and_deletes_as_the_protocol_says():
    """What PyTorch and CuPy do with the unversioned capsule: rename it, later call the
    deleter through the struct's function pointer."""
    gc.collect()
    before = dlpack.pending()
    t = dnnkit.tensor(np.ones((3,), np.float64))
    cap = t.__dlpack__()
    m, _ = _struct(cap)
    addr, deleter = ctypes.addressof(m), m.deleter
    assert _api.PyCapsule_SetName(cap, b"used_dltensor") == 0
    del cap, m
    gc.collect()
    assert dlpack.pending() == before + 1        # consumed: the capsule leaves it alone
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(addr)
    assert dlpack.pending() == before


def test_copy_true_exports_a_copy_and_says_so():
    t = dnnkit.tensor(np.arange(3, dtype=np.float32))
    m, _ = _struct(t.__dlpack__(max_version=(1, 0), copy=True))
    assert m.flags & dlpack.IS_COPIED and m.dl_tensor.data != dlpack.address(t.data)
    if not SIMULATOR:
        return
    a = np.from_dlpack(t, copy=True)
    a[0] = 7.0
    assert t.numpy()[0] == 0.0


def test_export_refusals():
    t = dnnkit.tensor(np.ones(2, np.float32))
    with pytest.raises(BufferError, match="dl_device"):
        t.__dlpack__(dl_device=(13, 5))
    with pytest.raises(TypeError, match="complex64"):
        dlpack.dl_dtype(np.complex64)
    for bad in (-2, "1", 1.5, True):
        with pytest.raises(ValueError, match="stream must be"):
            dlpack._consumer_handle(bad)
    assert [dlpack._consumer_handle(s) for s in (None, 0, 1, 2, -1, 0x1234)] == \
        [0, 0, 0, dnnkit.device.PER_THREAD, None, 0x1234]


def test_consume_reads_another_librarys_capsule_and_gives_it_back():
    base = np.arange(12, dtype=np.int64).reshape(3, 4)[:, 1:]      # strided
    owner = weakref.ref(base)
    for cap in (base.__dlpack__(), base.__dlpack__(max_version=(1, 0))):
        ptr, shape, strides, dt, dev, holder = dlpack.consume(cap)
        assert (ptr, shape, strides, dt, dev) == (base.ctypes.data, (3, 3), (32, 8),
                                                  np.dtype(np.int64), 0)
        with pytest.raises(TypeError, match="unused DLPack capsule"):
            dlpack.consume(cap)                   # renamed: used
        del cap
        gc.collect()
        del holder
    gc.collect()
    del base
    gc.collect()
    assert owner() is None                 # every export's deleter ran
    with pytest.raises(TypeError, match="unused DLPack capsule"):
        dlpack.consume(object())


def test_consume_refuses_types_it_cannot_view():
    with pytest.raises(TypeError, match="type code 5"):
        dlpack.consume(np.zeros(2, np.complex64).__dlpack__())


def test_pytorch_reads_a_tensor_without_a_copy():
    torch = pytest.importorskip("torch")
    if not SIMULATOR and not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA on a GPU machine")
    gc.collect()
    before = dlpack.pending()
    t = dnnkit.tensor(np.arange(4, dtype=np.float32))
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == dlpack.address(t.data)
    tt.mul_(2)
    if not SIMULATOR:
        torch.cuda.synchronize()
    assert t.numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
    del tt
    gc.collect()
    assert dlpack.pending() == before
