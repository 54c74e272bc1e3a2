"""validation/kernel_resources.py: a kernel's registers and SASS instruction count from ptxas,
and ``compare``, which names whatever moved between two trees (the check that a refactor left
the machine code alone). Compiles in a subprocess without Numba's simulator (PTX needs the
real compiler); skipped where no ptxas is installed."""

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json
from validation import kernel_resources as kr
rows = kr.report(kr.find_ptxas(), ["float32"], "conv_partsum_fwd")
print(json.dumps(rows))
"""


def _ptxas():
    from validation import kernel_resources as kr
    try:
        return kr.find_ptxas()
    except SystemExit:
        return None


def test_report_counts_registers_and_instructions_and_compare_names_a_change():
    if _ptxas() is None:
        pytest.skip("no ptxas here (CUDA toolkit or nvidia-cuda-nvcc wheel)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                       env=env, cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["kernel"] == "conv_partsum_fwd_kernel" and row["dtype"] == "float32"
    assert "error" not in row and row["registers"] > 0 and row["instructions"] > 10
    from validation import kernel_resources as kr
    assert kr.compare([row], [dict(row)]) == []
    moved = dict(row, instructions=row["instructions"] + 8)
    assert kr.compare([row], [moved]) == [
        f"conv_partsum_fwd_kernel float32: instructions {row['instructions']} -> "
        f"{row['instructions'] + 8}"]
    assert kr.compare([row], []) == ["conv_partsum_fwd_kernel float32: gone"]
