"""Theano's old flag names and values, kept as spellings of dnnkit's flags (dnnkit/config.py).

A Theano user's rc file or ``THEANO_FLAGS`` habits keep working: an old name sets the new
flags it stands for, from Python, ``DNNKIT_FLAGS`` and the rc file alike, with a
DeprecationWarning that names what to write instead. An old name can be set, not read.

    dnn.conv.algo_bwd      -> dnn.conv.algo_bwd_data and dnn.conv.algo_bwd_filter (one value)
    dnn.conv.workmem       -> dnn.conv.algo_fwd              (Theano 0.7)
    dnn.conv.workmem_bwd   -> both backward flags            (Theano 0.7)
    dnn.base_path          -> dnn.library_path = <base>/lib64, or <base>/lib where only it exists
    dnn.bin_path           -> dnn.library_path (Theano: the folder cuDNN loads from)
    dnn.include_path       -> nothing (dnnkit compiles nothing against cuDNN's headers)
    dnn.conv.algo_bwd_data = small -> none

This module only renames; config parses the values it hands back.
"""

import contextlib
import os
import sys
import warnings


def path_value(name, value):
    """A path flag's value: a str or os.PathLike, stripped; None is ''."""
    if value is None:
        return ""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"flag {name}: bad value {value!r}; allowed: a file or folder path, or ''")
    return os.fspath(value).strip()


def library_folder(root):
    """Theano's ``dnn.base_path`` is cuDNN's install root: the library is in its lib64 (Theano's
    rule on Linux; the CUDA toolkit's layout), else in its lib where only that exists (NVIDIA's
    cuDNN archives, conda). '' stays '' (search the usual places)."""
    root = path_value("dnn.base_path", root)
    if not root:
        return ""
    lib64, lib = os.path.join(root, "lib64"), os.path.join(root, "lib")
    return lib if os.path.isdir(lib) and not os.path.isdir(lib64) else lib64


def _no_effect(value):
    path_value("dnn.include_path", value)      # still a path: a list or a number is an error
    return {}


_BWD = ("dnn.conv.algo_bwd_data", "dnn.conv.algo_bwd_filter")

# old name -> (value -> {new flag: value}, the flags to read instead, what it was). Theano split
# algo_bwd in two (0.8) and called its 0.7 algorithm flags workmem; its base_path, include_path
# and bin_path located cuDNN to compile against it, which dnnkit never does.
OLD_NAMES = {
    "dnn.conv.algo_bwd": (lambda v: dict.fromkeys(_BWD, v), _BWD,
                          "Theano's one flag for both backward directions"),
    "dnn.conv.workmem": (lambda v: {"dnn.conv.algo_fwd": v}, ("dnn.conv.algo_fwd",),
                         "Theano 0.7's forward algorithm flag"),
    "dnn.conv.workmem_bwd": (lambda v: dict.fromkeys(_BWD, v), _BWD,
                             "Theano 0.7's backward algorithm flag"),
    "dnn.base_path": (lambda v: {"dnn.library_path": library_folder(v)}, ("dnn.library_path",),
                      "Theano's cuDNN install root"),
    "dnn.bin_path": (lambda v: {"dnn.library_path": v}, ("dnn.library_path",),
                     "Theano's folder that cuDNN loads from"),
    "dnn.include_path": (_no_effect, (), "Theano's cuDNN header folder; dnnkit compiles "
                         "nothing against cuDNN, and dnn.library_path chooses the library"),
}

# old values, per flag: the forward and filter-gradient "small" (an algorithm with a small
# workspace) has no data-gradient counterpart; ALGO_0 ("none") needs no workspace at all
OLD_VALUES = {"dnn.conv.algo_bwd_data": {"small": "none"}}


def rename(name, value):
    """``(raw, notes, old)``: the {flag: unparsed value} that setting ``name`` to ``value``
    means, the deprecation notes for it, and whether ``name`` is an old name."""
    entry = OLD_NAMES.get(name) if isinstance(name, str) else None
    raw = {name: value} if entry is None else entry[0](value)
    notes = []
    for k, v in raw.items():
        new = OLD_VALUES.get(k, {}).get(str(v).strip().lower())
        if new is not None:
            if entry is None:
                notes.append(f"flag {k}: value {v!r} is deprecated (cuDNN has no "
                             f"small-workspace data-gradient algorithm); write {k} = {new}")
            raw[k] = new
    if entry is not None:
        sets = ", ".join(f"{k} = {v}" for k, v in raw.items())
        notes.append(f"flag {name} is deprecated ({entry[2]}); "
                     + (f"write {sets}" if sets else "it has no effect"))
    return raw, notes, entry is not None


# dnnkit's frames, and the standard library's between a user's line and config
_SKIP = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
         os.path.abspath(contextlib.__file__), "<frozen importlib")


def warn(text):
    """A DeprecationWarning attributed to the first line outside dnnkit (the assignment, or the
    flag read that loaded DNNKIT_FLAGS or the rc file): Python's default filters then show it
    for a script's own code, as they show one that the script's own call raised."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    if f is None:
        warnings.warn(text, DeprecationWarning, stacklevel=2)
        return
    g = f.f_globals
    warnings.warn_explicit(text, DeprecationWarning, f.f_code.co_filename, f.f_lineno,
                           module=g.get("__name__", "__main__"),
                           registry=g.setdefault("__warningregistry__", {}))
