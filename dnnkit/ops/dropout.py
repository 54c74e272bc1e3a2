"""Dropout, forward and backward.

    y  = x  * mask / (1 - p)        mask[i] = 1 with probability 1 - p, else 0
    dx = dy * mask / (1 - p)        (the same mask)

``dropout(x, p, seed=None)`` returns ``(y, state)``; ``dropout_backward(dy, state)`` applies the
forward's mask to dy on the backend that made it. ``p`` is in [0, 1): p == 0 keeps everything
(y is a copy of x, the mask all ones); p == 1 is rejected, since it would drop every element and
the rescaling 1/(1 - p) would be infinite (PyTorch returns zeros there; use them directly).

Masks differ between backends by design, each reproducible from its seed:
- Numba: a counter-based generator (SplitMix64 at each element index, kernels/dropout.py): the
  mask is a pure function of (seed + offset, element index), re-derived in the backward pass,
  so the state holds only the seed. Same seed and offset, same mask; ``seed=None`` draws a
  fresh 64-bit seed (kept in ``state.seed``).
- cuDNN: cudnnDropoutForward/Backward; the mask lives in cuDNN's reserve space, kept by the
  state. RNG states are initialised once per (device, stream, seed, p), on the stream (no host
  wait); offset 0 restores them, and offset k + 1 follows offset k's call on the same stream
  (each forward advances the states), so a sequence of calls -- nn.Dropout's, whose offset is
  its call count -- costs one initialisation and the same seed gives the same masks
  (cudnn/dropout.py). Another offset is not reachable: ``auto`` runs Numba, ``forced`` raises.
  ``seed=None`` advances one generator per (device, stream, p) initialised once from a fresh
  seed: a new mask each call at no initialisation cost. cuDNN takes p as a
  float32, so its scale is 1/(1 - float32(p)); where that is off by more than 4 ulps of the data
  type (float64 for most p, float32 for p = 0.999; see ``cudnn_scale_error``) cuDNN is not used:
  ``auto`` runs Numba, ``forced`` raises CudnnUnavailableError saying so.

A state made by one backend cannot be used by the other: under ``auto`` the backward follows the
state; ``backend="numba"`` with a cuDNN state raises ValueError, ``forced``/``"cudnn"`` with a
Numba state raises CudnnUnavailableError, both saying why.

``out=`` writes y into a given array (x itself for in place; ops/inplace.py): the Numba kernel
reads each element before writing it; cuDNN's reference does not promise cudnnDropoutForward
in place, so there y == x goes through a pool array and a copy. The gradient needs only the
mask, never x: backward through an in-place dropout is exact.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:       # (numpy.typing costs ~15 ms of `import dnnkit`)
    import numpy.typing as npt

from .. import arrays, device, fastpath
from ..cudnn import dropout as cudnn_dropout
from ..autograd import gradient
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, DType, Shape, Stream
from ..launch import launch
from ..seeds import fresh_seed
from ..registry import register
from . import inplace


class DropoutState:
    """What :func:`dropout_backward` needs: the backend, p, the seed, x's shape and dtype and,
    for cuDNN, its reserve space (``saved``). ``mask()`` returns the mask (host, bool)."""

    def __init__(self, backend: Backend, p: float, seed: int | None, x_shape: Shape,
                 x_dtype: DType, saved: object = None) -> None:
        self.backend, self.p, self.seed = backend, p, seed
        self.x_shape, self.x_dtype, self.saved = tuple(x_shape), np.dtype(x_dtype), saved

    def memo_key(self) -> tuple:
        """What dropout_backward's checks read (dnnkit/fastpath.py): not the seed, so that
        each step's new state takes the memoised call."""
        return self.backend, self.p, self.x_shape, self.x_dtype.str

    def mask(self, *, stream: Stream = None) -> npt.NDArray[np.bool_]:
        """The kept elements (True) as a host bool array: the backward pass of ones."""
        ones = np.ones(self.x_shape, self.x_dtype)
        dx = dropout_backward(ones, self, backend=self.backend, stream=stream)
        return dx.copy_to_host() != 0

    def __repr__(self):
        return (f"DropoutState(backend={self.backend!r}, p={self.p}, seed={self.seed}, "
                f"shape={self.x_shape}, dtype={self.x_dtype})")


fastpath.carried_type(DropoutState)      # a backward call gets each step's own state


class DropoutArgs(NamedTuple):
    """dropout's checked arguments, as its implementations take them (seed None: fresh)."""
    x: object
    p: float
    seed: object
    offset: int
    stream: object
    out: object = None


class DropoutBackwardArgs(NamedTuple):
    """dropout_backward's checked arguments."""
    dy: object
    state: DropoutState
    stream: object


def _check_p(op, p):
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: p must be a number in [0, 1); got {p!r}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        why = (" (p == 1 would drop every element and make the scale 1/(1 - p) infinite; "
               "use zeros instead)") if p == 1.0 else ""
        raise ValueError(f"{op}: p must be in [0, 1); got {p!r}{why}")
    return p


def _check_seed(op, seed):
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{op}: seed must be an integer or None; got {seed!r}")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"{op}: seed must be in [0, 2**64); got {seed}")
    return seed


@public_op("dropout", memo=False)      # seed=None draws a fresh seed on every call
def dropout(x: ArrayLike, p: float, *, seed: int | None = None, offset: int = 0,
            out: ArrayLike = None, stream: Stream = None,
            backend: Backend | None = None) -> DropoutArgs:
    """Zero each element of x with probability p and scale the rest by 1 / (1 - p):
    y = x * mask / (1 - p), shaped like x; returns ``(y, state)`` (a :class:`DropoutState`: pass it
    to :func:`dropout_backward`).

    ``p``: a number in [0, 1) (0 keeps everything; 1 is refused: the scale would be infinite).
    ``seed``: an int in [0, 2**64) fixing the mask, or None (default) for a fresh one each call
    (kept in ``state.seed``). ``offset``: an int >= 0, the offset-th mask of the sequence the
    seed starts (a layer's call count: nn.Dropout passes it); on cuDNN, offset k + 1 must follow
    offset k on the stream (or be 0), else ``auto`` runs Numba and ``forced`` raises. The
    backends draw different masks for one seed, each reproducible.
    x: float16, float32 or float64, any shape. ``out``: a device array of x's shape and dtype
    to write y into (x itself: in place), returned as y; None (default): a new array.
    Raises ValueError for p, seed or offset out of range, an offset without a seed, or an out
    of another shape or overlapping x in part; TypeError for a p, seed or offset of the wrong
    type or an out of another dtype."""
    p = _check_p("dropout", p)
    s = arrays.as_stream(stream)
    if p:
        device.refuse_in_capture("dropout", "its mask comes from a seed fixed on the host "
                                 "(drawn, or given), so every replay of a CUDA graph would "
                                 "repeat the recorded mask", device.stream_pointer(s))
    seed = _check_seed("dropout", seed)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"dropout: offset must be an integer; got {offset!r}")
    if not 0 <= offset < 2**64:
        raise ValueError(f"dropout: offset must be in [0, 2**64); got {offset}")
    if offset and seed is None:
        raise ValueError(f"dropout: offset {offset} names a mask of a seed's sequence; "
                         "pass the seed too")
    x = arrays.device_input("dropout", "x", x, s)
    out = inplace.output("dropout", out, x, s, x=x)
    return DropoutArgs(x, p, seed, int(offset), s, out)


@public_op("dropout_backward")
def dropout_backward(dy: ArrayLike, state: DropoutState, *, stream: Stream = None,
                     backend: Backend | None = None) -> DropoutBackwardArgs:
    """Gradient of :func:`dropout`: dx = dy * mask / (1 - p), with the forward's mask.

    ``state``: the :class:`DropoutState` the forward returned; dy: the forward's x shape and
    dtype. The backward runs where the state was made: a Numba state re-derives its mask from
    the seed, a cuDNN state holds cuDNN's reserve space.
    Raises TypeError for a state that is not a DropoutState or a dy of another dtype;
    ValueError for a dy of another shape or ``backend="numba"`` with a cuDNN state
    (CudnnUnavailableError for "cudnn" with a Numba state)."""
    op = "dropout_backward"
    if not isinstance(state, DropoutState):
        raise TypeError(f"{op}: state must be the DropoutState returned by dropout; got "
                        f"{type(state).__name__}")
    s = arrays.as_stream(stream)
    dy = arrays.device_input(op, "dy", dy, s)
    if tuple(dy.shape) != state.x_shape:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but the forward's x had "
                         f"{state.x_shape}")
    if dy.dtype != state.x_dtype:
        raise TypeError(f"{op}: dy has dtype {dy.dtype} but the forward's x had {state.x_dtype}")
    return DropoutBackwardArgs(dy, state, s)


# ---------------------------------------------------------------- Numba
# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

_MAX_BLOCKS = 4096   # grid-stride: any grid is correct (tests shrink it on the simulator)


def _quiet_on_the_simulator():
    """On Numba's CUDA simulator the kernel's uint64 arithmetic runs on NumPy scalars, which
    warn when they wrap; wrapping modulo 2**64 is what the generator means. Set per call (not
    at import) because test runners restore the warning filters around each test; adding the
    same filter again replaces it."""
    from numba.core import config as nconfig
    if nconfig.ENABLE_CUDASIM:
        warnings.filterwarnings("ignore", message=r".*overflow encountered in scalar",
                                category=RuntimeWarning, module=r".*kernels[./]dropout$")


def _apply_numba(a, state, stream, out=None):
    """a * mask / (1 - p) with the mask of ``state`` (forward: a = x, backward: a = dy), into
    ``out`` when given (the kernel reads each element before writing it: out may be a)."""
    from ..kernels import dropout_fwd_kernel
    from ..kernels.dropout import mask_key
    out = inplace.result(out, a, stream)
    if a.size:
        _quiet_on_the_simulator()
        acc = arrays.acc_array(a.dtype)
        thr = np.uint64(min(round(state.p * 2**32), 2**32))
        blocks, threads = arrays.grid_1d((a.size + 1) // 2, max_blocks=_MAX_BLOCKS)  # pairs
        launch(dropout_fwd_kernel, blocks, threads, stream,
               (arrays.flat(a), arrays.flat(out), mask_key(state.seed), thr,
                acc.dtype.type(1.0 / (1.0 - state.p)), acc))
    return out


@register("dropout", "numba", crosscheck=False)
def _dropout_numba(x, p, seed, offset, stream, out=None):
    seed = fresh_seed() if seed is None else (seed + offset) % 2**64
    state = DropoutState("numba", p, seed, x.shape, x.dtype)
    return _apply_numba(x, state, stream, out), state


@register("dropout_backward", "numba", crosscheck=False)
def _dropout_backward_numba(dy, state, stream):
    if state.backend != "numba":
        raise ValueError(f"dropout_backward: this state was made by the {state.backend} "
                         "backend, which keeps the mask in its reserve space; only it can use "
                         "it (run dropout_backward with backend='auto' or 'cudnn')")
    return _apply_numba(dy, state, stream)


# ---------------------------------------------------------------- cuDNN

def cudnn_scale_error(p):
    """The relative error of cuDNN's scale 1/(1 - p): cudnnSetDropoutDescriptor takes p as a
    float32, so the scale is 1/(1 - float32(p)) (0 for p = 0.5; 2.4e-7 for p = 0.9; 1.3e-5 for
    p = 0.999)."""
    p32 = float(np.float32(p))
    return abs(p32 - p) / (1.0 - p32) if p32 < 1.0 else float("inf")


def _supports_forward(x, p, seed, offset, stream, out=None):
    err, eps = cudnn_scale_error(p), float(np.finfo(x.dtype).eps)
    if err > 4 * eps:
        return (f"cuDNN takes p as a float32: its scale 1/(1 - p) for p = {p!r} is off by "
                f"{err:.1e} relative, more than {x.dtype}'s precision allows ({4 * eps:.1e})")
    if x.size >= 2**31:
        return f"{x.size} elements exceed cuDNN's 32-bit tensor size"
    if seed is not None and x.size:
        return cudnn_dropout.reachable(p, seed, offset, stream)
    return None


def _supports_backward(dy, state, stream):
    if state.backend != "cudnn":
        return (f"the state was made by the {state.backend} backend, whose mask only it can "
                "re-derive (from the seed); cuDNN needs the reserve space of its own forward")
    return None


@register("dropout", "cudnn", supports=_supports_forward, crosscheck=False)
def _dropout_cudnn(x, p, seed, offset, stream, out=None):
    saved = []

    def write(y):
        # an empty x has nothing to drop (and cuDNN rejects empty tensors): no reserve space
        saved.append(cudnn_dropout.forward(x, y, p, seed, offset, stream) if x.size else None)
    y = inplace.through_copy(out, x, stream, write)
    return y, DropoutState("cudnn", p, seed, x.shape, x.dtype, saved[0])


@register("dropout_backward", "cudnn", supports=_supports_backward, crosscheck=False)
def _dropout_backward_cudnn(dy, state, stream):
    dx = arrays.empty_like(dy, stream)
    if dy.size:           # (dy has the forward's shape: empty exactly when it had no mask)
        cudnn_dropout.backward(dy, dx, state.saved, stream)
    return dx


# ---------------------------------------------------------------- python -m dnnkit check

class _CheckView:
    """Dropout output checked without knowing the mask in advance: ``copy_to_host()`` gives
    out*(1 - p) where the forward kept an element and a + out where it dropped one, which equals
    a (the float64 reference) exactly when kept elements are scaled by 1/(1 - p) and dropped
    ones are 0; then one more element, 1.0 when the keep rate is within 6 standard deviations
    of 1 - p (binomial), else 0.0 (reference: 1.0)."""

    def __init__(self, a, kept_by, out, p):
        self.a, self.kept_by, self.out, self.p = a, kept_by, out, p

    def copy_to_host(self):
        a = arrays.to_host(self.a).astype(np.float64).ravel()
        out = arrays.to_host(self.out).astype(np.float64).ravel()
        kept = arrays.to_host(self.kept_by).ravel() != 0
        view = np.where(kept, out * (1 - self.p), a + out)
        rate_ok = abs(kept.mean() - (1 - self.p)) <= \
            6 * np.sqrt(self.p * (1 - self.p) / kept.size) + 1 / kept.size
        return np.append(view, 1.0 if rate_ok else 0.0)


def selfcheck_cases(Case):
    p, seed = 0.3, 20240607
    forward_states = {}

    def run_fwd(backend, stream, i):
        y, _ = dropout(i[0], p, seed=seed, backend=backend, stream=stream)
        return _CheckView(i[0], y, y, p)

    def run_bwd(backend, stream, i):
        cached = forward_states.get(backend)
        if cached is None or cached[0] is not i[0]:   # one forward per input: time the backward
            forward_states[backend] = (i[0], *dropout(i[0], p, seed=seed, backend=backend,
                                                      stream=stream))
        _, y, state = forward_states[backend]
        dx = dropout_backward(i[1], state, backend=backend, stream=stream)
        return _CheckView(i[1], y, dx, p)

    def make(rng, dtype, big):
        shape = (32, 64, 32, 32) if big else (3, 70)
        return tuple((rng.standard_normal(shape) * 3).astype(dtype) for _ in range(2))

    def ref(k):
        return lambda i: np.append(np.asarray(i[k], np.float64).ravel(), 1.0)

    return [Case("dropout", f"p={p}", run_fwd, ref(0), make),
            Case("dropout_backward", f"p={p}", run_bwd, ref(1), make)]


# ---------------------------------------------------------------- autograd

@gradient("dropout", outputs=(0,), reads_out=())     # the state only: not an array
def _dropout_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": dropout_backward(dy, g.out[1], backend=g.backend, stream=g.stream)}
