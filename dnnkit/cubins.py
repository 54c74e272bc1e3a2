"""Compiled kernels kept as cubins: a fresh process's first launch of a cached kernel without
Numba.

Numba's disk cache (``cache=True``) spares a process the compile, but a load still goes through
Numba's dispatcher: its first load refreshes the CUDA target (importing the lowering modules,
and SciPy's linear algebra where SciPy is installed: ~0.5 s on an H100 host), and each load
unpickles the kernel and checks its index (3-4 ms). Half of a cached first training step's
second (validation/notes/cold-start.md). So dnnkit keeps beside Numba's cache the one thing a
launch needs, the kernel's machine code and entry name, per (kernel, Numba argument types,
device): ``store`` after Numba compiled an overload in this process (dnnkit.launch, the
warm-up's workers; not one loaded from Numba's cache, which may be stale), ``find`` before a
launch would go through Numba; a found cubin is loaded with
cuModuleLoadData and launched by dnnkit.launch's packed launcher, as a learned one.

The key. Numba's index is stamped with the kernel's own source file only, so a device function
changed in another file leaves a stale entry. A cubin's key covers more: the sources of the
whole ``dnnkit.kernels`` package (hashed once per process, ~0.25 MB), the kernel's module,
name, bytecode, closure (``fingerprint``: the factory-made variants) and compile options,
the argument types, numba-cuda's version, the CUDA toolkit's
version and the device's compute capability. A kernel Numba would not cache (no
``cache=True``), one that links setup callbacks or refers to live objects, and a cooperative
or launch-configuration-sensitive one, is never stored.

Files: ``<Numba's cache folder of the kernel>/dnnkit-cubins/<name>-<key>.cubin``, written
atomically (dnnkit.files); a file that cannot be read or loaded is passed over (and removed
when the driver refuses it) for Numba's kernel. Removing the cache folder, as
for Numba's cache, removes them. numba is imported inside functions (``import dnnkit`` does
not load it).
"""

import contextlib
import hashlib
import os
import re
import threading

from . import files
from .device import driver
from .log import log

MAGIC = b"dnnkit-cubin/1\n"
FOLDER = "dnnkit-cubins"
_lock = threading.Lock()
_stamp = None           # hash of the kernels' sources and the compilers' versions (b"": none)
_kernel_parts = {}      # id(kernel) -> (kernel, its part of the key): kept alive with it
loaded = 0              # cubins this process loaded (validation's first-step counts)


def _sources_stamp():
    """The hash of the kernels' sources and the compilers' versions; b"" (no cubins in this
    process) when a source cannot be read."""
    global _stamp
    if _stamp is None:
        import llvmlite
        import numba
        import numba_cuda
        from numba.cuda.cudadrv import runtime

        from . import kernels
        h = hashlib.sha256()
        root = os.path.dirname(os.path.abspath(kernels.__file__))
        try:
            for folder, subs, names in sorted(os.walk(root)):
                subs[:] = sorted(s for s in subs if s != "__pycache__")
                for n in sorted(names):
                    if n.endswith(".py") and not n.startswith("."):   # not an editor's lock
                        path = os.path.join(folder, n)
                        h.update(os.path.relpath(path, root).encode() + b"\0")
                        with open(path, "rb") as f:
                            h.update(f.read() + b"\0")
            h.update(repr((numba.__version__, numba_cuda.__version__, llvmlite.__version__,
                           runtime.runtime.get_version())).encode())
            _stamp = h.digest()
        except OSError as e:
            log.debug("cubins: the kernels' sources cannot be read (%s): none used", e)
            _stamp = b""
    return _stamp


def _kernel_part(kernel):
    e = _kernel_parts.get(id(kernel))
    if e is None:
        part = fingerprint(kernel).encode()
        with _lock:
            e = _kernel_parts[id(kernel)] = (kernel, part)
    return e[1]


def fingerprint(obj, _seen=None):
    """A text standing for what a kernel's machine code depends on in ``obj`` (the kernel, or a
    value its closure holds), the same in every process and at any moment of one.

    Not Numba's pickle of the closure, which its own cache key hashes: a Numba type pickles with
    its instance attributes, and numba-cuda's target refresh (the first compile or cache load of
    a process) sets two on ``float16`` (``alignof_``, ``align``), so every kernel whose closure
    reaches float16 (the tensor-core GEMMs' device functions) had one key before a process's
    first compile and another after: a cubin stored after a compile was never found by the
    next process, which looks up before. Here: plain values by ``repr``; Numba types by name;
    NumPy arrays by dtype, shape and bytes; functions by module, name, code (bytecode, names,
    constants), defaults and closure (the values of their module-level names are the kernel
    sources', hashed in ``_sources_stamp``, as in Numba's own key); Numba
    dispatchers by their function and compile options; modules by name; anything else by
    Numba's pickle of it."""
    memo = {} if _seen is None else _seen    # id -> (the object, kept alive; its text)
    e = memo.get(id(obj))
    if e is not None:
        return "<cycle>" if e[1] is None else e[1]
    memo[id(obj)] = (obj, None)
    text = _text(obj, memo)
    memo[id(obj)] = (obj, text)
    return text


def _text(obj, memo):
    import types as pytypes

    import numpy as np
    from numba.core.types import Type
    t = type(obj)
    if obj is None or t in (bool, int, float, complex, str, bytes):
        return repr(obj)
    if t in (tuple, list):
        return t.__name__ + "(" + ",".join(fingerprint(o, memo) for o in obj) + ")"
    if t is dict:
        return "dict(" + ",".join(f"{fingerprint(k, memo)}:{fingerprint(v, memo)}"
                                  for k, v in sorted(obj.items(), key=repr)) + ")"
    if isinstance(obj, Type):
        return f"numba:{obj}"
    if isinstance(obj, np.ndarray):
        return f"ndarray:{obj.dtype!r}:{obj.shape}:{hashlib.sha256(obj.tobytes()).hexdigest()}"
    if isinstance(obj, (np.dtype, np.generic)) or (isinstance(obj, type)
                                                     and issubclass(obj, np.generic)):
        return f"numpy:{obj!r}"
    if isinstance(obj, pytypes.ModuleType):
        return f"module:{obj.__name__}"
    if isinstance(obj, pytypes.CodeType):
        return (f"code:{hashlib.sha256(obj.co_code).hexdigest()}:{obj.co_names}:"
                f"{fingerprint(obj.co_consts, memo)}")
    if isinstance(obj, pytypes.FunctionType):
        cells = tuple(c.cell_contents for c in obj.__closure__ or ())
        return (f"function:{obj.__module__}.{obj.__qualname__}:{fingerprint(obj.__code__, memo)}"
                f":{fingerprint((obj.__defaults__, obj.__kwdefaults__), memo)}"
                f":{fingerprint(cells, memo)}")
    f = getattr(obj, "py_func", None)
    if isinstance(f, pytypes.FunctionType):                 # a Numba dispatcher
        return (f"{t.__name__}:{fingerprint(f, memo)}:"
                f"{fingerprint(dict(getattr(obj, 'targetoptions', {})), memo)}")
    from numba.cuda.serialize import dumps
    return f"pickle:{t.__module__}.{t.__qualname__}:{hashlib.sha256(dumps(obj)).hexdigest()}"


def _cc():
    from numba import cuda
    return tuple(cuda.get_current_device().compute_capability)


def _folder(kernel):
    """Numba's cache folder of ``kernel``; None without one (not ``cache=True``)."""
    cache = getattr(kernel, "_cache", None)          # numba-cuda: CUDACache or NullCache
    folder = getattr(cache, "cache_path", None)
    return folder if folder and hasattr(kernel, "py_func") else None


def path(kernel, argtypes, cc=None):
    """The file of ``kernel``'s cubin for ``argtypes`` on a device of compute capability
    ``cc`` (default: the current device's); None for a kernel without a disk cache."""
    folder = _folder(kernel)
    if folder is None or not _sources_stamp():
        return None
    h = hashlib.sha256(_sources_stamp() + _kernel_part(kernel))
    h.update(repr((tuple(str(t) for t in argtypes), tuple(cc or _cc()))).encode())
    name = re.sub(r"[^A-Za-z0-9_]+", "_", kernel.py_func.__qualname__)[:60]
    return os.path.join(folder, FOLDER, f"{name}-{h.hexdigest()[:40]}.cubin")


def storable(overload):
    """Whether a compiled overload is machine code alone: no setup callbacks run at its
    module's load, no live objects it refers to, an ordinary launch (not a debug kernel, whose
    exceptions Numba's launch checks; no shared memory carveout, which Numba sets at bind)."""
    lib = overload._codelibrary
    return not (getattr(overload, "cooperative", False) or getattr(lib, "use_cooperative", False)
                or getattr(overload, "debug", False)
                or getattr(overload, "shared_memory_carveout", None) is not None
                or getattr(overload, "launch_config_sensitive", False)
                or getattr(lib, "_setup_functions", None) or getattr(lib, "referenced_objects",
                                                                    None)
                or getattr(lib, "needs_cudadevrt", False))


def compiled_here(kernel, argtypes):
    """Whether Numba compiled ``kernel`` for ``argtypes`` in this process (not a cache load)."""
    misses = getattr(getattr(kernel, "stats", None), "cache_misses", None)
    return misses is not None and bool(misses.get(tuple(argtypes)))


def store(kernel, argtypes, overload):
    """Write ``overload``'s cubin (``kernel`` compiled for ``argtypes`` on the current device)
    unless its file exists; True when written. Only an overload this process compiled: one
    Numba loaded from its cache may be stale (Numba's index is stamped with the kernel's own
    file, not with the device functions it calls from other files) and would be kept under a
    key made from the current sources. Never raises: the launch it follows has run, and the
    cubin is a convenience beside Numba's cache."""
    try:
        if (_folder(kernel) is None or not storable(overload)
                or not compiled_here(kernel, argtypes)):
            return False
        cc = _cc()
        p = path(kernel, argtypes, cc)
        if p is None or os.path.exists(p):
            return False
        # the target Numba compiled for (sm_90a on an H100: (9, 0, "a")), not a new link
        cubin = machine_code(overload._codelibrary.get_cubin())
        if cubin is None:
            log.debug("cubins: %s's compiled code is not a cubin: not stored", overload.entry_name)
            return False
        os.makedirs(os.path.dirname(p), exist_ok=True)
        files.write_bytes(p, MAGIC + overload.entry_name.encode() + b"\n" + cubin)
        return True
    except OSError as e:
        log.debug("cubins: %s not stored (%s)", getattr(overload, "entry_name", kernel), e)
        return False
    except Exception as e:       # a defect here must not fail the launch that ran: said loudly
        log.warning("cubins: %s not stored (%s: %s)", getattr(overload, "entry_name", kernel),
                    type(e).__name__, e)
        return False


def machine_code(obj):
    """The ELF bytes of what Numba's ``get_cubin`` returned: bytes, or (numba-cuda 0.30) a
    cuda.core ObjectCode holding them; None for anything else (PTX, a file name)."""
    if getattr(obj, "code_type", "cubin") != "cubin":
        return None
    code = getattr(obj, "code", obj)
    if not isinstance(code, (bytes, bytearray, memoryview)):
        return None
    code = bytes(code)
    return code if code.startswith(b"\x7fELF") else None


def read(p):
    """(entry name, cubin bytes) of a cubin file, or None when it is missing or not one."""
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data.startswith(MAGIC):
        return None
    entry, sep, cubin = data[len(MAGIC):].partition(b"\n")
    return (entry.decode("ascii", "replace"), cubin) if sep and entry and cubin else None


def load_function(cubin, entry):
    """The handle (int) of ``entry`` in ``cubin`` loaded into the current context, or None
    when the driver refuses the image (another architecture, a newer toolkit's code)."""
    d = driver()
    err, module = d.cuModuleLoadData(cubin)
    if int(err) != 0:
        return None
    err, fn = d.cuModuleGetFunction(module, entry.encode())
    if int(err) != 0:
        d.cuModuleUnload(module)
        return None
    # the module stays loaded for the process's life, as Numba's modules do
    return int(fn)


def find(kernel, argtypes):
    """(entry name, loader) of a stored cubin of ``kernel`` for ``argtypes`` on the current
    device, or None. ``loader()`` returns the kernel's handle in the current context: the
    stored cubin on a device of its compute capability, else (another device, or a cubin the
    driver refuses, whose file is then removed) Numba's overload, compiled or loaded."""
    cc = _cc()
    p = path(kernel, argtypes, cc)
    found = None if p is None else read(p)
    if found is None:
        return None
    entry, cubin = found

    def loader():
        global loaded
        if _cc() == cc:
            fn = load_function(cubin, entry)
            if fn is not None:
                with _lock:
                    loaded += 1
                return fn
            with contextlib.suppress(OSError):
                os.unlink(p)            # refused: written again only from a compile (store)
        overload = kernel.compile(argtypes)
        store(kernel, argtypes, overload)
        return int(overload._codelibrary.get_cufunc().handle)
    return entry, loader
