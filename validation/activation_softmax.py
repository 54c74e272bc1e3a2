"""GPU cross-check and benchmark of activations and softmax: Numba vs cuDNN vs PyTorch.

    python -m validation.activation_softmax [--reps 50] [--json out.json]

Correctness first (max relative error vs a float64 reference computed by PyTorch on the GPU
from the same inputs, or NumPy without PyTorch), then time: median of CUDA-event-timed runs
after a warm-up, inputs rotated among several sets so that the L2 cache does not flatter small
shapes. Memory-bound ops are reported in GB/s (bytes read + written) next to the device's copy
bandwidth measured in the same run.
"""

import argparse
import json

import numpy as np

import dnnkit
from dnnkit import reference
from dnnkit.timing import median_ms

SETS = 3


def copy_bandwidth(reps):
    """Device copy rate, bytes read + written, the best of cuMemcpyDtoD and (where installed)
    PyTorch's copy kernel on a 1 GiB buffer."""
    from numba import cuda
    n = 2**30
    src = cuda.to_device(np.random.default_rng(0).standard_normal(n // 4).astype(np.float32))
    dst = cuda.device_array_like(src)
    rates = [2 * n / median_ms(lambda i: dst.copy_to_device(src), reps) / 1e6]
    torch = _torch()
    if torch is not None:
        ts, td = torch.as_tensor(src, device="cuda"), torch.as_tensor(dst, device="cuda")
        rates.append(2 * n / median_ms(lambda i: td.copy_(ts), reps) / 1e6)
    return max(rates)


def _torch():
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch
    except ImportError:
        return None


def cases():
    act = (64, 256, 56, 56)
    yield ("activation relu fwd", act, 2,
           lambda x, b: dnnkit.activation(x, "relu", backend=b),
           lambda t, tt: tt.relu(t), lambda x: reference.activation(x, "relu"))
    yield ("activation tanh fwd", act, 2,
           lambda x, b: dnnkit.activation(x, "tanh", backend=b),
           lambda t, tt: tt.tanh(t), lambda x: reference.activation(x, "tanh"))
    yield ("activation elu fwd", act, 2,
           lambda x, b: dnnkit.activation(x, "elu", 1.0, backend=b),
           lambda t, tt: tt.nn.functional.elu(t), lambda x: reference.activation(x, "elu", 1.0))
    sm = (8192, 4096)
    for algo, tfn in (("accurate", lambda t, tt: tt.softmax(t, 1)),
                      ("log", lambda t, tt: tt.log_softmax(t, 1))):
        yield (f"softmax {algo} fwd", sm, 2,
               lambda x, b, a=algo: dnnkit.softmax(x, a, "channel", backend=b), tfn,
               lambda x, a=algo: reference.softmax(x, a, "channel"))
    sp = (64, 32, 56, 56)
    yield ("softmax channel 4-D fwd", sp, 2,
           lambda x, b: dnnkit.softmax(x, "accurate", "channel", backend=b),
           lambda t, tt: tt.softmax(t, 1), lambda x: reference.softmax(x, "accurate", "channel"))
    yield ("softmax instance 4-D fwd", sp, 2,
           lambda x, b: dnnkit.softmax(x, "accurate", "instance", backend=b),
           lambda t, tt: tt.softmax(t.flatten(1), 1).view_as(t),
           lambda x: reference.softmax(x, "accurate", "instance"))


class _ReuseOutputs:
    """Inside the block, ops write into one cached buffer per (shape, dtype) instead of
    allocating: separates the op's own time from Numba's per-call cudaMalloc."""

    def __enter__(self):
        from dnnkit import arrays
        self._orig, cache = arrays.empty_like, {}

        def empty_like(a, stream):
            key = (tuple(a.shape), str(a.dtype))
            if key not in cache:
                cache[key] = self._orig(a, stream)
            return cache[key]
        arrays.empty_like = empty_like

    def __exit__(self, *exc):
        from dnnkit import arrays
        arrays.empty_like = self._orig


def run(reps):
    from numba import cuda
    torch = _torch()
    rng = np.random.default_rng(0)
    rows = []
    for name, shape, passes, fn, tfn, ref_fn in cases():
        host = [rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(SETS)]
        dev = [cuda.to_device(h) for h in host]
        if torch is not None:
            tens = [torch.as_tensor(d, device="cuda") for d in dev]
            ref = tfn(tens[0].double(), torch).cpu().numpy()
        else:
            ref = ref_fn(host[0].astype(np.float64))
        nbytes = passes * host[0].nbytes
        impls = {b: (lambda i, b=b: fn(dev[i % SETS], b)) for b in ("numba", "cudnn")}
        for b in ("numba", "cudnn"):
            def reuse(i, b=b):
                with _ReuseOutputs():
                    return fn(dev[i % SETS], b)
            impls[b + "-noalloc"] = reuse
        if torch is not None:
            impls["torch"] = lambda i: tfn(tens[i % SETS], torch)
        for backend, f in impls.items():
            try:
                out = f(0)
            except dnnkit.CudnnUnavailableError as e:
                rows.append(dict(op=name, backend=backend, error=str(e)))
                continue
            got = out.cpu().numpy() if hasattr(out, "cpu") else out.copy_to_host()
            err = reference.rel_error(got, ref)
            ms = median_ms(f, reps)
            rows.append(dict(op=name, shape=list(shape), backend=backend, rel_err=err, ms=ms,
                             gbps=nbytes / ms / 1e6))
    return rows


def table(rows, bw):
    out = [f"copy bandwidth (read+write): {bw:.0f} GB/s", "",
           f"{'op':<26} {'backend':<14} {'rel err':>9} {'ms':>8} {'GB/s':>7} {'%copy':>6} "
           f"{'vs cudnn':>8} {'vs torch':>8}"]
    by = {(r["op"], r["backend"]): r for r in rows}
    for r in rows:
        if "error" in r:
            out.append(f"{r['op']:<26} {r['backend']:<14} unavailable: {r['error'][:60]}")
            continue
        c, t = by.get((r["op"], "cudnn")), by.get((r["op"], "torch"))
        vc = f"{r['ms'] / c['ms']:8.2f}" if c and "ms" in c else f"{'-':>8}"
        vt = f"{r['ms'] / t['ms']:8.2f}" if t and "ms" in t else f"{'-':>8}"
        out.append(f"{r['op']:<26} {r['backend']:<14} {r['rel_err']:9.2e} {r['ms']:8.3f} "
                   f"{r['gbps']:7.0f} {100 * r['gbps'] / bw:6.1f} {vc} {vt}")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    print(dnnkit.backends.status(), "\n")
    bw = copy_bandwidth(a.reps)
    rows = run(a.reps)
    print(table(rows, bw))
    print("\n*-noalloc: the same op writing into a reused output buffer (no cudaMalloc per call)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
