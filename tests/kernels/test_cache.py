"""Every kernel's on-disk cache key is the same in every process.

Numba keys a cached kernel by its bytecode and the pickled bytes of its closure
(numba.core.caching, ``_index_key``), so a factory-built kernel (softmax, spatial, GEMM
variants) is found again only if its closure pickles identically in a new process. An
intrinsic pickles with a uuid drawn per process: the tensor-core GEMM, whose ``mma_slab``
closure calls two, would get a new key in every process and be recompiled by each (the first
conv of a second process: 5.2 s instead of 0.8 s on an H100). kernels/tensorcore.py gives its
intrinsics fixed uuids; this test compares the keys of two fresh processes (compiling
nothing; the real numba.cuda, as for the PTX check)."""

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import hashlib, json
import dnnkit.kernels
from numba.core.serialize import dumps
out = {}
for name, k in sorted(dnnkit.kernels.all_kernels().items()):
    f = k.py_func
    cells = () if f.__closure__ is None else tuple(c.cell_contents for c in f.__closure__)
    out[name] = hashlib.sha256(f.__code__.co_code + dumps(cells)).hexdigest()
print(json.dumps(out))
"""


def _keys():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cache_keys_are_the_same_in_every_process():
    first, second = _keys(), _keys()
    assert len(first) > 40 and first.keys() == second.keys()
    changed = sorted(n for n in first if first[n] != second[n])
    assert not changed, f"cache keys differ between processes (recompiled every time): {changed}"
    assert any(n.startswith("gemm_") and "_tc_" in n for n in first)   # the intrinsics' case
