"""The command line: ``python -m dnnkit`` or the ``dnnkit`` console script.

``info`` (backends and flags), ``check`` (cross-check every registered op on every available
backend against float64 NumPy, with timings), ``demo`` (train a small CNN, a residual CNN
and an LSTM end to end) and ``warmup`` (compile a model's Numba kernels in parallel into the
disk cache: dnnkit/warmup.py). An error of dnnkit's (a missing library, a bad flag) ends the command with one line
on stderr, ``dnnkit: error: <the reason>``, and exit status 1; a bad command line, with
argparse's usage line and status 2.
"""

import argparse
import os
import sys
import time

from . import __version__, backends, config, demo, selfcheck, warmup
from .errors import DnnkitError

DTYPES = ("float16", "float32", "float64")
BACKENDS = ("auto", "cudnn", "numba")


def _ensure_device(argv):
    """Without a CUDA driver, re-run on Numba's CUDA simulator (which must be chosen before
    numba.cuda is imported) so the check still runs, on tiny shapes."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") or backends.driver_available():
        return
    print("dnnkit: no CUDA driver or GPU found; running on Numba's CUDA simulator "
          "(NUMBA_ENABLE_CUDASIM=1), tiny shapes, times meaningless", flush=True)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    os.execve(sys.executable, [sys.executable, "-m", "dnnkit", *argv], env)


def cmd_info(_args):
    print(backends.status())
    print("\nflags (value, source):")
    for name, value, source, _doc in config.describe():
        print(f"  {name:<20} = {value!r:<12} ({source})")
    return 0


def cmd_check(args):
    st = backends.status()
    print(f"cuDNN: {'available' if st.cudnn_available else 'unavailable'}"
          f"{'' if st.cudnn_available else ' (' + st.cudnn_reason + ')'}; "
          f"Numba: {st.numba.describe()}\n")
    t0 = time.perf_counter()
    rows = []
    print(selfcheck.HEADER + "\n" + "-" * len(selfcheck.HEADER), flush=True)
    for row in selfcheck.run(dtypes=args.dtypes, reps=args.reps, ops_=args.ops):
        rows.append(row)
        print(selfcheck.format_row(row), flush=True)
    bad = [r for r in rows if r["status"] == "FAIL"]
    elapsed = time.perf_counter() - t0
    ran = sum(r["status"] != "skipped" for r in rows)
    print(f"\n{ran} checks ran, {len(bad)} failed, "
          f"{sum(r['status'] == 'skipped' for r in rows)} skipped ({elapsed:.0f} s)")
    return 1 if bad else 0


def cmd_demo(args):
    if args.gpus > 1 and "RANK" not in os.environ:
        return demo.launch(args.gpus, args.argv)
    results = demo.run(backend=args.backend, crosscheck=args.crosscheck, plot=args.plot,
                       seed=args.seed, data_parallel="RANK" in os.environ)
    return 0 if demo.finite(results) else 1


def cmd_warmup(args):
    return warmup.command(args)


COMMANDS = {"info": cmd_info, "check": cmd_check, "demo": cmd_demo, "warmup": cmd_warmup}


def _names(kind, allowed):
    """An argparse type: a comma-separated list of names out of ``allowed()``."""
    def parse(text):
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"no {kind} given")
        valid = allowed()
        bad = [n for n in names if n not in valid]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {kind} {', '.join(map(repr, bad))}; valid: {', '.join(sorted(valid))}")
        return names
    return parse


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {v}")
    return v


def checked_ops():
    """The op names ``check`` has rows for."""
    return {case.op for case in selfcheck.cases()}


def build_parser(prog="python -m dnnkit"):
    p = argparse.ArgumentParser(
        prog=prog, description="dnnkit: deep-learning ops on Numba CUDA kernels and cuDNN. "
        "Without a GPU every command runs on Numba's CUDA simulator (tiny shapes).")
    p.add_argument("--version", action="version", version=f"dnnkit {__version__}",
                   help="print dnnkit's version and exit")
    sub = p.add_subparsers(dest="cmd", title="commands", metavar="COMMAND")
    sub.add_parser("info", help="backend status (cuDNN, Numba, the GPU) and flag values",
                   description="Print the backend report and every flag with its source.")
    d = sub.add_parser("demo", help="train a small CNN, a residual CNN and an LSTM end to end",
                       description="Train a small CNN and a residual CNN on 8x8 digits and an "
                       "LSTM on a sequence task, then print held-out accuracies and the per-op "
                       "time table.")
    d.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="where the ops run: auto (cuDNN where it can, else Numba), cudnn "
                   "(cuDNN or an error), numba (never cuDNN); default: %(default)s")
    d.add_argument("--crosscheck", action="store_true",
                   help="train a cuDNN and a Numba copy side by side; report their divergence")
    d.add_argument("--plot", metavar="PNG", help="write the loss curves (needs matplotlib)")
    d.add_argument("--gpus", type=_positive, default=1,
                   help="train data-parallel on N GPUs of this host (dnnkit.distributed: one "
                   "process per GPU, each batch split between them, gradients averaged "
                   "over NCCL; needs the dist extra); default: %(default)s")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the data and the initial weights; default: %(default)s")
    c = sub.add_parser("check", help="cross-check every op on every backend vs float64 NumPy",
                       description="One row per op, variant, dtype and backend: the relative "
                       "error against a float64 NumPy reference and the median time.")
    c.add_argument("--dtypes", default=list(DTYPES), type=_names("dtype", lambda: DTYPES),
                   help=f"comma-separated dtypes out of {', '.join(DTYPES)}; default: all")
    c.add_argument("--reps", type=_positive, default=20,
                   help="timed runs per row on a GPU (the median is shown); default: "
                   "%(default)s")
    c.add_argument("--ops", type=_names("op", checked_ops), default=None,
                   help="comma-separated op names (default: all); an unknown name lists the "
                   "valid ones")
    w = sub.add_parser("warmup", help="compile a model's Numba kernels in parallel into the "
                       "disk cache (fast first steps later)",
                       description="Record the kernel signatures of one training step of a "
                       "model without running it, compile them in worker processes into "
                       "Numba's on-disk cache, and report the slowest. A later process's first "
                       "step loads them (docs/performance.md, cold start). Needs a GPU.")
    w.add_argument("--model", default="vgg", choices=warmup.MODELS,
                   help="dnnkit.models.vgg_cnn or resnet18 (10 classes, 3x32x32 input); "
                   "default: %(default)s")
    w.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="the model's dtype; default: %(default)s")
    w.add_argument("--batch", type=_positive, default=32, help="batch size; default: "
                   "%(default)s")
    w.add_argument("--backend", default="numba", choices=BACKENDS,
                   help="where the model's layers run (auto and cudnn still launch Numba "
                   "kernels for what cuDNN lacks); default: %(default)s")
    w.add_argument("--workers", type=_positive, default=None,
                   help="compile processes; default: one per CPU")
    w.add_argument("--manifest", metavar="PATH",
                   help="compile the signatures of this manifest instead of recording a step")
    w.add_argument("--record-manifest", metavar="PATH",
                   help="also write the recorded signatures to PATH (for --manifest later)")
    w.add_argument("--check", action="store_true",
                   help="then time a fresh process's first training step (of --model, --dtype, "
                   "--batch, --backend) from the cache")
    return p


def _one_line(e):
    return " ".join(str(e).split()) or type(e).__name__


def main(argv=None, prog="python -m dnnkit"):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser(prog)
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 2
    if args.cmd == "warmup" and args.manifest and args.record_manifest:
        p.error(f"warmup: --manifest {args.manifest} gives the signatures; --record-manifest "
                f"{args.record_manifest} records a step's: give one of them")
    if args.cmd == "demo" and args.gpus > 1 and args.crosscheck:
        p.error("demo: --crosscheck trains two copies on one GPU; it does not combine with "
                "--gpus")
    try:
        config.get("dnn.enabled")        # a bad DNNKIT_FLAGS or rc file: say so before anything
        if args.cmd == "demo" and args.backend == "cudnn":
            # before the simulator's re-run: without a GPU there is no cuDNN to wait for
            st = backends.status()
            if not st.cudnn_available:
                raise DnnkitError(f"--backend cudnn needs cuDNN, which cannot run here: "
                                  f"{st.cudnn_reason}")
        _ensure_device(argv)
        args.argv = argv
        return COMMANDS[args.cmd](args)
    except (DnnkitError, config.ConfigError) as e:
        # dnnkit's own errors (the environment, a library, a flag): the reason, not a traceback
        print(f"dnnkit: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def cli():
    """The ``dnnkit`` console script."""
    return main(prog="dnnkit")


if __name__ == "__main__":
    sys.exit(main())
