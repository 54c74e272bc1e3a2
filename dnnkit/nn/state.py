"""State dicts in and out: the checks of ``load_state_dict`` and the .npz files of
``Module.save`` / ``Module.load``.

A save goes through ``files.atomic_open`` (a temporary file beside the target, flushed,
fsynced and renamed over it): a failed write -- a full disk, a file-size limit -- leaves the
previous file whole. A load reads every array of the file first (no pickles: ``allow_pickle``
is off), and every damage -- an empty, truncated or foreign file, an object or string array --
becomes a ValueError naming the file (and the key), before the module is touched.
"""

import collections.abc
import os

import numpy as np

from .. import arrays
from ..files import atomic_open


def npz_path(path):
    """``path`` with the ``.npz`` suffix NumPy's ``savez`` gives a name without one."""
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    return p if p.endswith(".npz") else p + ".npz"


def save(state, path):
    """Write ``state`` ({name: host array}) to ``npz_path(path)`` atomically; returns the
    path written."""
    p = npz_path(path)
    with atomic_open(p, "wb") as f:
        np.savez(f, **state)
    return p


def load(cls, path):
    """(the path read, {key: host array}) of an .npz file written by :func:`save`:
    ``npz_path(path)``, or ``path`` as given when only that exists. ValueError naming the file
    (and the key) for anything that is not such a file; FileNotFoundError when neither
    exists."""
    raw = os.fsdecode(os.fspath(path))
    p = npz_path(raw)
    if not os.path.exists(p) and os.path.exists(raw):
        p = raw
    if os.path.isdir(p):
        raise IsADirectoryError(21, f"{cls}.load: is a folder, not a saved module", p)
    try:
        f = np.load(p, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(2, f"{cls}.load: no such file (nor {raw!r})", p) from None
    except PermissionError:
        raise
    except Exception as e:          # EOFError, BadZipFile, UnpicklingError, ValueError, ...
        raise ValueError(f"{cls}.load: {p} is not a saved module (.npz): "
                         f"{type(e).__name__}: {e}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{cls}.load: {p} holds a single array (.npy), not a saved module "
                         f"(.npz of named arrays)")
    out = {}
    with f:
        try:
            keys = list(f.files)
        except Exception as e:
            raise ValueError(f"{cls}.load: {p} is damaged: {type(e).__name__}: {e}") from None
        for k in keys:
            try:
                out[k] = f[k]
            except Exception as e:
                raise ValueError(f"{cls}.load: {p}, key {k!r}: cannot be read "
                                 f"({type(e).__name__}: {e})") from None
    return p, out


def _host(cls, key, value):
    """``value`` (a NumPy array, a number, a device array or a Tensor) as a host array."""
    if hasattr(value, "grad_fn") and hasattr(value, "data"):      # a Tensor
        value = value.data
    if arrays.is_device_array(value):
        return value.copy_to_host()
    if hasattr(value, "__cuda_array_interface__"):
        from ..device import numba_cuda
        return numba_cuda().as_cuda_array(value).copy_to_host()
    try:
        return np.asarray(value)
    except Exception as e:
        raise ValueError(f"{cls}.load_state_dict: {key} is not an array "
                         f"({type(value).__name__}: {e})") from None


def check_state(cls, slots, state, strict):
    """[(slot, host array to write)] for every key of ``state`` the model has, after checking
    all of them: missing and unexpected keys (``strict``), shapes, dtypes. Raises ValueError
    (TypeError for a ``state`` that is not a mapping) naming the key; writes nothing."""
    if not isinstance(state, collections.abc.Mapping):
        raise TypeError(f"{cls}.load_state_dict: state must be a mapping of names to arrays; "
                        f"got {type(state).__name__}")
    missing = sorted(set(slots) - set(state))
    extra = sorted(str(k) for k in set(state) - set(slots))
    if strict and (missing or extra):
        raise ValueError(f"{cls}.load_state_dict: missing keys {missing}, unexpected keys "
                         f"{extra}")
    writes = []
    for key, slot in slots.items():
        if key not in state:
            continue
        h = _host(cls, key, state[key])
        want = np.dtype(slot.dtype)
        if want.kind == "f":
            ok = h.dtype.kind in "fiu"
        else:
            ok = h.dtype.kind in "iu"
        if not ok:
            raise ValueError(f"{cls}.load_state_dict: {key} has dtype {h.dtype}; the module "
                             f"holds {want} (a {'real' if want.kind == 'f' else 'integer'} "
                             f"array is needed)")
        if tuple(h.shape) != tuple(slot.shape):
            raise ValueError(f"{cls}.load_state_dict: {key} has shape {tuple(h.shape)}, the "
                             f"module's is {tuple(slot.shape)}")
        writes.append((slot, h.astype(want, copy=False)))
    return writes
