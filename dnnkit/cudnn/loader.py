"""Find, sanity-check and load the cuDNN 9 library; probe whether it can run here.

Order: ``dnn.library_path`` (a file or a folder) if set, else
``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")`` (pip wheels cu12/cu13, conda, system).

cuDNN 9 is split into ``libcudnn.so.9`` and sub-libraries that it dlopens on its first call;
when one is missing the process *aborts* inside cuDNN. So before any call we read the file's
ELF soname (is it cuDNN's main library, and which major version? -- a path may name libz, a
sub-library or a cuDNN 8 file, and calling into those would crash or mislead), check that the
sub-libraries sit beside it, and only then ask ``cudnnGetVersion`` and try ``cudnnCreate``
(which answers CUDNN_STATUS_NOT_INITIALIZED when there is no CUDA device).

``cuda.pathfinder`` and Numba are imported inside the functions that need them: ``import
dnnkit`` loads neither (tests/cudnn/test_loader.py checks).
"""

import ctypes
import dataclasses
import glob
import os
import re
import struct
import sys
import threading

from .. import config, files
from .enums import STATUS_NAMES, STATUS_SUCCESS

MAIN_NAME = "libcudnn.so.9"
# Every cuDNN 9 release ships these beside libcudnn.so.9 (later ones add more, loaded only when
# used): the heuristic and engine libraries are what picks and runs a kernel, so a folder
# without them is as broken as one without the op libraries.
SUBLIBRARIES = ("libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9",
                "libcudnn_adv.so.9", "libcudnn_heuristic.so.9",
                "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9")
MIN_VERSION = 90000


@dataclasses.dataclass(frozen=True)
class CudnnStatus:
    """What dnnkit knows about cuDNN in this process."""
    available: bool
    reason: str = ""           # why it is unavailable ("" when available)
    version: int | None = None  # e.g. 91900 for 9.19.0
    path: str | None = None
    found_via: str | None = None  # "dnn.library_path", "site-packages", "conda", "system", ...
    lib: object = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def version_string(self):
        return None if self.version is None else version_string(self.version)

    def describe(self):
        where = f" at {self.path}" if self.path else ""
        ver = f"cuDNN {self.version_string}" if self.version else "cuDNN"
        how = f" (found via {self.found_via})" if self.found_via else ""
        if self.available:
            return f"{ver}{where}{how}"
        found = f"; found {ver}{where}{how}" if self.path else ""
        return f"{self.reason}{found}"


def version_string(v):
    """cudnnGetVersion's number as text: 9.x encodes major*10000 + minor*100 + patch (91900),
    8.x and older major*1000 + minor*100 + patch (8906 = 8.9.6)."""
    major, rest = (v // 10000, v % 10000) if v >= MIN_VERSION else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def version_problem(version):
    """None when cudnnGetVersion's answer is new enough, else the reason."""
    if version < MIN_VERSION:
        return f"too old: cuDNN {version_string(version)}; cuDNN >= 9 is required"
    return None


def soname(path):
    """The DT_SONAME of the ELF shared library at ``path`` (read from the file, never loaded),
    or None when the file is not ELF or has no soname."""
    try:
        with open(path, "rb") as f:
            elf = files.elf_sections(f)
            if elf is None:
                return None
            end, bits64, sections = elf
            for _, kind, offset, size, link in sections:
                if kind != 6:   # SHT_DYNAMIC
                    continue
                f.seek(offset)
                dyn = f.read(size)
                entry = end + ("qQ" if bits64 else "iI")
                step = struct.calcsize(entry)
                for i in range(0, len(dyn) - step + 1, step):
                    tag, val = struct.unpack_from(entry, dyn, i)
                    if tag == 0:          # DT_NULL ends the table
                        break
                    if tag == 14:         # DT_SONAME: an offset into the linked string table
                        f.seek(sections[link][2] + val)
                        return f.read(256).split(b"\0", 1)[0].decode(errors="replace")
    except (OSError, struct.error, IndexError):
        return None
    return None


def identity_problem(path, name):
    """None when soname ``name`` is cuDNN 9's main library (or unknown: then the library
    itself must answer), else why the file at ``path`` cannot be used."""
    if name is None or name == MAIN_NAME:
        return None
    m = re.fullmatch(r"libcudnn\.so\.(\d+)", name)
    if m and int(m.group(1)) < 9:
        return f"too old: {path} is cuDNN {m.group(1)} (soname {name}); cuDNN >= 9 is required"
    if name.startswith("libcudnn"):
        return (f"not cuDNN's main library: {path} is the sub-library {name}; name "
                f"{MAIN_NAME} or its folder")
    return f"not a cuDNN library: {path} has soname {name}, expected {MAIN_NAME}"


_lock = threading.Lock()
_cache = {}  # library_path flag value -> CudnnStatus


def _locate(library_path):
    """Return (path, found_via) or raise LookupError with the reason."""
    if library_path:
        p = os.path.expanduser(library_path)
        if os.path.isdir(p):
            cand = os.path.join(p, MAIN_NAME)
            if not os.path.isfile(cand):
                others = sorted(glob.glob(os.path.join(p, "libcudnn.so*")))
                extra = f" (found {', '.join(map(os.path.basename, others))})" if others else ""
                raise LookupError(f"library not found: dnn.library_path={library_path!r} is a "
                                  f"folder without {MAIN_NAME}{extra}")
            return cand, "dnn.library_path"
        if os.path.isfile(p):
            return p, "dnn.library_path"
        raise LookupError(f"library not found: dnn.library_path={library_path!r} does not exist")
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError as e:  # pragma: no cover - cuda-pathfinder is a dependency
        raise LookupError(f"library not found: cuda-pathfinder is not importable ({e})") from None
    try:
        # Loading (dlopen) without calling anything is safe even when sub-libraries are missing.
        loaded = load_nvidia_dynamic_lib("cudnn")
    except Exception as e:  # DynamicLibNotFoundError and friends
        raise LookupError(not_found_reason(e)) from None
    return loaded.abs_path, getattr(loaded, "found_via", None) or "cuda.pathfinder"


def not_found_reason(error):
    """The one-line reason for a failed ``load_nvidia_dynamic_lib("cudnn")``. cuda.pathfinder
    loads cuDNN's dependencies (cuBLASLt, ...) before cuDNN itself, so its error may name a
    dependency even where cuDNN is absent too: say which file is missing, and what for."""
    fix = "install dnnkit[cu12] (or [cu13]) or set dnn.library_path"
    m = re.search(r'Failure finding "([^"]+)"', str(error))
    missing = m.group(1) if m else None
    main = main_file()
    if main is None or missing is None or "cudnn" in missing.lower():
        return (f"library not found: no cuDNN 9 in pip wheels (nvidia-cudnn-cu12/cu13), conda "
                f"or system paths: {MAIN_NAME}, the library of dnnkit's cuDNN backend, is "
                f"missing; {fix}")
    return (f"library not loadable: {main} was found, but {missing}, a library cuDNN needs, "
            f"is missing from the wheels, conda and system paths; {fix}")


def main_file():
    """Where ``libcudnn.so.9`` is (a wheel's nvidia/cudnn/lib on sys.path, conda, the CUDA
    toolkit, LD_LIBRARY_PATH, or the system's linker cache), without loading it; None."""
    dirs = [os.path.join(p, "nvidia", "cudnn", "lib") for p in sys.path if p]
    dirs += [os.path.join(os.environ[v], sub) for v in ("CONDA_PREFIX", "CUDA_HOME", "CUDA_PATH")
             if os.environ.get(v) for sub in ("lib", "lib64")]
    dirs += os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    for d in filter(None, dirs):
        if os.path.isfile(os.path.join(d, MAIN_NAME)):
            return os.path.join(d, MAIN_NAME)
    # ctypes.util loads subprocess (7 ms): imported here, off `import dnnkit`
    import ctypes.util
    found = ctypes.util.find_library("cudnn")      # the linker cache: a name, not a path
    return found if found == MAIN_NAME else None


def status_name(lib, status):
    """The name of a cudnnStatus_t value: from ``enums``, else ``lib``'s cudnnGetErrorString."""
    name = STATUS_NAMES.get(status)
    if name is None:
        try:
            lib.cudnnGetErrorString.restype = ctypes.c_char_p
            lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
            name = lib.cudnnGetErrorString(status).decode()
        except Exception:  # pragma: no cover
            name = f"CUDNN_STATUS_{status}"
    return name


def _probe(library_path, device_ok, device_reason):
    try:
        path, via = _locate(library_path)
    except LookupError as e:
        return CudnnStatus(False, str(e))
    why = identity_problem(path, soname(path))
    if why:
        return CudnnStatus(False, why, path=path, found_via=via)
    folder = os.path.dirname(os.path.realpath(path) if os.path.islink(path) else path)
    missing = [s for s in SUBLIBRARIES if not os.path.exists(os.path.join(folder, s))
               and not os.path.exists(os.path.join(os.path.dirname(path), s))]
    if missing:
        return CudnnStatus(False, f"sub-library missing: {', '.join(missing)} not beside {path} "
                           "(cuDNN would abort the process on its first call)", path=path,
                           found_via=via)
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return CudnnStatus(False, f"library not loadable: {e}", path=path, found_via=via)
    if not hasattr(lib, "cudnnGetVersion"):   # a shared library without a soname
        return CudnnStatus(False, f"not a cuDNN library: {path} has no cudnnGetVersion",
                           path=path, found_via=via)
    # size_t cudnnGetVersion(void);
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    lib.cudnnGetVersion.argtypes = []
    version = int(lib.cudnnGetVersion())
    base = dict(version=version, path=path, found_via=via, lib=lib)
    why = version_problem(version)
    if why:
        return CudnnStatus(False, why, **base)
    # cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
    handle = ctypes.c_void_p()
    st = lib.cudnnCreate(ctypes.byref(handle))
    if st != STATUS_SUCCESS:
        name = status_name(lib, st)
        why = "no CUDA device" if name == "CUDNN_STATUS_NOT_INITIALIZED" else "cannot initialise"
        return CudnnStatus(False, f"{why} (cudnnCreate returned {name})", **base)
    # int cudnnDestroy(cudnnHandle_t handle);
    lib.cudnnDestroy(handle)
    if not device_ok:
        return CudnnStatus(False, device_reason, **base)
    return CudnnStatus(True, "", **base)


def _device_state():
    """(ok, reason): cuDNN needs real device memory, not Numba's simulator.

    With no device at all, cudnnCreate itself answers CUDNN_STATUS_NOT_INITIALIZED, which is
    the reason we report; this only catches a GPU machine that runs Numba on the simulator.
    """
    from numba.core import config as nconfig
    if nconfig.ENABLE_CUDASIM:
        return False, ("Numba runs on the CUDA simulator (NUMBA_ENABLE_CUDASIM=1): cuDNN needs "
                       "real device memory")
    from numba import cuda
    try:
        if cuda.is_available():
            cuda.current_context()  # cuDNN then shares Numba's primary context
    except Exception:
        pass
    return True, ""


def status(library_path=None):
    """The CudnnStatus for ``library_path`` (default: the ``dnn.library_path`` flag); cached."""
    if library_path is None:
        library_path = config.get("dnn.library_path")
    st = _cache.get(library_path)     # every cuDNN call asks: no lock once probed
    if st is not None:
        return st
    with _lock:
        st = _cache.get(library_path)
        if st is None:
            ok, why = _device_state()
            st = _cache[library_path] = _probe(library_path, ok, why)
        return st


def loaded_status():
    """The status if cuDNN was already probed for the current flag value, else None (no load)."""
    return _cache.get(config.get("dnn.library_path"))


def probed():
    """The probe results' dict: a new object after every ``clear_cache()`` (callers that keep
    what a probe gave compare it by identity)."""
    return _cache


def clear_cache():
    """Forget probe results (tests; a library once loaded stays mapped in the process)."""
    global _cache
    with _lock:
        _cache = {}
