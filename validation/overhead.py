"""Where the time of one op call goes: host wall time per call vs the GPU kernels' own time.

    python -m validation.overhead

For each op and backend: ``host us/call`` is the wall time of 200 back-to-back calls (one sync
at the end) divided by 200, the median of 9 such rounds, so it is the host cost when the GPU
keeps up; ``gpu us/call`` is the sum of kernel durations per call from the PyTorch profiler
(CUPTI). When host >> gpu the op is launch-bound; compare the PyTorch row for the same shape.
"""

import statistics
import time

import numpy as np

import dnnkit


def host_us(fn, n=200):
    return host_us_each({0: fn}, n)[0]


def host_us_each(fns, n=200, rounds=9):
    """``{name: host µs per call}``: per round, each function in turn runs ``n`` back-to-back
    calls and one sync (wall time / n); the median over ``rounds`` rounds. Interleaved, so a
    change of the host's speed during the run (the lent machines' moved PyTorch's own figure by
    a third between runs) falls on every function alike."""
    from numba import cuda
    for fn in fns.values():
        for _ in range(5):
            fn()
    cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def gpu_us(torch, fn, n=20):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages())
    names = sorted({e.key[:40] for e in prof.key_averages() if e.device_time_total > 0})
    return total / n, names


def main():
    import torch
    from numba import cuda
    print(dnnkit.backends.status(), "\n")
    rows = []
    for shape in [(1024,), (64, 256, 56, 56)]:
        x = cuda.to_device(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        t = torch.as_tensor(x, device="cuda")
        calls = {"numba": lambda: dnnkit.relu(x, backend="numba"),
                 "cudnn": lambda: dnnkit.relu(x, backend="cudnn"),
                 "torch": lambda: torch.relu(t)}
        for name, fn in calls.items():
            g, kernels = gpu_us(torch, fn)
            rows.append((f"relu {shape}", name, host_us(fn), g, ", ".join(kernels)))
    sm = cuda.to_device(np.random.default_rng(1).standard_normal((8192, 4096)).astype(np.float32))
    ts = torch.as_tensor(sm, device="cuda")
    for name, fn in {"numba": lambda: dnnkit.softmax(sm, backend="numba"),
                     "cudnn": lambda: dnnkit.softmax(sm, backend="cudnn"),
                     "torch": lambda: torch.softmax(ts, 1)}.items():
        g, kernels = gpu_us(torch, fn)
        rows.append(("softmax (8192, 4096)", name, host_us(fn), g, ", ".join(kernels)))
    xc = cuda.to_device(np.random.default_rng(2).standard_normal((1, 8, 8, 8)).astype(np.float32))
    wc = cuda.to_device(np.random.default_rng(3).standard_normal((8, 8, 3, 3)).astype(np.float32))
    txc, twc = torch.as_tensor(xc, device="cuda"), torch.as_tensor(wc, device="cuda")
    for name, fn in {"numba": lambda: dnnkit.conv2d(xc, wc, padding=1, backend="numba"),
                     "cudnn": lambda: dnnkit.conv2d(xc, wc, padding=1, backend="cudnn"),
                     "torch": lambda: torch.nn.functional.conv2d(txc, twc, padding=1)}.items():
        g, kernels = gpu_us(torch, fn)
        rows.append(("conv2d (1, 8, 8, 8) 3x3", name, host_us(fn), g, ", ".join(kernels)))
    print(f"{'op':<26} {'backend':<7} {'host us/call':>12} {'gpu us/call':>11}  kernels")
    for op, b, h, g, k in rows:
        print(f"{op:<26} {b:<7} {h:12.1f} {g:11.1f}  {k[:90]}")


if __name__ == "__main__":
    main()
