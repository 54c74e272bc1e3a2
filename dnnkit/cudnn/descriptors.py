"""cuDNN descriptors as context managers; ``weakref.finalize`` destroys any that escape."""

import ctypes
import weakref

import numpy as np

from . import api
from .enums import DATA_TYPES, PROPAGATE_NAN

INT_MAX = 2**31 - 1


def _destroy(fn_name, ptr):
    try:
        api.function(fn_name)(ptr)
    except Exception:  # pragma: no cover - best effort
        pass


class _Descriptor:
    _create = _destroy_fn = None

    def __init__(self):
        self.ptr = ctypes.c_void_p()
        api.call(self._create, ctypes.byref(self.ptr))
        self._fin = weakref.finalize(self, _destroy, self._destroy_fn, self.ptr)

    def close(self):
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def _as_parameter_(self):  # lets ctypes take the descriptor itself as an argument
        return self.ptr


class TensorDescriptor(_Descriptor):
    """A packed (C-contiguous) tensor of 3 to 8 dims; smaller ranks are padded with 1s."""
    _create, _destroy_fn = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, shape, dtype):
        super().__init__()
        dims = list(shape) + [1] * (4 - len(shape))
        strides = [int(np.prod(dims[i + 1:], dtype=np.int64)) for i in range(len(dims))]
        if max(dims + strides) > INT_MAX:
            self.close()
            raise ValueError(f"tensor {tuple(shape)} exceeds cuDNN's 32-bit dimension limit")
        n = len(dims)
        self.shape = tuple(dims)
        try:
            api.call("cudnnSetTensorNdDescriptor", self.ptr, DATA_TYPES[np.dtype(dtype).name], n,
                     (ctypes.c_int * n)(*dims), (ctypes.c_int * n)(*strides),
                     context=f"dims {tuple(dims)}, dtype {np.dtype(dtype).name}")
        except Exception:
            self.close()
            raise


class ActivationDescriptor(_Descriptor):
    _create, _destroy_fn = "cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor"

    def __init__(self, mode_id, coef, swish_beta=None):
        super().__init__()
        try:
            api.call("cudnnSetActivationDescriptor", self.ptr, mode_id, PROPAGATE_NAN,
                     float(coef), context=f"mode {mode_id}, coef {coef}")
            if swish_beta is not None:
                api.call("cudnnSetActivationDescriptorSwishBeta", self.ptr, float(swish_beta),
                         context=f"beta {swish_beta}")
        except Exception:
            self.close()
            raise


def scalars(dtype):
    """(alpha=1, beta=0) host scalars: double for double data, float otherwise (cuDNN's rule)."""
    t = ctypes.c_double if np.dtype(dtype) == np.float64 else ctypes.c_float
    return t(1.0), t(0.0)
