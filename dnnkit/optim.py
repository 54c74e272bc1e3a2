"""Optimizers for dnnkit.nn: SGD and Adam with PyTorch's semantics, one multi-tensor kernel
launch per up to 12 parameters and step (kernels/optim.py).

    opt = Adam(model.parameters(), lr=1e-3)
    opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step()

Parameters (leaf Tensors, dnnkit.nn.Parameter) are updated in place (``p.data``) from
``p.grad`` (a Tensor; a device array is accepted too), and their version is bumped, so a graph
recorded before the step refuses to differentiate the old value. A parameter whose grad is
None is skipped (its step count does not advance, as in PyTorch). A step reads nothing back
from the device: the kernels are queued on the stream and ``step()`` returns.

State buffers (SGD's momentum, Adam's m and v) are flat device arrays in the accumulation
dtype (float32 for float16 and float32 parameters, float64 for float64), made (zeroed by a
memset) on a parameter's first step. ``state_dict()`` holds host NumPy copies, in PyTorch's
layout: {"state": {index: {...}}, "param_groups": [{hyper-parameters, "params": [indices]}]};
``load_state_dict`` checks every key before it changes anything.

The kernels (dnnkit.kernels) and numba are imported inside the functions that use them:
``import dnnkit`` must not pay for numba.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from . import arrays
from .autograd import no_grad
from .hints import Stream
from .launch import At, launch, pow2_at_most
from .tensors import Tensor


def _number(cls, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{cls}: {name} must be a real number; got {value!r}")
    return float(value)


def _at_least(cls, name, value, low=0.0):
    # written "not >=" so that NaN is refused too
    value = _number(cls, name, value)
    if not value >= low:
        raise ValueError(f"{cls}: invalid {name} {value} (must be >= {low})")
    return value


def _is_device(a):
    return arrays.is_device_array(a) or hasattr(a, "__cuda_array_interface__")


class Optimizer:
    """Base class: the parameter list, per-parameter state and hyper-parameters (``defaults``,
    read at every step, so ``opt.lr = ...`` between steps takes effect)."""

    def __init__(self, params: Iterable[Tensor], defaults: Mapping[str, Any]) -> None:
        cls = type(self).__name__
        if _is_device(params) or hasattr(params, "data"):
            raise TypeError(f"{cls}: params must be an iterable of Parameters; got a single "
                            f"{type(params).__name__}")
        try:
            self.params = list(params)
        except TypeError:
            raise TypeError(f"{cls}: params must be an iterable of Parameters; got "
                            f"{type(params).__name__}") from None
        if not self.params:
            raise ValueError(f"{cls}: got an empty parameter list")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError(f"{cls}: a parameter appears more than once (it would be "
                             f"updated twice per step)")
        for i, p in enumerate(self.params):
            if not _is_device(getattr(p, "data", None)):
                raise TypeError(f"{cls}: parameter {i} has no device array .data "
                                f"(got {type(p).__name__})")
            if getattr(p, "grad_fn", None) is not None:
                raise ValueError(f"{cls}: parameter {i} was made by an op (grad_fn "
                                 f"{p.grad_fn.op}); only leaf tensors can be optimized")
        self.defaults = dict(defaults)
        self.state = [{} for _ in self.params]
        self._flats = {}       # id(parameter) -> (its array, checked, flat view)

    # hyper-parameters ---------------------------------------------------------------

    @classmethod
    def _validate(cls, **hyper):
        """The hyper-parameters, checked and normalised (raises ValueError/TypeError)."""
        raise NotImplementedError

    @property
    def lr(self) -> float:
        return self.defaults["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self.defaults = self._validate(**dict(self.defaults, lr=value))

    # stepping -----------------------------------------------------------------------

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self, stream: Stream = None) -> None:
        """Update every parameter that has a gradient, in place, on ``stream`` (queued: the
        host does not wait for the GPU). Parameters of one dtype and state go together, up to
        ``kernels.optim.TENSORS`` per launch (multi-tensor kernels)."""
        from .kernels.optim import TENSORS
        s = arrays.as_stream(stream)
        op = f"{type(self).__name__}.step"
        groups, flats = {}, self._flats
        with no_grad():
            for i, (p, st) in enumerate(zip(self.params, self.state)):
                g = p.grad
                if g is None:
                    continue
                # the checks once per parameter array (a step runs every few ms: its host
                # time is a training step's); gradients are new arrays every step
                data, cached = p.data, flats.get(id(p))
                if cached is None or cached[0] is not data:
                    d = arrays.device_input(op, f"parameter {i}", data, s)
                    cached = flats[id(p)] = (data, d, At(d, 0))
                grad, d = g.data if hasattr(g, "grad_fn") else g, cached[1]
                # a gradient of the parameter's own array type, shape and dtype is a device
                # array already: the full checks only for anything else
                if type(grad) is not type(d) or grad.shape != d.shape or \
                        grad.dtype != d.dtype or not grad.is_c_contiguous():
                    grad = arrays.device_input(op, f"grad of parameter {i}", grad, s)
                    arrays.same_shape(op, f"parameter {i}", d, grad=grad)
                if d.size:
                    acc = arrays.acc_array(d.dtype)
                    key = (d.dtype.str, self._prepare(st, d.size, acc, s))
                    # At: the kernel reads the gradient as flat, without a Numba view of it
                    groups.setdefault(key, []).append((cached[2], At(grad, 0), st))
                if hasattr(p, "bump_version"):
                    p.bump_version()
            for (_, group), items in groups.items():
                acc = arrays.acc_array(items[0][0].dtype)
                for k in range(0, len(items), TENSORS):
                    self._update(items[k:k + TENSORS], group, s, acc)

    def _prepare(self, state, n, acc, stream):
        """Make parameter state (n elements) before its step; returns what must be equal for
        two parameters to step in one launch."""
        raise NotImplementedError

    def _update(self, items, group, stream, acc):
        """One step of up to TENSORS (flat parameter, flat gradient, state dict) ``items``
        whose ``_prepare`` returned ``group``."""
        raise NotImplementedError

    @staticmethod
    def _launch(kernel, items, stream, args):
        """``kernel`` over ``items``' parameters: grid row y steps parameter y; the tuples in
        ``args`` padded to TENSORS by repeating their last array (rows past len(items) do not
        exist). A small largest parameter (biases, BatchNorm scales) gets a block of its size
        rounded up to a warp: 8x fewer simulated threads than 256."""
        from .kernels.optim import TENSORS
        n = max(p.size for p, _, _ in items)
        blocks, threads = arrays.grid_1d(n, max(32, pow2_at_most(n, 256)))
        args = tuple(a + (a[-1],) * (TENSORS - len(a)) if type(a) is tuple else a
                     for a in args)
        launch(kernel, (blocks, len(items)), threads, stream, args)

    @staticmethod
    def _buffer(n, acc, stream, zero=True):
        """A state buffer: n elements of the accumulation dtype (zeros, by a memset on the
        stream, or uninitialised), from the caching pool like every dnnkit array (and so
        allowed in a CUDA graph's capture)."""
        buf = arrays.cuda_empty((n,), acc.dtype, stream)
        return arrays.zero_fill(buf, stream) if zero else buf

    # saving -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Host copies: buffers shaped like their parameter, step counts, hyper-parameters."""
        state = {}
        for i, (p, st) in enumerate(zip(self.params, self.state)):
            if st:
                state[i] = {k: (arrays.to_host(v).reshape(p.data.shape) if _is_device(v)
                                else v) for k, v in st.items()}
        group = dict(self.defaults, params=list(range(len(self.params))))
        return {"state": state, "param_groups": [group]}

    # the keys of one parameter's state, all present or none: {key: "buffer" | "count"}
    STATE_KEYS = {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (buffers are copied to the device).
        Everything is checked first: a malformed dict raises ValueError naming the key and
        leaves the optimizer as it was."""
        cls = type(self).__name__
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
        for k in self.defaults:
            if k not in group:
                raise ValueError(f"{where}: param_groups[0] has no {k!r} key")
        try:
            hyper = self._validate(**{k: group[k] for k in self.defaults})
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: param_groups[0]: {e}") from None
        params = group.get("params", ())
        if not isinstance(params, (list, tuple)) or len(params) != len(self.params):
            raise ValueError(f"{where}: param_groups[0]['params'] must list the "
                             f"{len(self.params)} parameters of this optimizer; got "
                             f"{params!r:.60}")
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: 'state' must be a dict {{parameter index: dict}}; got "
                             f"{type(saved).__name__}")
        for i in saved:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or \
                    not 0 <= i < len(self.params):
                raise ValueError(f"{where}: state key {i!r} is not a parameter index in "
                                 f"[0, {len(self.params)})")
        state = [self._load_one(where, i, saved.get(i, {})) for i in range(len(self.params))]
        self.defaults, self.state = hyper, state

    def _load_one(self, where, i, saved):
        from numba import cuda
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: state[{i}] must be a dict; got {type(saved).__name__}")
        p = self.params[i]
        acc = arrays.acc_dtype(p.data.dtype)
        for k in saved:
            if k not in self.STATE_KEYS:
                raise ValueError(f"{where}: state[{i}] has an unknown key {k!r} (a "
                                 f"{type(self).__name__} keeps {', '.join(self.STATE_KEYS)})")
        if saved and set(saved) != set(self.STATE_KEYS):
            missing = sorted(set(self.STATE_KEYS) - set(saved))
            raise ValueError(f"{where}: state[{i}] lacks {', '.join(map(repr, missing))}")
        out = {}
        for k, v in saved.items():
            if self.STATE_KEYS[k] == "count":
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
                        or v < 0:
                    raise ValueError(f"{where}: state[{i}][{k!r}] must be a count >= 0; got "
                                     f"{v!r}")
                out[k] = int(v)
                continue
            try:            # a ragged list: NumPy's own ValueError names nothing
                h = np.asarray(v) if not _is_device(v) else arrays.to_host(v)
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


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov momentum and L2
    weight decay, exactly as torch.optim.SGD (see kernels/optim.py: sgd_fwd_kernel)."""
    STATE_KEYS = {"momentum_buffer": "buffer"}

    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False,
                 dampening: float = 0.0) -> None:
        hyper = self._validate(lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=nesterov, dampening=dampening)
        super().__init__(params, hyper)

    @classmethod
    def _validate(cls, lr, momentum, weight_decay, nesterov, dampening):
        c = cls.__name__
        h = dict(lr=_at_least(c, "lr", lr), momentum=_at_least(c, "momentum", momentum),
                 weight_decay=_at_least(c, "weight_decay", weight_decay),
                 nesterov=bool(nesterov), dampening=_number(c, "dampening", dampening))
        if h["nesterov"] and (h["momentum"] <= 0 or h["dampening"] != 0):
            raise ValueError(f"{c}: nesterov needs momentum > 0 and dampening 0; got "
                             f"momentum={h['momentum']}, dampening={h['dampening']}")
        return h

    def _prepare(self, state, n, acc, stream):
        first = self.defaults["momentum"] != 0 and "momentum_buffer" not in state
        if first:
            # no zeros needed: the first step writes buf = g
            state["momentum_buffer"] = self._buffer(n, acc, stream, zero=False)
        return first

    def _update(self, items, first, stream, acc):
        from .kernels import sgd_fwd_kernel
        h, t = self.defaults, acc.dtype.type
        # with momentum 0 the kernel never touches buf: acc stands in for it
        bufs = tuple(st.get("momentum_buffer", acc) for _, _, st in items)
        self._launch(sgd_fwd_kernel, items, stream,
                     (tuple(p for p, _, _ in items), tuple(g for _, g, _ in items), bufs,
                      t(h["lr"]), t(h["momentum"]), t(1.0 - h["dampening"]),
                      t(h["weight_decay"]), int(first), int(h["nesterov"]), acc))


class Adam(Optimizer):
    """Adam (Kingma and Ba 2015) with L2 weight decay added to the gradient, exactly as
    torch.optim.Adam with amsgrad off (see kernels/optim.py: adam_fwd_kernel)."""
    STATE_KEYS = {"step": "count", "exp_avg": "buffer", "exp_avg_sq": "buffer"}

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, self._validate(lr=lr, betas=betas, eps=eps,
                                                weight_decay=weight_decay))

    @classmethod
    def _validate(cls, lr, betas, eps, weight_decay):
        c = cls.__name__
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise ValueError(f"{c}: betas must be a pair (beta1, beta2); got {betas!r}") from None
        for name, b in (("beta1", b1), ("beta2", b2)):
            b = _number(c, name, b)
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{c}: invalid {name} {b} (must be in [0, 1))")
        eps = _number(c, "eps", eps)
        if not eps > 0:
            raise ValueError(f"{c}: invalid eps {eps} (must be > 0)")
        return dict(lr=_at_least(c, "lr", lr), betas=(float(b1), float(b2)), eps=eps,
                    weight_decay=_at_least(c, "weight_decay", weight_decay))

    def _prepare(self, state, n, acc, stream):
        if "step" not in state:
            state.update(step=0, exp_avg=self._buffer(n, acc, stream),
                         exp_avg_sq=self._buffer(n, acc, stream))
        state["step"] += 1
        return state["step"]

    def _update(self, items, step, stream, acc):
        from .kernels import adam_fwd_kernel
        h, t = self.defaults, acc.dtype.type
        b1, b2 = h["betas"]
        # bias corrections on the host in float64: mhat = m / bc1, vhat = v / bc2
        bc1, bc2 = 1.0 - b1 ** step, 1.0 - b2 ** step
        self._launch(adam_fwd_kernel, items, stream,
                     (tuple(p for p, _, _ in items), tuple(g for _, g, _ in items),
                      tuple(st["exp_avg"] for _, _, st in items),
                      tuple(st["exp_avg_sq"] for _, _, st in items),
                      t(h["lr"] / bc1), t(b1), t(1.0 - b1), t(b2), t(1.0 - b2),
                      t(1.0 / math.sqrt(bc2)), t(h["eps"]), t(h["weight_decay"]), acc))


__all__ = ["Optimizer", "SGD", "Adam"]
