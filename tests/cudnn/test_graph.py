"""cuDNN graph (backend) API layer without a GPU: enum values against the installed headers,
convolution operations built and finalized by the real library (host work only), descriptor
counts, and conv_graph's choosing and caching logic with plans stubbed."""

import gc
import types

import numpy as np
import pytest

from dnnkit.cudnn import algo_cache, api, conv_graph, conv_plans, descriptors, enums, graph
from dnnkit.cudnn import workspace
from dnnkit.errors import CudnnError
from tests.cudnn.test_conv import _headers, geom2, geom3


@pytest.fixture
def real_lib(real, monkeypatch):
    """dnnkit's cuDNN layer bound to the real library even without a GPU (descriptors need
    none; only handles, graphs on a handle and execution do)."""
    monkeypatch.setattr(api, "library", lambda: real.lib)
    return real.lib


@pytest.mark.parametrize("table, prefix", [
    (enums.BACKEND_DESCRIPTOR, "CUDNN_BACKEND_"), (enums.ATTR_TYPE, "CUDNN_TYPE_"),
    (enums.ATTR, "CUDNN_ATTR_"), (enums.HEUR_MODE, "CUDNN_HEUR_MODE_"),
    (enums.NUMERICAL_NOTE, "CUDNN_NUMERICAL_NOTE_"), (enums.BEHAVIOR_NOTE, "CUDNN_BEHAVIOR_NOTE_"),
])
def test_graph_enums_match_the_headers(real, table, prefix):
    import re
    text = _headers(real)
    for name, value in table.items():
        m = re.search(rf"\b{prefix}{name}\b[^=,]*=\s*(\d+)", text)
        assert m, f"{prefix}{name} not in the headers"
        assert int(m.group(1)) == value, f"{prefix}{name}"


def test_pure_helpers():
    assert graph.packed_strides((2, 3, 4, 5)) == [60, 20, 5, 1]
    assert graph.alignment([0x1000, 0x2010]) == 16
    assert graph.alignment([0x1000, 0x2004]) == 4
    assert graph.alignment([0x1001]) == 1
    assert graph.backend_kind("EXECUTION_PLAN_DESCRIPTOR") == "BackendExecutionPlan"
    assert graph.backend_kind("VARIANT_PACK_DESCRIPTOR") == "BackendVariantPack"


def _config(numerical=(), behavior=()):
    c = object.__new__(graph.EngineConfig)
    c.numerical, c.behavior = set(numerical), set(behavior)
    return c


def test_engine_filters():
    tc, down = enums.NUMERICAL_NOTE["TENSOR_CORE"], enums.NUMERICAL_NOTE["DOWN_CONVERT_INPUTS"]
    nondet = enums.NUMERICAL_NOTE["NONDETERMINISTIC"]
    rtc = enums.BEHAVIOR_NOTE["RUNTIME_COMPILATION"]
    assert _config().usable(False, True)
    assert not _config([tc]).usable(False, False) and _config([tc]).usable(True, False)
    assert not _config([down]).usable(False, False) and _config([down]).usable(True, False)
    assert not _config([nondet]).usable(True, True) and _config([nondet]).usable(True, False)
    assert not _config(behavior=[rtc]).usable(True, False)


@pytest.mark.gpu   # finalizing loads cuDNN's engine libraries, which need the CUDA driver
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("geom", [geom2(), geom3(), geom2(groups=1, w_shape=(4, 6, 1, 3, 2))],
                         ids=["2d-groups-flip", "3d", "2d"])
@pytest.mark.parametrize("dtype, compute", [("float32", "float32"), ("float16", "float32"),
                                            ("float64", "float64")])
def test_operations_finalize_and_are_destroyed(real_lib, direction, geom, dtype, compute):
    live0 = descriptors.live_counts()
    op, refs = conv_graph.build_operation(direction, conv_plans.descriptor_dims(geom), dtype,
                                          compute, geom.flip, 16)
    name = {"fwd": "Forward", "bwd_data": "BackwardData", "bwd_filter": "BackwardFilter"}
    assert _delta(live0, descriptors.live_counts()) == {
        "BackendTensor": 3, "BackendConvolution": 1,
        f"BackendOperationConvolution{name[direction]}": 1}
    del op, refs
    gc.collect()
    assert _delta(live0, descriptors.live_counts()) == {}


def _delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)
            if after.get(k, 0) != before.get(k, 0)}


def test_a_tensor_that_fails_leaks_nothing(real_lib):
    """A negative dimension (refused when set or finalized on a GPU machine; without a driver
    every finalize fails loading cuDNN's engine library): the error names the descriptor and
    the step, and nothing stays alive."""
    live0 = descriptors.live_counts()
    with pytest.raises(CudnnError) as ei:
        graph.tensor(1, (2, -3, 3, 3), enums.DATA_FLOAT, 16)
    assert "TENSOR_DESCRIPTOR: " in str(ei.value)
    gc.collect()
    assert _delta(live0, descriptors.live_counts()) == {}


def test_engine_names_are_cache_entries(tmp_path):
    algo_cache.clear()
    key = algo_cache.make_key(
        "fwd", "guess_once", device={"pci": "0000:01:00", "name": "GPU", "cc": (9, 0)},
        cudnn_version=91900, nd=2, shapes=[(1, 2, 3, 3)] * 3, strides=[(18, 9, 3, 1)] * 3,
        padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1, flip=False, dtype="float32",
        compute_dtype="float32", math_type=3, deterministic=False, workspace_limit=None)
    algo_cache.store("guess_once", "fwd", key, "engine12_k3=1_k17=-1")
    path = tmp_path / "cache.json"
    algo_cache.save(path)
    algo_cache.clear()
    assert algo_cache.load(path) == 1 and algo_cache.get(key) == "engine12_k3=1_k17=-1"
    with pytest.raises(ValueError, match="graph-API engine"):
        algo_cache.store("guess_once", "fwd", key, "engine_x")
    algo_cache.clear()


# ------------------------------------------------ conv_graph's logic, plans stubbed


class FakePlan:
    def __init__(self, name, ws, fails=False):
        self.name, self.workspace, self.fails, self.runs = name, ws, fails, []

    def execute(self, h, pointers, wp, context=""):
        if self.fails:
            raise CudnnError("cudnnBackendExecute", 3000, "CUDNN_STATUS_NOT_SUPPORTED", "")
        self.runs.append((pointers, wp))


class FakeGraph:
    def __init__(self, plans):
        self.configs = [types.SimpleNamespace(name=p.name) for p in plans]
        self._plans = {p.name: p for p in plans}
        self.built = 0

    def plan(self, h, c):
        return self._plans[c.name]

    def named(self, h, name):
        return self._plans.get(name)


@pytest.fixture
def stubbed(monkeypatch):
    algo_cache.clear()
    conv_graph.clear()
    graphs = {}
    monkeypatch.setattr(conv_graph.handle, "get", lambda s: types.SimpleNamespace(value=7))

    def make(h, direction, *spec):
        g = graphs["g"]
        g.built += 1
        return g
    monkeypatch.setattr(conv_graph, "cached_graph", make)
    oom = set()
    monkeypatch.setattr(workspace, "alloc",
                        lambda n, s: None if (not n or n in oom) else np.zeros(n, np.uint8))
    monkeypatch.setattr(workspace, "held", lambda ws: _Held(ws))
    yield graphs, oom
    algo_cache.clear()
    conv_graph.clear()


class _Held:
    def __init__(self, ws):
        self.ws = ws

    def __enter__(self):
        return None if self.ws is None else self.ws.size

    def __exit__(self, *a):
        pass


def _run(choice="guess_once", limit=None, raw=("r",)):
    return conv_graph.convolve("fwd", (16, 32, 48), raw, lambda: f"key-{raw}",
                               lambda: (None, "float32", "float32", False, False, False),
                               limit, 0, choice)


def test_guess_takes_the_first_plan_that_fits_and_remembers_it(stubbed):
    graphs, _ = stubbed
    big, small = FakePlan("engine1", 1000), FakePlan("engine2", 64)
    graphs["g"] = FakeGraph([big, small])
    assert _run(limit=100) == "engine2"
    assert _run(limit=100) == "engine2"            # the fast path: no graph lookup
    assert graphs["g"].built == 1 and len(small.runs) == 2 and small.runs[0][1] == 64
    assert algo_cache.get("key-('r',)") == "engine2"
    assert _run(limit=None, raw=("other",)) == "engine1"   # no limit: the heuristics' first


def test_a_remembered_plan_over_a_smaller_limit_is_chosen_again(stubbed):
    graphs, _ = stubbed
    graphs["g"] = FakeGraph([FakePlan("engine1", 1000), FakePlan("engine2", 0)])
    assert _run(limit=None) == "engine1"
    assert _run(limit=10) == "engine2"


def test_out_of_memory_runs_a_plan_without_workspace_once(stubbed):
    graphs, oom = stubbed
    big, zero = FakePlan("engine1", 1000), FakePlan("engine2", 0)
    graphs["g"] = FakeGraph([big, zero])
    oom.add(1000)
    assert _run() == "engine2" and zero.runs == [((16, 32, 48), None)]
    oom.clear()
    assert _run() == "engine1"                     # memory is back: the chosen plan again


def test_no_usable_plan_returns_none(stubbed):
    graphs, _ = stubbed
    graphs["g"] = FakeGraph([FakePlan("engine1", 1000)])
    assert _run(limit=10) is None
    graphs["g"] = FakeGraph([])
    assert _run(raw=("x",)) is None


def test_time_runs_the_candidates_and_keeps_the_fastest(stubbed, monkeypatch):
    graphs, _ = stubbed
    plans = [FakePlan("engine1", 0), FakePlan("engine2", 8), FakePlan("engine3", 0, fails=True)]
    graphs["g"] = FakeGraph(plans)
    times = {"engine1": 3.0, "engine2": 1.0}
    order = []

    class Ev:
        def record(self, s):
            pass

        def synchronize(self):
            pass
    fake_cuda = types.SimpleNamespace(
        event=Ev, default_stream=lambda: None, external_stream=lambda s: None,
        event_elapsed_time=lambda a, b: times[order[-1]] * conv_graph.TIME_REPS)

    real_execute = FakePlan.execute

    def execute(self, *a, **k):
        order.append(self.name)
        return real_execute(self, *a, **k)
    monkeypatch.setattr(FakePlan, "execute", execute)
    import numba
    monkeypatch.setattr(numba, "cuda", fake_cuda, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "numba.cuda", fake_cuda)
    assert _run("time_once") == "engine2"
    assert "engine3" in order                      # tried, failed, skipped
