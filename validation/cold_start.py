"""Cold start of a training step on the Numba path: the time from starting a Python process to
the end of its first (synchronised) training step, for the VGG-style CNN and ResNet-18
(float32, batch 32, every layer pinned to Numba), each in fresh processes. Needs a GPU.

    python -m validation.cold_start [--models vgg,resnet18] [--workers 16] [--out DIR]

Per model, with its own empty Numba cache folder (NUMBA_CACHE_DIR) per scenario:

- ``empty``: nothing cached: the first step compiles every kernel it launches, one by one
  (``dnn.compile_ahead`` off); its first launches are recorded (the real step's manifest);
- ``cached``: a second process on that cache;
- ``empty, compiling ahead``: nothing cached, ``dnn.compile_ahead`` on (the default): the first
  compile starts the background compile of the step's usual kernels (dnnkit.compile_ahead);
- ``warm-up``: ``python -m dnnkit warmup`` on a new empty folder (record-only step, then the
  signatures compiled by N worker processes): its own wall time;
- ``after warm-up``: a fresh process's first step on the folder the warm-up filled.

Every process reads Python's bytecode from one folder of the run (PYTHONPYCACHEPREFIX), compiled
there first for the packages a step imports, as an installed package has its .pyc files (the
lent GPU machines set PYTHONDONTWRITEBYTECODE: each process would compile ~320 modules from
source).

Prints a table (and writes DIR/cold_start.md): seconds to the first step, kernel signatures compiled
and loaded in that process (from Numba's cache + from the cubins dnnkit stores beside it, launched
without Numba's dispatcher: dnnkit.cubins), the warm-up's time; the warm-up's output (its 10 slowest
signatures with their compile seconds); and whether the record-only pass saw every signature the
real step launched.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from dnnkit import warmup

DTYPE, BATCH, BACKEND = "float32", 32, "numba"


# the packages a first step imports (numba's lowering registries pull in scipy.linalg where
# SciPy is installed)
PACKAGES = ("dnnkit", "dnnkit.kernels", "numba", "numba_cuda", "llvmlite", "numpy", "scipy",
            "cuda")


def _bytecode(env, folder):
    """``env`` with Python's bytecode read from (and written to) ``folder``, as an installed
    package has its .pyc files (None: ``env`` as it is). The lent GPU machines set
    PYTHONDONTWRITEBYTECODE, so without this every fresh process compiled ~320 modules from
    source (~0.5-0.9 s, half of a cached first step's time)."""
    if folder is not None:
        env["PYTHONPYCACHEPREFIX"] = folder
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _env(cache, ahead=True):
    """A scenario's environment: its Numba cache, the run's bytecode (compile_bytecode), and
    ``dnn.compile_ahead`` (set in DNNKIT_FLAGS only to turn it off)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    if not ahead:
        flags = env.get("DNNKIT_FLAGS", "")
        env["DNNKIT_FLAGS"] = ",".join(filter(None, [flags, "dnn.compile_ahead=False"]))
    return _bytecode(env, _PYC[0])


_PYC = [None]      # the run's bytecode folder, once compile_bytecode has filled it


def compile_bytecode(folder, workers):
    """Every module of PACKAGES compiled to bytecode under ``folder`` (PYTHONPYCACHEPREFIX),
    in a child process that sets the prefix before it compiles."""
    import importlib.util
    dirs = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs += list(spec.submodule_search_locations)
    _PYC[0] = folder
    code = ("import compileall, sys\nfor d in sys.argv[1:]:\n"
            f"    compileall.compile_dir(d, quiet=2, workers={workers})\n")
    subprocess.run([sys.executable, "-c", code, *dirs], env=_bytecode(dict(os.environ), folder),
                   check=False, capture_output=True, timeout=600)


def run_model(model, workers, tmp):
    rows, notes = [], []
    a_cache, b_cache = os.path.join(tmp, f"{model}-a"), os.path.join(tmp, f"{model}-b")
    real = os.path.join(tmp, f"{model}-real.pkl")
    recorded = os.path.join(tmp, f"{model}-recorded.pkl")

    def first(label, cache, ahead=True, **kw):
        r = warmup.fresh_first_step(model, DTYPE, BATCH, BACKEND, env=_env(cache, ahead), **kw)
        rows.append((model, label, f"{r['to_step_s']:.2f}", f"{r['step_s']:.2f}",
                     str(r["compiled"]), f"{r['loaded']} + {r['cubins']} cubins", ""))
        print(rows[-1], flush=True)

    first("empty cache", a_cache, ahead=False, manifest=real)
    first("cached (second process)", a_cache)
    first("empty cache, compiling ahead", os.path.join(tmp, f"{model}-c"))
    t0 = time.perf_counter()
    w = subprocess.run([sys.executable, "-m", "dnnkit", "warmup", "--model", model, "--dtype",
                        DTYPE, "--batch", str(BATCH), "--backend", BACKEND, "--workers",
                        str(workers), "--record-manifest", recorded],
                       capture_output=True, text=True, env=_env(b_cache), timeout=600)
    wall = time.perf_counter() - t0
    notes.append(f"### {model}: python -m dnnkit warmup --workers {workers} "
                 f"(exit {w.returncode}, {wall:.1f} s)\n\n```\n{w.stdout.strip()}\n"
                 f"{w.stderr.strip()[-3000:]}\n```")
    m = re.search(r"^(\d+) kernel signatures in ([\d.]+) s", w.stdout, re.M)
    rows.append((model, f"warm-up, {workers} workers", "", "", m.group(1) if m else "?", "",
                 f"{wall:.1f} (compiling {m.group(2) if m else '?'})"))
    print(rows[-1], flush=True)
    if w.returncode == 0:
        first("after warm-up", b_cache)
        want, got = set(warmup.load(real)), set(warmup.load(recorded))
        missed = sorted(warmup.describe(e) for e in want - got)
        notes.append(f"{model}: the real first step launched {len(want)} signatures, the "
                     f"record-only pass recorded {len(got)}; missed by the record: "
                     f"{missed or 'none'}; recorded but not launched: {len(got - want)}")
    return rows, notes


def table(rows):
    head = ("| model | scenario | s to first step (from process start) | step s | compiled | "
            "loaded | warm-up wall s |")
    return "\n".join([head, "|" + "---|" * 7] + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="vgg,resnet18",
                    help="comma-separated, out of " + ", ".join(warmup.MODELS))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in warmup.MODELS]
    if bad or a.workers < 1:
        ap.error(f"unknown models {bad}" if bad else f"--workers must be >= 1; got {a.workers}")
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        compile_bytecode(os.path.join(tmp, "pyc"), a.workers)
        print(f"bytecode of {', '.join(PACKAGES)} compiled in {time.perf_counter() - t0:.1f} s",
              flush=True)
        for model in models:
            r, n = run_model(model, a.workers, tmp)
            rows += r
            notes += n
    text = (f"# Cold start ({DTYPE}, batch {BATCH}, backend {BACKEND})\n\n{table(rows)}\n\n"
            + "\n\n".join(notes) + "\n")
    print("\n" + text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "cold_start.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
