"""``python -m dnnkit info`` (backends and flags) and ``python -m dnnkit check`` (cross-check
every registered op on every available backend against float64 NumPy, with timings)."""

import argparse
import os
import sys
import time

from . import backends, config, demo, selfcheck


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
    only = args.ops.split(",") if args.ops else None
    print(selfcheck.HEADER + "\n" + "-" * len(selfcheck.HEADER), flush=True)
    for row in selfcheck.run(dtypes=args.dtypes.split(","), reps=args.reps, ops_=only):
        rows.append(row)
        print(selfcheck.format_row(row), flush=True)
    bad = [r for r in rows if r["status"] == "FAIL"]
    elapsed = time.perf_counter() - t0
    ran = sum(r["status"] != "skipped" for r in rows)
    print(f"\n{ran} checks ran, {len(bad)} failed, "
          f"{sum(r['status'] == 'skipped' for r in rows)} skipped ({elapsed:.0f} s)")
    return 1 if bad else 0


def cmd_demo(args):
    results = demo.run(backend=args.backend, crosscheck=args.crosscheck, plot=args.plot,
                       seed=args.seed)
    return 0 if demo.finite(results) else 1


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m dnnkit")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="backend status and flags")
    d = sub.add_parser("demo", help="train a small CNN and an LSTM end to end")
    d.add_argument("--backend", default="auto", choices=["auto", "cudnn", "numba"])
    d.add_argument("--crosscheck", action="store_true",
                   help="train a cuDNN and a Numba copy side by side; report their divergence")
    d.add_argument("--plot", metavar="PNG", help="write the loss curves (needs matplotlib)")
    d.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check", help="cross-check every op on every backend vs float64 NumPy")
    c.add_argument("--dtypes", default="float16,float32,float64")
    c.add_argument("--reps", type=int, default=20, help="timed runs per row (GPU)")
    c.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 2
    _ensure_device(argv)
    return {"info": cmd_info, "check": cmd_check, "demo": cmd_demo}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
