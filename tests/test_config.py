import contextlib
import os
import re
import threading

import numpy as np
import pytest

import dnnkit
from dnnkit import config


def test_defaults():
    assert config.dnn.enabled == "auto"
    assert config.dnn.library_path == ""
    assert config.dnn.deterministic is False
    assert config.dnn.verbose is False
    assert config.dnn.crosscheck is False
    assert config.source("dnn.enabled") == "default"


def _rc(tmp_path, monkeypatch, text):
    p = tmp_path / "dnnkitrc"
    p.write_text(text)
    monkeypatch.setenv("DNNKIT_RC", str(p))
    config.reload()


def test_precedence_python_over_env_over_rc_over_default(tmp_path, monkeypatch):
    _rc(tmp_path, monkeypatch, "[dnn]\nenabled = disabled\nverbose = True\n")
    assert (config.dnn.enabled, config.source("dnn.enabled")) == ("disabled", "rc")
    assert config.dnn.verbose is True
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.enabled=forced, dnn.crosscheck=1")
    config.reload()
    assert (config.dnn.enabled, config.source("dnn.enabled")) == ("forced", "env")
    assert config.dnn.crosscheck is True and config.dnn.verbose is True
    config.dnn.enabled = "auto"
    assert (config.dnn.enabled, config.source("dnn.enabled")) == ("auto", "python")
    config.reload()  # re-reading env and rc keeps the Python assignment
    assert config.dnn.enabled == "auto"
    with config.change_flags({"dnn.enabled": "disabled"}):
        assert (config.dnn.enabled, config.source("dnn.enabled")) == ("disabled", "change_flags")
    assert config.dnn.enabled == "auto"


def test_dnnkit_config_is_the_module():
    dnnkit.config.dnn.enabled = "disabled"
    assert config.get("dnn.enabled") == "disabled"


@pytest.mark.parametrize("value,expected", [(True, "forced"), (False, "disabled"),
                                            ("True", "forced"), ("False", "disabled"),
                                            ("FORCED", "forced"), (" auto ", "auto")])
def test_theano_spellings(value, expected):
    config.dnn.enabled = value
    assert config.dnn.enabled == expected


def test_bad_value_lists_allowed_values():
    with pytest.raises(ValueError, match=r"dnn.enabled.*'sometimes'.*auto, forced, disabled"):
        config.dnn.enabled = "sometimes"
    with pytest.raises(ValueError, match=r"dnn.verbose.*'loud'.*True, False"):
        config.set("dnn.verbose", "loud")
    assert config.dnn.enabled == "auto"


def test_unknown_flag_lists_known_flags():
    with pytest.raises(ValueError, match=r"unknown flag 'dnn.enable'.*dnn.enabled"):
        config.dnn.enable = "forced"
    with pytest.raises(ValueError, match=r"unknown flag 'dnn.bogus'"):
        config.dnn.bogus
    assert not hasattr(config.dnn, "bogus")
    with pytest.raises(ValueError, match="unknown flag"):
        with config.change_flags({"dnn.nope": 1}):
            pass


def test_bad_env_and_rc_name_their_source(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.enabled")
    with pytest.raises(ValueError, match="DNNKIT_FLAGS"):
        config.reload()
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.enabled=maybe")
    with pytest.raises(ValueError, match="maybe"):
        config.reload()
    monkeypatch.delenv("DNNKIT_FLAGS")
    with pytest.raises(ValueError, match="rc file .*dnnkitrc.*perhaps"):
        _rc(tmp_path, monkeypatch, "[dnn]\ncrosscheck = perhaps\n")


def test_change_flags_restores_on_exception_and_nests():
    with pytest.raises(RuntimeError):
        with config.change_flags({"dnn.enabled": "disabled"}):
            with config.change_flags(dnn__enabled="forced", dnn__verbose=True):
                assert config.dnn.enabled == "forced" and config.dnn.verbose is True
            assert config.dnn.enabled == "disabled" and config.dnn.verbose is False
            raise RuntimeError("boom")
    assert config.dnn.enabled == "auto"


def test_change_flags_is_scoped_to_its_thread():
    inside, seen, done = threading.Event(), [], threading.Event()

    def other():
        inside.wait(5)
        seen.append(config.dnn.enabled)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with config.change_flags({"dnn.enabled": "disabled"}):
        inside.set()
        done.wait(5)
        assert config.dnn.enabled == "disabled"
    t.join()
    assert seen == ["auto"]


def test_describe_lists_every_flag():
    names = [row[0] for row in config.describe()]
    assert {"dnn.enabled", "dnn.library_path", "dnn.deterministic", "dnn.verbose",
            "dnn.crosscheck"} <= set(names)
    assert "dnn.enabled = 'auto'" in repr(config.dnn)


def test_allocator_flag_is_known_right_after_import():
    """dnn.allocator lives in dnnkit.memory; `import dnnkit` must register it, so that
    DNNKIT_FLAGS, the rc file and config.describe() know it before the first op runs."""
    import subprocess
    import sys
    code = ("import dnnkit; from dnnkit import config; "
            "print(config.get('dnn.allocator'), "
            "[n for n, *_ in config.describe()].count('dnn.allocator'))")
    import os
    env = dict(os.environ, DNNKIT_FLAGS="dnn.allocator=numba")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["numba", "1"], r.stdout + r.stderr


# ------------------------------------------------------------- a damaged rc file

def _rc_bytes(tmp_path, monkeypatch, data):
    p = tmp_path / "dnnkitrc"
    p.write_bytes(data)
    monkeypatch.setenv("DNNKIT_RC", str(p))
    return str(p)


def test_rc_values_are_literal(tmp_path, monkeypatch):
    _rc(tmp_path, monkeypatch, "[dnn]\nlibrary_path = /opt/100%/lib %(x)s\n")
    assert config.dnn.library_path == "/opt/100%/lib %(x)s"
    assert config.source("dnn.library_path") == "rc"


@pytest.mark.parametrize("data,words", [
    ("[dnn]\nenabled = forced\n".encode("utf-16"), ["UTF-16"]),
    (bytes(range(256)), ["line 1, column 1", "binary"]),
    (b"[dnn]\nverbose = 1\nenabled = d\xe9sactiv\xe9\n", ["line 3, column 12", "0xe9"]),
    (b"enabled = forced\n", ["line 1", "before any [section]"]),
    (b"[dnn]\nverbose = 1\nenabled forced\n", ["line 3", "'enabled forced'"]),
    (b"[dnn]\nenabled = auto\nenabled = forced\n", ["line 3", "'enabled' appears twice"]),
    (b"[dnn]\nverbose = 1\n[dnn]\n", ["line 3", "[dnn] appears twice"]),
    (b"[dnn]\nverbose = 1\n\n[dnn.conv]\nalgo_fwd = quickest\n",
     ["line 5", "dnn.conv.algo_fwd", "'quickest'"]),
    (b"[dnn]\nverbose = 1\nnope = 2\n", ["line 3", "unknown flag 'dnn.nope'"]),
])
def test_a_bad_rc_file_gives_one_message_naming_the_file_and_line(tmp_path, monkeypatch, data,
                                                                  words):
    path = _rc_bytes(tmp_path, monkeypatch, data)
    for _ in range(2):          # every read raises until the file is fixed: nothing half-read
        with pytest.raises(config.ConfigError) as ei:
            config.reload()
        msg = str(ei.value)
        assert msg.startswith(f"rc file {path}") and "\n" not in msg, msg
        for w in words:
            assert w in msg, msg
    assert isinstance(ei.value, ValueError)
    assert config.dnn.enabled == "auto"        # a failed reload keeps what was read before
    # read lazily (a fresh process): every flag read raises until the file is fixed
    config.state.loaded, config.state.merged = False, None
    for _ in range(2):
        with pytest.raises(config.ConfigError, match="rc file"):
            config.get("dnn.enabled")
    # the next good file works, and nothing of the bad one was applied
    _rc(tmp_path, monkeypatch, "[dnn]\nverbose = yes\n")
    assert config.dnn.verbose is True and config.dnn.enabled == "auto"


def test_a_bad_rc_file_in_python_m_dnnkit_info(tmp_path):
    import os
    import subprocess
    import sys
    rc = tmp_path / "dnnkitrc"
    rc.write_bytes("[dnn]\nlibrary_path = /opt/100%/lib\n".encode("utf-16"))
    env = {k: v for k, v in os.environ.items() if k != "DNNKIT_FLAGS"}
    env.update(DNNKIT_RC=str(rc), NUMBA_ENABLE_CUDASIM="1")
    r = subprocess.run([sys.executable, "-m", "dnnkit", "info"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"rc file {rc}: is UTF-16 text" in r.stderr
    rc.write_text("[dnn]\nlibrary_path = /opt/100%/lib\n")      # literal: it runs
    r = subprocess.run([sys.executable, "-m", "dnnkit", "info"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "/opt/100%/lib" in r.stdout


def test_bad_dnnkit_flags_is_a_config_error(monkeypatch):
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.memo=perhaps")
    with pytest.raises(config.ConfigError, match="DNNKIT_FLAGS: flag dnn.memo: bad value"):
        config.reload()


@pytest.mark.parametrize("value,expect", [
    (0, 0), (1 << 40, 1 << 40), ("1048576", 1 << 20), (1e9, 10**9), ("1e9", 10**9),
    (" auto ", "auto"),
])
def test_workspace_limit_takes_whole_numbers_of_bytes(value, expect):
    config.set("dnn.conv.workspace_limit", value)
    assert config.get("dnn.conv.workspace_limit") == expect


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), "inf", 1.5, -1,
                                   "-5", True, None, [1], "lots", "1.5e3.2"])
def test_workspace_limit_refuses_the_rest_clearly(value):
    with pytest.raises(ValueError, match=r"flag dnn.conv.workspace_limit: bad value .*"
                                         r"allowed: 'auto' or a whole number of bytes >= 0"):
        config.set("dnn.conv.workspace_limit", value)
    assert config.get("dnn.conv.workspace_limit") == "auto"        # unchanged


# ------------------------------------------------------------- Theano's old names

BWD = ("dnn.conv.algo_bwd_data", "dnn.conv.algo_bwd_filter")


def _algos():
    return {n: config.get(n) for n in ("dnn.conv.algo_fwd",) + BWD}


@pytest.mark.parametrize("name,value,expect,advice", [
    ("dnn.conv.algo_bwd", "fft", dict.fromkeys(BWD, "fft"),
     "write dnn.conv.algo_bwd_data = fft, dnn.conv.algo_bwd_filter = fft"),
    ("dnn.conv.algo_bwd", "time_once", dict.fromkeys(BWD, "time_once"),
     "write dnn.conv.algo_bwd_data = time_once, dnn.conv.algo_bwd_filter = time_once"),
    # "small" is a filter algorithm; its data-gradient spelling is none (ALGO_0)
    ("dnn.conv.algo_bwd", "small", {BWD[0]: "none", BWD[1]: "small"},
     "write dnn.conv.algo_bwd_data = none, dnn.conv.algo_bwd_filter = small"),
    ("dnn.conv.algo_bwd_data", "small", {BWD[0]: "none"},
     "flag dnn.conv.algo_bwd_data: value 'small' is deprecated"),
    ("dnn.conv.workmem", "large", {"dnn.conv.algo_fwd": "large"},
     "write dnn.conv.algo_fwd = large"),
    ("dnn.conv.workmem_bwd", "deterministic", dict.fromkeys(BWD, "deterministic"),
     "write dnn.conv.algo_bwd_data = deterministic, dnn.conv.algo_bwd_filter = deterministic"),
    ("dnn.bin_path", "/opt/cudnn/lib", {"dnn.library_path": "/opt/cudnn/lib"},
     "write dnn.library_path = /opt/cudnn/lib"),
])
@pytest.mark.parametrize("how", ["set", "attribute", "change_flags"])
def test_old_names_from_python_warn_and_set_the_new_flags(name, value, expect, advice, how):
    before = {k: config.get(k) for k in expect}
    with pytest.warns(DeprecationWarning, match=re.escape(advice)) as record:
        if how == "set":
            config.set(name, value)
        elif how == "attribute":
            ns = config.dnn
            *path, last = name.split(".")[1:]
            for part in path:
                ns = getattr(ns, part)
            setattr(ns, last, value)
        else:
            block = config.change_flags({name: value})
            block.__enter__()
    # attributed to the line that set it, so Python's default filters show it in a script
    assert {w.filename for w in record} == {__file__}
    try:
        assert {k: config.get(k) for k in expect} == expect
        assert {config.source(k) for k in expect} == {"python" if how != "change_flags"
                                                      else "change_flags"}
    finally:
        if how == "change_flags":
            block.__exit__(None, None, None)
    if how == "change_flags":
        assert {k: config.get(k) for k in expect} == before


def test_old_names_from_dnnkit_flags(monkeypatch):
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.conv.algo_bwd=fft, dnn.conv.workmem=small")
    with pytest.warns(DeprecationWarning) as record:
        config.reload()
    said = [str(w.message) for w in record]
    assert said == [
        "DNNKIT_FLAGS: flag dnn.conv.algo_bwd is deprecated (Theano's one flag for both "
        "backward directions); write dnn.conv.algo_bwd_data = fft, dnn.conv.algo_bwd_filter = "
        "fft",
        "DNNKIT_FLAGS: flag dnn.conv.workmem is deprecated (Theano 0.7's forward algorithm "
        "flag); write dnn.conv.algo_fwd = small"]
    assert _algos() == {"dnn.conv.algo_fwd": "small", BWD[0]: "fft", BWD[1]: "fft"}
    assert {config.source(k) for k in _algos()} == {"env"}


def test_old_names_from_the_rc_file_name_the_line(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    with pytest.warns(DeprecationWarning) as record:
        _rc(tmp_path, monkeypatch, "[dnn]\nverbose = 1\ninclude_path = /usr/include\n"
                                   f"base_path = {tmp_path}\n\n[dnn.conv]\n"
                                   "algo_bwd = deterministic\n")
    rc = tmp_path / "dnnkitrc"
    said = [str(w.message) for w in record]
    assert said == [
        f"rc file {rc}, line 3: flag dnn.include_path is deprecated (Theano's cuDNN header "
        "folder; dnnkit compiles nothing against cuDNN, and dnn.library_path chooses the "
        "library); it has no effect",
        f"rc file {rc}, line 4: flag dnn.base_path is deprecated (Theano's cuDNN install root);"
        f" write dnn.library_path = {tmp_path / 'lib'}",
        f"rc file {rc}, line 7: flag dnn.conv.algo_bwd is deprecated (Theano's one flag for "
        "both backward directions); write dnn.conv.algo_bwd_data = deterministic, "
        "dnn.conv.algo_bwd_filter = deterministic"]
    assert config.dnn.library_path == str(tmp_path / "lib")
    assert config.source("dnn.library_path") == "rc"
    assert {config.get(k) for k in BWD} == {"deterministic"}


def test_an_old_name_loses_to_the_new_name_in_the_same_source(tmp_path, monkeypatch):
    """Whatever the order: the new name is the more precise of the two."""
    for text in ("dnn.conv.algo_bwd_data=deterministic,dnn.conv.algo_bwd=fft",
                 "dnn.conv.algo_bwd=fft,dnn.conv.algo_bwd_data=deterministic"):
        monkeypatch.setenv("DNNKIT_FLAGS", text)
        with pytest.warns(DeprecationWarning):
            config.reload()
        assert (config.get(BWD[0]), config.get(BWD[1])) == ("deterministic", "fft")
    monkeypatch.delenv("DNNKIT_FLAGS")
    with pytest.warns(DeprecationWarning):
        _rc(tmp_path, monkeypatch, "[dnn.conv]\nalgo_bwd_filter = none\nalgo_bwd = fft\n")
    assert (config.get(BWD[0]), config.get(BWD[1])) == ("fft", "none")
    with pytest.warns(DeprecationWarning):
        with config.change_flags({"dnn.conv.algo_bwd_data": "winograd",
                                  "dnn.conv.algo_bwd": "time_once"}):
            assert (config.get(BWD[0]), config.get(BWD[1])) == ("winograd", "time_once")
    # in Python assignments the last one wins, as for any flag
    config.set(BWD[0], "none")
    with pytest.warns(DeprecationWarning):
        config.set("dnn.conv.algo_bwd", "fft")
    assert config.get(BWD[0]) == "fft"


def test_base_path_finds_lib64_else_lib(tmp_path):
    def library_path_for(root):
        with pytest.warns(DeprecationWarning, match="dnn.base_path is deprecated"):
            config.set("dnn.base_path", root)
        return config.dnn.library_path
    assert library_path_for(tmp_path) == str(tmp_path / "lib64")       # Theano's rule
    (tmp_path / "lib").mkdir()
    assert library_path_for(tmp_path) == str(tmp_path / "lib")         # a cuDNN archive's
    (tmp_path / "lib64").mkdir()
    assert library_path_for(tmp_path) == str(tmp_path / "lib64")
    assert library_path_for("") == ""                                  # search as usual


def test_old_names_cannot_be_read_and_say_what_to_read():
    with pytest.raises(config.UnknownFlagError,
                       match="read dnn.conv.algo_bwd_data and dnn.conv.algo_bwd_filter"):
        config.get("dnn.conv.algo_bwd")
    with pytest.raises(AttributeError, match="read dnn.library_path"):
        config.dnn.base_path
    assert not hasattr(config.dnn.conv, "algo_bwd")
    with pytest.raises(ValueError, match="dnn.include_path is a deprecated name.*no value"):
        config.source("dnn.include_path")
    names = [row[0] for row in config.describe()]
    assert not {"dnn.conv.algo_bwd", "dnn.base_path", "dnn.include_path"} & set(names)


@pytest.mark.parametrize("how,name", [
    (lambda n: config.set(n, 1), ["dnn.enabled"]),
    (lambda n: config.set(n, 1), ("dnn", "enabled")),
    (lambda n: config.change_flags({n: 1}).__enter__(), ("dnn", "enabled"))])
def test_a_name_that_is_not_a_str_is_a_type_error(how, name):
    with pytest.raises(TypeError, match="a flag name is a str such as 'dnn.enabled'; got"):
        how(name)


def test_include_path_has_no_effect_but_is_still_checked():
    before = config.describe()
    with pytest.warns(DeprecationWarning, match="it has no effect"):
        config.set("dnn.include_path", "/usr/local/cuda/include")
    assert config.describe() == before
    with pytest.raises(ValueError, match=r"dnn.include_path.*bad value 3"):
        config.set("dnn.include_path", 3)


def test_a_bad_value_through_an_old_name_names_both_and_sets_nothing(monkeypatch):
    # winograd is a data-gradient algorithm only
    with pytest.raises(ValueError, match=r"flag dnn.conv.algo_bwd \(sets dnn.conv.algo_bwd_data, "
                                         r"dnn.conv.algo_bwd_filter\): flag "
                                         r"dnn.conv.algo_bwd_filter: bad value 'winograd'"):
        config.set("dnn.conv.algo_bwd", "winograd")
    assert {config.source(k) for k in BWD} == {"default"}
    monkeypatch.setenv("DNNKIT_FLAGS", "dnn.conv.algo_bwd=quick")
    with pytest.raises(config.ConfigError, match="DNNKIT_FLAGS: flag dnn.conv.algo_bwd "):
        config.reload()


def test_a_script_sees_the_warning_by_default(tmp_path):
    """Python shows a DeprecationWarning by default only when it is attributed to __main__:
    the warnings of an assignment and of DNNKIT_FLAGS both name the script's line."""
    import os
    import subprocess
    import sys
    code = ("import dnnkit\nfrom dnnkit import config\nconfig.get('dnn.enabled')\n"
            "config.dnn.conv.algo_bwd = 'none'\n")
    env = dict(os.environ, DNNKIT_FLAGS="dnn.conv.workmem=large",
               DNNKIT_RC=str(tmp_path / "absent"))
    env.pop("PYTHONWARNINGS", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "<string>:3: DeprecationWarning: DNNKIT_FLAGS: flag dnn.conv.workmem" in r.stderr
    assert "<string>:4: DeprecationWarning: flag dnn.conv.algo_bwd is deprecated" in r.stderr


# ------------------------------------------------------------- dnn.benchmark

def _set_in(source, name, value, tmp_path, monkeypatch, stack):
    """Give ``name`` = ``value`` from one source (stack: an ExitStack for change_flags)."""
    if source == "python":
        config.set(name, value)
    elif source == "change_flags":
        stack.enter_context(config.change_flags({name: value}))
    elif source == "env":
        old = os.environ.get("DNNKIT_FLAGS", "")
        monkeypatch.setenv("DNNKIT_FLAGS", ",".join(filter(None, [old, f"{name}={value}"])))
        config.reload()
    else:
        rc = tmp_path / "dnnkitrc"
        text = rc.read_text() if rc.exists() else ""
        section, key = name.rsplit(".", 1)
        rc.write_text(text + f"[{section}]\n{key} = {value}\n")
        monkeypatch.setenv("DNNKIT_RC", str(rc))
        config.reload()


SOURCES = ["rc", "env", "python", "change_flags"]


def test_benchmark_moves_the_algorithm_defaults_to_time_once():
    assert config.dnn.benchmark is False and set(_algos().values()) == {"guess_once"}
    config.dnn.benchmark = True
    assert set(_algos().values()) == {"time_once"}
    assert {config.source(k) for k in _algos()} == {"dnn.benchmark"}
    rows = {name: (value, src) for name, value, src, _ in config.describe()}
    assert rows["dnn.conv.algo_fwd"] == ("time_once", "dnn.benchmark")
    config.dnn.benchmark = False
    assert set(_algos().values()) == {"guess_once"}
    assert {config.source(k) for k in _algos()} == {"default"}


@pytest.mark.parametrize("bench_from", SOURCES)
@pytest.mark.parametrize("algo_from", SOURCES)
def test_an_explicit_algorithm_flag_wins_over_benchmark_from_any_source(
        bench_from, algo_from, tmp_path, monkeypatch):
    """The rule: dnn.benchmark changes the default only. An algorithm flag given a value
    anywhere keeps it, whichever of the two sources ranks higher; the other two flags follow
    dnn.benchmark."""
    with contextlib.ExitStack() as stack:
        _set_in(algo_from, "dnn.conv.algo_fwd", "guess_once", tmp_path, monkeypatch, stack)
        _set_in(bench_from, "dnn.benchmark", "True", tmp_path, monkeypatch, stack)
        assert config.dnn.benchmark is True
        assert _algos() == {"dnn.conv.algo_fwd": "guess_once", BWD[0]: "time_once",
                            BWD[1]: "time_once"}
        assert config.source("dnn.conv.algo_fwd") == algo_from
        assert config.source(BWD[0]) == "dnn.benchmark"
    assert config.get(BWD[0]) == ("time_once" if bench_from != "change_flags" else "guess_once")


def test_benchmark_in_a_block_and_on_another_thread():
    config.dnn.benchmark = True
    with config.change_flags(dnn__benchmark=False):
        assert set(_algos().values()) == {"guess_once"}
        with config.change_flags({"dnn.conv.algo_bwd_filter": "fft"}):
            assert set(_algos().values()) == {"guess_once", "fft"}
    assert set(_algos().values()) == {"time_once"}
    config.dnn.benchmark = False
    seen = []
    with config.change_flags(dnn__benchmark=True):
        t = threading.Thread(target=lambda: seen.append(_algos()))
        t.start()
        t.join()
        assert set(_algos().values()) == {"time_once"}
    assert set(seen[0].values()) == {"guess_once"}          # the block is this thread's only


def test_benchmark_reaches_the_convolution_options_and_a_call_algo_wins():
    from dnnkit.ops import conv_args
    config.dnn.benchmark = True
    for direction in ("fwd", "bwd_data", "bwd_filter"):
        assert conv_args.resolve_opts("conv2d", direction, np.float32, None,
                                      None)["algo"] == "time_once"
    assert conv_args.resolve_opts("conv2d", "fwd", np.float32, "fft", None)["algo"] == "fft"
    config.reset()                                           # forgets it like any assignment
    assert conv_args.resolve_opts("conv2d", "fwd", np.float32, None, None)["algo"] == \
        "guess_once"
