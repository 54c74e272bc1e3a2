"""Which path runs under each policy; runtime fallback; cross-checking; tracing; logging."""

import contextlib
import logging

import numpy as np
import pytest

import dnnkit
from dnnkit import config, crosscheck, dispatch, placement, policy, registry
from dnnkit.cudnn.loader import CudnnStatus
from dnnkit.errors import CrosscheckError, CudnnError, CudnnUnavailableError
from tests.conftest import cudnn_ok

X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


def test_auto_picks_cudnn_when_it_can_else_numba():
    with dnnkit.trace() as t:
        dnnkit.softmax(X)
        dnnkit.activation(X, "identity")   # cuDNN has no identity: always Numba
    assert t.backends() == ["cudnn" if cudnn_ok() else "numba", "numba"]
    assert "identity" in t[1].reason


@pytest.mark.skipif(cudnn_ok(), reason="cuDNN works here")
def test_forced_raises_with_op_and_reason():
    config.dnn.enabled = "forced"
    with pytest.raises(CudnnUnavailableError) as ei:
        dnnkit.softmax(X)
    st = policy.cudnn_status()
    assert str(ei.value) == (f"softmax: cuDNN is required (dnn.enabled=forced) but cannot be "
                             f"used: {st.describe()}")
    assert ei.value.op == "softmax" and ei.value.reason == st.describe()
    with pytest.raises(CudnnUnavailableError, match=r"^relu|^activation: cuDNN is required "
                       r"\(backend='cudnn'\)"):
        config.dnn.enabled = "auto"
        dnnkit.relu(X, backend="cudnn")


def test_forced_identity_names_the_unsupported_argument():
    with pytest.raises(CudnnUnavailableError, match="activation: .*forced.*identity"):
        with config.change_flags({"dnn.enabled": "forced"}):
            dnnkit.activation(X, "identity")


def test_per_call_backend_overrides_the_flag():
    config.dnn.enabled = "forced"
    with dnnkit.trace() as t:
        dnnkit.relu(X, backend="numba")
    assert t.backends() == ["numba"] and t[0].reason == "backend='numba'"


def test_disabled_runs_numba():
    with config.change_flags({"dnn.enabled": "disabled"}), dnnkit.trace() as t:
        dnnkit.tanh(X)
        dnnkit.softmax(X, backend="auto")
    assert t.backends() == ["numba", "cudnn" if cudnn_ok() else "numba"]
    assert t[0].reason == "dnn.enabled=disabled"


def test_select_backend_answers_without_running():
    with dnnkit.trace() as t:
        b, why = dnnkit.select_backend("softmax", X, algo="log", explain=True)
        assert dnnkit.select_backend("activation", X, "identity") == "numba"
        assert dnnkit.select_backend("softmax", X, backend="numba") == "numba"
    assert len(t) == 0
    assert b == ("cudnn" if cudnn_ok() else "numba") and why
    with pytest.raises(ValueError, match="softmax: algo must be"):
        dnnkit.select_backend("softmax", X, algo="nope")
    with pytest.raises(ValueError, match="unknown op 'conv9d'"):
        dnnkit.select_backend("conv9d", X)
    if not cudnn_ok():
        with pytest.raises(CudnnUnavailableError):
            dnnkit.select_backend("softmax", X, backend="cudnn")


def test_trace_records_op_backend_algo_shapes_dtype():
    with dnnkit.trace() as outer:
        with dnnkit.trace() as inner:
            dnnkit.log_softmax(X.astype(np.float64))
        dnnkit.relu(X)
    assert [(e.op, e.algo, e.shapes, e.dtype) for e in inner] == \
        [("softmax", "log", ((3, 4),), "float64")]
    assert outer.ops() == ["softmax", "activation"]


def test_fallback_is_logged_once_and_verbose_logs_every_decision(caplog):
    if cudnn_ok():
        pytest.skip("cuDNN works here: nothing falls back")
    policy.announced.clear()
    with caplog.at_level(logging.INFO, logger="dnnkit"):
        dnnkit.relu(X)
        dnnkit.relu(X)
    notes = [r for r in caplog.records if "cuDNN not used" in r.getMessage()]
    assert len(notes) == 1 and "NOT_INITIALIZED" in notes[0].getMessage()
    assert not [r for r in caplog.records if r.getMessage().startswith("activation: numba")]
    caplog.clear()
    config.dnn.verbose = True
    with caplog.at_level(logging.INFO, logger="dnnkit"):
        dnnkit.relu(X)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO][-1] \
        .startswith("activation: numba backend (no CUDA device")


# ------------------------------------------------ dispatcher logic with a test-only op

@pytest.fixture
def fake_op(monkeypatch):
    """An op 'fake' whose cuDNN side is scripted, with cuDNN reported available."""
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(True, version=91900))
    script = {"cudnn": lambda a: a * 2, "numba": lambda a: a * 2, "supports": None}
    registry.register("fake", "numba")(lambda a: script["numba"](a))
    registry.register("fake", "cudnn", supports=lambda a: script["supports"])(
        lambda a: script["cudnn"](a))
    yield script
    registry.REGISTRY.pop("fake")
    registry.OPS.pop("fake")


def _raise(status):
    def fn(a):
        raise CudnnError("cudnnFake", status, {3000: "CUDNN_STATUS_NOT_SUPPORTED",
                                               3002: "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
                                               2000: "CUDNN_STATUS_BAD_PARAM"}[status],
                         "x (2,)")
    return fn


@pytest.mark.parametrize("status", [3000, 3002])
def test_runtime_not_supported_falls_back_under_auto_only(fake_op, status):
    fake_op["cudnn"] = _raise(status)
    a = np.arange(2.0)
    with dnnkit.trace() as t:
        assert np.array_equal(dispatch.dispatch("fake", a), a * 2)
    assert t.backends() == ["numba"] and "at run time" in t[0].reason
    with pytest.raises(CudnnError, match="cudnnFake failed with CUDNN_STATUS_NOT_SUPPORTED"):
        dispatch.dispatch("fake", a, backend="cudnn")


def test_other_cudnn_errors_propagate(fake_op):
    fake_op["cudnn"] = _raise(2000)
    with pytest.raises(CudnnError) as ei:
        dispatch.dispatch("fake", np.arange(2.0))
    assert (ei.value.function, ei.value.status_name, ei.value.context) == \
        ("cudnnFake", "CUDNN_STATUS_BAD_PARAM", "x (2,)")


def test_supports_predicate_routes_and_forced_reports_it(fake_op):
    fake_op["supports"] = "odd sizes are not supported"
    assert policy.select_backend.__name__  # public
    with dnnkit.trace() as t:
        dispatch.dispatch("fake", np.arange(3.0))
    assert t.backends() == ["numba"] and t[0].reason == "odd sizes are not supported"
    with pytest.raises(CudnnUnavailableError, match="fake: cuDNN is required .* odd sizes"):
        dispatch.dispatch("fake", np.arange(3.0), backend="cudnn")


def test_crosscheck_passes_when_backends_agree_and_raises_when_not(fake_op):
    config.dnn.crosscheck = True
    a = np.linspace(1, 2, 5)
    dispatch.dispatch("fake", a)
    fake_op["numba"] = lambda v: v * 2 * (1 + 1e-3)
    with pytest.raises(CrosscheckError) as ei:
        dispatch.dispatch("fake", a)
    e = ei.value
    assert e.op == "fake" and e.max_abs == pytest.approx(4e-3) and e.max_rel == pytest.approx(1e-3, rel=1e-2)
    assert "cudnn vs numba max abs error 0.004" in str(e)


def test_crosscheck_skips_the_calls_its_op_says_differ_by_design(fake_op):
    """registry.OpInfo.crosscheck_skip(args, kw): true for a call whose result depends on the
    backend by design (an RNN forward drawing dropout masks); such calls are not repeated."""
    config.dnn.crosscheck = True
    fake_op["numba"] = lambda v: v * 3                   # would disagree with cuDNN's v * 2
    registry.OPS["fake"].crosscheck_skip = lambda args, kw: args[0][0] < 0
    dispatch.dispatch("fake", np.array([-1.0, 2.0]))     # skipped: no error
    with pytest.raises(CrosscheckError):
        dispatch.dispatch("fake", np.array([1.0, 2.0]))


def test_crosscheck_compares_arrays_only(fake_op):
    """A result tuple may hold a non-array (an RNN's training state, with a shape of its own,
    different per backend): only the arrays are compared."""
    class State:
        def __init__(self, backend):
            self.backend, self.shape = backend, (3,)
    config.dnn.crosscheck = True
    fake_op["numba"] = lambda v: (v * 2, State("numba"))
    fake_op["cudnn"] = lambda v: (v * 2, State("cudnn"))
    y, st = dispatch.dispatch("fake", np.ones(3))
    assert np.array_equal(y, np.full(3, 2.0)) and st.backend == "cudnn"
    fake_op["numba"] = lambda v: (v * 3, State("numba"))
    with pytest.raises(CrosscheckError):
        dispatch.dispatch("fake", np.ones(3))


def test_assert_backends_agree(fake_op):
    def fake(a, backend=None):
        return dispatch.dispatch("fake", a, backend=backend)
    out = dnnkit.testing.assert_backends_agree(fake, np.ones(4))
    assert np.array_equal(out, np.full(4, 2.0))
    fake_op["cudnn"] = lambda v: v * 2 + 1e-3
    with pytest.raises(CrosscheckError, match="max abs error 0.001"):
        dnnkit.testing.assert_backends_agree(fake, np.ones(4))
    dnnkit.testing.assert_backends_agree(fake, np.ones(4), atol=1e-2)


@pytest.mark.skipif(cudnn_ok(), reason="cuDNN works here")
def test_crosscheck_without_cudnn_warns_once_and_returns(caplog):
    config.dnn.crosscheck = True
    policy.announced.clear()
    with caplog.at_level(logging.WARNING, logger="dnnkit"):
        y1 = dnnkit.relu(X)
        dnnkit.relu(X)
    assert np.array_equal(y1.copy_to_host(), np.maximum(X, 0))
    assert len([r for r in caplog.records if "not cross-checked" in r.getMessage()]) == 1
    with pytest.raises(CudnnUnavailableError):
        dnnkit.testing.assert_backends_agree(dnnkit.relu, X)


@pytest.mark.parametrize("a,b,ok", [
    ([1.0, np.nan, np.inf], [1.0, np.nan, np.inf], True),
    ([1.0, np.nan, 2.0], [1.0, 2.0, 2.0], False),
    ([1.0, np.inf], [1.0, -np.inf], False),
    ([1.0, 2.0], [1.0, 2.0 + 1e-9], True),
    ([1.0, 2.0], [1.0, 2.1], False),
])
def test_compare_treats_nan_and_inf_as_ieee(a, b, ok):
    a, b = np.array(a, np.float32), np.array(b, np.float32)
    if ok:
        crosscheck.compare("x", a, b)
    else:
        with pytest.raises(CrosscheckError):
            crosscheck.compare("x", a, b)


def test_unknown_backend_names_the_op():
    with pytest.raises(ValueError, match=r"softmax: backend must be .*got 'tpu'"):
        dnnkit.softmax(X, backend="tpu")


def test_launch_configurations_do_not_leak_between_block_shapes(rng):
    """Softmax picks its block shape from the input; alternating shapes must each be right
    (the simulator configures kernels in place, so a naive launch cache would replay the
    last configuration)."""
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 70)).astype(np.float32)
    for _ in range(2):
        for x in (a, b):
            y = dnnkit.softmax(x).copy_to_host()
            assert dnnkit.reference.rel_error(y, dnnkit.reference.softmax(x)) < 1e-6


# ------------------------------------------------ several devices

class DeviceNDArrayBase:      # stands for Numba's base class (recognised by name)
    pass


class FakeDeviceArray(DeviceNDArrayBase):
    def __init__(self, dev):
        import types
        self.gpu_data = types.SimpleNamespace(
            context=types.SimpleNamespace(device=types.SimpleNamespace(id=dev)))


@pytest.fixture
def two_devices(monkeypatch):
    monkeypatch.setattr(placement, "single_device", lambda: False)


def test_one_device_needs_no_check(monkeypatch):
    monkeypatch.setattr(placement, "single_device", lambda: True)    # also on a 2-GPU machine
    assert placement.call_device("op", (FakeDeviceArray(0), FakeDeviceArray(1))) is None


def test_call_device_is_the_device_of_the_arrays(two_devices):
    a0, b0, c1 = FakeDeviceArray(0), FakeDeviceArray(0), FakeDeviceArray(1)
    assert placement.call_device("op", (a0, "relu", 0.0, b0)) == 0
    assert placement.call_device("op", (c1, 3, None)) == 1
    assert placement.call_device("op", ("no arrays", 1.0)) is None
    with pytest.raises(ValueError) as ei:
        placement.call_device("conv2d", (a0, c1))
    msg = str(ei.value)
    assert "conv2d" in msg and "argument 0 on device 0" in msg and "argument 1 on device 1" \
        in msg and "numba.cuda.gpus[1]" in msg


class FakeForeignArray:        # a PyTorch/CuPy tensor: only the interface, at an address
    def __init__(self, ptr):
        self.ptr = ptr

    @property
    def __cuda_array_interface__(self):      # a property of the type, as PyTorch's is
        return {"data": (self.ptr, False), "shape": (4,), "typestr": "<f4", "version": 3}


def test_foreign_arrays_devices_are_asked_of_the_driver(monkeypatch, two_devices):
    from dnnkit import device
    owner = {0x1000: 0, 0x2000: 1}
    monkeypatch.setattr(device, "pointer_device", lambda ptr: owner.get(ptr))
    t1 = FakeForeignArray(0x2000)
    assert placement.call_device("softmax", (t1, "accurate")) == 1
    assert placement.call_device("relu", (FakeForeignArray(0x1000),)) == 0
    # an empty tensor (address 0) or one the driver cannot place decides nothing
    assert placement.call_device("op", (FakeForeignArray(0), t1)) == 1
    assert placement.call_device("op", (FakeForeignArray(0x3000),)) is None
    with pytest.raises(ValueError, match=r"argument 0 on device 0, argument 1 on device 1"):
        placement.call_device("conv2d", (FakeDeviceArray(0), t1))


def test_a_call_on_another_device_runs_inside_that_device(monkeypatch, two_devices):
    seen = []

    @contextlib.contextmanager
    def on_device(dev):
        seen.append(("enter", dev))
        yield
        seen.append(("exit", dev))
    monkeypatch.setattr(placement, "on_device", on_device)
    monkeypatch.setattr(dispatch, "_run_here",
                        lambda op, args, b, kw, keep: (seen.append(op) or 7, None))
    monkeypatch.setattr(dispatch, "device_id", lambda: 0)
    assert dispatch.dispatch("relu", FakeDeviceArray(1)) == 7
    assert seen == [("enter", 1), "relu", ("exit", 1)]
    seen.clear()
    assert dispatch.dispatch("relu", FakeDeviceArray(0)) == 7
    assert seen == ["relu"]            # already current: no switch


def test_memo_device_is_the_current_one_when_the_arrays_are_on_it(monkeypatch):
    monkeypatch.setattr(placement, "device_id", lambda: 1)
    assert placement.memo_device((FakeDeviceArray(1), "relu", 0.0), {}) == 1
    assert placement.memo_device(("no arrays",), {"x": 2}) == 1
    assert placement.memo_device((FakeDeviceArray(1),), {"y": FakeDeviceArray(0)}) is None
    assert placement.memo_device((FakeDeviceArray(0),), {}) is None


def test_the_memo_serves_a_machine_with_several_gpus(monkeypatch, two_devices):
    """Several GPUs: repeated calls whose arrays are on the current device are memoised under
    a signature holding that device; a call with an array elsewhere takes the full path."""
    from dnnkit import fastpath
    monkeypatch.setattr(placement, "one_device", False)
    monkeypatch.setattr(placement, "device_id", lambda: 0)
    from numba import cuda
    x = cuda.to_device(np.linspace(-1, 1, 8, dtype=np.float32))
    dnnkit.activation(x, "relu", backend="numba")
    hits = fastpath.stats["hits"]
    y = dnnkit.activation(x, "relu", backend="numba").copy_to_host()
    assert fastpath.stats["hits"] == hits + 1
    np.testing.assert_array_equal(y, np.maximum(np.linspace(-1, 1, 8, dtype=np.float32), 0))
    sig0 = fastpath.signature("activation", (x,), None, {}, 0)
    assert sig0 != fastpath.signature("activation", (x,), None, {}, 1)
    monkeypatch.setattr(placement, "memo_device", lambda args, kw: None)   # an array elsewhere
    dnnkit.activation(x, "relu", backend="numba")
    assert fastpath.stats["hits"] == hits + 1


def test_crosscheck_runs_the_other_backend_on_copies_of_the_state_a_call_updates(rng):
    """An op registered with ``updates`` changes those argument fields in place; the copy
    dispatch takes for dnn.crosscheck holds the values from before the call."""
    from dnnkit import dispatch as dispatch_mod
    from dnnkit.registry import OPS
    assert OPS["batch_norm_train"].updates == ("running_mean", "running_var")
    from numba import cuda
    import collections
    Args = collections.namedtuple("Args", "x running_mean running_var stream")
    rm = cuda.to_device(np.arange(3, dtype=np.float32))
    args = Args(None, rm, None, 0)
    checked = dispatch_mod._before_update("batch_norm_train", args)
    rm.copy_to_device(np.full(3, 7, np.float32))            # the call's in-place update
    assert checked.running_var is None and checked.x is None
    assert checked.running_mean is not rm
    np.testing.assert_array_equal(checked.running_mean.copy_to_host(), [0, 1, 2])
