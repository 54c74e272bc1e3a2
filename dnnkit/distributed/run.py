"""The launcher: ``python -m dnnkit.distributed.run --gpus N script.py [args]``.

Starts N copies of the script on this host, one per GPU, each with the variables
dnnkit.distributed.init() reads: ``RANK`` (node_rank * N + i), ``LOCAL_RANK`` (i),
``WORLD_SIZE`` (nnodes * N), ``LOCAL_WORLD_SIZE`` (N), ``MASTER_ADDR``, ``MASTER_PORT`` (a free
port of this host unless given). ``--isolate`` also sets ``CUDA_VISIBLE_DEVICES`` to the
rank's one GPU (init() then uses device 0). ``-m module`` runs a module instead of a script.
Several hosts: run it once per host with ``--nnodes``, ``--node-rank`` and the same
``--master-addr``/``--master-port`` (node 0's), or use mpirun / srun instead (they set ranks
themselves; docs/distributed.md).

Each rank runs in a process group of its own. SIGINT, SIGTERM and SIGHUP sent to the launcher
are forwarded to every rank. When a rank fails (a non-zero exit status or a signal), the
launcher names it on stderr, sends SIGTERM to the others, SIGKILL after ``--grace`` seconds,
and exits with that rank's status (128 + the signal number for a signal). It exits 0 when
every rank does.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

PREFIX = "dnnkit.distributed.run:"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m dnnkit.distributed.run",
        description="Start one process per GPU with RANK, LOCAL_RANK, WORLD_SIZE, "
                    "MASTER_ADDR and MASTER_PORT set (dnnkit.distributed.init reads them).")
    p.add_argument("--gpus", type=int, required=True, help="processes (GPUs) on this host")
    p.add_argument("--nnodes", type=int, default=1, help="hosts in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this host's index (default 0)")
    p.add_argument("--master-addr", default=None,
                   help="host of rank 0's store (default 127.0.0.1 on one host)")
    p.add_argument("--master-port", type=int, default=None,
                   help="port of rank 0's store (default: a free port, on one host)")
    p.add_argument("--isolate", action="store_true",
                   help="give each rank only its GPU through CUDA_VISIBLE_DEVICES")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping the ranks")
    p.add_argument("-m", dest="module", default=None, help="run a module, as python -m")
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def rank_environ(base, args, local_rank, port):
    """The environment of local rank ``local_rank``."""
    environ = dict(base)
    environ.update(RANK=str(args.node_rank * args.gpus + local_rank),
                   LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.nnodes * args.gpus),
                   LOCAL_WORLD_SIZE=str(args.gpus),
                   MASTER_ADDR=args.master_addr or "127.0.0.1", MASTER_PORT=str(port))
    if args.isolate:
        visible = [v for v in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        environ["CUDA_VISIBLE_DEVICES"] = visible[local_rank] if local_rank < len(visible) \
            else str(local_rank)
    return environ


def _check(p, args):
    if args.module is None and args.script is None:
        p.error("give the script to run (or -m module)")
    if args.module is not None and args.script is not None:
        args.args = [args.script] + args.args      # with -m every word is the module's
        args.script = None
    if args.gpus < 1:
        p.error(f"--gpus must be >= 1; got {args.gpus}")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank must be in [0, --nnodes={args.nnodes}); got {args.node_rank}")
    if args.nnodes > 1 and (args.master_addr is None or args.master_port is None):
        p.error("--nnodes > 1 needs --master-addr and --master-port (node 0's host and a "
                "free port there), the same on every host")
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        p.error(f"--master-port must be a TCP port (1 to 65535); got {args.master_port}")
    if not args.grace >= 0:
        p.error(f"--grace must be >= 0; got {args.grace}")


def _describe(code):
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}", 128 - code
    return f"exited with status {code}", code


def _signal_all(procs, sig):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _stop(procs, grace):
    """SIGTERM to every rank still running, SIGKILL to those left after ``grace`` s."""
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


_VALUED = ("--gpus", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--grace")


def _split_module(argv):
    """(the launcher's arguments, the module's) for ``... -m module args``: everything after
    the module's name belongs to it (as with ``python -m``), options included, which argparse
    alone would take for the launcher's. The launcher's options end at ``-m`` or at the first
    positional argument (the script, whose arguments argparse keeps as they are)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return argv[:i + 2], argv[i + 2:]
        if not a.startswith("-"):
            break
        i += 2 if a in _VALUED else 1
    return argv, []


def main(argv=None):
    p = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    head, module_args = _split_module(argv)
    args = p.parse_args(head)
    if args.module:
        args.args = module_args + list(args.args)
    _check(p, args)
    if args.master_port is not None:
        port = args.master_port
    else:
        from .env import free_port
        port = free_port()
    cmd = [sys.executable] + (["-m", args.module] if args.module else [args.script]) + \
        list(args.args)
    received = []

    def forward(signum, frame):
        received.append(signum)
        _signal_all(procs, signum)

    procs = []
    old = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        for i in range(args.gpus):
            procs.append(subprocess.Popen(cmd, env=rank_environ(os.environ, args, i, port),
                                          start_new_session=True))
        return _watch(procs, args, received)
    finally:
        _stop(procs, args.grace)
        for s, h in old.items():
            signal.signal(s, h)


def _watch(procs, args, received):
    """Wait for the ranks; the launcher's exit status (module docstring)."""
    first = args.node_rank * args.gpus
    while True:
        if received:
            sig = received[0]
            print(f"{PREFIX} got {signal.Signals(sig).name}: forwarded to every rank; "
                  f"stopping", file=sys.stderr, flush=True)
            _stop(procs, args.grace)
            return 128 + sig
        for i, proc in enumerate(procs):
            code = proc.poll()
            if code is not None and code != 0:
                what, status = _describe(code)
                others = [str(first + j) for j, q in enumerate(procs)
                          if j != i and q.poll() is None]
                print(f"{PREFIX} rank {first + i} (local rank {i}, pid {proc.pid}) {what}; "
                      f"stopping {'ranks ' + ', '.join(others) if others else 'nothing else'}",
                      file=sys.stderr, flush=True)
                _stop(procs, args.grace)
                return status
        if all(proc.poll() == 0 for proc in procs):
            return 0
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
