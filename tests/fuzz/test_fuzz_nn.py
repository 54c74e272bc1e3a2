"""Property-based fuzzer over dnnkit.nn and dnnkit.optim's own inputs: layer and optimizer
constructors given one odd argument, ``Module.load`` given damaged files, ``load_state_dict``
and ``Adam.load_state_dict`` given malformed states.

Each call either works or raises ValueError or TypeError whose message names the class (a file
error names the file); after an error nothing changed (the module's state, the optimizer's
state) and the next good call works (the constructor with good arguments, a good file, a good
state). No kernel runs: constructors and loads only copy arrays.

``CONSTRUCTORS`` is the list to extend when a layer is added: (class, good positional
arguments, good keyword arguments); every argument is fuzzed in turn.
"""

import io
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnkit import nn, optim
from tests.fuzz import common

CONSTRUCTORS = [
    (nn.Conv2d, (2, 4, 3), dict(stride=1, padding=1, dilation=1, groups=2, bias=True,
                                dtype="float32", seed=0)),
    (nn.Conv3d, (2, 4, 1), dict(stride=1, padding="half", seed=0)),
    (nn.Linear, (3, 2), dict(bias=True, dtype="float64", seed=0)),
    (nn.MaxPool2d, (2,), dict(stride=None, padding=0, deterministic=False)),
    (nn.MaxPool3d, (2,), dict(stride=2, padding=1)),
    (nn.AvgPool2d, (3,), dict(stride=1, padding=1, count_include_pad=True)),
    (nn.AdaptiveAvgPool2d, (1,), {}),
    (nn.ClippedReLU, (6.0,), {}),
    (nn.ELU, (1.0,), {}),
    (nn.Softmax, ("channel",), {}),
    (nn.LogSoftmax, ("instance",), {}),
    (nn.Dropout, (0.5,), dict(seed=3)),
    (nn.Embedding, (5, 3), dict(padding_idx=0, dtype="float32", seed=0)),
    (nn.SpatialTransformer, (1.0, 0.5), {}),
    (nn.BatchNorm1d, (3,), dict(eps=1e-5, momentum=0.1, dtype="float32")),
    (nn.BatchNorm2d, (3,), dict(eps=1e-3, momentum=0.2)),
    (nn.BatchNorm3d, (3,), {}),
    (nn.RNN, (2, 3), dict(num_layers=1, nonlinearity="relu", bidirectional=False)),
    (nn.LSTM, (2, 3), dict(num_layers=2, bidirectional=True)),
    (nn.GRU, (2, 3), dict(num_layers=1)),
    (nn.CrossEntropyLoss, (), dict(reduction="sum", ignore_index=-100)),
    (nn.NLLLoss, (), dict(reduction="none")),
    (nn.MSELoss, (), dict(reduction="mean")),
]
ODD = [None, True, 0, -1, 1.5, float("nan"), float("inf"), 2**64, "3", "", "relu", b"x",
       [3], (1, 2, 3), (0,), {"a": 1}, object(), np.float32(2), np.int64(-2), np.array([2])]


def _good(cls, args, kw):
    try:
        return cls(*args, **kw)
    except TypeError as e:      # a keyword this class does not take: drop it from the table
        pytest.fail(f"CONSTRUCTORS' good arguments of {cls.__name__} fail: {e}")


@common.fuzz_settings(300)
@given(data=st.data())
def test_fuzz_constructors(data):
    cls, args, kw = common.pick(data, CONSTRUCTORS, "constructor")
    slots = [("arg", i) for i in range(len(args))] + [("kw", k) for k in kw]
    if not slots:
        return
    where, which = common.pick(data, slots, "argument")
    value = common.pick(data, ODD, "value")
    a, k = list(args), dict(kw)
    if where == "arg":
        a[which] = value
    else:
        k[which] = value
    try:
        cls(*a, **k)
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert cls.__name__ in msg or any(b.__name__ in msg for b in cls.__mro__), \
            f"{cls.__name__}({a}, {k}): the message does not name the class: {msg!r}"
        assert "unhashable" not in msg and "invalid literal" not in msg, msg
    _good(cls, args, kw)


def _model():
    return nn.Sequential(nn.Linear(3, 2, seed=0), nn.BatchNorm1d(2))


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


def _damaged(data, good_bytes, state):
    """Bytes of a damaged or foreign file, drawn from several kinds of damage."""
    kind = data.draw(st.sampled_from(["random", "truncated", "flipped", "state"]), label="kind")
    if kind == "random":
        return data.draw(st.binary(max_size=400), label="bytes")
    if kind == "truncated":
        return good_bytes[:data.draw(st.integers(0, len(good_bytes) - 1), label="cut")]
    if kind == "flipped":
        b = bytearray(good_bytes)
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            i = data.draw(st.integers(0, len(b) - 1), label="at")
            b[i] ^= data.draw(st.integers(1, 255), label="mask")
        return bytes(b)
    s = dict(state)
    key = data.draw(st.sampled_from(sorted(s)), label="key")
    change = data.draw(st.sampled_from(["drop", "extra", "shape", "int", "str", "object",
                                        "0-d", "bool", "complex"]), label="change")
    if change == "drop":
        del s[key]
    elif change == "extra":
        s["extra.weight"] = np.ones(2, np.float32)
    elif change == "shape":
        s[key] = np.ones(s[key].shape + (1,), s[key].dtype)
    elif change == "int":
        s[key] = s[key].astype(np.int32)
    elif change == "str":
        s[key] = np.full(s[key].shape, "a")
    elif change == "object":
        s[key] = np.array([object(), 1], dtype=object)
    elif change == "0-d":
        s[key] = np.float32(1)
    elif change == "bool":
        s[key] = np.ones(s[key].shape, bool)
    else:
        s[key] = np.ones(s[key].shape, np.complex64)
    buf = io.BytesIO()
    np.savez(buf, **s)
    return buf.getvalue()


@common.fuzz_settings(150)
@given(data=st.data())
def test_fuzz_module_load(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    model = _model()
    good = folder / "good.npz"
    model.save(good)
    reference_state = model.state_dict()
    other = _model()
    for p in other.parameters():                 # a different state to load into
        p.data.copy_to_device(np.full(p.data.shape, 7, p.data.dtype))
    before = other.state_dict()
    bad = folder / "bad.npz"
    bad.write_bytes(_damaged(data, good.read_bytes(), reference_state))
    try:
        other.load(bad)
    except (ValueError, TypeError, OSError, zipfile.BadZipFile) as e:
        assert not isinstance(e, zipfile.BadZipFile), f"a raw BadZipFile: {e}"
        assert isinstance(e, ValueError) or isinstance(e, OSError) and e.errno, repr(e)
        assert str(bad) in str(e), str(e)
        assert _same(other.state_dict(), before)  # nothing written
    else:
        loaded = other.state_dict()
        assert loaded.keys() == before.keys()
    other.load(good)                              # the next good call works
    assert _same(other.state_dict(), reference_state)


JUNK = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 2**65), st.floats(),
              st.text(max_size=5), st.just(np.ones(3, np.float32)),
              st.just(np.ones((2, 3), np.float32)), st.just(np.array(["a"]))),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.one_of(st.integers(-1, 3), st.text(max_size=4)),
                                            inner, max_size=3)),
    max_leaves=8)


@common.fuzz_settings(150)
@given(data=st.data())
def test_fuzz_optimizer_load_state_dict(data):
    layer = nn.Linear(3, 2, seed=0)
    cls = common.pick(data, [optim.Adam, optim.SGD], "optimizer")
    opt = cls(layer.parameters(), lr=0.1) if cls is optim.SGD else cls(layer.parameters())
    good = opt.state_dict()
    n = len(good["param_groups"][0]["params"])
    shapes = [tuple(p.data.shape) for p in layer.parameters()]
    keys = list(opt.STATE_KEYS)
    entry = {k: (3 if opt.STATE_KEYS[k] == "count" else np.zeros(shapes[0], np.float32))
             for k in keys}
    d = {"state": {0: dict(entry)} if keys else {}, "param_groups": [dict(good["param_groups"][0])]}
    where = data.draw(st.sampled_from(["top", "state", "entry", "group", "whole"]), label="where")
    new = data.draw(JUNK, label="junk")
    if where == "whole":
        d = new
    elif where == "top":
        d[data.draw(st.sampled_from(["state", "param_groups", "other"]), label="key")] = new
    elif where == "state":
        d["state"][data.draw(st.sampled_from([0, n, -1, "0", 1.0]), label="index")] = new
    elif where == "entry" and keys:
        d["state"][0][data.draw(st.sampled_from(keys + ["other"]), label="key")] = new
    else:
        group = d["param_groups"][0]
        group[data.draw(st.sampled_from(sorted(group) + ["other"]), label="key")] = new
    before = opt.state_dict()
    try:
        opt.load_state_dict(d)
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert cls.__name__ in msg, msg
        after = opt.state_dict()
        assert after["param_groups"] == before["param_groups"]
        assert after["state"].keys() == before["state"].keys()
    opt.load_state_dict(good)                     # the next good call works
    assert opt.state_dict()["param_groups"] == good["param_groups"]
