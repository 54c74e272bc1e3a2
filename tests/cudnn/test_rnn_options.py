"""cuDNN RNN options without a GPU, cuDNN stubbed (tests/cudnn/test_rnn.py's FakeCudnn): the
LSTM projection (projSize, the h and c descriptors), the algorithms (cudnnRNNAlgo_t, the
dynamic plan's builds, supports() and "auto"), and the dropout between layers (the states per
seed, the restore at offset 0, the offsets that follow, the descriptor without states for
inference)."""

import types

import numpy as np
import pytest

from dnnkit.cudnn import rnn as cr, rnn_dropout
from dnnkit.errors import CudnnError
from dnnkit.ops import rnn_cudnn
from dnnkit.rnn_layout import RNNConfig
from tests.cudnn.test_rnn import Dev, FakeCudnn, Shaped, W_BYTES, fwd_reason, run_forward, val

PROJ = RNNConfig("lstm", 3, 6, 2, bidirectional=True, proj_size=4)
DROP = RNNConfig("gru", 3, 4, 3, dropout=0.25)


@pytest.fixture
def fake(monkeypatch):
    f = FakeCudnn(monkeypatch, W_BYTES)
    yield f
    cr.clear_plans()
    rnn_dropout.clear()


# --- projection ----------------------------------------------------------------------------

def test_projection_sets_proj_size_and_separate_h_and_c_descriptors(fake):
    saved, a = run_forward(PROJ, T=5, N=3)
    (rd,) = fake.named("cudnnSetRNNDescriptor_v8")
    assert [val(v) for v in rd[9:13]] == [3, 6, 4, 2]       # input, hidden, proj, layers
    cd, hd = fake.named("cudnnSetTensorNdDescriptor")     # c made first
    assert list(hd[3]) == [4, 3, 4] and list(cd[3]) == [4, 3, 6]    # (L*D, N, P), (L*D, N, H)
    xd, yd = fake.named("cudnnSetRNNDataDescriptor")
    assert val(yd[5]) == 2 * 4                               # y: D*P
    (f,) = fake.named("cudnnRNNForward")
    assert val(f[8]) == val(saved.data.h) and val(f[11]) == val(saved.data.c)
    assert val(saved.data.h) != val(saved.data.c)
    dy, dx, dw = Dev(a["y"].shape), Dev(a["x"].shape), Dev(a["w"].shape)
    cr.backward(PROJ, a["w"], a["x"], a["y"], dy, None, None, a["hx"], a["cx"], dx,
                Dev(a["hy"].shape), Dev(a["cy"].shape), dw, saved, stream=None)
    (bd,) = fake.named("cudnnRNNBackwardData_v8")
    assert val(bd[8]) == val(saved.data.h) and val(bd[12]) == val(saved.data.c)


def test_projection_runs_only_on_the_standard_algorithm():
    why = fwd_reason(PROJ, Shaped((5, 3, 3)), algo="persist_static")
    assert "projection" in why and "standard" in why and "persist_static" in why
    assert fwd_reason(PROJ, Shaped((5, 3, 3)), algo="standard") is None
    assert rnn_cudnn.auto_algo(PROJ, Shaped((5, 3, 3)), None, False, None) == "standard"


def test_state_shapes_with_a_projection(monkeypatch):
    monkeypatch.setattr(cr, "forward", lambda *a, **kw: None)
    x = np.zeros((5, 3, 3), np.float32)
    y, hy, cy, _ = rnn_cudnn._forward_cudnn(PROJ, None, x, None, None, None, False, None, 0,
                                            "standard", 0)
    assert (y.shape, hy.shape, cy.shape) == ((5, 3, 8), (4, 3, 4), (4, 3, 6))


# --- algorithms ----------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["standard", "persist_static", "persist_static_small_h",
                                  "persist_dynamic"])
def test_the_descriptor_carries_the_algorithm(fake, algo):
    saved, _ = run_forward(RNNConfig("lstm", 3, 4), algo=algo)
    (rd,) = fake.named("cudnnSetRNNDescriptor_v8")
    assert val(rd[1]) == cr.ALGO[algo] and saved.net.algo == algo
    assert len(fake.named("cudnnBuildRNNDynamic")) == (algo == "persist_dynamic")


def test_the_dynamic_plan_is_built_per_batch_size(fake):
    cfg = RNNConfig("gru", 3, 4)
    saved, a = run_forward(cfg, N=3, algo="persist_dynamic")
    run_forward(cfg, N=3, algo="persist_dynamic")
    assert [val(b[2]) for b in fake.named("cudnnBuildRNNDynamic")] == [3]
    run_forward(cfg, N=5, algo="persist_dynamic")
    assert [val(b[2]) for b in fake.named("cudnnBuildRNNDynamic")] == [3, 5]
    # the N = 3 state's backward builds the plan for its own batch again
    cr.backward(cfg, a["w"], a["x"], a["y"], Dev(a["y"].shape), None, None, None, None,
                Dev(a["x"].shape), Dev(a["hy"].shape), None, Dev(a["w"].shape), saved,
                stream=None)
    assert [val(b[2]) for b in fake.named("cudnnBuildRNNDynamic")] == [3, 5, 3]
    assert fake.count("cudnnCreateRNNDescriptor") == 1


def test_standard_and_persistent_plans_are_separate(fake):
    cfg = RNNConfig("lstm", 3, 4)
    run_forward(cfg, algo="standard")
    run_forward(cfg, algo="persist_static")
    assert fake.count("cudnnCreateRNNDescriptor") == 2
    assert fake.count("cudnnGetRNNTempSpaceSizes") == 2      # sizes per algorithm


def test_a_refused_algorithm_is_a_supports_reason(fake):
    fake.refuse_algos.add(cr.ALGO["persist_static_small_h"])
    cfg = RNNConfig("lstm", 3, 4)
    why = fwd_reason(cfg, Shaped((5, 3, 3)), algo="persist_static_small_h")
    assert "persist_static_small_h" in why and "STATUS_3000" in why
    assert fwd_reason(cfg, Shaped((5, 3, 3)), algo="persist_static") is None
    n = fake.count("cudnnGetRNNTempSpaceSizes")
    fwd_reason(cfg, Shaped((5, 3, 3)), algo="persist_static_small_h")    # remembered
    assert fake.count("cudnnGetRNNTempSpaceSizes") == n


def test_auto_picks_persist_static_for_small_batches_where_cudnn_takes_it(fake):
    small = RNNConfig("lstm", 3, 64)
    limit = rnn_cudnn.AUTO_PERSIST_MAX_BATCH
    assert rnn_cudnn.auto_algo(small, Shaped((5, limit, 3)), None, True, None) == \
        "persist_static"
    assert rnn_cudnn.auto_algo(small, Shaped((5, limit + 1, 3)), None, True, None) == "standard"
    wide = RNNConfig("lstm", 3, rnn_cudnn.AUTO_PERSIST_MAX_HIDDEN + 1)
    assert rnn_cudnn.auto_algo(wide, Shaped((5, 1, 3)), None, True, None) == "standard"
    fake.refuse_algos.add(cr.ALGO["persist_static"])
    other = RNNConfig("gru", 3, 64)
    assert rnn_cudnn.auto_algo(other, Shaped((5, 4, 3)), None, True, None) == "standard"
    assert fwd_reason(other, Shaped((5, 4, 3)), algo="auto") is None


def test_auto_falls_back_to_standard_when_the_call_is_refused(monkeypatch):
    runs = []

    def forward(*a, algo, seed, offset):
        runs.append(algo)
        if algo != "standard":
            raise CudnnError("cudnnRNNForward", 3000, "CUDNN_STATUS_NOT_SUPPORTED")
        return types.SimpleNamespace(net=types.SimpleNamespace(algo=algo), reserve_bytes=0)
    monkeypatch.setattr(cr, "forward", forward)
    monkeypatch.setattr(rnn_cudnn, "auto_algo", lambda *a: "persist_static")
    x = np.zeros((5, 3, 3), np.float32)
    cfg = RNNConfig("lstm", 3, 4)
    *_, st = rnn_cudnn._forward_cudnn(cfg, None, x, None, None, None, True, None, 0, "auto", 0)
    assert runs == ["persist_static", "standard"] and st.algo == "standard"
    with pytest.raises(CudnnError, match="NOT_SUPPORTED"):    # asked for: no silent change
        rnn_cudnn._forward_cudnn(cfg, None, x, None, None, None, True, None, 0,
                                 "persist_static", 0)


# --- dropout -------------------------------------------------------------------------------

def test_dropout_states_are_made_once_per_seed_and_restored_at_offset_zero(fake):
    saved, _ = run_forward(DROP, seed=9, offset=0)
    e = saved.net.entry
    (sd,) = fake.named("cudnnSetDropoutDescriptor")     # initialised into the pristine states
    assert [val(v) for v in sd[2:]] == [0.25, e.pristine.addr, 777, 9]
    (rs,) = fake.named("cudnnRestoreDropoutDescriptor")   # then pointed at the working ones
    assert val(rs[0]) == val(sd[0]) and [val(v) for v in rs[2:]] == [0.25, e.work.addr, 777, 9]
    assert fake.copies[-1][:3] == (e.work.addr, e.pristine, 777)
    rds = fake.named("cudnnSetRNNDescriptor_v8")
    assert len(rds) == 2 and val(rds[-1][13]) == val(sd[0])   # set again after the restore
    assert saved.net.entry is not None and saved.net.entry.next == 1
    run_forward(DROP, seed=9, offset=1)              # follows on the working states
    assert len(fake.named("cudnnRestoreDropoutDescriptor")) == 1
    assert len(fake.named("cudnnSetDropoutDescriptor")) == 1
    with pytest.raises(ValueError, match="call 5 of seed 9 follows call 4.*stand at 2"):
        run_forward(DROP, seed=9, offset=5)
    run_forward(DROP, seed=9, offset=0)              # back to the start: restored again
    assert len(fake.named("cudnnRestoreDropoutDescriptor")) == 2
    run_forward(DROP, seed=10, offset=0)             # another seed: its own states
    assert [val(v[5]) for v in fake.named("cudnnSetDropoutDescriptor")] == [9, 10]


def test_dropout_applies_to_training_forwards_only(fake):
    run_forward(DROP, training=False)
    (sd,) = fake.named("cudnnSetDropoutDescriptor")
    assert [val(v) for v in sd[2:]] == [0.0, None, 0, 0]    # no states
    one = RNNConfig("gru", 3, 4, 1, dropout=0.25)           # one layer: nothing between layers
    run_forward(one, training=True, seed=1)
    assert len(fake.named("cudnnSetDropoutDescriptor")) == 2
    assert fake.named("cudnnRestoreDropoutDescriptor") == []


def test_unseeded_dropout_advances_one_generator(fake):
    run_forward(DROP, seed=None)
    run_forward(DROP, seed=None)
    assert len(fake.named("cudnnSetDropoutDescriptor")) == 1
    assert fake.named("cudnnRestoreDropoutDescriptor") == []


def test_dropout_supports_reasons(fake):
    x = Shaped((5, 3, 3))
    assert fwd_reason(DROP, x, training=True, seed=3, offset=0) is None
    why = fwd_reason(DROP, x, training=True, seed=3, offset=2)
    assert "call 2 of seed 3" in why and "stand at 0" in why
    assert fwd_reason(DROP, x, training=False, seed=3, offset=2) is None   # no dropout
    f64 = RNNConfig("gru", 3, 4, 2, dtype="float64", dropout=0.3)
    why = fwd_reason(f64, Shaped((5, 3, 3), "float64"), training=True, seed=1)
    assert "float32" in why and "0.3" in why
    half = RNNConfig("gru", 3, 4, 2, dtype="float64", dropout=0.5)   # exact in float32
    assert fwd_reason(half, Shaped((5, 3, 3), "float64"), training=True, seed=1) is None


def test_dropout_states_are_kept_per_thread_on_the_per_thread_default_stream(monkeypatch):
    # CU_STREAM_PER_THREAD (2) is each thread's own stream: generator states advanced on one
    # thread's must not be taken up by another's, unordered (the other handles: per handle)
    import threading

    from dnnkit.cudnn import dropout as cd
    from dnnkit.device import PER_THREAD
    monkeypatch.setattr(rnn_dropout, "device_id", lambda: 0)
    monkeypatch.setattr(cd, "_device_id", lambda: 0)

    def keys():
        return (rnn_dropout._key(0.5, 7, PER_THREAD), cd._key(0.5, 7, PER_THREAD),
                rnn_dropout._key(0.5, 7, 0x5000), cd._key(0.5, 7, 0x5000))

    mine, theirs = keys(), []
    t = threading.Thread(target=lambda: theirs.append(keys()))
    t.start()
    t.join()
    assert mine[0] != theirs[0][0] and mine[1] != theirs[0][1]
    assert mine[2:] == theirs[0][2:] and mine == keys()


def test_an_ended_threads_per_thread_dropout_states_go(monkeypatch):
    import threading

    from dnnkit.cudnn import dropout as cd
    from dnnkit.device import PER_THREAD
    monkeypatch.setattr(rnn_dropout, "device_id", lambda: 0)
    monkeypatch.setattr(cd, "_device_id", lambda: 0)
    monkeypatch.setattr(rnn_dropout, "_cache", rnn_dropout.collections.OrderedDict())
    monkeypatch.setattr(cd, "_cache", cd.collections.OrderedDict())

    def fill():
        for m in (rnn_dropout, cd):
            m._cache[m._key(0.5, 7, PER_THREAD)] = "states"
            m._cache[m._key(0.5, 7, 0x5000)] = "shared"

    t = threading.Thread(target=fill)
    t.start()
    t.join()
    assert list(rnn_dropout._cache.values()) == list(cd._cache.values()) == ["shared"]
