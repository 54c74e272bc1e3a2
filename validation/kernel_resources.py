"""Registers, spills, stack and instruction count of every kernel, per dtype, for sm_90 — no
GPU needed.

    python -m validation.kernel_resources [--ptxas PATH] [--dtypes float32,float16]
                                          [--only PREFIX] [--json OUT] [--compare BEFORE]

Compiles each kernel to PTX (kernels/signatures.py: ``ptx`` with the signatures there) and
assembles it with ptxas -v (from the CUDA toolkit or the nvidia-cuda-nvcc wheel); the
instruction count is the size of the cubin's code sections over 16 bytes (sm_90 encodes every
instruction in 16). Run with NUMBA_ENABLE_CUDASIM unset. Spills (local-memory stores and
loads) and a stack frame in a hot kernel are the first thing to fix; the figures that set a
kernel's launch bounds are on its page under validation/notes/.

A change meant to leave the machine code alone (how device functions are inlined, a refactor
of a kernel factory) is checked with ``--json before.json`` on the old tree and ``--compare
before.json`` on the new: every kernel whose registers, spills, stack or instruction count
moved is listed, and the exit status is 1 if any did.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
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


def instructions(cubin):
    """SASS instructions in an sm_90 cubin: its .text sections' bytes / 16."""
    from dnnkit import files
    with open(cubin, "rb") as f:
        _, _, sections = files.elf_sections(f)
    return sum(size for name, _, _, size, _ in sections if name.startswith(".text")) // 16


def report(ptxas, dtypes=None, only=""):
    import dnnkit.kernels as kernels
    from dnnkit.kernels.signatures import DTYPES, signatures
    from dnnkit.kernels.signatures import ptx as compile_ptx
    rows = []
    kernels = kernels.all_kernels()
    names = sorted(n for n in kernels if n.startswith(only))
    with tempfile.TemporaryDirectory() as tmp:
        for dt in dtypes or DTYPES:
            sigs = signatures(dt)
            for name in names:
                if name not in sigs:        # declared for other data types (tensor cores)
                    continue
                ptx, _ = compile_ptx(kernels[name], sigs[name], cc=(9, 0))
                path = os.path.join(tmp, f"{name}_{dt}.ptx")
                with open(path, "w") as f:
                    f.write(ptx)
                out = subprocess.run([ptxas, "-arch=sm_90", "-v", path, "-o", path + ".cubin"],
                                     capture_output=True, text=True)
                text = out.stderr + out.stdout
                row = dict(kernel=name, dtype=dt)
                for key, pat in _FIELDS.items():
                    m = re.findall(pat, text)
                    row[key] = max(map(int, m)) if m else 0
                if out.returncode:
                    row["error"] = text.strip().splitlines()[-1]
                else:
                    row["instructions"] = instructions(path + ".cubin")
                rows.append(row)
    return rows


def compare(before, rows):
    """Lines naming every kernel of ``rows`` whose figures differ from ``before`` (rows as
    ``--json`` wrote them), or that either side lacks."""
    key = lambda r: (r["kernel"], r["dtype"])        # noqa: E731
    old = {key(r): r for r in before}
    new = {key(r): r for r in rows}
    lines = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a is None or b is None:
            lines.append(f"{k[0]} {k[1]}: {'new' if a is None else 'gone'}")
            continue
        moved = [f"{f} {a.get(f)} -> {b.get(f)}" for f in list(_FIELDS) + ["instructions"]
                 if a.get(f) != b.get(f)]
        if moved:
            lines.append(f"{k[0]} {k[1]}: " + ", ".join(moved))
    return lines


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ptxas")
    p.add_argument("--dtypes", default="", help="comma-separated; default: every data type")
    p.add_argument("--only", default="", help="kernels whose name starts with this")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--compare", help="a --json file of an earlier tree: list what moved")
    a = p.parse_args()
    ptxas = find_ptxas(a.ptxas)
    rows = report(ptxas, [d for d in a.dtypes.split(",") if d] or None, a.only)
    print(f"ptxas: {ptxas}\n")
    print(f"{'kernel':<36} {'dtype':<8} {'regs':>5} {'stack':>6} {'spill st':>9} "
          f"{'spill ld':>9} {'smem':>6} {'instr':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<36} {r['dtype']:<8} ptxas failed: {r['error']}")
            continue
        print(f"{r['kernel']:<36} {r['dtype']:<8} {r['registers']:5d} {r['stack']:6d} "
              f"{r['spill_st']:9d} {r['spill_ld']:9d} {r['smem']:6d} {r['instructions']:6d}")
    if a.json:
        from dnnkit import files
        files.write_text(a.json, json.dumps(rows, indent=1))
    if a.compare:
        with open(a.compare) as f:
            moved = compare(json.load(f), rows)
        print(f"\nagainst {a.compare}: " + (f"{len(moved)} moved" if moved else
                                            "every kernel the same"))
        print("\n".join(moved))
        return 1 if moved else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
