"""Stored cubins on a GPU (dnnkit.cubins): a fresh process launches the kernels an earlier one
compiled without Numba's dispatcher (its compile and cache load are made to raise) and gets
the same bits; a cubin the driver refuses is dropped for Numba's overload, and the results
stay the same; only a process that compiled a kernel stores its cubin.

Run on a GPU: python -m pytest -q tests/gpu/test_cubins.py
"""

import glob
import hashlib
import json
import os
import subprocess
import sys

import pytest

from dnnkit import cubins

_SCRIPT = r"""
import hashlib, json, sys
import numpy as np
from numba import cuda
import dnnkit
from dnnkit import cubins
from numba.cuda.dispatcher import CUDADispatcher
compiled, plain = [0], CUDADispatcher.compile
if sys.argv[1] == "forbid":
    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"Numba's dispatcher compiled or loaded {self.py_func.__name__}")
    CUDADispatcher.compile = refuse
else:
    def counting(self, sig):            # the signatures Numba compiled (not cache loads)
        before = sum(self.stats.cache_misses.values())
        out = plain(self, sig)
        compiled[0] += sum(self.stats.cache_misses.values()) - before
        return out
    CUDADispatcher.compile = counting
rng = np.random.default_rng(0)
x = cuda.to_device(rng.standard_normal((2, 4, 9, 9)).astype(np.float32))
w = cuda.to_device(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
h = hashlib.sha256()
for _ in range(2):                  # the second call takes the memo's packed launches
    y = dnnkit.conv2d(x, w, padding=1, backend="numba")
    z = dnnkit.activation(y, "relu", backend="numba")
    p = dnnkit.pool2d(z, 2, backend="numba")
    s = dnnkit.softmax(p, backend="numba")
    for a in (y, z, p, s):
        v = np.asarray(a.copy_to_host())
        assert np.isfinite(v).all()
        h.update(v.tobytes())
print(json.dumps({"digest": h.hexdigest(), "cubins": cubins.loaded, "compiled": compiled[0]}))
"""


def _run(mode, cache):
    # compile ahead off: its background compiles would store other kernels' cubins too
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), DNNKIT_FLAGS="dnn.compile_ahead=False")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_a_fresh_process_launches_stored_cubins_without_numba(tmp_path):
    first = _run("plain", tmp_path)                   # compiles through Numba, stores cubins
    stored = sorted(glob.glob(os.path.join(str(tmp_path), "**", cubins.FOLDER, "*.cubin"),
                              recursive=True))
    assert first["cubins"] == 0 and first["compiled"] >= len(stored) >= 4, (first, stored)
    for p in stored:
        entry, cubin = cubins.read(p)
        assert cubin.startswith(b"\x7fELF") and entry
    second = _run("forbid", tmp_path)                 # Numba's dispatcher would raise
    assert second["digest"] == first["digest"]
    assert second["cubins"] == len(stored)

    # every file's machine code replaced by bytes no driver loads: Numba's overload (from its
    # cache) is taken and the file removed; not written again from a cache load (cubins.store)
    for p in stored:
        entry, _ = cubins.read(p)
        with open(p, "wb") as f:
            f.write(cubins.MAGIC + entry.encode() + b"\n" + b"not a cubin")
    third = _run("plain", tmp_path)
    assert third["compiled"] == 0, "Numba's cache missed in a later process: " + str(third)
    assert third["digest"] == first["digest"] and third["cubins"] == 0
    assert not any(os.path.exists(p) for p in stored)

    # Numba's index files gone: the next process compiles, and stores every cubin again
    for p in glob.glob(os.path.join(str(tmp_path), "**", "*.nbi"), recursive=True):
        os.remove(p)
    fourth = _run("plain", tmp_path)
    assert fourth["digest"] == first["digest"] and fourth["compiled"] == first["compiled"]
    for p in stored:
        assert cubins.read(p)[1].startswith(b"\x7fELF"), p
    assert _run("forbid", tmp_path)["digest"] == first["digest"]
    digests = {hashlib.sha256(open(p, "rb").read()).hexdigest() for p in stored}
    assert len(digests) == len(stored)
