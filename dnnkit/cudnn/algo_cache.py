"""Process-wide memo of the convolution algorithms that cuDNN chose (``guess_*``/``time_*``).

A key (``make_key``) is a canonical JSON string of everything that can change cuDNN's answer:
direction, device (PCI address, name, compute capability), cuDNN version, shapes and strides,
padding, stride, dilation, groups, mode, data and compute dtypes, math type, determinism,
workspace limit (rounded down to a power of two) and the kind of choice (guess or time). Being
a string it is hashable, and it saves to JSON and reloads byte for byte.

``*_once`` choices stay for the life of the process (``get``/``put``). ``*_on_shape_change``
keeps only the last key and answer per (direction, kind) and forgets the old one when the key
changes (``lookup``/``store`` route by choice). ``save(path)`` writes the ``*_once`` entries and
``load(path)`` merges a file back, so a production process can start warm. Entries made on
another device or cuDNN version load harmlessly: their keys never match a lookup here.

The lock guards the dicts only; choosing (GPU work) happens outside it, so two threads that miss
at once may both choose, and the last ``put`` wins.

Numba is imported inside ``current_device``: ``import dnnkit`` must not load it; ``json`` is
imported where a key is made or a file read or written, which keeps it (3 ms) out of
``import dnnkit`` too.
"""

import os
import re
import threading

import numpy as np

from .. import fastpath, files
from .enums import CONV_BWD_DATA_ALGO, CONV_BWD_FILTER_ALGO, CONV_FWD_ALGO, MATH_NAMES

FORMAT = "dnnkit-cudnn-algo-cache"
FORMAT_VERSION = 1
CHOICES = ("guess_once", "guess_on_shape_change", "time_once", "time_on_shape_change")
ALGO_NAMES = {"fwd": CONV_FWD_ALGO, "bwd_data": CONV_BWD_DATA_ALGO,
              "bwd_filter": CONV_BWD_FILTER_ALGO}
KEY_FIELDS = ("direction", "kind", "device", "cudnn_version", "nd", "shapes", "strides",
              "padding", "stride", "dilation", "groups", "flip", "dtype", "compute_dtype",
              "math_type", "deterministic", "workspace_limit")

_lock = threading.Lock()
_once = {}      # key -> algorithm name
_latest = {}    # (direction, kind) -> (key, algorithm name)
_counts = {"hits": 0, "misses": 0}


def choice_kind(choice):
    """("guess" | "time", remembered forever?) for one of CHOICES."""
    if choice not in CHOICES:
        raise ValueError(f"algorithm choice must be one of {', '.join(CHOICES)}; got {choice!r}")
    kind, _, when = choice.partition("_")
    return kind, when == "once"


def current_device():
    """{"pci": "dddd:bb:dd", "name": ..., "cc": [major, minor]} of Numba's current device."""
    from numba import cuda
    dev = cuda.get_current_device()
    pci = "%04x:%02x:%02x" % tuple(int(getattr(dev, a, 0) or 0) for a in
                                   ("PCI_DOMAIN_ID", "PCI_BUS_ID", "PCI_DEVICE_ID"))
    name = getattr(dev, "name", "")
    name = name.decode() if isinstance(name, bytes) else str(name)
    cc = [int(v) for v in getattr(dev, "compute_capability", (0, 0))]
    return {"pci": pci, "name": name, "cc": cc}


def _ints(t):
    return [int(v) for v in t]


def _canonical(obj):
    import json
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def limit_bucket(limit):
    """The workspace limit rounded down to a power of two. An "auto" limit that follows the
    free memory would otherwise make a new key (and a new choice) on almost every call; the
    exact limit is still enforced when the remembered algorithm runs."""
    return None if limit is None else (1 << (int(limit).bit_length() - 1) if limit > 0 else 0)


def make_key(direction, choice, *, device, cudnn_version, nd, shapes, strides, padding, stride,
             dilation, groups, flip, dtype, compute_dtype, math_type, deterministic,
             workspace_limit):
    """The cache key (a canonical JSON string). ``shapes``/``strides``: one tuple per array
    (strides in elements); ``math_type``: the cudnnMathType_t value; ``workspace_limit``
    enters rounded down to a power of two."""
    if direction not in ALGO_NAMES:
        raise ValueError(f"direction must be one of {', '.join(ALGO_NAMES)}; got {direction!r}")
    fields = {
        "direction": direction, "kind": choice_kind(choice)[0],
        "device": {"pci": str(device["pci"]), "name": str(device["name"]),
                   "cc": _ints(device["cc"])},
        "cudnn_version": int(cudnn_version), "nd": int(nd),
        "shapes": [_ints(s) for s in shapes], "strides": [_ints(s) for s in strides],
        "padding": _ints(padding), "stride": _ints(stride), "dilation": _ints(dilation),
        "groups": int(groups), "flip": bool(flip), "dtype": np.dtype(dtype).name,
        "compute_dtype": np.dtype(compute_dtype).name,
        "math_type": MATH_NAMES.get(int(math_type), str(int(math_type))),
        "deterministic": bool(deterministic),
        "workspace_limit": limit_bucket(workspace_limit),
    }
    return _canonical(fields)


# a graph-API engine configuration (conv_graph): engine index and knob choices
ENGINE_NAME = re.compile(r"engine\d+(_k\d+=-?\d+)*")


def _check_name(direction, name):
    if name not in ALGO_NAMES[direction] and not (isinstance(name, str)
                                                  and ENGINE_NAME.fullmatch(name)):
        raise ValueError(f"{name!r} is not a cuDNN {direction} algorithm "
                         f"({', '.join(ALGO_NAMES[direction])}) nor a graph-API engine "
                         "configuration (engine<index>_k<knob>=<value>...)")


def get(key):
    """The remembered algorithm name for ``key`` (``*_once``), or None; counts hits/misses."""
    with _lock:
        name = _once.get(key)
        _counts["hits" if name is not None else "misses"] += 1
        return name


def hit():
    """Count a hit answered by a faster cache in front of this one (conv_graph's plans)."""
    with _lock:
        _counts["hits"] += 1


def put(key, name):
    with _lock:
        _once[key] = name


def lookup(choice, direction, key):
    """The remembered answer for ``key`` under ``choice``, or None."""
    kind, forever = choice_kind(choice)
    if forever:
        return get(key)
    with _lock:
        last = _latest.get((direction, kind))
        hit = last is not None and last[0] == key
        _counts["hits" if hit else "misses"] += 1
        return last[1] if hit else None


def store(choice, direction, key, name):
    _check_name(direction, name)
    kind, forever = choice_kind(choice)
    if forever:
        put(key, name)
    else:
        with _lock:
            _latest[(direction, kind)] = (key, name)  # the previous shape's answer is dropped


def clear():
    """Forget every entry and zero the counters."""
    with _lock:
        _once.clear()
        _latest.clear()
        _counts.update(hits=0, misses=0)
    fastpath.invalidate()     # memoised convolutions keep the plans they chose


def stats():
    with _lock:
        return dict(_counts, entries=len(_once), latest=len(_latest))


def save(path):
    """Write the ``*_once`` entries to ``path`` as JSON (sorted, so equal caches give equal
    files). The file is replaced whole or not at all (``dnnkit.files.atomic_open``): when the
    write fails (a full disk, ``path`` a folder) an OSError naming ``path`` is raised, the old
    file is kept and no temporary file is left."""
    with _lock:
        items = sorted(_once.items())
    import json
    # One entry a line: readable, and diffs between two saved caches stay small.
    rows = ",\n".join(json.dumps({"algo": v, "key": json.loads(k)}, sort_keys=True)
                      for k, v in items)
    head = json.dumps({"format": FORMAT, "version": FORMAT_VERSION})[:-1]
    files.write_text(path, f'{head}, "entries": [\n{rows}\n]}}\n')


def _parse(path, text):
    import json
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not a dnnkit algorithm cache (invalid JSON: {e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a dnnkit algorithm cache (JSON nested too deeply to "
                         "read)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a dnnkit algorithm cache (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: algorithm cache format version {doc.get('version')!r}; this "
                         f"dnnkit reads version {FORMAT_VERSION}")
    if not isinstance(doc.get("entries"), list):
        raise ValueError(f"{path}: not a dnnkit algorithm cache (\"entries\" is not a list)")
    out = {}
    for i, e in enumerate(doc["entries"]):
        try:
            key, name = e["key"], e["algo"]
            if sorted(key) != sorted(KEY_FIELDS):
                raise ValueError(f"key fields {sorted(key)} differ from {sorted(KEY_FIELDS)}")
            _check_name(key["direction"], name)
            out[_canonical(key)] = name
        except (TypeError, KeyError, ValueError, RecursionError) as err:
            why = "nested too deeply" if isinstance(err, RecursionError) else err
            raise ValueError(f"{path}: entry {i} is malformed ({why})") from None
    return out


def load(path):
    """Merge the entries of a file written by ``save``; entries already in memory are kept.
    Raises ValueError naming ``path`` when it is not a cache of this format version (binary,
    not UTF-8, not JSON, nested too deeply, another format or version, a malformed entry),
    OSError when it cannot be read; either way before anything is merged. Returns the number
    of entries read."""
    path = os.fspath(path)
    entries = _parse(path, files.read_text(path, "algorithm cache"))
    with _lock:
        for k, v in entries.items():
            _once.setdefault(k, v)
    return len(entries)
