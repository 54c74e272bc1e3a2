"""Leaks: many calls of every op keep device memory, host memory and cuDNN objects flat.

- The descriptor counter (dnnkit.cudnn.descriptors.live_counts) against the real cuDNN library:
  creating and destroying descriptors needs no GPU (cuDNN 9 answers them on the host), so this
  part runs everywhere; only cudnnCreate (a handle) needs a device.
- Per op family, on each backend (marked gpu; cuDNN also marked cudnn): every op of the family
  run DNNKIT_LEAK_CALLS times (default 10000) on small inputs made once; afterwards free device
  memory (allocator cache emptied), host RSS, the number of live Python objects, the caching
  allocator's misses and the live cuDNN objects per kind are back where they were.
- A tiny simulator variant (20 calls of the cheap ops, Numba) runs the same harness in CI.

Run on a GPU: python -m pytest -q tests/gpu/test_leaks.py  (DNNKIT_LEAK_CALLS=... to change N)
"""

import gc
import os
import resource
import time

import numpy as np
import pytest

from dnnkit import memory, selfcheck
from dnnkit.cudnn import activation as cudnn_activation
from dnnkit.cudnn import api, conv, conv_plans, descriptors, handle
from dnnkit.registry import REGISTRY
from dnnkit.errors import CudnnError, CudnnUnavailableError
from dnnkit.geometry import ConvGeom
from tests.conftest import HAVE_DRIVER, SIMULATOR

N_GPU = int(os.environ.get("DNNKIT_LEAK_CALLS", "10000"))
N_SIM = 20
WARMUP = 3
DEVICE_SLACK = 4 << 20        # bytes: a leaked output of these shapes is >= 512 B per call
RSS_SLACK = 32 << 20          # bytes: the allocator keeps arenas; the object count is sharper
FAMILIES = {
    "activation": ("activation", "activation_backward"),
    "softmax": ("softmax", "softmax_backward"),
    "conv": ("conv2d", "conv2d_backward_data", "conv2d_backward_filter", "conv3d",
             "conv3d_backward_data", "conv3d_backward_filter", "conv_backward_bias"),
    "pool": ("pool2d", "pool2d_backward", "pool3d", "pool3d_backward"),
    "batchnorm": ("batch_norm_train", "batch_norm_inference", "batch_norm_backward"),
    "dropout": ("dropout", "dropout_backward"),
    "rnn": ("rnn_forward", "rnn_backward"),
    "spatial": ("affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
                "spatial_transformer"),
    "matmul": ("linear", "matmul"),
    "embedding": ("embedding", "embedding_backward"),
    "loss": ("cross_entropy", "cross_entropy_backward", "mse_loss", "mse_loss_backward",
             "nll_loss", "nll_loss_backward"),
    "global_pool": ("global_avg_pool",),
    "arith": ("add", "divide", "multiply", "subtract"),
    "reduce": ("broadcast_to", "mean", "mean_backward", "sum", "sum_to"),
    "shape": ("concatenate", "reshape", "split", "take_batch", "take_batch_backward"),
    "lrn": ("lrn", "lrn_backward"),
}
# Cheap enough on the simulator for 20 calls each (about 1 s in all).
SIM_OPS = ("activation", "activation_backward", "pool2d", "batch_norm_inference", "dropout",
           "affine_grid", "grid_sample")


# ------------------------------------------------ the counter, with the real library

@pytest.fixture
def real_lib(real, monkeypatch):
    """dnnkit's cuDNN layer bound to the real library even without a GPU (the loader calls
    it unavailable because cudnnCreate fails; descriptor calls work all the same)."""
    assert real.lib is not None
    monkeypatch.setattr(api, "library", lambda: real.lib)
    return real.lib


def _delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)
            if after.get(k, 0) != before.get(k, 0)}


def _created(before, after):
    return {k: after[k][0] - before.get(k, (0, 0))[0] for k in after
            if after[k][0] != before.get(k, (0, 0))[0]}


def test_create_and_close_are_counted_per_kind(real_lib):
    live0, tot0 = descriptors.live_counts(), descriptors.total_counts()
    with descriptors.TensorDescriptor((2, 3, 4, 5), np.float32), \
            conv_plans.FilterDescriptor((4, 3, 3, 3), np.float32), \
            conv_plans.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1, np.float32), \
            cudnn_activation.ActivationDescriptor(1, 0.0):
        assert _delta(live0, descriptors.live_counts()) == {
            "TensorDescriptor": 1, "FilterDescriptor": 1, "ConvolutionDescriptor": 1,
            "ActivationDescriptor": 1}
    assert _delta(live0, descriptors.live_counts()) == {}
    assert _created(tot0, descriptors.total_counts()) == {
        "TensorDescriptor": 1, "FilterDescriptor": 1, "ConvolutionDescriptor": 1,
        "ActivationDescriptor": 1}


def test_an_escaped_descriptor_is_destroyed_and_counted_when_collected(real_lib):
    live0 = descriptors.live_counts()
    d = descriptors.TensorDescriptor((2, 3), np.float64)
    assert _delta(live0, descriptors.live_counts()) == {"TensorDescriptor": 1}
    del d
    gc.collect()
    assert _delta(live0, descriptors.live_counts()) == {}


def test_a_descriptor_whose_set_call_fails_leaks_nothing(real_lib):
    live0, tot0 = descriptors.live_counts(), descriptors.total_counts()
    with pytest.raises(CudnnError, match="cudnnSetTensorNdDescriptor failed with "
                                         "CUDNN_STATUS_BAD_PARAM"):
        descriptors.TensorDescriptor((2, 0, 3), np.float32)     # a zero dimension
    with pytest.raises(CudnnError, match="cudnnSetConvolutionGroupCount"):
        conv_plans.ConvolutionDescriptor((0, 0), (1, 1), (1, 1), 1, np.float32, groups=0)
    assert _delta(live0, descriptors.live_counts()) == {}
    assert _created(tot0, descriptors.total_counts()) == {"TensorDescriptor": 1,
                                                          "ConvolutionDescriptor": 1}


def test_conv_plans_hold_descriptors_until_cleared(real_lib):
    geom = ConvGeom(2, (2, 6, 1, 9, 8), (4, 3, 1, 3, 2), (1, 2, 1), (0, 1, 0), (1, 1, 2), 2,
                    False)
    conv_plans.clear_plans()
    live0 = descriptors.live_counts()
    for d in (conv.FWD, conv.BWD_DATA, conv.BWD_FILTER):
        for _ in range(3):   # the second and third time: the cached plan, nothing new
            conv_plans.plan_for(d, geom, np.dtype(np.float32), "float32", 0, 0)
    assert _delta(live0, descriptors.live_counts()) == {
        "TensorDescriptor": 6, "FilterDescriptor": 3, "ConvolutionDescriptor": 3}
    conv_plans.clear_plans()
    assert _delta(live0, descriptors.live_counts()) == {}


@pytest.mark.skipif(HAVE_DRIVER, reason="this machine has a CUDA driver")
def test_a_handle_that_cannot_be_created_is_not_counted(real_lib):
    live0 = descriptors.live_counts()
    with pytest.raises(CudnnError, match="cudnnCreate failed with CUDNN_STATUS_NOT_INITIALIZED"):
        handle.get(0)
    assert descriptors.live_counts().get("Handle", 0) == live0.get("Handle", 0)


def test_kind_names():
    assert descriptors.kind_of("cudnnCreateRNNDataDescriptor") == "RNNDataDescriptor"
    assert descriptors.kind_of("cudnnCreate") == "Handle"


# ------------------------------------------------------------------ the harness

def test_families_cover_every_op():
    assert {op for ops in FAMILIES.values() for op in ops} == set(REGISTRY)


def _cases():
    """One selfcheck case per op (its small float32 inputs and its run function)."""
    out = {}
    for c in selfcheck.cases():
        # the first variant of each op
        if c.op not in out:
            out[c.op] = c
    return out


def _device_inputs(case, seed=0):
    from numba import cuda
    inputs = case.make(np.random.default_rng(seed), np.dtype(np.float32), False)
    return tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in inputs)


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _snapshot():
    """Everything measured, after the device is idle and every cache that frees is emptied."""
    from numba import cuda
    cuda.synchronize()
    gc.collect()
    ctx = cuda.current_context()
    memory.empty_cache()
    if hasattr(ctx, "deallocations"):   # Numba defers cuMemFree; do them now
        ctx.deallocations.clear()
    free = None if SIMULATOR else ctx.get_memory_info()[0]
    return dict(free=free, rss=_rss(), objects=len(gc.get_objects()),
                live=descriptors.live_counts(), totals=descriptors.total_counts())


def _leak_check(ops, backend, n):
    cases = _cases()
    runs = []
    for op in ops:
        case, inputs = cases[op], _device_inputs(cases[op])
        try:
            for _ in range(WARMUP):   # compiles kernels, makes plans, handles, cached states
                case.run(backend, None, inputs)
        except CudnnUnavailableError:
            assert backend == "cudnn"
            continue                  # no cuDNN path for these arguments: nothing to check
        runs.append((op, case, inputs))
    assert runs, f"no op of {ops} runs on {backend}"
    before = _snapshot()
    for _, case, inputs in runs:      # refill the allocator cache emptied by the snapshot
        case.run(backend, None, inputs)
    misses0 = memory.stats()["misses"]
    t0 = time.perf_counter()
    for _, case, inputs in runs:
        for _ in range(n):
            case.run(backend, None, inputs)
    elapsed = time.perf_counter() - t0
    misses = memory.stats()["misses"] - misses0
    after = _snapshot()
    calls = n * len(runs)
    what = f"{[r[0] for r in runs]} on {backend}, {n} calls each ({elapsed:.1f} s)"
    assert _delta(before["live"], after["live"]) == {}, f"cuDNN objects leaked: {what}"
    if after["free"] is not None:
        assert before["free"] - after["free"] <= DEVICE_SLACK, \
            f"device memory fell by {(before['free'] - after['free']) >> 10} KiB: {what}"
    # Outputs caught in reference cycles return their blocks only when the collector runs,
    # so a few hundred misses are normal; a leaked block per call would be n misses.
    assert misses <= len(runs) * 4 + n // 10, f"{misses} allocator misses in a loop: {what}"
    assert after["rss"] - before["rss"] <= RSS_SLACK, \
        f"host RSS grew by {(after['rss'] - before['rss']) >> 20} MiB: {what}"
    # a clean run leaves ~0 more; one leaked output per call leaves >= 1 per call
    assert after["objects"] - before["objects"] <= 100 + calls // 100, \
        f"{after['objects'] - before['objects']} more Python objects: {what}"
    return before, after


BACKENDS = ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_many_calls_leak_nothing(family, backend):
    before, after = _leak_check(FAMILIES[family], backend, N_GPU)
    made = _created(before["totals"], after["totals"])
    if backend == "cudnn" and family == "activation":
        # descriptors are made once per shape and mode and shared (descriptors.DescriptorCache)
        assert not made.get("ActivationDescriptor") and not made.get("TensorDescriptor"), made
    if backend == "cudnn" and family == "conv":
        # the runtime choices (the default) run through graph-API plans made once, with
        # variant packs kept by device address: the allocator hands the same blocks back, so
        # the loop made a few packs (at least one: the graph path ran) and no plan
        assert 0 < made.get("BackendVariantPack", 0) <= 100, made
        assert not made.get("BackendExecutionPlan"), made


def test_many_calls_leak_nothing_simulator_variant():
    """The same harness, tiny: 20 calls of the cheap ops on Numba (CI has no GPU)."""
    _leak_check(SIM_OPS, "numba", N_SIM)
