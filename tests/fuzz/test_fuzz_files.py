"""Property-based fuzzer over what dnnkit reads besides arrays: flag names and values
(``config.set``, ``change_flags``, ``DNNKIT_FLAGS``), rc files of random bytes and of random
INI text, and the cuDNN algorithm cache's loader (random bytes, mutated caches).

Every input either works or raises the documented error -- ValueError or TypeError for a flag,
``config.ConfigError`` naming the rc file (or ``DNNKIT_FLAGS``) in one line, ValueError naming
the cache file -- and after each error nothing has changed (the flags' values and sources, the
cache's entries) and the next good call works (a flag set, an op run, a good file loaded).
No GPU needed: none of it runs a kernel except the one small op call that checks the next
good call, on Numba.
"""

import json
import string

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit import config
from dnnkit.cudnn import algo_cache
from tests.fuzz import common

FLAG_NAMES = sorted(config.FLAGS)
ODD_VALUES = [None, True, False, 0, 1, -1, 2**70, 1.5, 1e9, float("inf"), float("-inf"),
              float("nan"), "", " ", "auto", "AUTO", "on", "off", "nan", "none", "%", "%(x)s",
              "/opt/100%/lib", "é", "\x00", "1e9", "-5", b"auto", ["auto"], ("auto",),
              {"auto": 1}, object(), np.float32(3), np.int64(4), np.bool_(True)]
X = np.linspace(-1, 1, 6, dtype=np.float32)


def _flags_now():
    return [(name, repr(value), src) for name, value, src, _ in config.describe()]


def _good_call(run=False):
    """A flag set and an op's checks and backend choice (which read the flags) -- and with
    ``run``, the op run (on the simulator a kernel launch costs ~0.3 s: once per test, below,
    not per example): the state after an error is usable."""
    with config.change_flags({"dnn.verbose": True}):
        assert config.dnn.verbose is True
    assert dnnkit.select_backend("activation", X, "relu", backend="numba") == "numba"
    if run:
        y = dnnkit.relu(X, backend="numba").copy_to_host()
        assert np.array_equal(y, np.maximum(X, 0))


def _names(data):
    return data.draw(st.one_of(
        st.sampled_from(FLAG_NAMES),
        st.sampled_from(FLAG_NAMES).map(lambda n: n.upper()),
        st.text(string.ascii_letters + "._%", max_size=20),
        st.sampled_from([None, 1, ["dnn.enabled"], ("dnn.enabled",), b"dnn.enabled"])),
        label="name")


def _values(data):
    return data.draw(st.one_of(
        st.sampled_from(ODD_VALUES),
        st.text(max_size=12),
        st.integers(-2**40, 2**40),
        st.floats(allow_nan=True, allow_infinity=True)), label="value")


@common.fuzz_settings(150)
@given(data=st.data())
def test_fuzz_flag_set_and_change_flags(data):
    name, value = _names(data), _values(data)
    before = _flags_now()
    how = data.draw(st.sampled_from(["set", "change_flags", "attribute"]), label="how")
    try:
        if how == "set":
            config.set(name, value)
        elif how == "attribute":
            if not isinstance(name, str) or not name.startswith("dnn."):
                return
            ns = config.dnn
            parts = name.split(".")[1:]
            for p in parts[:-1]:
                ns = getattr(ns, p)
            setattr(ns, parts[-1], value)
        else:
            with config.change_flags({name: value} if isinstance(name, (str, int, tuple, bytes))
                                     or name is None else {}):
                for n in FLAG_NAMES:
                    config.get(n)
            assert _flags_now() == before      # a block leaves nothing behind
    except (ValueError, TypeError, AttributeError) as e:
        msg = str(e)
        assert msg and "\n" not in msg, msg
        assert "unhashable" not in msg and "invalid literal" not in msg, msg
        if isinstance(name, str) and name in config.FLAGS:
            assert name in msg, msg         # a bad value names its flag
        assert _flags_now() == before       # nothing changed
    else:
        if how != "change_flags":
            assert config.source(name) == "python"
            assert config.get(name) == config.FLAGS[name].parse(name, value)
    _good_call()
    config.reset()


_INI_LINE = st.one_of(
    st.sampled_from(FLAG_NAMES).map(lambda n: "[" + n.rsplit(".", 1)[0] + "]"),
    st.sampled_from(["[dnn]", "[dnn.conv]", "[DEFAULT]", "[]", "[dnn", "# comment",
                     "; comment", ""]),
    st.tuples(st.sampled_from([n.rsplit(".", 1)[1] for n in FLAG_NAMES] + ["nope", ""]),
              st.sampled_from([" = ", "=", ": ", " "]),
              st.one_of(st.sampled_from([str(v) for v in ODD_VALUES[:30]]),
                        st.text(max_size=10))).map("".join),
    st.text(max_size=20))


@common.fuzz_settings(150)
@given(data=st.data())
def test_fuzz_rc_file(data, tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("rc")
    path = folder / "dnnkitrc"
    if data.draw(st.booleans(), label="random bytes?"):
        raw = data.draw(st.binary(max_size=200), label="bytes")
    else:
        lines = data.draw(st.lists(_INI_LINE, max_size=8), label="lines")
        enc = data.draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1"]),
                        label="encoding")
        raw = "\n".join(lines).encode(enc, errors="replace")
    path.write_bytes(raw)
    monkeypatch.delenv("DNNKIT_FLAGS", raising=False)   # (conftest's): the rc file's sources only
    config.set("dnn.verbose", True)            # a Python assignment the error must keep
    before = _flags_now()
    monkeypatch.setenv("DNNKIT_RC", str(path))
    try:
        config.reload()
    except config.ConfigError as e:
        msg = str(e)
        assert msg.startswith(f"rc file {path}") and "\n" not in msg, msg
        assert "Traceback" not in msg and "UnicodeDecodeError" not in msg
        assert _flags_now() == before              # the failed reload kept what was read
        config.state.loaded, config.state.merged = False, None     # as in a fresh process:
        with pytest.raises(config.ConfigError):   # every read refused, nothing half-read
            config.get("dnn.enabled")
        monkeypatch.setenv("DNNKIT_RC", str(folder / "absent"))
        config.reload()
        assert _flags_now() == before
    else:
        for name, value, src, _ in config.describe():
            assert src in ("python", "rc", "default")
            if src == "rc":
                assert config.FLAGS[name].parse(name, value) == value
        assert config.dnn.verbose is True and config.source("dnn.verbose") == "python"
    _good_call()
    monkeypatch.setenv("DNNKIT_RC", str(folder / "absent"))
    config.reset()


@common.fuzz_settings(100)
@given(text=st.text(string.printable + "é%", max_size=60))
def test_fuzz_dnnkit_flags(text, monkeypatch):
    monkeypatch.setenv("DNNKIT_FLAGS", text)
    try:
        config.reload()
    except config.ConfigError as e:
        assert str(e).startswith("DNNKIT_FLAGS: ") and "\n" not in str(e), str(e)
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.verbose=1")
    config.reload()
    assert config.dnn.verbose is True
    _good_call()


# ---------------------------------------------------------------- the algorithm cache

DEVICE = {"pci": "0000:01:00", "name": "NVIDIA H100", "cc": (9, 0)}


def _key(groups):
    return algo_cache.make_key(
        "fwd", "time_once", device=DEVICE, cudnn_version=91900, nd=2,
        shapes=[(2, 4, 8, 8), (4, 4 // groups, 3, 3), (2, 4, 8, 8)],
        strides=[(256, 64, 8, 1), (36 // groups, 9, 3, 1), (256, 64, 8, 1)], padding=(1, 1),
        stride=(1, 1), dilation=(1, 1), groups=groups, flip=False, dtype="float32",
        compute_dtype="float32", math_type=0, deterministic=False, workspace_limit=2**30)


def _doc(n=3):
    return {"format": algo_cache.FORMAT, "version": algo_cache.FORMAT_VERSION,
            "entries": [{"key": json.loads(_key(g)), "algo": a}
                        for g, a in zip((1, 2, 4)[:n], ("fft", "implicit_gemm", "engine7_k3=1"))]}


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**20), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def _mutate(data, doc):
    """One change to a valid cache document: a field removed, replaced or nested deeply."""
    where = data.draw(st.sampled_from(["top", "entry", "key", "deep", "raw"]), label="where")
    if where == "deep":
        depth = data.draw(st.sampled_from([10, 900, 5000, 200000]), label="depth")
        return '{"format": "%s", "version": 1, "entries": %s%s}' % (
            algo_cache.FORMAT, "[" * depth, "]" * depth)
    text = json.dumps(doc)
    if where == "raw":
        cut = data.draw(st.integers(0, len(text)), label="cut")
        junk = data.draw(st.text(max_size=5), label="junk")
        return text[:cut] + junk + text[cut + len(junk):]
    target = doc if where == "top" else doc["entries"][0]
    if where == "key":
        target = target["key"]
    field = data.draw(st.sampled_from(sorted(target) + ["extra"]), label="field")
    if data.draw(st.booleans(), label="remove?"):
        target.pop(field, None)
    else:
        target[field] = data.draw(JSONISH, label="new value")
    return json.dumps(doc, allow_nan=True)


@common.fuzz_settings(200)
@given(data=st.data())
def test_fuzz_algo_cache_loader(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    path = folder / "algos.json"
    algo_cache.clear()
    algo_cache.store("time_once", "fwd", _key(1), "direct")        # in memory before the load
    if data.draw(st.booleans(), label="random bytes?"):
        path.write_bytes(data.draw(st.binary(max_size=300), label="bytes"))
    else:
        enc = data.draw(st.sampled_from(["utf-8", "utf-16", "utf-32"]), label="encoding")
        path.write_bytes(_mutate(data, _doc()).encode(enc))
    before = sorted(algo_cache._once.items())
    try:
        n = algo_cache.load(path)
    except ValueError as e:
        assert str(path) in str(e) and "\n" not in str(e), str(e)
        assert sorted(algo_cache._once.items()) == before      # nothing merged
    else:
        assert 0 <= n and algo_cache.get(_key(1)) == "direct"   # memory wins on a merge
        for k in algo_cache._once:
            json.loads(k)                                       # every key is canonical JSON
    good = folder / "good.json"
    good.write_text(json.dumps(_doc()))
    assert algo_cache.load(good) == 3 and algo_cache.get(_key(4)) == "engine7_k3=1"
    algo_cache.save(folder / "saved.json")                      # what loaded saves again
    algo_cache.clear()
    assert algo_cache.load(folder / "saved.json") >= 3
    algo_cache.clear()


def test_an_op_runs_after_each_kind_of_error(tmp_path, monkeypatch):
    """The errors above, one of each, then a real op call on each backend path it may take."""
    with pytest.raises(TypeError):
        config.set(["dnn.enabled"], "auto")
    with pytest.raises(ValueError):
        config.set("dnn.conv.workspace_limit", float("inf"))
    rc = tmp_path / "dnnkitrc"
    rc.write_bytes("[dnn]\nenabled = auto\n".encode("utf-16"))
    monkeypatch.setenv("DNNKIT_RC", str(rc))
    with pytest.raises(config.ConfigError):
        config.reload()
    cache = tmp_path / "algos.json"
    cache.write_bytes(b"[" * 100000)
    with pytest.raises(ValueError):
        algo_cache.load(cache)
    _good_call(run=True)
