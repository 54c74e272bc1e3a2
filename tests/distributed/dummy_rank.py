"""A CPU-only stand-in for a training script, started by the launcher in
tests/distributed/test_run.py: ``dummy_rank.py MODE OUTDIR``. Each rank writes
OUTDIR/rank<RANK>.json (its pid and the launcher's variables) first, then acts out MODE."""

import json
import os
import signal
import sys
import time

VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES")


def note(outdir, name, **data):
    path = os.path.join(outdir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def main(mode, outdir, *rest):
    rank = int(os.environ["RANK"])
    note(outdir, f"rank{rank}.json", pid=os.getpid(), argv=list(rest),
         env={k: os.environ.get(k) for k in VARS})
    if mode == "env":
        return 0
    if mode == "fail":                   # rank 1 fails; the others would run for a minute
        if rank == 1:
            time.sleep(0.5)
            return 3
        time.sleep(60)
        note(outdir, f"survived{rank}.json")
        return 0
    if mode == "killed":
        if rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        return 0
    if mode == "signal":                 # every rank waits for the forwarded SIGTERM
        def on_term(signum, frame):
            note(outdir, f"term{rank}.json", signal=signum)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        note(outdir, f"ready{rank}.json")
        time.sleep(60)
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
