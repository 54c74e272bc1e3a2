"""A second convolution set for the benchmark report (``python -m validation.bench --set
deepbench``), modelled on DeepBench's training convolutions (github.com/baidu-research/
DeepBench, kernels/conv_problems.h): shapes the ResNet-50 set has none of; eight layers, 48
rows. Each layer runs
forward and both gradients, float32 and float16, on the Numba and cuDNN backends side by
side (validation/bench.py), against PyTorch in float64.

    kind      x (N, C, [D,] H, W)   w (K, C/G, [T,] R, S)  stride  padding  groups
    speech    16x1x161x700          32x1x5x20              2       0        1   DeepSpeech 1st
    speech    16x32x79x341          32x32x5x10             2       0        1   DeepSpeech 2nd
    vision    16x3x224x224          64x3x7x7               2       3        1   7x7/2 stem
    vision    16x64x112x56          128x64x5x5             2       2        1   5x5/2, tall
    depthwise 16x256x28x28          256x1x3x3              1       1        256 MobileNet
    grouped   16x256x28x28          256x8x3x3              1       1        32  ResNeXt
    1x1       16x1024x14x14         2048x1024x1x1          1       0        1
    video     8x64x8x56x56          128x64x3x3x3           1       1        1   C3D 3x3x3
"""

import math

import dnnkit
from validation.bench_cases import CONV_ALGO, Case

# (kind, x shape, w shape, stride, padding, groups)
LAYERS = [
    ("speech", (16, 1, 161, 700), (32, 1, 5, 20), 2, 0, 1),
    ("speech", (16, 32, 79, 341), (32, 32, 5, 10), 2, 0, 1),
    ("vision", (16, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1),
    ("vision", (16, 64, 112, 56), (128, 64, 5, 5), 2, 2, 1),
    ("depthwise", (16, 256, 28, 28), (256, 1, 3, 3), 1, 1, 256),
    ("grouped", (16, 256, 28, 28), (256, 8, 3, 3), 1, 1, 32),
    ("1x1", (16, 1024, 14, 14), (2048, 1024, 1, 1), 1, 0, 1),
    ("video", (8, 64, 8, 56, 56), (128, 64, 3, 3, 3), 1, 1, 1),
]
DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")


def _dev(rng, shape, dtype, scale=1.0):
    from numba import cuda
    return cuda.to_device((rng.standard_normal(shape) * scale).astype(dtype))


def out_shape(x_shape, w_shape, stride, padding):
    return (x_shape[0], w_shape[0]) + tuple((i + 2 * padding - r) // stride + 1
                                            for i, r in zip(x_shape[2:], w_shape[2:]))


def _ops(nd):
    if nd == 2:
        return dnnkit.conv2d, dnnkit.conv2d_backward_data, dnnkit.conv2d_backward_filter
    return dnnkit.conv3d, dnnkit.conv3d_backward_data, dnnkit.conv3d_backward_filter


def label(kind, x_shape, w_shape, stride, groups):
    spatial = "x".join(map(str, x_shape[2:]))
    kern = "x".join(map(str, w_shape[2:]))
    g = f" g{groups}" if groups > 1 else ""
    return f"{kind} {x_shape[1]}->{w_shape[0]} {spatial} {kern}/{stride}{g}"


def deepbench_cases(dtypes=("float32", "float16"), directions=DIRECTIONS,
                    backends=("numba", "cudnn")):
    out = []
    for dtype in dtypes:
        for kind, xs, ws, st, pad, groups in LAYERS:
            out += _layer_cases(dtype, directions, backends, kind, xs, ws, st, pad, groups)
    return out


def _layer_cases(dtype, directions, backends, kind, xs, ws, st, pad, groups):
    nd = len(xs) - 2
    ys = out_shape(xs, ws, st, pad)
    fwd, bwd_d, bwd_f = _ops(nd)
    kw = dict(stride=st, padding=pad, groups=groups)

    def make(rng):
        return dict(x=_dev(rng, xs, dtype), w=_dev(rng, ws, dtype, 1 / math.sqrt(
            math.prod(ws[1:]))), dy=_dev(rng, ys, dtype))
    calls = {
        "fwd": lambda b: lambda i: (fwd(i["x"], i["w"], backend=b, **kw),),
        "bwd_data": lambda b: lambda i: (bwd_d(i["dy"], i["w"], xs, backend=b, **kw),),
        "bwd_filter": lambda b: lambda i: (bwd_f(i["x"], i["dy"], ws, backend=b, **kw),)}

    def torch_fn(direction, double=False):
        def fn(T, i):
            cv = (lambda a: T.as_tensor(a, device="cuda").double()) if double else \
                (lambda a: T.as_tensor(a, device="cuda"))
            x, w, dy = cv(i["x"]), cv(i["w"]), cv(i["dy"])
            conv = getattr(T.nn.functional, f"conv{nd}d")
            d_in = getattr(T.nn.grad, f"conv{nd}d_input")
            d_w = getattr(T.nn.grad, f"conv{nd}d_weight")
            f = {"fwd": lambda: conv(x, w, stride=st, padding=pad, groups=groups),
                 "bwd_data": lambda: d_in(x.shape, w, dy, st, pad, groups=groups),
                 "bwd_filter": lambda: d_w(x, w.shape, dy, st, pad, groups=groups)}[direction]
            return (lambda: (f(),)) if double else f
        return fn
    flop = 2.0 * math.prod(ys) * math.prod(ws[1:])
    flags = dict(CONV_ALGO, **{"dnn.conv.allow_tf32": False})
    # float16 outputs round to 2^-11 of an element; float32 sums over up to 18k terms
    tol = {"float16": 1e-2, "float32": 1e-4}[dtype]
    out = []
    for d in directions:
        ref = torch_fn(d, double=True)
        out.append(Case(f"deepbench {d}", label(kind, xs, ws, st, groups), dtype, make,
                        {b: calls[d](b) for b in backends},
                        ref=lambda T, i, ref=ref: ref(T, i)(), torch=torch_fn(d),
                        work=("flop", flop), tol=tol, flags=flags))
    return out


def summary(rows, floor_gmean=0.6, floor_row=0.4):
    """Targets of the set (docs/performance.md): per pass and data type the geometric mean
    of Numba/cuDNN throughput >= ``floor_gmean`` and its worst row >= ``floor_row``; a list of
    (name, goal, reached, met)."""
    out = []
    for dtype in ("float32", "float16"):
        for d in DIRECTIONS:
            v = [r["numba_vs_cudnn"] for r in rows if r["op"] == f"deepbench {d}"
                 and r["dtype"] == dtype and r.get("numba_vs_cudnn")]
            if not v:
                continue
            g = math.exp(sum(map(math.log, v)) / len(v))
            worst = min(v)
            out.append((f"deepbench {d} {dtype}: Numba/cuDNN geomean / worst row",
                        f">= {floor_gmean} / >= {floor_row}", f"{g:.2f} / {worst:.2f}",
                        g >= floor_gmean and worst >= floor_row))
    return out
