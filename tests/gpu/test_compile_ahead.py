"""Compiling ahead on a GPU (dnnkit.compile_ahead): a fresh process with nothing cached takes
most of a training step's kernels from cubins compiled in the background, and its step is
bitwise the step of a process that compiled every kernel itself.

Run on a GPU: python -m pytest -q tests/gpu/test_compile_ahead.py
"""

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import hashlib, json, sys, time
import numpy as np
from dnnkit import compile_ahead, cubins, warmup
parts = warmup.setup("vgg", "float32", 8, "numba", width=8, image_size=16)
t0 = time.perf_counter()
with warmup.recording(launch=True, through_numba=False) as seen:
    loss = float(warmup.step(*parts).item())
step_s = time.perf_counter() - t0
stats = [k.stats for k in {id(k): k for k, _ in seen}.values()]
h = hashlib.sha256()
for p in parts[0].parameters():
    h.update(np.ascontiguousarray(p.numpy()).tobytes())
for j in compile_ahead.jobs:            # the process waits for its jobs (not needed by users)
    j.done.wait(600)
print(json.dumps({"loss": loss, "params": h.hexdigest(), "step_s": step_s,
                  "signatures": len({(id(k), t) for k, t in seen}),
                  "compiled": sum(sum(s.cache_misses.values()) for s in stats),
                  "cubins": cubins.loaded,
                  "jobs": [[len(j.entries), j.workers, j.error] for j in compile_ahead.jobs]}))
"""


def _run(cache, ahead):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache),
               DNNKIT_FLAGS=f"dnn.compile_ahead={ahead}")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_a_cold_first_step_takes_kernels_compiled_ahead_and_the_same_bits(tmp_path):
    alone = _run(tmp_path / "alone", False)
    ahead = _run(tmp_path / "ahead", True)
    assert alone["jobs"] == [] and alone["cubins"] == 0
    assert alone["compiled"] == alone["signatures"], alone
    assert ahead["jobs"] and all(err is None for _, _, err in ahead["jobs"]), ahead
    # most signatures came from the background (cubins), the rest compiled in the process
    assert ahead["cubins"] >= ahead["signatures"] // 2, ahead
    assert ahead["compiled"] < alone["compiled"] - ahead["cubins"] // 2, (ahead, alone)
    assert (ahead["loss"], ahead["params"]) == (alone["loss"], alone["params"])
    print(f"\nstep: {alone['step_s']:.1f} s compiling alone, {ahead['step_s']:.1f} s with "
          f"compile ahead ({ahead['cubins']} of {ahead['signatures']} signatures from cubins; "
          f"jobs {ahead['jobs']})")
