"""dnnkit/cudnn/matmul.py: its plan cache and its NOT_SUPPORTED answer with cuDNN's graph
pieces stubbed (no GPU needed), and on a GPU the real matmul operation's descriptors."""

import ctypes
import gc
import types

import pytest

from dnnkit.cudnn import descriptors, handle
from dnnkit.cudnn import matmul as cm
from dnnkit.errors import CudnnError

DIMS = ((1, 4, 3), (1, 3, 5), (1, 4, 5))
STRIDES = ((12, 3, 1), (15, 5, 1), (20, 5, 1))


class FakePlan:
    name, workspace = "engine7", 0

    def __init__(self):
        self.runs = []

    def execute(self, h, pointers, wp, context=""):
        self.runs.append((h.value, pointers, wp))


def _array(addr):
    return types.SimpleNamespace(__cuda_array_interface__={"data": (addr, False)})


@pytest.fixture
def stubbed(monkeypatch):
    """handle.get and the graph building stubbed: float64 has no plan, the others one."""
    cm.clear()
    monkeypatch.setattr(handle, "get", lambda stream=0: ctypes.c_void_p(0x77))
    built = []

    def build(h, dims, strides, dtype, align, allow_tc, det):
        built.append((dims, strides, dtype, align))
        if dtype == "float64":
            return cm._Entry(None, (), "no engine for it here")
        return cm._Entry(FakePlan(), (), None)
    monkeypatch.setattr(cm, "_build", build)
    yield built
    cm.clear()


def test_a_plan_per_shape_runs_on_the_pointers_in_uid_order(stubbed):
    a, b, c = _array(0x1000), _array(0x2000), _array(0x3000)
    assert cm.matmul(a, b, c, DIMS, STRIDES, "float32", False, False, 0) == "engine7"
    assert cm.matmul(a, b, c, DIMS, STRIDES, "float32", False, False, 0) == "engine7"
    assert len(stubbed) == 1 and stubbed[0][3] == 16          # built once, 16-byte aligned
    entry = next(iter(cm._plans.values()))
    assert entry.plan.runs == [(0x77, (0x1000, 0x2000, 0x3000), None)] * 2
    cm.matmul(a, b, _array(0x3004), DIMS, STRIDES, "float32", False, False, 0)
    assert len(stubbed) == 2 and stubbed[1][3] == 4           # the alignment is in the key


def test_supports_asks_cudnn_once_per_shape_and_calls_refuse_alike(stubbed):
    assert cm.unsupported(DIMS, STRIDES, "float64", False, False, 0) == "no engine for it here"
    assert cm.unsupported(DIMS, STRIDES, "float64", False, False, 0) == "no engine for it here"
    assert cm.unsupported(DIMS, STRIDES, "float32", False, False, 0) is None
    assert len(stubbed) == 2                                 # one build per shape and dtype
    a, b, c = _array(0x1000), _array(0x2000), _array(0x3000)
    with pytest.raises(CudnnError) as e:
        cm.matmul(a, b, c, DIMS, STRIDES, "float64", False, False, 0)
    assert e.value.not_supported and "no engine for it here" in str(e.value)
    assert cm.matmul(a, b, c, DIMS, STRIDES, "float32", False, False, 0) == "engine7"
    assert len(stubbed) == 2                                 # the calls reuse those plans


def test_a_graph_cuDNN_refuses_to_build_has_no_plan(monkeypatch):
    def refuse(*args):
        raise CudnnError("cudnnBackendFinalize", 2000, "CUDNN_STATUS_BAD_PARAM", "")
    monkeypatch.setattr(cm, "_operation", refuse)
    entry = cm._build(ctypes.c_void_p(1), DIMS, STRIDES, "float32", 16, False, False)
    assert entry.plan is None and "CUDNN_STATUS_BAD_PARAM" in entry.why


@pytest.mark.gpu   # finalizing loads cuDNN's engine libraries, which need the CUDA driver
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_operation_finalizes_and_is_destroyed(dtype):
    live0 = descriptors.live_counts()
    op, refs = cm._operation(DIMS, ((12, 1, 4), (15, 1, 3), (20, 5, 1)), dtype, 16)
    assert _delta(live0, descriptors.live_counts()) == {
        "BackendTensor": 3, "BackendMatmul": 1, "BackendOperationMatmul": 1}
    del op, refs
    gc.collect()
    assert _delta(live0, descriptors.live_counts()) == {}


def _delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)
            if after.get(k, 0) != before.get(k, 0)}
