"""Host cost of each step of a small op call, on a GPU (the host-overhead target of
docs/performance.md):

    python -m validation.host_cost [--profile DIR]

Each row is the median over 2,000 timed repetitions (``perf_counter`` around batches of 20) of
one step of the path a ``dnnkit.relu`` / ``dnnkit.conv2d`` call takes, then the whole calls and
PyTorch's for the same shapes (the target compares against those). The GPU keeps up with every
step here (all shapes are tiny), so these are host times. ``--profile DIR`` also writes a
cProfile listing of 2,000 calls of each whole call into DIR.
"""

from dnnkit import device
import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import numpy as np


def per_call_us(fn, reps=2000, batch=20):
    for _ in range(50):
        fn()
    samples = []
    for _ in range(reps // batch):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(samples)


def steps():
    """(label, callable) for each step of the small-call path, then the whole calls."""
    from numba import cuda

    import dnnkit
    from dnnkit import arrays, memory, policy
    from dnnkit.cudnn import activation as cudnn_activation, handle
    from dnnkit.cudnn.descriptors import TensorDescriptor
    rng = np.random.default_rng(0)
    x = cuda.to_device(rng.standard_normal(1024).astype(np.float32))
    xc = cuda.to_device(rng.standard_normal((1, 8, 8, 8)).astype(np.float32))
    wc = cuda.to_device(rng.standard_normal((8, 8, 3, 3)).astype(np.float32))
    s = arrays.as_stream(None)
    y = arrays.empty_like(x, s)
    dnnkit.relu(x, backend="cudnn")
    bound = cudnn_activation.bind(False, x.size, x.dtype, "relu", 0.0, 0)

    dnnkit.relu(x, backend="numba")
    from dnnkit import launch as launch_mod
    from dnnkit.kernels import activation_fwd_kernel as rkernel
    acc = arrays.acc_array(x.dtype)
    rargs = (x, y, 0, np.float32(0.0), acc)
    launch_mod.launch(rkernel, 4, 256, s, rargs)
    fast = launch_mod._fast[(id(rkernel), launch_mod._types(rargs))]

    def descriptor():
        with TensorDescriptor((1, 1, 1, 1024), np.float32):
            pass
    out = [
        ("arrays.as_stream(None)", lambda: arrays.as_stream(None)),
        ("device.device_id()", device.device_id),
        ("arrays.device_input(x)", lambda: arrays.device_input("relu", "x", x, s)),
        ("memory.device_array(1024 f32)", lambda: memory.device_array((1024,), np.float32, s)),
        ("cuda.device_array(1024 f32)", lambda: cuda.device_array(1024, np.float32)),
        ("config.get('dnn.enabled')", lambda: dnnkit.config.get("dnn.enabled")),
        ("policy.choose(relu, cudnn)",
         lambda: policy.choose("activation", (x, "relu", 0.0, s), {}, "cudnn")),
        ("handle.get(0)", lambda: handle.get(0)),
        ("TensorDescriptor create+destroy", descriptor),
        ("cudnn_activation.forward",
         lambda: cudnn_activation.forward(x, y, "relu", 0.0, 0)),
        # the floor of dnnkit's relu: cuDNN's own host time, ctypes and the handle (what the
        # memoised call adds is the dispatch, the allocation and the output array)
        ("cudnnActivationForward, bound", lambda: bound(x, y)),
        # the Numba path's launch of relu's kernel, step by step (the arguments as the op
        # passes them): working out their types, packing them, and the driver call
        ("launch._types(relu args)", lambda: launch_mod._types(rargs)),
        ("launcher.pack(relu args)", lambda: fast.pack(rargs)),
        ("cuLaunchKernel, packed", lambda: fast(4, 256, 0, rargs, 0)),
        ("launch(relu kernel), fast path", lambda: launch_mod.launch(rkernel, 4, 256, s, rargs)),
        ("relu 1024 numba (whole call)", lambda: dnnkit.relu(x, backend="numba")),
        ("relu 1024 cudnn (whole call)", lambda: dnnkit.relu(x, backend="cudnn")),
        ("conv 1x8x8x8 numba (whole call)",
         lambda: dnnkit.conv2d(xc, wc, padding=1, backend="numba")),
        ("conv 1x8x8x8 cudnn (whole call)",
         lambda: dnnkit.conv2d(xc, wc, padding=1, backend="cudnn")),
    ]
    rnn = dnnkit.RNN("lstm", 512, 512)
    wr = rnn.init_params(seed=1)
    xr = cuda.to_device(rng.standard_normal((50, 64, 512)).astype(np.float32))
    out.append(("lstm 512 N=64 T=50 numba fwd (whole call)",
                lambda: rnn.forward(wr, xr, backend="numba")))
    try:
        import torch
        t = torch.as_tensor(x, device="cuda")
        tx, tw = torch.as_tensor(xc, device="cuda"), torch.as_tensor(wc, device="cuda")
        out += [("relu 1024 torch", lambda: torch.relu(t)),
                ("conv 1x8x8x8 torch", lambda: torch.nn.functional.conv2d(tx, tw, padding=1))]
    except ImportError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="")
    args = ap.parse_args()
    from numba import cuda
    rows = []
    for label, fn in steps():
        long = "lstm" in label            # milliseconds a call: fewer repetitions
        rows.append((label, per_call_us(fn, *((100, 5) if long else ()))))
        cuda.synchronize()
        if args.profile and "whole call" in label:
            os.makedirs(args.profile, exist_ok=True)
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(50 if long else 2000):
                fn()
            cuda.synchronize()
            pr.disable()
            buf = io.StringIO()
            st = pstats.Stats(pr, stream=buf)
            st.sort_stats("tottime").print_stats(30)
            st.sort_stats("cumulative").print_stats(45)
            name = label.split(" (")[0].replace(" ", "_").replace("=", "")
            with open(os.path.join(args.profile, f"prof_{name}.txt"), "w") as f:
                f.write(buf.getvalue())
    print(f"{'step':<36} {'host us/call':>12}")
    for label, us in rows:
        print(f"{label:<36} {us:12.1f}")


if __name__ == "__main__":
    main()
