"""Loading an optimizer's state (dnnkit/optim.py's ``load_state_dict``): PyTorch's layout
{"state": {index: {...}}, "param_groups": [{hyper-parameters, "params": [indices]}]}, checked
whole before anything changes."""

import numpy as np

from . import arrays


def is_device(a):
    """Whether ``a`` is a device array (Numba's, or any with ``__cuda_array_interface__``)."""
    return arrays.is_device_array(a) or hasattr(a, "__cuda_array_interface__")


def loaded_state(opt, d, validate):
    """(hyper-parameters, per-parameter state) of optimizer ``opt`` from what its
    ``state_dict()`` returned, every key checked before anything is made (a malformed dict
    raises ValueError naming the key); ``validate(**hyper)``: the class's hyper-parameter
    checks. Buffers are copied to the device."""
    cls = type(opt).__name__
    where = f"{cls}.load_state_dict"
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a dict with 'state' and 'param_groups'; got "
                         f"{type(d).__name__}")
    for key in ("state", "param_groups"):
        if key not in d:
            raise ValueError(f"{where}: the dict has no {key!r} key")
    groups, saved = d["param_groups"], d["state"]
    if not isinstance(groups, (list, tuple)) or len(groups) != 1 or \
            not isinstance(groups[0], dict):
        raise ValueError(f"{where}: 'param_groups' must be a list of one dict; got "
                         f"{groups!r:.80}")
    group = groups[0]
    for k in opt.defaults:
        if k not in group:
            raise ValueError(f"{where}: param_groups[0] has no {k!r} key")
    try:
        hyper = validate(**{k: group[k] for k in opt.defaults})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: param_groups[0]: {e}") from None
    params = group.get("params", ())
    if not isinstance(params, (list, tuple)) or len(params) != len(opt.params):
        raise ValueError(f"{where}: param_groups[0]['params'] must list the "
                         f"{len(opt.params)} parameters of this optimizer; got "
                         f"{params!r:.60}")
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: 'state' must be a dict {{parameter index: dict}}; got "
                         f"{type(saved).__name__}")
    for i in saved:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or \
                not 0 <= i < len(opt.params):
            raise ValueError(f"{where}: state key {i!r} is not a parameter index in "
                             f"[0, {len(opt.params)})")
    return hyper, [_load_one(opt, where, i, saved.get(i, {}))
                   for i in range(len(opt.params))]


def _load_one(opt, where, i, saved):
    from numba import cuda
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: state[{i}] must be a dict; got {type(saved).__name__}")
    p = opt.params[i]
    acc = arrays.acc_dtype(p.data.dtype)
    for k in saved:
        if k not in opt.STATE_KEYS:
            raise ValueError(f"{where}: state[{i}] has an unknown key {k!r} (a "
                             f"{type(opt).__name__} keeps {', '.join(opt.STATE_KEYS)})")
    if saved and set(saved) != set(opt.STATE_KEYS):
        missing = sorted(set(opt.STATE_KEYS) - set(saved))
        raise ValueError(f"{where}: state[{i}] lacks {', '.join(map(repr, missing))}")
    out = {}
    for k, v in saved.items():
        if opt.STATE_KEYS[k] == "count":
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
                    or v < 0:
                raise ValueError(f"{where}: state[{i}][{k!r}] must be a count >= 0; got "
                                 f"{v!r}")
            out[k] = int(v)
            continue
        try:            # a ragged list: NumPy's own ValueError names nothing
            h = np.asarray(v) if not is_device(v) else arrays.to_host(v)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: state[{i}][{k!r}] is not an array: {e}") from None
        if h.dtype.kind not in "fiu":
            raise ValueError(f"{where}: state[{i}][{k!r}] must be a real array; got dtype "
                             f"{h.dtype}")
        if tuple(h.shape) != tuple(p.data.shape):
            raise ValueError(f"{where}: state[{i}][{k!r}] has shape {h.shape}, the "
                             f"parameter {tuple(p.data.shape)}")
        out[k] = h
    return {k: (cuda.to_device(arrays.host_contiguous(v.astype(acc, copy=False))
                               .reshape(-1)) if isinstance(v, np.ndarray) else v)
            for k, v in out.items()}


__all__ = ["loaded_state", "is_device"]
