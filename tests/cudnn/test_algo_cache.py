"""The algorithm cache's file (dnnkit.cudnn.algo_cache.save/load), no GPU needed: a failed save
(a full disk shown by a file-size limit in a child process, a folder as the target) keeps the
previous file and leaves no temporary file; a damaged file (binary, UTF-16, truncated, nested
too deeply, empty) raises ValueError naming it and leaves the cache in memory as it was.
(The round trip and the format checks: tests/cudnn/test_conv.py.)"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dnnkit.cudnn import algo_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = {"pci": "0000:01:00", "name": "NVIDIA H100", "cc": (9, 0)}


def _key(groups=1, direction="fwd"):
    return algo_cache.make_key(
        direction, "time_once", device=DEVICE, cudnn_version=91900, nd=2,
        shapes=[(2, 4, 8, 8), (4, 4 // groups, 3, 3), (2, 4, 8, 8)],
        strides=[(256, 64, 8, 1), (36 // groups, 9, 3, 1), (256, 64, 8, 1)], padding=(1, 1),
        stride=(1, 1), dilation=(1, 1), groups=groups, flip=False, dtype="float32",
        compute_dtype="float32", math_type=0, deterministic=False, workspace_limit=2**30)


@pytest.fixture
def cache():
    """Two entries in memory."""
    algo_cache.clear()
    algo_cache.store("time_once", "fwd", _key(1), "implicit_precomp_gemm")
    algo_cache.store("time_once", "fwd", _key(2), "engine3_k2=1")
    yield
    algo_cache.clear()


def _state():
    return sorted(algo_cache._once.items()), algo_cache.stats()["entries"]


def _valid_text():
    return json.dumps({"format": algo_cache.FORMAT, "version": algo_cache.FORMAT_VERSION,
                       "entries": [{"key": json.loads(_key(4)), "algo": "fft"}]})


def _nested(depth):
    return '{"format": "dnnkit-cudnn-algo-cache", "version": 1, "entries": [' + \
        "[" * depth + "]" * depth + "]}"


@pytest.mark.parametrize("data,words", [
    (b"", ["invalid JSON"]),
    (_valid_text().encode()[:40], ["invalid JSON"]),                     # truncated
    (bytes(range(256)) * 4, ["NUL byte", "line 1"]),                      # binary
    (_valid_text().encode("utf-16"), ["UTF-16"]),
    (_valid_text().encode("latin-1") + b"\xe9", ["0xe9", "not UTF-8"]),
    (_nested(100000).encode(), ["nested too deeply"]),
    (_nested(500).encode(), ["entry 0 is malformed"]),
    (b'{"format": "dnnkit-cudnn-algo-cache", "version": 1, "entries": [{"key": [1, "a"], '
     b'"algo": "fft"}]}', ["entry 0 is malformed"]),
    (b'{"format": "dnnkit-cudnn-algo-cache", "version": 1, "entries": [{"key": {"direction": '
     b'["fwd"]}, "algo": ["fft"]}]}', ["entry 0 is malformed"]),
    (b"[1, 2]", ["not a dnnkit algorithm cache"]),
])
def test_a_damaged_file_raises_naming_it_and_changes_nothing(tmp_path, cache, data, words):
    path = tmp_path / "algos.json"
    path.write_bytes(data)
    before, hits = _state(), algo_cache.stats()["hits"]
    with pytest.raises(ValueError) as ei:
        algo_cache.load(path)
    msg = str(ei.value)
    assert str(path) in msg and all(w in msg for w in words), msg
    assert _state() == before
    # the next good call works
    good = tmp_path / "good.json"
    good.write_text(_valid_text())
    assert algo_cache.load(good) == 1 and algo_cache.get(_key(4)) == "fft"
    assert algo_cache.stats()["hits"] == hits + 1


def test_a_bom_is_accepted(tmp_path, cache):
    path = tmp_path / "algos.json"
    path.write_bytes(b"\xef\xbb\xbf" + _valid_text().encode())
    assert algo_cache.load(path) == 1


def test_saving_onto_a_folder_keeps_everything(tmp_path, cache):
    target = tmp_path / "algos.json"
    target.mkdir()
    before = _state()
    with pytest.raises(IsADirectoryError) as ei:
        algo_cache.save(target)
    assert str(target) in str(ei.value)
    assert sorted(os.listdir(tmp_path)) == ["algos.json"] and os.listdir(target) == []
    assert _state() == before
    algo_cache.save(tmp_path / "ok.json")          # the next good call works
    algo_cache.clear()
    assert algo_cache.load(tmp_path / "ok.json") == 2


CHILD = textwrap.dedent("""
    import resource, sys
    from dnnkit.cudnn import algo_cache
    path, limit, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for i in range(n):       # enough entries that the file is over the limit
        key = algo_cache.make_key(
            "fwd", "time_once", device={"pci": "0000:01:00", "name": "GPU", "cc": (9, 0)},
            cudnn_version=91900, nd=2, shapes=[(i + 1, 4, 8, 8), (4, 4, 3, 3), (i + 1, 4, 8, 8)],
            strides=[(256, 64, 8, 1)] * 3, padding=(1, 1), stride=(1, 1), dilation=(1, 1),
            groups=1, flip=False, dtype="float32", compute_dtype="float32", math_type=0,
            deterministic=False, workspace_limit=2**30)
        algo_cache.put(key, "fft")
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        algo_cache.save(path)
    except OSError as e:
        print("OSError", e.errno, e.filename == path)
    else:
        print("saved")
""")


def test_a_full_disk_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, cache):
    path = tmp_path / "algos.json"
    algo_cache.save(path)
    old = path.read_bytes()
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(len(old) + 100), "40"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OSError", "27", "True"]       # EFBIG, naming the file
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["algos.json"]
    algo_cache.clear()
    assert algo_cache.load(path) == 2
