"""Fused batch normalization + relu and convolution + bias + relu against the ops apart, per
pattern, on both backends.

    python -m validation.fusion_bench [--out DIR] [--quick]

Patterns (device arrays, the memo's path, as a training step calls them):
- ``train``: batch_norm_train(activation="relu") and its batch_norm_backward(activation="relu",
  y=y), against batch_norm_train, activation(relu), activation_backward, batch_norm_backward;
- ``residual``: ResNet's block end, batch_norm_train(activation="relu", residual=z) and its
  backward(residual=True), against batch_norm_train, add, activation and their backwards
  (the add's backward passes dy through: no call);
- ``inference``: batch_norm_inference(activation="relu") against batch_norm_inference then
  activation;
- ``conv``: conv2d(x, w, b, activation="relu") (3x3, padding 1, C -> C channels) and its
  gradient's calls (activation_backward from y, conv_backward_bias, the data and filter
  gradients), against conv2d, activation, activation_backward and the same three;
- ``conv_inference``: conv2d(activation="relu") against conv2d then activation.
Shapes: the activations of ResNet-18 (CIFAR form) at batch 32 and 128, float32 and float16.

Correctness first: the fused outputs (y, dx, dgamma, dbeta, dz; y, dx, dw, db) against a
float64 reference from the same inputs, the gradients given the variant's own relu decisions
(``reference``), the largest normwise relative error (``check``; the unfused variant's beside
it). Then time: each variant queued K times between
two CUDA events on the default stream, the GPU idle when a round starts (so a host-bound
variant shows its host time), the median of the rounds; ``host us``: wall time to queue one
pattern. Writes DIR/fusion_bench.json and fusion_bench.md.
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
import time

import numpy as np

import dnnkit

SHAPES = [(32, 64, 32, 32), (32, 128, 16, 16), (32, 256, 8, 8), (32, 512, 4, 4),
          (128, 64, 32, 32), (128, 512, 4, 4)]


def arrays_for(shape, dtype, rng):
    """The pattern's device arrays: x, gamma, beta, dy, running mean, running var, residual."""
    from numba import cuda
    c = shape[1]
    return [cuda.to_device(a) for a in (
        rng.standard_normal(shape).astype(dtype), (1 + 0.3 * rng.standard_normal(c)).astype(
            np.float32), rng.standard_normal(c).astype(np.float32),
        rng.standard_normal(shape).astype(dtype), np.zeros(c, np.float32),
        np.ones(c, np.float32), rng.standard_normal(shape).astype(dtype))]


CONV_PATTERNS = ("conv", "conv_inference")
PATTERNS = ("train", "residual", "inference") + CONV_PATTERNS


def conv_arrays_for(shape, dtype, rng):
    """The convolution patterns' device arrays: x, w (C, C, 3, 3), bias, dy."""
    from numba import cuda
    c = shape[1]
    return [cuda.to_device(a) for a in (
        rng.standard_normal(shape).astype(dtype),
        (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(dtype),
        (0.3 * rng.standard_normal(c)).astype(dtype), rng.standard_normal(shape).astype(dtype))]


def conv_variants(pattern, backend, arrs):
    """{"fused": fn, "unfused": fn} of a convolution pattern."""
    x, w, b, dy = arrs
    kw = dict(backend=backend, padding=1)

    def grads(y, g):
        return [y, dnnkit.conv2d_backward_data(g, w, x.shape, **kw),
                dnnkit.conv2d_backward_filter(x, g, w.shape, **kw),
                dnnkit.conv_backward_bias(g, backend=backend)]

    def fused():
        y = dnnkit.conv2d(x, w, b, activation="relu", **kw)
        if pattern == "conv_inference":
            return [y]
        return grads(y, dnnkit.activation_backward(y, y, dy, "relu", backend=backend))

    def unfused():
        h = dnnkit.conv2d(x, w, b, **kw)
        y = dnnkit.activation(h, "relu", backend=backend)
        if pattern == "conv_inference":
            return [y]
        return grads(y, dnnkit.activation_backward(h, y, dy, "relu", backend=backend))
    return {"fused": fused, "unfused": unfused}


def conv_reference(pattern, arrs, mask=None):
    """A convolution pattern's outputs in float64: y, then dx, dw, db (dy through ``mask``,
    else through y > 0)."""
    from dnnkit import reference as ref
    x, w, b, dy = (a.copy_to_host().astype(np.float64) for a in arrs)
    kw = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    y = np.maximum(ref.conv_forward(x, w, b, **kw), 0)
    if pattern == "conv_inference":
        return [y]
    g = np.where(y > 0 if mask is None else mask, dy, 0)
    return [y, ref.conv_backward_data(g, w, x.shape, **kw),
            ref.conv_backward_filter(x, g, w.shape, **kw), ref.conv_backward_bias(g)]


def variants(pattern, backend, arrs):
    """{"fused": fn, "unfused": fn}, each returning the pattern's outputs."""
    if pattern in CONV_PATTERNS:
        return conv_variants(pattern, backend, arrs)
    x, g, b, dy, rm, rv, z = arrs
    kw = dict(backend=backend)
    if pattern == "inference":
        return {"fused": lambda: [dnnkit.batch_norm_inference(x, g, b, rm, rv, activation="relu",
                                                              **kw)],
                "unfused": lambda: [dnnkit.activation(dnnkit.batch_norm_inference(
                    x, g, b, rm, rv, **kw), "relu", **kw)]}

    res = pattern == "residual"

    def fused():
        y, m, i = dnnkit.batch_norm_train(x, g, b, running_mean=rm, running_var=rv,
                                          activation="relu", residual=z if res else None, **kw)
        return [y, *dnnkit.batch_norm_backward(x, dy, g, m, i, activation="relu", y=y,
                                               residual=res, **kw)]

    def unfused():
        h, m, i = dnnkit.batch_norm_train(x, g, b, running_mean=rm, running_var=rv, **kw)
        if res:
            h = dnnkit.add(h, z, **kw)
        y = dnnkit.activation(h, "relu", **kw)
        dh = dnnkit.activation_backward(h, y, dy, "relu", **kw)
        return [y, *dnnkit.batch_norm_backward(x, dh, g, m, i, **kw)] + ([dh] if res else [])
    return {"fused": fused, "unfused": unfused}


def reference(pattern, arrs, mask=None):
    """The fused variant's outputs in float64 (numpy) from the same inputs: y, and for the
    training patterns dx, dgamma, dbeta (and dz, the residual's gradient), dy taken through
    the relu where ``mask`` (None: where the float64 y > 0). The bench passes the device's
    own y > 0: where the relu's input is within rounding of 0 the device may decide the other
    way, a difference of a whole dy value there that says nothing of the gradient's
    arithmetic (the unfused float16 variants round before the addition that decides, so
    they do it more often); the gradients are checked given the forward's decisions."""
    if pattern in CONV_PATTERNS:
        return conv_reference(pattern, arrs, mask)
    x, g, b, dy, rm, rv, z = (a.copy_to_host().astype(np.float64) for a in arrs)
    c = (1, -1, 1, 1)
    if pattern == "inference":
        return [np.maximum((x - rm.reshape(c)) / np.sqrt(rv.reshape(c) + 1e-5) * g.reshape(c)
                           + b.reshape(c), 0)]
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    invstd = 1 / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    xhat = (x - mean) * invstd
    y = np.maximum(xhat * g.reshape(c) + b.reshape(c) + (z if pattern == "residual" else 0), 0)
    gy = np.where(y > 0 if mask is None else mask, dy, 0)
    m = x.size // x.shape[1]
    dbeta, dgamma = gy.sum(axis=(0, 2, 3)), (gy * xhat).sum(axis=(0, 2, 3))
    dx = g.reshape(c) * invstd * (gy - dbeta.reshape(c) / m - xhat * dgamma.reshape(c) / m)
    return [y, dx, dgamma, dbeta] + ([gy] if pattern == "residual" else [])


def tolerance(dtype, shape):
    """The check's bound: float16's rounding of the outputs (1e-2), or for float32 1e-5 or,
    where larger, 4 sqrt(terms) float32 roundings, terms = N*H*W, the longest sum (the bias,
    filter and scale gradients'): a sum's rounding errors add up as a random walk (cuDNN's
    filter gradient at 128x64x32x32 measured 2e-5 on an H200)."""
    if dtype == "float16":
        return 1e-2
    return max(1e-5, 4 * np.sqrt(shape[0] * shape[2] * shape[3]) * 2.0 ** -24)


def rel_errors(outs, ref):
    """Each output's normwise relative error, ||a - r|| / ||r||."""
    return [float(np.linalg.norm(a - r) / max(np.linalg.norm(r), 1e-30))
            for a, r in zip(outs, ref)]


def rel_error(outs, ref):
    """The largest normwise relative error over the outputs."""
    return max(rel_errors(outs, ref))


def time_variants(fns, rounds, per_round):
    from numba import cuda
    ev, host = {n: [] for n in fns}, {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            s, e = cuda.event(), cuda.event()
            cuda.synchronize()
            t0 = time.perf_counter()
            s.record()
            for _ in range(per_round):
                fn()
            e.record()
            host[n].append((time.perf_counter() - t0) * 1e6 / per_round)
            ev[n].append((s, e))
    cuda.synchronize()
    return {n: (statistics.median(cuda.event_elapsed_time(s, e) / per_round for s, e in ev[n]),
                statistics.median(host[n])) for n in fns}


def run(quick):
    from numba import cuda
    rng = np.random.default_rng(0)
    rows = []
    shapes = SHAPES[:2] if quick else SHAPES
    rounds, per_round = (3, 5) if quick else (9, 40)
    for dtype in ("float32", "float16"):
        for shape in shapes:
            bn_arrs, conv_arrs = arrays_for(shape, dtype, rng), conv_arrays_for(shape, dtype, rng)
            for pattern in PATTERNS:
                arrs = conv_arrs if pattern in CONV_PATTERNS else bn_arrs
                # once per pattern and relu mask (the convolutions' in float64 take seconds):
                # the inference pattern reads rm, rv, which only the training patterns update
                refs = {}

                def ref_for(y):
                    key = hashlib.sha1(np.packbits(y > 0).tobytes()).hexdigest()
                    if key not in refs:
                        refs[key] = reference(pattern, arrs, y > 0)
                    return refs[key]
                for backend in ("cudnn", "numba"):
                    fns = variants(pattern, backend, arrs)
                    outs = {n: [o.copy_to_host().astype(np.float64) for o in fn()]
                            for n, fn in fns.items()}
                    errs = {n: rel_errors(o, ref_for(o[0])) for n, o in outs.items()}
                    diff, plain = max(errs["fused"]), max(errs["unfused"])
                    ok = np.isfinite(diff) and diff <= tolerance(dtype, shape)
                    for fn in fns.values():           # warm-up: the memo's runners
                        fn()
                    cuda.synchronize()
                    t = time_variants(fns, rounds, per_round)
                    row = dict(dtype=dtype, shape=list(shape), pattern=pattern, backend=backend,
                               diff=diff, unfused_diff=plain, ok=bool(ok),
                               errors=errs["fused"], unfused_errors=errs["unfused"],
                               fused_ms=t["fused"][0],
                               unfused_ms=t["unfused"][0], fused_host_us=t["fused"][1],
                               unfused_host_us=t["unfused"][1])
                    rows.append(row)
                    print(f"{dtype} {shape} {pattern:9s} {backend:5s} diff {diff:.1e} "
                          f"{'ok' if ok else 'FAIL'} (unfused {plain:.1e}; each "
                          f"{' '.join(f'{e:.0e}' for e in errs['fused'])})  "
                          f"GPU ms {row['fused_ms']:.4f} / "
                          f"{row['unfused_ms']:.4f}  host us {row['fused_host_us']:.1f} / "
                          f"{row['unfused_host_us']:.1f}")
    return rows


def write(out_dir, gpu, rows):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "fusion_bench.json"), "w") as f:
        json.dump({"gpu": gpu, "rows": rows}, f, indent=1)
    md = [f"# Batch norm + relu and conv + bias + relu, fused against apart ({gpu})", "",
          "GPU ms per pattern (median; the larger of GPU and host time when host-bound) and "
          "host us to queue it; fused / unfused. check: the fused outputs' largest normwise "
          "relative error against float64, the gradients given the variant's own relu "
          "decisions (ok within ``tolerance``: 1e-2 for float16, for float32 1e-5 or 4 "
          "sqrt(N*H*W) roundings); unfused: the unfused variant's.", "",
          "| dtype | shape | pattern | backend | check | unfused | GPU ms fused | unfused | "
          "ratio | host us fused | unfused |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['dtype']} | {'x'.join(map(str, r['shape']))} | {r['pattern']} | "
                  f"{r['backend']} | {r['diff']:.1e} {'ok' if r['ok'] else 'FAIL'} | "
                  f"{r['unfused_diff']:.1e} | "
                  f"{r['fused_ms']:.4f} | {r['unfused_ms']:.4f} | "
                  f"{r['fused_ms'] / r['unfused_ms']:.2f} | {r['fused_host_us']:.1f} | "
                  f"{r['unfused_host_us']:.1f} |")
    with open(os.path.join(out_dir, "fusion_bench.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true", help="two shapes, few rounds")
    q = p.parse_args(argv)
    from numba import cuda
    gpu = cuda.get_current_device().name
    gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
    rows = run(q.quick)
    write(q.out, gpu, rows)
    print(f"wrote {os.path.join(q.out, 'fusion_bench.md')}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
