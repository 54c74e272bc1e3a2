"""Optimizers for dnnkit.nn: SGD and Adam with PyTorch's semantics, one fused kernel per
parameter and step (kernels/optim.py).

    opt = Adam(model.parameters(), lr=1e-3)
    opt.zero_grad(); model.backward(loss.backward()); opt.step()

Parameters are updated in place (``p.data``) from ``p.grad``; a parameter whose grad is None is
skipped (its step count does not advance, as in PyTorch). State buffers (SGD's momentum, Adam's
m and v) are flat device arrays in the accumulation dtype (float32 for float16 and float32
parameters, float64 for float64), made on a parameter's first step. ``state_dict()`` holds host
NumPy copies, in PyTorch's layout: {"state": {index: {...}}, "param_groups": [{hyper-parameters,
"params": [indices]}]}.

The kernels (dnnkit.kernels) and numba are imported inside the functions that use them:
``import dnnkit`` must not pay for numba.
"""

import math
import numbers

import numpy as np

from . import arrays
from .launch import launch


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

    def __init__(self, params, defaults):
        cls = type(self).__name__
        if _is_device(params) or hasattr(params, "data"):
            raise TypeError(f"{cls}: params must be an iterable of Parameters; got a single "
                            f"{type(params).__name__}")
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{cls}: got an empty parameter list")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError(f"{cls}: a parameter appears more than once (it would be "
                             f"updated twice per step)")
        for i, p in enumerate(self.params):
            if not _is_device(getattr(p, "data", None)):
                raise TypeError(f"{cls}: parameter {i} has no device array .data "
                                f"(got {type(p).__name__})")
        self.defaults = dict(defaults)
        self.state = [{} for _ in self.params]

    # hyper-parameters ---------------------------------------------------------------

    @classmethod
    def _validate(cls, **hyper):
        """The hyper-parameters, checked and normalised (raises ValueError/TypeError)."""
        raise NotImplementedError

    @property
    def lr(self):
        return self.defaults["lr"]

    @lr.setter
    def lr(self, value):
        self.defaults = self._validate(**dict(self.defaults, lr=value))

    # stepping -----------------------------------------------------------------------

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self, stream=None):
        """Update every parameter that has a gradient, on ``stream``."""
        s = arrays.as_stream(stream)
        op = f"{type(self).__name__}.step"
        for i, (p, st) in enumerate(zip(self.params, self.state)):
            if p.grad is None:
                continue
            data = arrays.device_input(op, f"parameter {i}", p.data, s)
            grad = arrays.device_input(op, f"grad of parameter {i}", p.grad, s)
            arrays.same_shape(op, f"parameter {i}", data, grad=grad)
            if data.size:
                self._update(arrays.flat(data), arrays.flat(grad), st, s,
                             arrays.acc_array(data.dtype))

    def _update(self, p, g, state, stream, acc):
        """One step of flat parameter ``p`` with gradient ``g``; ``state``: its dict."""
        raise NotImplementedError

    @staticmethod
    def _launch(kernel, n, stream, args):
        blocks, threads = arrays.grid_1d(n)
        launch(kernel, blocks, threads, stream, args)

    @staticmethod
    def _buffer(n, acc, stream, zero=True):
        """A state buffer: n elements of the accumulation dtype (zeros, or uninitialised)."""
        from numba import cuda
        if not zero:
            return cuda.device_array(n, acc.dtype, stream=stream)
        return cuda.to_device(np.zeros(n, acc.dtype), stream=stream)

    # saving -------------------------------------------------------------------------

    def state_dict(self):
        """Host copies: buffers shaped like their parameter, step counts, hyper-parameters."""
        state = {}
        for i, (p, st) in enumerate(zip(self.params, self.state)):
            if st:
                state[i] = {k: (arrays.to_host(v).reshape(p.data.shape) if _is_device(v)
                                else v) for k, v in st.items()}
        group = dict(self.defaults, params=list(range(len(self.params))))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, d):
        """Restore what :meth:`state_dict` returned (buffers are copied to the device)."""
        cls = type(self).__name__
        try:
            (group,) = d["param_groups"]
            hyper = {k: group[k] for k in self.defaults}
            saved = d["state"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{cls}.load_state_dict: not a {cls} state dict") from None
        if len(group.get("params", ())) != len(self.params):
            raise ValueError(f"{cls}.load_state_dict: {len(group.get('params', ()))} "
                             f"parameters saved, this optimizer has {len(self.params)}")
        hyper = self._validate(**hyper)
        state = [self._load_one(i, saved.get(i, {})) for i in range(len(self.params))]
        self.defaults, self.state = hyper, state

    def _load_one(self, i, saved):
        from numba import cuda
        p = self.params[i]
        acc = arrays.acc_dtype(p.data.dtype)
        out = {}
        for k, v in saved.items():
            if isinstance(v, np.ndarray):
                if tuple(v.shape) != tuple(p.data.shape):
                    raise ValueError(f"{type(self).__name__}.load_state_dict: {k} of parameter "
                                     f"{i} has shape {v.shape}, the parameter {p.data.shape}")
                v = cuda.to_device(arrays.host_contiguous(v.astype(acc, copy=False)).reshape(-1))
            out[k] = v
        return out


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov momentum and L2
    weight decay, exactly as torch.optim.SGD (see kernels/optim.py: sgd_fwd_kernel)."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, nesterov=False,
                 dampening=0.0):
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

    def _update(self, p, g, state, stream, acc):
        from .kernels import sgd_fwd_kernel
        h, t = self.defaults, acc.dtype.type
        buf = state.get("momentum_buffer")
        first = buf is None
        if h["momentum"] != 0 and first:
            # no zeros needed: the first step writes buf = g
            buf = state["momentum_buffer"] = self._buffer(p.size, acc, stream, zero=False)
        # with momentum 0 the kernel never touches buf: acc stands in for it
        self._launch(sgd_fwd_kernel, p.size, stream,
                     (p, g, acc if buf is None else buf, t(h["lr"]), t(h["momentum"]),
                      t(1.0 - h["dampening"]), t(h["weight_decay"]), int(first),
                      int(h["nesterov"]), acc))


class Adam(Optimizer):
    """Adam (Kingma and Ba 2015) with L2 weight decay added to the gradient, exactly as
    torch.optim.Adam with amsgrad off (see kernels/optim.py: adam_fwd_kernel)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
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

    def _update(self, p, g, state, stream, acc):
        from .kernels import adam_fwd_kernel
        h, t = self.defaults, acc.dtype.type
        if "step" not in state:
            state.update(step=0, exp_avg=self._buffer(p.size, acc, stream),
                         exp_avg_sq=self._buffer(p.size, acc, stream))
        state["step"] += 1
        b1, b2 = h["betas"]
        # bias corrections on the host in float64: mhat = m / bc1, vhat = v / bc2
        bc1, bc2 = 1.0 - b1 ** state["step"], 1.0 - b2 ** state["step"]
        self._launch(adam_fwd_kernel, p.size, stream,
                     (p, g, state["exp_avg"], state["exp_avg_sq"], t(h["lr"] / bc1), t(b1),
                      t(1.0 - b1), t(b2), t(1.0 - b2), t(1.0 / math.sqrt(bc2)), t(h["eps"]),
                      t(h["weight_decay"]), acc))


__all__ = ["Optimizer", "SGD", "Adam"]
