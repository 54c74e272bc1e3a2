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


from . import arrays
from .autograd import no_grad
from .hints import Stream
from .device import simulator
from .launch import At, Prepared, pow2_at_most
from .optim_state import is_device as _is_device, loaded_state
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


class _Plan:
    """A step's packed launches (``Optimizer.step``): ``structure`` what they depend on besides
    the arrays (None: not reusable), ``entries`` per parameter with a gradient, in order:
    (index, its array, the gradient's array type, shape, dtype, its launch, its place there,
    ((state key, buffer), ...), its state dict), ``launches`` [(launch.Prepared, group, its
    parameters' state dicts, the accumulation type)], ``params`` whose version a step
    bumps."""
    __slots__ = ("structure", "entries", "launches", "params")

    def __init__(self, structure, entries, launches, params):
        self.structure, self.entries, self.launches, self.params = \
            structure, entries, launches, params


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
        self._plan = None      # the packed launches of the last step (``step``)

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
        ``kernels.optim.TENSORS`` per launch (multi-tensor kernels).

        The launches are packed once (``launch.Prepared``) and kept while the step's shape
        stays: the same parameters with gradients, the same parameter arrays and state
        buffers, gradients of the same array type, shape and dtype (C-contiguous). Then a step
        costs a check and a pointer write per parameter, its scalars and the launches; any
        change takes the full path, which checks everything and packs the launches anew."""
        s = arrays.as_stream(stream)
        plan = self._plan
        if plan is not None and self._reuse(plan):
            self._advance(plan)
        else:
            with no_grad():
                plan = self._plan = self._build(s)
        for pl, group, states, t in plan.launches:
            self._scalars(pl, group, states, t)
            pl(s)
        for p in plan.params:
            p.bump_version()

    @property
    def launches_per_step(self) -> int:
        """Kernel launches of the last step (0 before the first)."""
        return 0 if self._plan is None else len(self._plan.launches)

    def _reuse(self, plan):
        """Whether ``plan`` serves this step; on the way, each gradient's address is packed
        into its launch (a plan that fails is rebuilt whole, so a partial update is moot)."""
        if self._structure() != plan.structure:
            return False
        params, k = self.params, 0
        for i, p in enumerate(params):
            g = p.grad
            if g is None:
                continue
            if k == len(plan.entries):
                return False
            e = plan.entries[k]
            k += 1
            if e[0] != i or p.data is not e[1]:
                return False
            a = g.data if isinstance(g, Tensor) else g
            if type(a) is not e[2] or a.shape != e[3] or a.dtype != e[4] or \
                    not a.is_c_contiguous():
                return False
            st = self.state[i]
            if st is not e[8]:
                return False
            for key, buf in e[7]:
                if st.get(key) is not buf:
                    return False
            e[5].set_flat(e[6], a)
        return k == len(plan.entries)

    def _build(self, s):
        """The full path: every parameter and gradient checked, state made, launches packed."""
        from .kernels.optim import TENSORS
        op = f"{type(self).__name__}.step"
        groups, flats, entries, checked = {}, self._flats, [], []
        for i, (p, st) in enumerate(zip(self.params, self.state)):
            g = p.grad
            if g is None:
                continue
            # the checks once per parameter array; gradients are new arrays every step
            data, cached = p.data, flats.get(id(p))
            if cached is None or cached[0] is not data:
                d = arrays.device_input(op, f"parameter {i}", data, s)
                cached = flats[id(p)] = (data, d, At(d, 0))
            grad, d = g.data if isinstance(g, Tensor) else g, cached[1]
            # a gradient of the parameter's own array type, shape and dtype is a device
            # array already: the full checks only for anything else
            plain = type(grad) is type(d) and grad.shape == d.shape and \
                grad.dtype == d.dtype and grad.is_c_contiguous()
            if not plain:
                grad = arrays.device_input(op, f"grad of parameter {i}", grad, s)
                arrays.same_shape(op, f"parameter {i}", d, grad=grad)
            if d.size:
                # At: the kernel reads the gradient as flat, without a Numba view of it
                checked.append((cached[2], At(grad, 0), st, i, p, plain))
        # state only once every gradient passed its checks: a refused step changes nothing
        for item in checked:
            flat, st = item[0], item[2]
            acc = arrays.acc_array(flat.dtype)
            groups.setdefault((flat.dtype.str, self._prepare(st, flat.size, acc, s)),
                              []).append(item)
        launches = []
        params = [p for p in self.params if p.grad is not None and hasattr(p, "bump_version")]
        for (_, group), items in groups.items():
            acc = arrays.acc_array(items[0][0].dtype)
            for k in range(0, len(items), TENSORS):
                part = items[k:k + TENSORS]
                pl = self._launch(part, group, acc)
                launches.append((pl, group, [st for _, _, st, *_ in part], acc.dtype.type))
                for j, (flat, grad, st, i, p, plain) in enumerate(part):
                    if plain:       # a gradient later steps may swap in place (_reuse)
                        bufs = tuple((key, st[key]) for key in self.STATE_KEYS
                                     if self.STATE_KEYS[key] == "buffer" and key in st)
                        entries.append((i, p.data, type(grad.base), grad.base.shape,
                                        grad.base.dtype, pl, (1, j), bufs, st))
        # only a plan whose every gradient can be swapped in place is kept for reuse
        reusable = len(entries) == sum(1 for p in self.params if p.grad is not None) and \
            all(self._lasting(group) for _, group in groups)
        entries.sort(key=lambda e: e[0])
        return _Plan(self._structure() if reusable else None, entries, launches, params)

    def _structure(self):
        """What a kept plan depends on besides its arrays (``_reuse``)."""
        return ()

    def _lasting(self, group):
        """Whether a launch of ``group`` may be repeated by later steps (``_reuse``)."""
        return True

    def _advance(self, plan):
        """A kept plan's step: advance what ``_prepare`` advances on the full path."""

    def _prepare(self, state, n, acc, stream):
        """Make parameter state (n elements) before its step; returns what must be equal for
        two parameters to step in one launch."""
        raise NotImplementedError

    def _launch(self, items, group, acc):
        """The ``launch.Prepared`` of one step of up to TENSORS (flat parameter, flat
        gradient, state dict, ...) ``items`` whose ``_prepare`` returned ``group``."""
        raise NotImplementedError

    def _scalars(self, pl, group, states, t):
        """Pack this step's scalars (hyper-parameters, step counts; of NumPy type ``t``, the
        accumulation type) into launch ``pl`` (its parameters' ``states``)."""
        raise NotImplementedError

    @staticmethod
    def _grid(kernel, items, args, acc):
        """``launch.Prepared`` of ``kernel`` over ``items``' parameters (kernels/optim.py's
        mapping): each tensor a run of blocks of ``per * threads`` elements; the tuples in
        ``args`` padded to TENSORS by repeating their last array. A small largest parameter
        (biases, BatchNorm scales) gets a block of its size rounded up to a warp: 8x fewer
        simulated threads than 256. ``args``: (tuples of arrays..., scalars...); ends and per
        go after the tuples, acc last."""
        from .kernels.optim import TENSORS
        threads = max(32, pow2_at_most(max(p.size for p, *_ in items), 256))
        per = 1 if simulator() else 4
        ends, total = [], 0
        for p, *_ in items:
            total += -(-p.size // (threads * per))
            ends.append(total)
        ends += [total] * (TENSORS - len(ends))
        # the gradients padded with the last parameter, the rest with their own last array: a
        # padded place is never read, and a gradient kept there would outlive its step
        tuples = [a + ((args[0] if k == 1 else a)[-1],) * (TENSORS - len(a))
                  for k, a in enumerate(args) if type(a) is tuple]
        scalars = [a for a in args if type(a) is not tuple]
        return Prepared(kernel, total, threads, (*tuples, tuple(ends), per, *scalars, acc),
                        transient=[(1, j) for j in range(len(items))])

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
        hyper, state = loaded_state(self, d, self._validate)
        self.defaults, self.state, self._plan = hyper, state, None


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

    def _structure(self):
        # momentum 0 has no buffers
        return (self.defaults["momentum"] != 0,)

    def _lasting(self, first):
        return not first         # a first step (buf = g) happens once

    def _launch(self, items, first, acc):
        from .kernels import sgd_fwd_kernel
        # with momentum 0 the kernel never touches buf: acc stands in for it
        bufs = tuple(st.get("momentum_buffer", acc) for _, _, st, *_ in items)
        h, t = self.defaults, acc.dtype.type
        return self._grid(sgd_fwd_kernel, items,
                          (tuple(p for p, *_ in items), tuple(g for _, g, *_ in items), bufs,
                           t(h["lr"]), t(h["momentum"]), t(1.0 - h["dampening"]),
                           t(h["weight_decay"]), int(first), int(h["nesterov"])), acc)

    def _scalars(self, pl, first, states, t):
        h = self.defaults
        for k, v in enumerate((t(h["lr"]), t(h["momentum"]), t(1.0 - h["dampening"]),
                               t(h["weight_decay"]), int(first), int(h["nesterov"]))):
            if pl.args[5 + k] != v:
                pl.set(5 + k, v)


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

    def _launch(self, items, step, acc):
        from .kernels import adam_fwd_kernel
        t = acc.dtype.type
        return self._grid(adam_fwd_kernel, items,
                          (tuple(p for p, *_ in items), tuple(g for _, g, *_ in items),
                           tuple(st["exp_avg"] for _, _, st, *_ in items),
                           tuple(st["exp_avg_sq"] for _, _, st, *_ in items))
                          + (t(0.0),) * 8, acc)

    def _advance(self, plan):
        # a kept plan's parameters stepped together since it was packed: one count each
        for _, _, states, _ in plan.launches:
            for st in states:
                st["step"] += 1

    def _scalars(self, pl, _, states, t):
        step, h = states[0]["step"], self.defaults
        b1, b2 = h["betas"]
        # bias corrections on the host in float64: mhat = m / bc1, vhat = v / bc2
        bc1, bc2 = 1.0 - b1 ** step, 1.0 - b2 ** step
        for k, v in enumerate((t(h["lr"] / bc1), t(b1), t(1.0 - b1), t(b2), t(1.0 - b2),
                               t(1.0 / math.sqrt(bc2)), t(h["eps"]), t(h["weight_decay"]))):
            if pl.args[6 + k] != v:
                pl.set(6 + k, v)


__all__ = ["Optimizer", "SGD", "Adam"]
