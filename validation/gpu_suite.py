"""The GPU suite (every test marked ``gpu`` or ``cudnn``, and every test of DEVICE_FOLDERS,
which use the GPU wherever there is one), side by side on one GPU.

The tests are collected once, then run by several pytest processes side by side on the one GPU,
whole files dealt to the least-loaded process (a file of more than a quarter of one process's
share in pieces, its tests dealt to them in turn: the pooling tests' largest cases take
seconds each against their float64 references, and one process of consecutive ones would be
left with them), followed by the tests that read the device's free memory or start threads and
processes of their own (leaks, faults, scale, threads, several GPUs), which run alone. Each
process gets the time left to the deadline; one that does not finish is reported as such,
with its log; each log names the tests as they start, and a test still running after HANG_S
seconds has every thread's stack written there. On a fresh machine the whole selection takes
more than one 10-minute call (validation/notes/gpu-test-runs.md): run the alone files
(tests/gpu/test_leaks.py, ...) as PATHs in a second call.

    python -m validation.gpu_suite [--workers 8] [--budget 560] [--logs DIR] [PATH ...]

Prints one line per process (its pytest summary) and exits non-zero when any failed or did not
finish. Logs: DIR/worker-K.log and DIR/alone.log (default: $OUT/gpu_suite or /tmp/gpu_suite).
"""

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import time

# Tests that measure the device's free memory (leaks, autograd's flat-memory step), or use
# threads or several devices: alone.
ALONE = re.compile(r"(leaks|faults|scale|threads|multi|autograd)\.py$")
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
# a worker's log names each test as it starts (-v), and a test still running after this many
# seconds has every thread's stack written there: a hang shows where it is
HANG_S = 120


# Folders and files whose tests run on the GPU wherever there is one without being marked:
# they run on the simulator too, with CPU tensors or host memory (dnnkit.torch's: a CUDA
# backward runs on PyTorch's own autograd thread, a CPU one on the caller's, so only the GPU
# run shows some defects; DLPack's: CUDA capsules on a GPU). Every test there is collected,
# marked or not.
DEVICE_FOLDERS = ("tests/torch", "tests/test_dlpack.py")


def _collect(args):
    out = subprocess.run(PYTEST + ["--collect-only"] + args, capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "::" in line], out


def _inside(path, folder):
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder + os.sep)


def _device_paths(paths):
    """What of DEVICE_FOLDERS ``paths`` (default: everything) reach: a path inside one, or a
    folder that holds one."""
    if not paths:
        return list(DEVICE_FOLDERS)
    out = [p if _inside(p, f) else f for p in paths for f in DEVICE_FOLDERS
           if _inside(p, f) or _inside(f, p)]
    return list(dict.fromkeys(out))


def collect(marks, paths):
    """The marked tests under ``paths`` (default: all), and every test of DEVICE_FOLDERS
    there."""
    ids, out = _collect(["-m", marks] + paths)
    extra = _device_paths(paths)
    if extra:
        seen = set(ids)
        ids += [i for i in _collect(extra)[0] if i not in seen]
    if not ids:
        sys.exit(f"gpu_suite: no tests collected\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def split(ids, workers):
    """Files (with their tests) dealt to the least-loaded worker, largest first."""
    files = collections.OrderedDict()
    for i in ids:
        files.setdefault(i.split("::")[0], []).append(i)
    alone = [i for f, t in files.items() if ALONE.search(f) for i in t]
    loads = [[0, []] for _ in range(workers)]
    # a file of more than a quarter of a worker's share is dealt in pieces, a test to each
    # piece in turn: a parametrized test's heavy cases sit side by side (the pooling tests'
    # largest shapes, seconds a case against float64 references), and the worker given them
    # all would set the end alone
    share = max(1, -(-sum(len(t) for f, t in files.items() if not ALONE.search(f)) // workers))
    piece = max(1, share // 4)
    pieces = []
    for f, t in files.items():
        if not ALONE.search(f):
            n = -(-len(t) // piece)
            pieces += [(f, t[k::n]) for k in range(n)]
    for f, t in sorted(pieces, key=lambda ft: -len(ft[1])):
        w = min(loads, key=lambda lw: lw[0])
        w[0] += len(t)
        w[1].extend(t)
    return [w[1] for w in loads if w[1]], alone


def start(name, ids, logs):
    log = open(os.path.join(logs, f"{name}.log"), "w")
    # a few hundred node ids (~100 bytes each) are far under the argument-size limit
    # the ids were selected at collection (marks, DEVICE_FOLDERS): no -m here
    # each failure's report as it happens (validation/instant_failures.py), not only in the
    # summary a process stopped at the deadline never writes
    cmd = [a for a in PYTEST if a != "-q"] + ["-rfE", "-v", "-p", "validation.instant_failures",
                                               "-o", f"faulthandler_timeout={HANG_S}"] + ids
    # a session of its own: at the deadline the whole group goes, the processes a test
    # started too, so nothing runs on beside the next measurement
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True), log


def summary(path):
    lines = [ln.strip() for ln in open(path, errors="replace") if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"\b(passed|failed|error|no tests ran)\b", ln):
            return ln.strip("= ")
    return lines[-1] if lines else "(no output)"


def wait_all(procs, deadline):
    ok = True
    for name, (p, log) in procs.items():
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
        log.close()
        line = summary(log.name)
        print(f"{name}: {'DID NOT FINISH (deadline)' if rc is None else 'rc=' + str(rc)}: "
              f"{line}", flush=True)
        ok = ok and rc == 0
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--budget", type=float, default=560.0, help="seconds for the whole run")
    ap.add_argument("--marks", default="gpu or cudnn")
    ap.add_argument("--logs", default=os.path.join(os.environ.get("OUT", "/tmp"), "gpu_suite"))
    ap.add_argument("paths", nargs="*", help="test files or folders to collect from (default: all)")
    a = ap.parse_args(argv)
    os.makedirs(a.logs, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + a.budget
    ids = collect(a.marks, a.paths)
    groups, alone = split(ids, a.workers)
    print(f"gpu_suite: {len(ids)} tests, {len(groups)} workers side by side, {len(alone)} alone",
          flush=True)
    procs = {f"worker-{k}": start(f"worker-{k}", g, a.logs)
             for k, g in enumerate(groups)}
    ok = wait_all(procs, deadline)
    print(f"gpu_suite: side by side done at {time.monotonic() - t0:.0f} s", flush=True)
    if alone:
        ok = wait_all({"alone": start("alone", alone, a.logs)}, deadline) and ok
    print(f"gpu_suite: {'all passed' if ok else 'FAILURES or unfinished'} in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
