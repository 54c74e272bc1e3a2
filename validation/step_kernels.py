"""The GPU side of a training step, kernel by kernel: dnnkit (cuDNN path, Numba path) against
PyTorch eager on the same rows as validation/train_bench.py. Needs a GPU and PyTorch.

    python -m validation.step_kernels [--rows resnet18:128:float16,lm:32:float32]
                                      [--variants torch,cudnn,numba] [--steps 10] [--out DIR]
    python -m validation.step_kernels --rows converted:32     # dnnkit.torch's ResNet-18

A row ``converted:BATCH`` profiles validation/torch_bench.py's variants instead: the ResNet-18
written in PyTorch, unconverted, converted to each backend, and captured as CUDA graphs.

Each variant is warmed up, then ``--steps`` steps run under PyTorch's profiler (CUDA activity
only: CUPTI records every kernel, memset and copy of the device, dnnkit's cuDNN and Numba
kernels included), the GPU synchronised before and after. Per variant: the kernels' summed GPU
time per step, the span from the first kernel's start to the last one's end per step, and the
GPU's idle share of that span (gaps between kernels: the host or a launch not keeping up);
the time per step by kind of kernel (the name decides: a convolution or GEMM, batch norm,
element-wise, reductions and the loss, the optimizer, the RNN, copies and fills); and the
costliest kernels. Where a row is bound by the GPU (train_bench's ``bound`` column), the kinds
side by side say which kernels make up the difference. Writes DIR/step_kernels.md.
"""

import argparse
import collections
import os
import re
import sys

from dnnkit import files
from validation.train_bench import Row, dk_trainer, row_setup, torch_trainer

# (kind, pattern on the lower-cased kernel name), the first match wins
KINDS = (
    ("copy/fill", r"memcpy|memset|copy|fill"),
    ("optimizer", r"sgd|adam|multi_tensor|foreach|optim"),
    ("rnn", r"lstm|rnn|gru|persist|elemwise"),
    ("batch norm", r"batch_norm|batchnorm|bn_|_bn|welford"),
    ("conv/gemm", r"conv|gemm|xmma|cutlass|dgrad|wgrad|fprop|implicit|winograd|im2col|"
                  r"col2im|sm\d\d_|gemv|cublas|nchwtonhwc|nhwctonchw|tensorop|hmma"),
    ("loss/softmax", r"softmax|nll|loss|cross|log_"),
    ("pool", r"pool"),
    ("reduction", r"reduce|sum|mean"),
    ("element-wise", r"elementwise|vectorized|activation|relu|arith|add|mul|scale|unrolled"),
)


def kind_of(name):
    low = name.lower()
    for kind, pat in KINDS:
        if re.search(pat, low):
            return kind
    return "other"


def short(name, width=70):
    """A kernel's name for the table: a Numba kernel's qualified Python name (demangled, or
    from its mangled name, a list of length-prefixed parts: _ZN6cudapy6dnnkit7kernels...), else
    as given."""
    text = name
    if name.startswith("_ZN") and "cudapy" in name:
        parts, i = [], 3
        while i < len(name) and name[i].isdigit():
            j = i
            while name[j].isdigit():
                j += 1
            n = int(name[i:j])
            parts.append(name[j:j + n])
            i = j + n
        text = "::".join(p for p in parts[3:] if p) or name
    elif "dnnkit::kernels::" in name:      # demangled by the profiler: drop the ABI tags
        text = name.split("dnnkit::kernels::", 1)[-1].split("[abi:")[0].split("(")[0]
    return text if len(text) <= width else text[:width - 3] + "..."


def profile_variant(torch, step, steps):
    """[(name, start us, end us)] of every GPU activity of ``steps`` calls of ``step``."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.end > 0:
            out.append((e.name, e.time_range.start, e.time_range.end))
    return sorted(out, key=lambda r: r[1])


def summary(acts, steps):
    busy = collections.Counter()
    for name, s, e in acts:
        busy[name] += (e - s) / 1e3 / steps
    span = (max(e for _, _, e in acts) - min(s for _, s, _ in acts)) / 1e3 / steps if acts else 0
    # busy time of the union of intervals (concurrent kernels counted once)
    union, end = 0.0, None
    for _, s, e in acts:
        if end is None or s > end:
            union += e - s
            end = e
        elif e > end:
            union += e - end
            end = e
    kinds = collections.Counter()
    for name, ms in busy.items():
        kinds[kind_of(name)] += ms
    return {"kernels": busy, "kinds": kinds, "sum": sum(busy.values()), "span": span,
            "union": union / 1e3 / steps, "count": len(acts) / steps}


def build_variants(torch, row, names):
    tm, init, (tx, ty), (dx, dy) = row_setup(torch, row)
    out = {}
    for n in names:
        if n == "torch":
            ts = torch_trainer(torch, row, tm)
            out[n] = lambda ts=ts: ts(tx, ty)
        else:
            m = row.build()
            m.load_state_dict(init)
            ds = dk_trainer(row, m, n)
            out[n] = lambda ds=ds: ds(dx, dy)
    return out


def converted_variants(torch, batch):
    """validation/torch_bench.py's variants (a ResNet-18 written in PyTorch, unconverted,
    converted, and captured as CUDA graphs) as step functions of no argument."""
    from validation import torch_bench
    steps, x, y = torch_bench.variants(torch, batch)
    steps.update(torch_bench.graphed(torch, batch)[0])
    return {n: (lambda s=s: s(x, y)) for n, s in steps.items()}


def report_row(row, res, top):
    names = list(res)
    lines = [f"## {row.name}", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key in (("kernels' GPU ms per step", "sum"), ("span ms per step", "span"),
                       ("busy ms (overlaps once)", "union"), ("activities per step", "count")):
        lines.append(f"| {label} | " + " | ".join(f"{res[n][key]:.3f}" if key != "count"
                                                   else f"{res[n][key]:.0f}" for n in names)
                     + " |")
    lines.append("| GPU idle share of the span | " + " | ".join(
        f"{max(0.0, 1 - res[n]['union'] / res[n]['span']):.0%}" if res[n]["span"] else "-"
        for n in names) + " |")
    allk = sorted({k for n in names for k in res[n]["kinds"]},
                  key=lambda k: -max(res[n]["kinds"][k] for n in names))
    for k in allk:
        lines.append(f"| {k} | " + " | ".join(f"{res[n]['kinds'][k]:.3f}" for n in names)
                     + " |")
    for n in names:
        lines += ["", f"{n}: the costliest kernels (ms per step, kind)", ""]
        for name, ms in res[n]["kernels"].most_common(top):
            lines.append(f"- {ms:.3f}  {kind_of(name):12s} {short(name)}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="resnet18:32:float32,resnet18:128:float16,lm:32:float32")
    p.add_argument("--variants", default="torch,cudnn,numba")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", default=".")
    a = p.parse_args(argv)
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    parts = [f"# A training step's GPU kernels ({gpu})", "",
             f"`python -m validation.step_kernels --rows {a.rows} --variants {a.variants} "
             f"--steps {a.steps}`; ms per step.", ""]
    for spec in a.rows.split(","):
        model, batch, dtype = (spec + ":float32").split(":")[:3]
        row = Row(model, int(batch), dtype) if model != "converted" else \
            argparse.Namespace(name=f"converted ResNet-18 (validation.torch_bench) b{batch}")
        try:
            variants = build_variants(torch, row, a.variants.split(",")) \
                if model != "converted" else converted_variants(torch, int(batch))
            res = {}
            for n, fn in variants.items():
                for _ in range(a.warm):
                    fn()
                res[n] = summary(profile_variant(torch, fn, a.steps), a.steps)
            text = report_row(row, res, a.top)
        except Exception as e:  # noqa: BLE001 - the other rows go on
            text = f"## {row.name}\n\nfailed: {type(e).__name__}: {e}"
        print(text, flush=True)
        parts += [text, ""]
    os.makedirs(a.out, exist_ok=True)
    files.write_text(os.path.join(a.out, "step_kernels.md"), "\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
