"""Which device a call runs on: the device that holds its arrays (Numba's or foreign ones such
as PyTorch's and CuPy's), made current for the call when it is not. Arrays on two devices are
an error. On one GPU (or the simulator) nothing is checked: every array is on it."""

import contextlib

from .device import device_count, device_id, device_of, foreign_device, numba_cuda

# True: one GPU, the simulator or no driver; False: several GPUs; None: not asked yet. CUDA
# does not add devices to a running process, so the answer is kept (read on every call).
one_device = None

_array_types = {}    # type -> NUMBA, FOREIGN or None (asked once per type)
NUMBA, FOREIGN = 1, 2


def single_device():
    """One GPU (or the simulator, or no driver): every array is on it, nothing to check or
    switch."""
    global one_device
    if one_device is None:
        n = device_count()
        if not n:
            return True      # no driver (yet): ask again next time
        one_device = n <= 1
    return one_device


def array_kind(t):
    """NUMBA for a Numba device array type, FOREIGN for another type exporting
    ``__cuda_array_interface__`` (PyTorch, CuPy), None for anything else."""
    known = _array_types.get(t, 0)
    if known == 0:
        if any(c.__name__ == "DeviceNDArrayBase" for c in t.__mro__):
            known = NUMBA
        elif hasattr(t, "__cuda_array_interface__"):
            known = FOREIGN
        else:
            known = None
        _array_types[t] = known
    return known


def _device_of_arg(a, kind):
    """The device holding argument ``a`` of ``kind`` (None: unknown). A foreign array's
    device is asked of the driver from its address: Numba would tie its view to the current
    device whatever device holds the memory."""
    return device_of(a) if kind == NUMBA else foreign_device(a)


def call_device(op, args):
    """The device that holds the call's device arrays (Numba's or foreign ones): None when
    there are none (or on the simulator, whose arrays have no device). Arrays on two devices
    are an error."""
    if single_device():
        return None
    dev, first = None, None
    for i, a in enumerate(args):
        kind = array_kind(type(a))
        if kind is not None:
            d = _device_of_arg(a, kind)
            if d is None:
                continue
            if dev is None:
                dev, first = d, i
            elif d != dev:
                raise ValueError(
                    f"{op}: its arrays are on different devices (argument {first} on device "
                    f"{dev}, argument {i} on device {d}); host inputs are copied to the "
                    f"current device: pass device arrays of one device, or make that device "
                    f"current (with numba.cuda.gpus[{d}]: ...)")
    return dev


def memo_device(args, kw):
    """On several GPUs: the current device when every Numba array among the call's arguments
    is on it (or its device is unknown), else None. A memoised runner is bound to the device
    it was made on (its cuDNN handle, its pool, its kernels), so its signature carries the
    device, and a call whose arrays are elsewhere takes the full path, which switches to
    their device. Cost: one driver call and a dict lookup per array (device_of keeps the
    answer on the array; the pool's arrays are born with it)."""
    cur = device_id()
    for a in (*args, *kw.values()) if kw else args:
        if array_kind(type(a)) == NUMBA:
            d = device_of(a)
            if d is not None and d != cur:
                return None
    return cur


@contextlib.contextmanager
def on_device(dev):
    """Make ``dev`` current for the call (its context, its cuDNN handle, its kernels)."""
    with numba_cuda().gpus[dev]:
        yield
