"""The dispatcher's memo of repeated calls (dnnkit/fastpath.py): a call whose signature was
seen before runs the stored runner on its own arrays; anything that could change the answer
(flags, traces, invalidation, host inputs, a cuDNN refusal) takes the full path."""

import numpy as np
import pytest

import dnnkit
from dnnkit import config, dispatch, fastpath, policy, reference, registry
from dnnkit.cudnn.loader import CudnnStatus
from dnnkit.errors import CudnnError


@pytest.fixture
def counted(monkeypatch):
    """A public op 'fp_fake'(x, scale) -> x * scale whose steps are counted: argument checks
    (prepare), binds, and runs of the bound runner; cuDNN reported available."""
    from numba import cuda
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(True, version=91900))
    n = {"prepare": 0, "bind": 0, "run": 0, "cudnn": None}

    @dispatch.public_op("fp_fake")
    def fp_fake(x, scale=2.0, *, stream=None):
        n["prepare"] += 1
        if not isinstance(scale, float):
            raise TypeError(f"fp_fake: scale must be a float; got {scale!r}")
        return dnnkit.arrays.device_input("fp_fake", "x", x, None), scale

    def impl(x, scale):
        return cuda.to_device(x.copy_to_host() * scale)

    def binder(backend):
        def bind(x, scale):
            n["bind"] += 1

            def run(x, scale):
                n["run"] += 1
                if backend == "cudnn" and n["cudnn"] is not None:
                    raise n["cudnn"]        # the scripted cuDNN status
                return impl(x, scale)
            return run
        return bind
    for b in ("numba", "cudnn"):
        registry.register("fp_fake", b)(impl)
        registry.binder("fp_fake", b)(binder(b))
    yield fp_fake, n
    for table in (registry.REGISTRY, registry.OPS, registry.PREPARE):
        table.pop("fp_fake")


def _dev(a):
    from numba import cuda
    return cuda.to_device(np.asarray(a, np.float32))


def test_a_repeated_call_skips_checks_and_binding_and_uses_its_own_arrays(counted):
    op, n = counted
    a, b = _dev([1.0, 2.0]), _dev([5.0, -1.0])
    assert np.array_equal(op(a, 3.0).copy_to_host(), [3.0, 6.0])
    hits = fastpath.stats["hits"]
    assert np.array_equal(op(b, 3.0).copy_to_host(), [15.0, -3.0])   # b, not a
    assert n == dict(prepare=1, bind=1, run=2, cudnn=None)
    assert fastpath.stats["hits"] == hits + 1
    op(a, 4.0)                      # another scalar: another signature
    op(_dev([1.0, 2.0, 3.0]), 3.0)  # another shape
    assert (n["prepare"], n["bind"]) == (3, 3)


def test_numpy_scalars_and_tuples_of_numbers_are_keyed_by_value(counted):
    """np.float64(3.0) (a computed scale) and (1.5, 2) are values like 3.0 and (1, 2): their
    calls take the memo; another value is another signature."""
    op, n = counted
    a = _dev([1.0, 2.0])
    for scale in (np.float64(3.0), np.float64(3.0), np.float64(4.0)):
        op(a, scale)
    assert (n["prepare"], n["run"]) == (2, 3)
    sig = fastpath.signature("x", ((1.5, 2), np.int64(3)), None, {})
    assert sig == fastpath.signature("x", ((1.5, 2), np.int64(3)), None, {})
    assert sig != fastpath.signature("x", ((1.5, 2), np.int64(4)), None, {})
    assert sig != fastpath.signature("x", ((1.5, 2), 3), None, {})     # the type is keyed too
    assert fastpath.signature("x", (np.zeros(2),), None, {}) is None    # host arrays are not


def test_calls_inside_the_profiler_take_the_full_path(counted):
    """dnnkit.profile() times every call (the dispatcher's full path records it): a memoised
    signature is not used inside it, in this thread, and is used again after it."""
    op, n = counted
    a = _dev([1.0, 2.0])
    op(a, 1.0)
    op(a, 1.0)
    assert n["prepare"] == 1
    with dnnkit.profile() as prof:
        op(a, 1.0)
        op(a, 1.0)
    assert n["prepare"] == 3
    assert sum(row.calls for row in prof.rows.values()) == 2
    hits = fastpath.stats["hits"]
    op(a, 1.0)
    assert n["prepare"] == 3 and fastpath.stats["hits"] == hits + 1


def test_bad_arguments_are_checked_on_every_call(counted):
    op, n = counted
    a = _dev([1.0, 2.0])
    op(a, 1.0)
    for _ in range(2):
        with pytest.raises(TypeError, match="fp_fake: scale must be a float; got 1"):
            op(a, 1)                # an int, equal to 1.0: a signature of its own


@pytest.mark.parametrize("change", ["flag", "invalidate", "backend"])
def test_flag_changes_and_invalidation_take_the_full_path(counted, change):
    op, n = counted
    a = _dev([1.0, 2.0])
    op(a, 1.0)
    op(a, 1.0)
    assert n["prepare"] == 1
    if change == "flag":
        config.set("dnn.conv.workspace_limit", 1 << 20)     # any flag: the memo is stale
        op(a, 1.0)
    elif change == "invalidate":
        fastpath.invalidate()
        op(a, 1.0)
    else:
        op(a, 1.0, backend="numba")                      # backend= is part of the signature
    assert n["prepare"] == 2


def test_traces_change_flags_and_host_inputs_always_take_the_full_path(counted):
    op, n = counted
    a = _dev([1.0, 2.0])
    op(a, 1.0)
    with dnnkit.trace() as t:
        op(a, 1.0)
    assert t.ops() == ["fp_fake"] and n["prepare"] == 2
    h = np.array([1.0, 2.0], np.float32)
    for _ in range(2):
        assert np.array_equal(op(h, 2.0).copy_to_host(), [2.0, 4.0])
    assert n["prepare"] == 4       # the host copy is made on every call


def test_change_flags_blocks_memoise_their_own_calls(counted):
    op, n = counted
    a = _dev([1.0, 2.0])
    op(a, 1.0)
    with config.change_flags({"dnn.enabled": "disabled"}):
        with dnnkit.trace() as t:
            op(a, 1.0)
        assert t.backends() == ["numba"]        # the block's flags, not the memo's cuDNN
        op(a, 1.0)
        op(a, 1.0)
        assert n["prepare"] == 3                # once on entry (and once traced)
        with config.change_flags({"dnn.enabled": "forced"}):
            op(a, 1.0)
        op(a, 1.0)                              # back in the outer block: stale again
    assert n["prepare"] == 5
    with dnnkit.trace() as t:
        op(a, 1.0)
    assert t.backends() == ["cudnn"]


def test_a_cudnn_refusal_at_run_time_takes_the_full_path_and_falls_back(counted):
    op, n = counted
    a = _dev([1.0, 2.0])
    op(a, 1.0)
    n["cudnn"] = CudnnError("cudnnFake", 3000, "CUDNN_STATUS_NOT_SUPPORTED", "")
    with pytest.raises(CudnnError):          # forced: the full path raises it
        op(a, 1.0, backend="cudnn")
    with dnnkit.trace() as t:                # auto: the memoised cuDNN runner refuses, the
        assert np.array_equal(op(a, 1.0).copy_to_host(), [1.0, 2.0])    # full path falls back
    assert t.backends() == ["numba"] and "at run time" in t[0].reason
    prepared = n["prepare"]
    op(a, 1.0)
    op(a, 1.0)
    assert n["prepare"] == prepared + 1      # the fallback is memoised in its turn
    n["cudnn"] = CudnnError("cudnnFake", 2000, "CUDNN_STATUS_BAD_PARAM", "")
    with pytest.raises(CudnnError, match="BAD_PARAM"):      # not a refusal: raised as it is
        op(a, 1.0, backend="cudnn")


@pytest.mark.parametrize("backend", ["numba"])
def test_repeated_real_ops_match_the_reference(backend, rng):
    x1, x2 = (rng.standard_normal((4, 5, 3, 3)).astype(np.float32) for _ in range(2))
    from numba import cuda
    d1, d2 = cuda.to_device(x1), cuda.to_device(x2)
    for x, d in ((x1, d1), (x2, d2), (x1, d1)):
        y = dnnkit.relu(d, backend=backend).copy_to_host()
        assert np.array_equal(y, np.maximum(x, 0))
        s = dnnkit.softmax(d, backend=backend).copy_to_host()
        assert reference.rel_error(s, reference.softmax(x.astype(np.float64))) <= 1e-5


def test_repeated_numba_activations_write_each_calls_arrays_into_their_packed_launch(rng):
    """The Numba activation runners (a launch packed once, launch.Prepared): forward and
    backward, repeated with new arrays of one signature and with one array in two places,
    each call's own answer; the repeats are memo hits."""
    from numba import cuda
    xs = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(3)]
    dys = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(3)]
    hits = fastpath.stats["hits"]
    for mode, slope in (("relu", lambda x: (x > 0)), ("tanh", lambda x: 1 - np.tanh(x) ** 2)):
        for x, dy in zip(xs, dys):
            dx_, ddy = cuda.to_device(x), cuda.to_device(dy)
            y = dnnkit.activation(dx_, mode, backend="numba")
            want = np.maximum(x, 0) if mode == "relu" else np.tanh(x)
            assert reference.rel_error(y.copy_to_host(), want) <= 1e-6
            g = dnnkit.activation_backward(dx_, y, ddy, mode, backend="numba").copy_to_host()
            assert reference.rel_error(g, dy * slope(x)) <= 1e-5
            if mode == "relu":     # x in y's place: relu's slope reads either
                g2 = dnnkit.activation_backward(y, y, ddy, mode, backend="numba")
                assert reference.rel_error(g2.copy_to_host(), dy * (x > 0)) <= 1e-6
    assert fastpath.stats["hits"] - hits >= 2 * 2 + 2 * 2 + 1


def test_dropout_draws_a_fresh_mask_on_every_call(rng):
    """dropout's checks draw the seed (seed=None): never memoised, so no two masks repeat."""
    from numba import cuda
    x = cuda.to_device(np.ones(256, np.float32))
    masks = {tuple(dnnkit.dropout(x, 0.5)[0].copy_to_host() != 0) for _ in range(3)}
    assert len(masks) == 3


def test_a_call_with_one_array_in_two_places_is_stored_with_that_pattern():
    """Stored from (a, a), the entry serves (b, b) but not (b, c): which of b and c goes where
    is unknown. Stored from distinct arrays, it serves every call of its signature."""
    a, b, c = _dev([1.0, 2.0]), _dev([3.0, 4.0]), _dev([5.0, 6.0])
    run = lambda *p: None     # noqa: E731
    fastpath.store(("sig",), (a, a), {}, (a, a), run, "numba")
    fastpath.store(("sig2",), (a,), {"y": a}, (a, a), run, "numba")
    fastpath.store(("sig3",), (a, b), {}, (b, a), run, "numba")   # distinct
    m = fastpath._memo()
    assert m[("sig",)][2] == ((0, 0, None), (1, 0, None)) and m[("sig",)][4] == ((0, 1),)
    assert m[("sig2",)][2] == ((0, 0, None), (1, 0, None)) and m[("sig2",)][4] == ((0, "y"),)
    assert m[("sig3",)][2] == ((0, 1, None), (1, 0, None)) and m[("sig3",)][4] is None
    assert fastpath.usable(m[("sig",)], (b, b), {})
    assert not fastpath.usable(m[("sig",)], (b, c), {})
    assert fastpath.usable(m[("sig2",)], (c,), {"y": c})
    assert not fastpath.usable(m[("sig2",)], (c,), {"y": b})
    assert fastpath.usable(m[("sig3",)], (c, c), {}) and fastpath.usable(m[("sig3",)], (c, b), {})


def test_aliased_and_distinct_calls_of_one_signature_both_give_their_own_answer():
    """add(x, x) is memoised (a gradient rule passes one array twice every step); add(b, c)
    with the same shapes then takes the full path once and stores an entry that serves both."""
    a, b, c = _dev([1.0, 2.0]), _dev([3.0, 4.0]), _dev([5.0, 6.0])
    dnnkit.add(a, a, backend="numba")
    hits = fastpath.stats["hits"]
    np.testing.assert_array_equal(dnnkit.add(b, b, backend="numba").copy_to_host(), [6, 8])
    assert fastpath.stats["hits"] == hits + 1
    np.testing.assert_array_equal(dnnkit.add(b, c, backend="numba").copy_to_host(), [8, 10])
    assert fastpath.stats["hits"] == hits + 1                  # not the (x, x) entry
    np.testing.assert_array_equal(dnnkit.add(c, c, backend="numba").copy_to_host(), [10, 12])
    np.testing.assert_array_equal(dnnkit.add(a, b, backend="numba").copy_to_host(), [4, 6])
    assert fastpath.stats["hits"] == hits + 3


def test_the_memo_flag_turns_it_off(counted):
    op, n = counted
    a = _dev([1.0, 2.0])
    config.set("dnn.memo", False)
    for _ in range(3):
        op(a, 1.0)
    assert n["prepare"] == 3
    config.set("dnn.memo", True)
    for _ in range(3):
        op(a, 1.0)
    assert n["prepare"] == 4


def test_a_runners_handle_getter_rebinds_a_stream_another_op_changed(monkeypatch):
    """cudnn.handle.getter (the bound runners' handle): no cuDNN call on a repeat; when
    another op has bound the thread's handle to another stream, it binds it back."""
    import threading

    from dnnkit.cudnn import handle
    calls = []

    def call(name, *args, context=""):
        calls.append(name)
        if name == "cudnnCreate":
            args[0]._obj.value = 42
    monkeypatch.setattr(handle.api, "call", call)
    # the fake handle 42 must never reach the real cudnnDestroy when the thread's holder dies
    # (a segfault on a GPU machine): the holder's finalizer takes _destroy_all when it is made
    monkeypatch.setattr(handle, "_destroy_all", lambda handles: handles.clear())
    monkeypatch.setattr(handle, "_local", threading.local())
    monkeypatch.setattr(handle, "device_id", lambda: 0)
    get7 = handle.getter(7)
    assert calls == ["cudnnCreate", "cudnnSetStream"]
    assert get7().value == 42 and get7().value == 42 and len(calls) == 2
    assert handle.get(9).value == 42 and calls.count("cudnnSetStream") == 2
    assert get7().value == 42 and calls.count("cudnnSetStream") == 3
