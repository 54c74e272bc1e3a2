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
