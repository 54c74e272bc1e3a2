"""Softmax and activation kernels on a GPU: Numba next to cuDNN, kernel time only. Needs a GPU.

    python -m validation.softmax_bench [--reps 50] [--rounds 11] [--only softmax,relu]
                                       [--json out.json]

Per case, correctness first: both backends' outputs on one input set against the float64
reference (dnnkit.reference in NumPy, same inputs; max|got - ref| / max|ref|, a NaN where the
reference has none fails); a miss prints FAIL and makes the exit status 1. Then the time: the
GPU time per call with the host out of the way (validation.pool_bench.kernel_ms: a sleeping
kernel holds the stream while ``reps`` calls are queued behind it, CUDA events bracket the
queued calls; the median over ``rounds`` such samples, after warm-up calls), outputs reused
(no allocation between calls), inputs rotated among fresh random sets that together exceed
the L2 cache. GB/s = the bytes the op must move (each input read once, the output written
once) / time; %copy against the device's copy bandwidth measured in the same run;
"vs cuDNN" = cuDNN's time / Numba's (above 1: Numba is faster). The Numba softmax rows name
the launch configuration (dnnkit/ops/softmax.py: bx x by threads, K values per thread,
register-cached or streaming).
"""

import argparse
import importlib
import json
import math
import sys

import numpy as np

import dnnkit
from dnnkit import reference

L2_BYTES = 60e6          # H100 50 MB, H200 60 MB: the input sets together exceed three times it
TOL = 1e-5
SOFTMAX_2D = (8192, 4096)
SOFTMAX_4D = (64, 1000, 7, 7)        # channel mode: C = 1000 at stride S = 49
SOFTMAX_WIDE_S = (64, 32, 56, 56)    # channel mode: C = 32 at stride S = 3136
ACT = (64, 256, 56, 56)


def _softmax_case(algo, shape, direction):
    """(name, shape, make(rng) -> inputs, run(inputs, backend) -> output, ref(inputs) ->
    float64, bytes moved)."""
    from numba import cuda
    n = math.prod(shape)

    def make(rng):
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        inp = dict(x=cuda.to_device(x), xh=x)
        if direction == "bwd":
            y = dnnkit.softmax(inp["x"], algo, "channel", backend="numba")
            dy = rng.standard_normal(shape).astype(np.float32)
            inp.update(y=y, yh=y.copy_to_host(), dy=cuda.to_device(dy), dyh=dy)
        return inp

    if direction == "fwd":
        def run(i, b):
            return dnnkit.softmax(i["x"], algo, "channel", backend=b)

        def ref(i):
            return reference.softmax(i["xh"].astype(np.float64), algo, "channel")
        moved = 2 * n * 4
    else:
        def run(i, b):
            return dnnkit.softmax_backward(i["y"], i["dy"], algo, "channel", backend=b)

        def ref(i):
            return reference.softmax_backward(i["yh"].astype(np.float64),
                                              i["dyh"].astype(np.float64), algo, "channel")
        moved = 3 * n * 4
    label = "x".join(map(str, shape))
    return f"softmax {algo} {direction} {label}", shape, make, run, ref, moved


def _activation_case(mode, direction):
    from numba import cuda
    n = math.prod(ACT)

    def make(rng):
        x = (rng.standard_normal(ACT) * 3).astype(np.float32)
        dy = rng.standard_normal(ACT).astype(np.float32)
        y = dnnkit.activation(cuda.to_device(x), mode, backend="numba")
        return dict(x=cuda.to_device(x), xh=x, y=y, dy=cuda.to_device(dy), dyh=dy)

    if direction == "fwd":
        def run(i, b):
            return dnnkit.activation(i["x"], mode, backend=b)

        def ref(i):
            return reference.activation(i["xh"].astype(np.float64), mode)
        moved = 2 * n * 4
    else:
        def run(i, b):
            return dnnkit.activation_backward(i["x"], i["y"], i["dy"], mode, backend=b)

        def ref(i):
            return reference.activation_backward(i["xh"].astype(np.float64),
                                                 i["dyh"].astype(np.float64), mode)
        moved = 3 * n * 4      # dy, the one input the slope needs (x or y), dx
    return f"{mode} {direction} {'x'.join(map(str, ACT))}", ACT, make, run, ref, moved


def cases():
    for algo in ("accurate", "log"):
        for d in ("fwd", "bwd"):
            yield "softmax", _softmax_case(algo, SOFTMAX_2D, d)
    for d in ("fwd", "bwd"):
        yield "softmax", _softmax_case("accurate", SOFTMAX_4D, d)
    yield "softmax", _softmax_case("log", SOFTMAX_4D, "fwd")
    yield "softmax", _softmax_case("accurate", SOFTMAX_WIDE_S, "fwd")
    yield "relu", _activation_case("relu", "bwd")
    yield "relu", _activation_case("relu", "fwd")
    yield "relu", _activation_case("tanh", "bwd")        # the slope from y alone


def numba_config(name, shape):
    """The Numba softmax's launch configuration for this case, in words."""
    if not name.startswith("softmax"):
        return "grid-stride, 4 elements per thread per trip"
    ops = importlib.import_module("dnnkit.ops.softmax")
    n, c, s = ops._ncs(shape, "channel")
    bx, by, k, cached = ops._config(n, c, s, 4)
    return (f"rows of C={c} at stride {s}: {bx}x{by} threads, K={k} "
            f"{'register-cached' if cached else 'streaming'}")


def run_case(case, reps, rounds, rng):
    from validation.pool_bench import kernel_ms, reuse_outputs
    name, shape, make, run, ref, moved = case
    sets = [make(rng) for _ in range(max(2, math.ceil(3 * L2_BYTES / moved)))]
    want = ref(sets[0])
    row = dict(op=name, bytes=moved, numba_config=numba_config(name, shape))
    for b in ("numba", "cudnn"):
        try:
            got = run(sets[0], b).copy_to_host()
        except dnnkit.CudnnUnavailableError as e:
            row[b + "_skip"] = str(e)
            continue
        err = reference.rel_error(got, want)
        row[b + "_err"], row[b + "_ok"] = err, bool(err <= TOL)
        with reuse_outputs():
            for i in range(3):                                    # warm-up
                run(sets[i % len(sets)], b)
            ms = kernel_ms(lambda i, b=b: run(sets[i % len(sets)], b), reps, rounds)
        row[b + "_ms"], row[b + "_gbps"] = ms, moved / ms / 1e6
    if "numba_ms" in row and "cudnn_ms" in row:
        row["vs_cudnn"] = row["cudnn_ms"] / row["numba_ms"]
    return row


def table(rows, bw):
    out = [f"copy bandwidth (read + written): {bw:.0f} GB/s", "",
           f"{'case':<36} {'backend':<7} {'rel err':>9} {'ms':>8} {'GB/s':>7} {'%copy':>6} "
           f"{'vs cuDNN':>8}"]
    for r in rows:
        for b in ("numba", "cudnn"):
            if b + "_skip" in r:
                out.append(f"{r['op']:<36} {b:<7} unavailable: {r[b + '_skip'][:60]}")
                continue
            ok = "" if r[b + "_ok"] else "  FAIL"
            vs = f"{r['vs_cudnn']:8.2f}" if b == "numba" and "vs_cudnn" in r else f"{'':>8}"
            out.append(f"{r['op']:<36} {b:<7} {r[b + '_err']:9.2e} {r[b + '_ms']:8.4f} "
                       f"{r[b + '_gbps']:7.0f} {100 * r[b + '_gbps'] / bw:6.1f} {vs}{ok}")
        out.append(f"{'':<36} numba: {r['numba_config']}")
    return "\n".join(out)


def main():
    from validation.activation_softmax import copy_bandwidth
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=50, help="calls queued per timed sample")
    p.add_argument("--rounds", type=int, default=11, help="timed samples (median)")
    p.add_argument("--only", help="comma-separated: softmax, relu")
    p.add_argument("--json")
    a = p.parse_args()
    print(dnnkit.backends.status(), "\n")
    only = set(a.only.split(",")) if a.only else None
    bw = copy_bandwidth(a.reps)
    rng = np.random.default_rng(0)
    rows = []
    for family, case in cases():
        if only is None or family in only:
            rows.append(run_case(case, a.reps, a.rounds, rng))
            print("\n".join(table(rows[-1:], bw).splitlines()[3:]), flush=True)
    print("\n" + table(rows, bw))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)
    failed = [r["op"] for r in rows for b in ("numba", "cudnn") if r.get(b + "_ok") is False]
    if failed:
        print("\nFAIL (error above %g vs float64):" % TOL, ", ".join(failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
