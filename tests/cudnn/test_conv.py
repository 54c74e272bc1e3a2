"""cuDNN convolution layer without a GPU: prototypes against the real library and its headers,
algorithm tables, descriptor dims, algorithm choice and fallbacks (cuDNN stubbed), the cache."""

import ctypes
import glob
import importlib
import json
import os
import pkgutil
import re

import numpy as np
import pytest

import dnnkit.cudnn
from dnnkit.cudnn import algo_cache, api, conv, conv_algos, conv_plans, enums, loader, workspace
from dnnkit.errors import CudnnError, DnnkitError
from dnnkit.geometry import ConvGeom


def all_prototypes():
    """``api.PROTOTYPES`` once every module of dnnkit.cudnn has declared its own (each op
    family registers its prototypes when it is imported)."""
    for m in pkgutil.iter_modules(dnnkit.cudnn.__path__):
        importlib.import_module(f"dnnkit.cudnn.{m.name}")
    return api.PROTOTYPES


def _headers(real):
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(real.path))), "include")
    text = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(inc, "cudnn*.h"))))
    if "cudnnConvolutionForward" not in text:
        pytest.skip(f"no cuDNN headers in {inc}")
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)  # without comments


def test_every_prototype_is_in_the_real_library(real):
    lib = ctypes.CDLL(real.path)  # sub-libraries sit beside it, so dlopen/dlsym are safe
    missing = [n for n in all_prototypes() if not hasattr(lib, n)]
    assert not missing


def test_prototype_argument_counts_match_the_headers(real):
    text = _headers(real)
    for name, args in all_prototypes().items():
        m = re.search(rf"\b{name}\s*\(([^;{{]*?)\)\s*;", text)
        assert m, f"{name} not declared in the headers"
        params = m.group(1).strip()
        n = 0 if params in ("", "void") else params.count(",") + 1
        assert n == len(args), f"{name}: header has {n} parameters, prototype {len(args)}"


@pytest.mark.parametrize("table, prefix", [
    (enums.CONV_FWD_ALGO, "CUDNN_CONVOLUTION_FWD_ALGO_"),
    (enums.CONV_BWD_DATA_ALGO, "CUDNN_CONVOLUTION_BWD_DATA_ALGO_"),
    (enums.CONV_BWD_FILTER_ALGO, "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_"),
])
def test_algorithm_enums_match_the_headers(real, table, prefix):
    text = _headers(real)
    found = {m.group(1).lower(): int(m.group(2))  # BWD_*_ALGO_0 -> "algo_0"
             for m in re.finditer(rf"\b{prefix}(\w+)\s*=\s*(\d+)", text)}
    found = {("algo_" + k if k.isdigit() else k): v for k, v in found.items()}
    found.pop("count")
    assert found == table


def test_other_enums_match_the_headers(real):
    text = _headers(real)

    def val(name):
        return int(re.search(rf"\b{name}\s*=\s*(\d+)", text).group(1))
    assert (enums.CONVOLUTION, enums.CROSS_CORRELATION) == (val("CUDNN_CONVOLUTION"),
                                                             val("CUDNN_CROSS_CORRELATION"))
    assert [enums.MATH_DEFAULT, enums.MATH_TENSOR_OP, enums.MATH_TENSOR_OP_ALLOW_CONVERSION,
            enums.MATH_FMA] == [val(f"CUDNN_{n}") for n in (
                "DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH")]
    assert (enums.NON_DETERMINISTIC, enums.DETERMINISTIC) == (
        val("CUDNN_NON_DETERMINISTIC"), val("CUDNN_DETERMINISTIC"))
    assert enums.TENSOR_NCHW == val("CUDNN_TENSOR_NCHW")


def test_perf_struct_layout_matches_the_header(real):
    text = _headers(real)
    perf_t = conv_algos.AlgoPerf
    for which in ("Fwd", "BwdData", "BwdFilter"):
        body = re.search(rf"struct cudnnConvolution{which}AlgoPerfStruct\s*{{(.*?)}}", text,
                         re.S).group(1)
        fields = [re.sub(r"\[\d+\]", "", d.split()[-1]) for d in body.split(";") if d.strip()]
        assert fields == [f[0] for f in perf_t._fields_]
    offsets = {f[0]: getattr(perf_t, f[0]).offset for f in perf_t._fields_}
    assert offsets == {"algo": 0, "status": 4, "time": 8, "memory": 16, "determinism": 24,
                       "mathType": 28, "reserved": 32}
    assert ctypes.sizeof(perf_t) == 48


def test_every_module_declares_its_own_prototypes():
    """api.PROTOTYPES starts with what every family shares; each family declares the rest in
    its own file (``PROTOTYPES``, registered on import)."""
    everything = all_prototypes()
    declared = {}
    for m in pkgutil.iter_modules(dnnkit.cudnn.__path__):
        if m.name != "api":
            own = getattr(importlib.import_module(f"dnnkit.cudnn.{m.name}"), "PROTOTYPES", {})
            declared.update(dict.fromkeys(own, m.name))
    assert set(everything) - set(declared) == {
        "cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnGetVersion",
        "cudnnGetErrorString", "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor",
        "cudnnSetTensorNdDescriptor"}
    assert declared["cudnnActivationForward"] == "activation"
    assert declared["cudnnSoftmaxForward"] == "softmax"
    assert declared["cudnnConvolutionForward"] == "conv"
    assert declared["cudnnFindConvolutionForwardAlgorithmEx"] == "conv_algos"
    assert declared["cudnnSetFilterNdDescriptor"] == "conv_plans"


def test_algorithm_tables():
    assert conv_algos.FWD_ALGOS == {"none": 0, "small": 1, "large": 2, "direct": 3, "fft": 4,
                                    "fft_tiling": 5, "winograd": 6, "winograd_non_fused": 7}
    assert conv_algos.BWD_DATA_ALGOS == {"none": 0, "deterministic": 1, "fft": 2,
                                         "fft_tiling": 3, "winograd": 4,
                                         "winograd_non_fused": 5}
    assert conv_algos.BWD_FILTER_ALGOS == {"none": 0, "deterministic": 1, "fft": 2, "small": 3,
                                           "fft_tiling": 6, "winograd_non_fused": 5}
    assert conv_algos.CHOICES == ("guess_once", "guess_on_shape_change", "time_once",
                                  "time_on_shape_change")
    fwd, bwd_data, bwd_filter = conv_algos.FWD, conv_algos.BWD_DATA, conv_algos.BWD_FILTER
    assert fwd.default(False) == fwd.default(True) == 0
    assert (bwd_data.default(False), bwd_data.default(True)) == (0, 1)
    assert (bwd_filter.default(False), bwd_filter.default(True)) == (0, 1)
    assert fwd.algo_name(1) == "implicit_precomp_gemm"
    assert bwd_filter.algo_name(6) == "fft_tiling"
    assert (conv.FWD, conv.BWD_DATA, conv.BWD_FILTER) == (fwd, bwd_data, bwd_filter)


def geom2(**kw):
    g = dict(nd=2, x_shape=(2, 6, 1, 9, 8), w_shape=(4, 3, 1, 3, 2), stride=(1, 2, 1),
             padding=(0, 1, 0), dilation=(1, 1, 2), groups=2, flip=True)
    g.update(kw)
    return ConvGeom(**g)


def geom3(**kw):
    g = dict(nd=3, x_shape=(2, 3, 5, 6, 7), w_shape=(4, 3, 2, 3, 3), stride=(1, 1, 2),
             padding=(1, 0, 1), dilation=(2, 1, 1), groups=1, flip=False)
    g.update(kw)
    return ConvGeom(**g)


def test_descriptor_dims_2d_are_4d():
    d = conv_plans.descriptor_dims(geom2())
    assert (d.x, d.w, d.y, d.bias) == ((2, 6, 9, 8), (4, 3, 3, 2), (2, 4, 5, 6), (1, 4, 1, 1))
    assert (d.padding, d.stride, d.dilation) == ((1, 0), (2, 1), (1, 2))


def test_descriptor_dims_3d_are_5d():
    d = conv_plans.descriptor_dims(geom3())
    assert (d.x, d.w, d.y, d.bias) == ((2, 3, 5, 6, 7), (4, 3, 2, 3, 3), (2, 4, 5, 4, 4),
                                       (1, 4, 1, 1, 1))
    assert (d.padding, d.stride, d.dilation) == ((1, 0, 1), (1, 1, 2), (2, 1, 1))


def test_math_type():
    assert conv.math_type("float32", "float32", False) == enums.MATH_FMA
    assert conv.math_type("float32", "float32", True) == enums.MATH_DEFAULT
    assert conv.math_type("float16", "float32", False) == enums.MATH_TENSOR_OP
    assert conv.math_type("float64", "float64", True) == enums.MATH_DEFAULT


def test_supports():
    g = geom2()
    assert conv.supports(g, "float32", "float32") is None
    assert conv.supports(g, "float16", "float16") is None
    assert conv.supports(g, "float16", "float32") is None
    assert "float16 data with float64 compute" in conv.supports(g, "float16", "float64")
    assert "float64 data with float32" in conv.supports(g, "float64", "float32")
    assert "float32 data with float16" in conv.supports(g, np.float32, "float16")
    assert "data type int32" in conv.supports(g, "int32", "float32")
    big = geom3(x_shape=(2**31, 1, 1, 1, 1), w_shape=(1, 1, 1, 1, 1), padding=(0, 0, 0),
                dilation=(1, 1, 1), stride=(1, 1, 1))
    assert "32-bit" in conv.supports(big, "float32", "float32")
    many = geom3(x_shape=(2**11, 2**10, 2**10, 1, 1), w_shape=(1, 2**10, 1, 1, 1),
                 padding=(0, 0, 0), dilation=(1, 1, 1), stride=(1, 1, 1))
    assert "2**31 - 1" in conv.supports(many, "float32", "float32")
    assert "empty" in conv.supports(geom2(x_shape=(0, 6, 1, 9, 8)), "float32", "float32")
    assert "y shape (2, 4, 1, 0, 6) has an empty" in conv.supports(
        geom2(x_shape=(2, 6, 1, 1, 8), padding=(0, 0, 0)), "float32", "float32")
    assert "groups" in conv.supports(geom2(groups=4), "float32", "float32")
    for bad in (dict(stride=(1, 0, 1)), dict(dilation=(1, 1, 0)), dict(padding=(0, -1, 0))):
        assert "must be >= 1" in conv.supports(geom2(**bad), "float32", "float32")


# --- algorithm choice with cuDNN stubbed --------------------------------------------------------

def perf(algo, status=0, memory=0, det=1):
    return conv_algos.AlgoPerf(algo=algo, status=status, memory=memory, determinism=det)


def test_pick_filters_status_memory_and_determinism():
    perfs = [perf(4, status=3000), perf(2, memory=1 << 20), perf(0, det=0), perf(1, memory=10)]
    pick, bwd_data = conv_algos.pick, conv_algos.BWD_DATA
    assert pick(bwd_data, perfs, False, 100) == 0
    assert pick(bwd_data, perfs, True, 100) == 1
    assert pick(bwd_data, perfs, True, None) == 2
    assert pick(bwd_data, perfs[:2], False, 0) == 0     # none usable: the default
    assert pick(bwd_data, perfs[:2], True, 0) == 1
    assert pick(conv_algos.FWD, [perf(99)], False, None) == 0      # an unknown enum is skipped


def fake_call(d):
    plan = conv_plans.Plan((None, None, None), None, "ctx", {})
    return conv_plans.Call(d, None, plan, (None, None, None), np.dtype("float32"), 0)


@pytest.fixture
def fresh_cache():
    algo_cache.clear()
    yield
    algo_cache.clear()


def test_named_algorithms_and_determinism():
    args = ([], geom2(), "float32", enums.MATH_FMA)
    assert conv_algos.choose(fake_call(conv_algos.FWD), "fft", *args, True, 0) == 4
    assert conv_algos.choose(fake_call(conv_algos.BWD_DATA), "none", *args, False, 0) == 0
    assert conv_algos.choose(fake_call(conv_algos.BWD_DATA), "none", *args, True, 0) == 1
    assert conv_algos.choose(fake_call(conv_algos.BWD_FILTER), "small", *args, False, 0) == 3
    assert conv_algos.choose(fake_call(conv_algos.BWD_FILTER), "small", *args, True, 0) == 1
    assert conv_algos.choose(fake_call(conv_algos.BWD_FILTER), "fft", *args, True, 0) == 2


def _stub_choice(monkeypatch, guessed, timed):
    calls = []
    monkeypatch.setattr(conv_algos, "cache_key", lambda c, *a: f"key-{c.d.name}-{a[-1]}")
    monkeypatch.setattr(conv_algos, "heuristics", lambda c: calls.append("guess") or guessed)
    monkeypatch.setattr(conv_algos, "timings", lambda c, lim: calls.append("time") or timed)
    return calls


def test_guess_once_is_remembered(monkeypatch, fresh_cache):
    calls = _stub_choice(monkeypatch, [perf(1, memory=5)], None)
    c = fake_call(conv_algos.FWD)
    for _ in range(3):
        assert conv_algos.choose(c, "guess_once", [], geom2(), "float32", 3, False, 10) == 1
    assert calls == ["guess"]
    assert algo_cache.stats()["hits"] == 2 and algo_cache.stats()["misses"] == 1


def test_time_without_workspace_memory_guesses_and_forgets(monkeypatch, fresh_cache):
    calls = _stub_choice(monkeypatch, [perf(2)], None)  # timings answers None: no memory
    c = fake_call(conv_algos.FWD)
    assert conv_algos.choose(c, "time_once", [], geom2(), "float32", 3, False, 10) == 2
    assert conv_algos.choose(c, "time_once", [], geom2(), "float32", 3, False, 10) == 2
    assert calls == ["time", "guess", "time", "guess"]
    calls = _stub_choice(monkeypatch, [], [perf(5, status=3000), perf(7)])
    assert conv_algos.choose(c, "time_once", [], geom2(), "float32", 3, False, 10) == 7
    assert conv_algos.choose(c, "time_once", [], geom2(), "float32", 3, False, 10) == 7
    assert calls == ["time"]


def _stub_workspace(monkeypatch, sizes, oom=()):
    monkeypatch.setattr(conv_algos, "workspace_size", lambda c, algo: sizes[algo])
    monkeypatch.setattr(conv_algos, "alloc",
                        lambda n, s: None if (not n or n in oom) else np.zeros(n, np.uint8))


def test_workspace_over_the_limit_falls_back_to_the_default(monkeypatch, caplog):
    _stub_workspace(monkeypatch, {0: 0, 1: 64, 2: 1000})
    c = fake_call(conv_algos.FWD)
    with caplog.at_level("DEBUG", logger="dnnkit"):
        assert conv_algos.workspace_for(c, 2, False, 100)[::2] == (0, 0)
    assert "gemm needs 1000 bytes of workspace, over workspace_limit 100; using implicit_gemm" \
        in caplog.text
    algo, ws, n = conv_algos.workspace_for(c, 1, False, 100)
    assert (algo, ws.size, n) == (1, 64, 64)
    assert conv_algos.workspace_for(c, 2, False, None)[::2] == (2, 1000)


def test_workspace_that_cannot_be_allocated_falls_back(monkeypatch, caplog):
    _stub_workspace(monkeypatch, {0: 0, 1: 64}, oom=(64,))
    with caplog.at_level("DEBUG", logger="dnnkit"):
        c = fake_call(conv_algos.FWD)
        assert conv_algos.workspace_for(c, 1, False, 1 << 30)[::2] == (0, 0)
    assert "cannot allocate its 64-byte workspace" in caplog.text


def test_default_over_the_limit_raises(monkeypatch):
    _stub_workspace(monkeypatch, {0: 0, 1: 32, 3: 500})
    c = fake_call(conv_algos.BWD_FILTER)
    with pytest.raises(DnnkitError, match="algo_1 .the default. needs 32 bytes"):
        conv_algos.workspace_for(c, 3, True, 16)
    assert conv_algos.workspace_for(c, 3, False, 16)[0] == 0


def test_alloc_treats_only_out_of_memory_as_a_fallback(monkeypatch):
    from dnnkit import memory

    class CudaAPIError(Exception):  # Numba's (real or simulator) carries .code
        def __init__(self, code):
            super().__init__(code, "CUDA_ERROR")
            self.code = code

    def boom(exc):
        def f(*a, **k):
            raise exc
        return f
    for exc in (CudaAPIError(2), MemoryError(), RuntimeError("CUDA_ERROR_OUT_OF_MEMORY")):
        monkeypatch.setattr(memory, "scratch", boom(exc))
        assert workspace.alloc(10, 0) is None
    for exc in (CudaAPIError(700), CudaAPIError(12), ValueError("bad")):
        monkeypatch.setattr(memory, "scratch", boom(exc))
        with pytest.raises(type(exc)):
            workspace.alloc(10, 0)
    assert workspace.alloc(0, 0) is None


def _stub_convolve(monkeypatch, fail):
    ran = []

    def execute(c, algo, det, lim):
        ran.append(algo)
        if algo in fail:
            raise CudnnError("cudnnConvolutionForward", fail[algo], "CUDNN_STATUS_X", "ctx")
        return algo
    monkeypatch.setattr(conv, "open_call", lambda *a: fake_call(conv_algos.FWD))
    monkeypatch.setattr(conv, "execute", execute)
    return ran


def _arrays(g, dtype="float32"):
    return [np.zeros(s, dtype) for s in (g.x_shape, g.w_shape, g.y_shape)]


def _fwd(algo, g=None, **kw):
    g = g or geom2()
    opts = dict(algo=algo, compute_dtype="float32", allow_tf32=False, deterministic=False,
                workspace_limit=0, stream=0)
    opts.update(kw)
    return conv.forward(*_arrays(g, kw.pop("dtype", "float32")), g, **opts)


def test_not_supported_named_algorithm_retries_with_the_default(monkeypatch, caplog):
    ran = _stub_convolve(monkeypatch, {6: 3007})
    with caplog.at_level("DEBUG", logger="dnnkit"):
        assert _fwd("winograd") == "implicit_gemm"
    assert ran == [6, 0] and "winograd: CUDNN_STATUS_X; retrying with implicit_gemm" \
        in caplog.text


def test_other_errors_and_a_failing_default_raise(monkeypatch):
    ran = _stub_convolve(monkeypatch, {4: 2000})
    with pytest.raises(CudnnError):
        _fwd("fft")
    assert ran == [4]
    ran = _stub_convolve(monkeypatch, {0: 3000})
    with pytest.raises(CudnnError):
        _fwd("none")
    assert ran == [0]


def test_argument_errors_come_before_any_cudnn_call(monkeypatch):
    _stub_convolve(monkeypatch, {})
    monkeypatch.setattr(conv, "open_call", None)  # would fail if reached
    with pytest.raises(ValueError, match="algo must be one of none, small"):
        _fwd("fastest")
    with pytest.raises(ValueError, match="float32 data with float64 compute"):
        _fwd("none", compute_dtype="float64")
    g = geom2()
    x, w, y = _arrays(g)
    with pytest.raises(ValueError, match=r"expected \(2, 4, 1, 5, 6\)"):
        conv.forward(x, w, x, g, algo="none", compute_dtype="float32", allow_tf32=False,
                     deterministic=False, workspace_limit=0, stream=0)


# --- cache ---------------------------------------------------------------------------------

DEVICE = {"pci": "0000:1b:00", "name": "NVIDIA H200", "cc": (9, 0)}


def key_args(**kw):
    a = dict(device=DEVICE, cudnn_version=92800, nd=2,
             shapes=[(2, 6, 1, 9, 8), (4, 3, 1, 3, 2), (2, 4, 1, 5, 3)],
             strides=[(432, 72, 72, 8, 1), (18, 6, 6, 2, 1), (60, 15, 15, 3, 1)],
             padding=(0, 1, 0), stride=(1, 2, 1), dilation=(1, 1, 2), groups=2, flip=True,
             dtype="float32", compute_dtype="float32", math_type=enums.MATH_FMA,
             deterministic=False, workspace_limit=1 << 20)
    a.update(kw)
    return a


CHANGES = {
    "dtype": "float16", "compute_dtype": "float64", "padding": (0, 1, 1), "stride": (1, 1, 1),
    "dilation": (1, 1, 1), "groups": 1, "flip": False, "workspace_limit": 0,
    "deterministic": True, "math_type": enums.MATH_DEFAULT, "cudnn_version": 92700, "nd": 3,
    "device": dict(DEVICE, pci="0000:2a:00"),
    "shapes": [(3, 6, 1, 9, 8), (4, 3, 1, 3, 2), (3, 4, 1, 5, 3)],
    "strides": [(432, 72, 72, 8, 1), (18, 6, 6, 2, 1), (60, 15, 15, 3, 2)],
}


@pytest.mark.parametrize("field", sorted(CHANGES) + ["device.name", "device.cc"])
def test_key_changes_with_every_component(field):
    base = algo_cache.make_key("fwd", "guess_once", **key_args())
    assert base == algo_cache.make_key("fwd", "guess_once", **key_args())
    if field.startswith("device."):
        sub = field.split(".")[1]
        kw = {"device": dict(DEVICE, **{sub: "NVIDIA H100" if sub == "name" else (8, 0)})}
    else:
        kw = {field: CHANGES[field]}
    assert algo_cache.make_key("fwd", "guess_once", **key_args(**kw)) != base


def test_workspace_limit_enters_the_key_as_a_power_of_two():
    def k(limit):
        return algo_cache.make_key("fwd", "guess_once", **key_args(workspace_limit=limit))
    assert k(1000) == k(513) == k(512) != k(1024) == k(2047) != k(0) != k(None)
    assert json.loads(k(3 << 30))["workspace_limit"] == 2 << 30


def test_key_changes_with_direction_and_kind_but_not_persistence():
    k = algo_cache.make_key("fwd", "guess_once", **key_args())
    assert algo_cache.make_key("bwd_data", "guess_once", **key_args()) != k
    assert algo_cache.make_key("fwd", "time_once", **key_args()) != k
    assert algo_cache.make_key("fwd", "guess_on_shape_change", **key_args()) == k
    assert json.loads(k)["kind"] == "guess" and json.loads(k)["math_type"] == "fma"
    with pytest.raises(ValueError, match="choice must be one of"):
        algo_cache.make_key("fwd", "guess", **key_args())
    with pytest.raises(ValueError, match="direction"):
        algo_cache.make_key("forward", "guess_once", **key_args())


def test_conv_key_covers_the_geometry(monkeypatch):
    monkeypatch.setattr(algo_cache, "current_device", lambda: DEVICE)
    monkeypatch.setattr(conv_algos, "key_memo", {})
    c = fake_call(conv_algos.FWD)

    def key(g, **kw):
        o = dict(compute_dtype="float32", math_t=3, deterministic=False, limit=0,
                 choice="guess_once")
        o.update(kw)
        return conv_algos.cache_key(c, _arrays(g), g, *o.values())
    base = key(geom2())
    assert base == key(geom2())
    for g in (geom2(padding=(0, 0, 0)), geom2(stride=(1, 1, 1)), geom2(dilation=(1, 1, 1)),
              geom2(groups=1, w_shape=(4, 6, 1, 3, 2)), geom2(flip=False),
              geom2(x_shape=(2, 6, 1, 9, 9))):
        assert key(g) != base, g
    for kw in ({"compute_dtype": "float16"}, {"math_t": 0}, {"deterministic": True},
               {"limit": 1}, {"choice": "time_once"}):
        assert key(geom2(), **kw) != base, kw
    fields = json.loads(base)
    assert fields["strides"][0] == [432, 72, 72, 8, 1]
    assert fields["cudnn_version"] == loader.status().version
    assert len(conv_algos.key_memo) == 12 and key(geom2()) is base  # memoized by the raw inputs


def test_on_shape_change_keeps_only_the_last_key(fresh_cache):
    k1 = algo_cache.make_key("fwd", "guess_once", **key_args())
    k2 = algo_cache.make_key("fwd", "guess_once", **key_args(groups=1))
    ch = "guess_on_shape_change"
    assert algo_cache.lookup(ch, "fwd", k1) is None
    algo_cache.store(ch, "fwd", k1, "fft")
    assert algo_cache.lookup(ch, "fwd", k1) == "fft"
    algo_cache.store(ch, "fwd", k2, "gemm")
    assert algo_cache.lookup(ch, "fwd", k2) == "gemm"
    assert algo_cache.lookup(ch, "fwd", k1) is None       # forgotten
    assert algo_cache.lookup("time_on_shape_change", "fwd", k2) is None   # its own slot
    assert algo_cache.lookup(ch, "bwd_data", k2) is None
    assert algo_cache.get(k2) is None                      # never in the *_once memo
    assert algo_cache.stats() == {"hits": 2, "misses": 5, "entries": 0, "latest": 1}


def test_once_hits_and_misses(fresh_cache):
    k = algo_cache.make_key("bwd_filter", "time_once", **key_args())
    assert algo_cache.lookup("time_once", "bwd_filter", k) is None
    algo_cache.store("time_once", "bwd_filter", k, "algo_3")
    assert algo_cache.lookup("time_once", "bwd_filter", k) == "algo_3"
    assert algo_cache.get(k) == "algo_3"
    assert algo_cache.stats() == {"hits": 2, "misses": 1, "entries": 1, "latest": 0}
    with pytest.raises(ValueError, match="not a cuDNN bwd_filter algorithm"):
        algo_cache.store("time_once", "bwd_filter", k, "implicit_gemm")


def test_save_load_round_trip(tmp_path, fresh_cache):
    keys = [algo_cache.make_key(d, "time_once", **key_args(groups=g))
            for d in ("fwd", "bwd_data") for g in (1, 2)]
    for k, name in zip(keys, ("fft", "gemm", "algo_1", "fft_tiling")):
        algo_cache.store("time_once", json.loads(k)["direction"], k, name)
    algo_cache.store("guess_on_shape_change", "fwd", keys[0], "direct")  # not saved
    p1, p2 = tmp_path / "a.json", tmp_path / "b.json"
    algo_cache.save(p1)
    doc = json.loads(p1.read_text())
    assert doc["format"] == algo_cache.FORMAT and doc["version"] == algo_cache.FORMAT_VERSION
    assert len(doc["entries"]) == 4
    algo_cache.clear()
    assert algo_cache.load(str(p1)) == 4
    assert [algo_cache.get(k) for k in keys] == ["fft", "gemm", "algo_1", "fft_tiling"]
    algo_cache.save(p2)
    assert p1.read_bytes() == p2.read_bytes()
    algo_cache.put(keys[0], "direct")                    # memory wins over the file on merge
    algo_cache.load(p1)
    assert algo_cache.get(keys[0]) == "direct"


@pytest.mark.parametrize("content, match", [
    ("{not json", "invalid JSON"),
    ('{"format": "other", "version": 1, "entries": []}', "not a dnnkit algorithm cache"),
    (json.dumps({"format": algo_cache.FORMAT, "version": 99, "entries": []}),
     "format version 99"),
    (json.dumps({"format": algo_cache.FORMAT, "version": 1, "entries": {}}), "not a list"),
    (json.dumps({"format": algo_cache.FORMAT, "version": 1,
                 "entries": [{"key": {"direction": "fwd"}, "algo": "fft"}]}), "entry 0"),
    (json.dumps({"format": algo_cache.FORMAT, "version": 1, "entries": [
        {"key": json.loads(algo_cache.make_key("fwd", "guess_once", **key_args())),
         "algo": "algo_0"}]}), "not a cuDNN fwd algorithm"),
])
def test_bad_files_raise_value_error_naming_the_file(tmp_path, fresh_cache, content, match):
    p = tmp_path / "algos.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=match) as e:
        algo_cache.load(p)
    assert str(p) in str(e.value)
    assert algo_cache.stats()["entries"] == 0
