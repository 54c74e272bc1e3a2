"""Every kernel compiles to PTX for sm_90 in every dtype (the simulator would hide type errors),
and float32 kernels contain no float64 arithmetic (a stray Python literal promotes to double)."""

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import json, re
import dnnkit.kernels as K
from dnnkit.kernels.signatures import DTYPES, signatures
from numba import cuda
out = {}
kernels = K.all_kernels()
for dt in DTYPES:
    sigs = signatures(dt)
    for name in sorted(kernels):
        if name not in sigs:
            out[f"{name}/{dt}"] = "no signature"
            continue
        kern = kernels[name]
        bounds = getattr(kern.py_func, "launch_bounds", None)
        ptx, _ = cuda.compile_ptx(kern.py_func, sigs[name], cc=(9, 0), launch_bounds=bounds)
        f64 = len(re.findall(r"\.f64\b", ptx))
        out[f"{name}/{dt}"] = {"ok": ".target sm_90" in ptx, "f64": f64}
print(json.dumps(out))
"""


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    import dnnkit.kernels as K
    names = list(K.all_kernels())
    assert sorted(set(k.split("/")[0] for k in result)) == sorted(names)
    assert len(names) >= 4
    for key, v in result.items():
        assert v != "no signature", key
        assert v["ok"], key
        if not key.endswith("float64"):
            assert v["f64"] == 0, f"{key}: {v['f64']} float64 instructions in a float32 kernel"
