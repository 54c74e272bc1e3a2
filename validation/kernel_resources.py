"""Registers, spills and stack of every kernel, per dtype, for sm_90 — no GPU needed.

    python -m validation.kernel_resources [--ptxas PATH]

Compiles each kernel to PTX with numba.cuda.compile_ptx (the signatures of
kernels/signatures.py) and assembles it with ptxas -v (from the CUDA toolkit or the
nvidia-cuda-nvcc wheel). Run with NUMBA_ENABLE_CUDASIM unset. Spills (local-memory stores and
loads) and a stack frame in a hot kernel are the first thing to fix; the figures that set a
kernel's launch bounds are on its page under validation/notes/.
"""

import argparse
import os
import re
import shutil
import subprocess
import tempfile


def find_ptxas(explicit=None):
    if explicit:
        return explicit
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as m
        cand = os.path.join(list(m.__path__)[0], "bin", "ptxas")
        if os.path.exists(cand):
            return cand
    except ImportError:
        pass
    raise SystemExit("ptxas not found: install the CUDA toolkit or nvidia-cuda-nvcc-cu12")


_FIELDS = {"registers": r"Used (\d+) registers", "stack": r"(\d+) bytes stack frame",
           "spill_st": r"(\d+) bytes spill stores", "spill_ld": r"(\d+) bytes spill loads",
           "smem": r"(\d+) bytes smem"}


def report(ptxas):
    import dnnkit.kernels as kernels
    from dnnkit.kernels.signatures import DTYPES, signatures
    from dnnkit.kernels.signatures import ptx as compile_ptx
    rows = []
    kernels = kernels.all_kernels()
    names = sorted(kernels)
    with tempfile.TemporaryDirectory() as tmp:
        for dt in DTYPES:
            sigs = signatures(dt)
            for name in names:
                ptx, _ = compile_ptx(kernels[name], sigs[name], cc=(9, 0))
                path = os.path.join(tmp, f"{name}_{dt}.ptx")
                with open(path, "w") as f:
                    f.write(ptx)
                out = subprocess.run([ptxas, "-arch=sm_90", "-v", path, "-o", os.devnull],
                                     capture_output=True, text=True)
                text = out.stderr + out.stdout
                row = dict(kernel=name, dtype=dt)
                for key, pat in _FIELDS.items():
                    m = re.findall(pat, text)
                    row[key] = max(map(int, m)) if m else 0
                if out.returncode:
                    row["error"] = text.strip().splitlines()[-1]
                rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ptxas")
    a = p.parse_args()
    ptxas = find_ptxas(a.ptxas)
    print(f"ptxas: {ptxas}\n")
    print(f"{'kernel':<26} {'dtype':<8} {'regs':>5} {'stack':>6} {'spill st':>9} "
          f"{'spill ld':>9} {'smem':>6}")
    for r in report(ptxas):
        if "error" in r:
            print(f"{r['kernel']:<26} {r['dtype']:<8} ptxas failed: {r['error']}")
            continue
        print(f"{r['kernel']:<26} {r['dtype']:<8} {r['registers']:5d} {r['stack']:6d} "
              f"{r['spill_st']:9d} {r['spill_ld']:9d} {r['smem']:6d}")


if __name__ == "__main__":
    main()
