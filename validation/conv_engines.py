"""Which cuDNN engine each convolution gets, against every engine cuDNN offers and PyTorch's.

    python -m validation.conv_engines [--dtype float16] [--tf32] [--direction fwd]
                                      [--batch 32] [--top 16] [--reps 10]

For each ResNet-50 layer shape: every engine configuration of heuristics modes A, FALLBACK and
B (in that order, each once), its notes (tc = tensor cores, dc = down-converts inputs,
nd = nondeterministic, rtc = compiled at run time), whether dnnkit's filters keep it, its
workspace and its time (mean of ``reps`` back-to-back executions between CUDA events, after a
warm-up); then the plan dnnkit's ``guess_once`` picks, PyTorch's time on the same tensors with
the same settings, and the GPU kernels each one launches (PyTorch's profiler). Runs on a GPU
with PyTorch; the inputs are PyTorch tensors whose addresses go into the variant packs.
"""

import argparse

from dnnkit.cudnn import conv_graph, graph, handle
from dnnkit.cudnn.conv_plans import descriptor_dims
from dnnkit.cudnn.enums import BEHAVIOR_NOTE, NUMERICAL_NOTE
from dnnkit.geometry import ConvGeom

from .conv_bench import RESNET50

_NOTE_TAGS = {"TENSOR_CORE": "tc", "DOWN_CONVERT_INPUTS": "dc", "NONDETERMINISTIC": "nd",
              "FFT": "fft", "WINOGRAD": "wino", "REDUCED_PRECISION_REDUCTION": "rpr"}


def _notes(cfg):
    tags = [t for n, t in _NOTE_TAGS.items() if NUMERICAL_NOTE[n] in cfg.numerical]
    if BEHAVIOR_NOTE["RUNTIME_COMPILATION"] in cfg.behavior:
        tags.append("rtc")
    return ",".join(tags) or "-"


def _configs(g):
    """(mode, config) for modes A, FALLBACK, B: each configuration once, first mode wins."""
    out, seen = [], set()
    for mode in ("A", "FALLBACK", "B"):
        for c in graph.engine_configs(g, modes=(mode,)):
            if c.name not in seen:
                seen.add(c.name)
                out.append((mode, c))
    return out


def _time(torch, fn, reps):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def _kernels(torch, fn):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return "; ".join(n[:70] for n in names) or "-"


def _tensors(torch, c, k, hw, r, st, pad, batch, dtype):
    tdt = getattr(torch, dtype)
    x = torch.randn(batch, c, hw, hw, device="cuda", dtype=tdt)
    w = torch.randn(k, c, r, r, device="cuda", dtype=tdt) * 0.1
    y = torch.nn.functional.conv2d(x, w, stride=st, padding=pad)
    return x, w, y.normal_()


def _torch_fn(torch, direction, x, w, dy, st, pad):
    g = torch.nn.grad
    return {"fwd": lambda: torch.nn.functional.conv2d(x, w, stride=st, padding=pad),
            "bwd_data": lambda: g.conv2d_input(x.shape, w, dy, st, pad),
            "bwd_filter": lambda: g.conv2d_weight(x, w.shape, dy, st, pad)}[direction]


def report(torch, shape, args):
    c, k, hw, r, st, pad = shape
    x, w, y = _tensors(torch, c, k, hw, r, st, pad, args.batch, args.dtype)
    geom = ConvGeom(2, (args.batch, c, 1, hw, hw), (k, c, 1, r, r), (1, st, st), (0, pad, pad),
                    (1, 1, 1), 1, False)
    ct = "float64" if args.dtype == "float64" else "float32"
    allow_tc = args.dtype == "float16" or args.tf32
    h = handle.get(0)
    op, refs = conv_graph.build_operation(args.direction, descriptor_dims(geom), args.dtype,
                                          ct, False, 16)
    g = graph.operation_graph(h, [op])
    ptr = {1: x.data_ptr(), 2: w.data_ptr(), 3: y.data_ptr()}
    uids = conv_graph.UIDS[args.direction]
    pointers = tuple(ptr[u] for u in uids)
    ws = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    print(f"\n## {args.direction} {c}->{k} {hw}^2 {r}x{r}/{st} batch {args.batch} {args.dtype}"
          f"{' tf32' if args.tf32 else ''}\n")
    print("| mode | # | engine config | notes | kept | workspace MB | ms |")
    print("|---|---|---|---|---|---|---|")
    pick = None
    for i, (mode, cfg) in enumerate(_configs(g)):
        kept = cfg.usable(allow_tc, False)
        if i >= args.top and not (kept and pick is None and mode != "B"):
            print(f"| {mode} | {i} | {cfg.name} | {_notes(cfg)} | {kept} | | not run |")
            continue
        try:
            p = graph.Plan(h, cfg, uids)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"| {mode} | {i} | {cfg.name} | {_notes(cfg)} | {kept} | - | no plan "
                  f"({getattr(e, 'status_name', e)}) |")
            continue
        if kept and pick is None and mode != "B":
            pick = p
        ms = "-"
        if p.workspace <= ws.numel():
            ms = f"{_time(torch, lambda p=p: p.execute(h, pointers, ws.data_ptr()), args.reps):.3f}"
        print(f"| {mode} | {i} | {p.name} | {_notes(cfg)} | {kept} | "
              f"{p.workspace / 2**20:.1f} | {ms} |")
    torch.backends.cudnn.allow_tf32 = args.tf32
    tf = _torch_fn(torch, args.direction, x, w, y, st, pad)
    print(f"\ndnnkit guess_once: {pick.name if pick else None}; PyTorch: "
          f"{_time(torch, tf, args.reps):.3f} ms")
    if pick is not None:
        print(f"kernels, dnnkit's pick: "
              f"{_kernels(torch, lambda: pick.execute(h, pointers, ws.data_ptr()))}")
    print(f"kernels, PyTorch: {_kernels(torch, tf)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--direction", default="fwd", choices=("fwd", "bwd_data", "bwd_filter"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shapes", default="", help="comma-separated indices into RESNET50")
    args = ap.parse_args()
    import torch
    torch.backends.cudnn.benchmark = False
    idx = [int(i) for i in args.shapes.split(",")] if args.shapes else range(len(RESNET50))
    for i in idx:
        report(torch, RESNET50[i], args)


if __name__ == "__main__":
    main()
