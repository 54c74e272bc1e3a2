import threading

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
