"""Every kernel compiles to PTX for sm_90 in every dtype (the simulator would hide type errors),
float32 kernels contain no float64 arithmetic (a stray Python literal promotes to double), and
no kernel multiplies integers in 32 bits (an index product that wraps past 2**31 elements).

Why the last check holds today: Numba types threadIdx/blockIdx/blockDim/gridDim as int32 but
promotes every integer operation to int64 (its integer typing widens to intp), and the kernels'
integer arguments are int64, so index products compile to ``mul.wide.s32`` or 64-bit
``mul.lo.s64``. The only 32-bit multiplies in the PTX are LLVM's division bypass: a 64-bit
division whose operands both fit in 32 bits (tested at run time) is done as ``div.u32``, and
its remainder as ``mul.lo.s32`` of that quotient (right after it, or scheduled elsewhere),
which cannot wrap. A kernel that multiplies in 32 bits on purpose (a value proven below
2**31, e.g. within a plane) is listed in its module's ``INDEX32`` tuple."""

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import json, re, sys
import dnnkit.kernels
from dnnkit.kernels.signatures import DTYPES, signatures, ptx as compile_ptx
out = {}
kernels = dnnkit.kernels.all_kernels()
for dt in sys.argv[1:]:
    sigs = signatures(dt)
    for name in sorted(kernels):
        if name not in sigs:
            out[f"{name}/{dt}"] = "no signature"
            continue
        ptx, _ = compile_ptx(kernels[name], sigs[name], cc=(9, 0))
        f64 = len(re.findall(r"\.f64\b", ptx))
        lines = [l.strip() for l in ptx.splitlines() if l.strip()]
        # quotients of LLVM's 32-bit division bypass; their remainder's multiply may be
        # scheduled away from the div.u32 (into another block)
        quot = {m.group(1) for l in lines for m in [re.match(r"div\.[su]32\s+(%r\d+),", l)]
                if m}
        mul32 = sum(1 for i, l in enumerate(lines)
                    if re.match(r"(mul|mad)\.lo\.[su]32\b", l)
                    and not re.match(r"div\.[su]32\b", lines[i - 1])
                    and not set(re.findall(r"%r\d+\b", l.split(",", 1)[1])) & quot)
        out[f"{name}/{dt}"] = {"ok": ".target sm_90" in ptx, "f64": f64, "mul32": mul32,
                               "mma": ptx.count("mma.sync.aligned.m16n8k")}
print(json.dumps(out))
"""


def test_every_kernel_compiles_for_sm90():
    # one process per dtype, side by side (compiling is single-threaded; CI has two cores)
    from dnnkit.kernels.signatures import DTYPES
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT, dt], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for dt in DTYPES]
    result = {}
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        result.update(json.loads(out.strip().splitlines()[-1]))
    import dnnkit.kernels
    names = list(dnnkit.kernels.all_kernels())
    assert sorted(set(k.split("/")[0] for k in result)) == sorted(names)
    assert len(names) >= 4
    index32 = {n for m in dnnkit.kernels.FAMILY_MODULES for n in getattr(m, "INDEX32", ())}
    no_f64 = {n for m in dnnkit.kernels.FAMILY_MODULES for n in getattr(m, "NO_FLOAT64", ())}
    only = {n: d for m in dnnkit.kernels.FAMILY_MODULES
            for n, d in getattr(m, "ONLY_DTYPES", {}).items()}
    for key, v in result.items():
        name, dt = key.split("/")
        if v == "no signature" and (dt == "float64" and name in no_f64
                                    or dt not in only.get(name, (dt,))):
            continue        # declared for other data types only (tensor cores)
        assert v != "no signature", key
        assert v["ok"], key
        # the tensor-core GEMMs (and only they) multiply with mma (m16n8k8 or m16n8k16)
        assert (v["mma"] > 0) == (key.split("/")[0] in no_f64), key
        if key.split("/")[0] not in index32:
            assert v["mul32"] == 0, f"{key}: {v['mul32']} 32-bit integer multiplies"
        if not key.endswith("float64"):
            assert v["f64"] == 0, f"{key}: {v['f64']} float64 instructions in a float32 kernel"
