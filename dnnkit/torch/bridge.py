"""PyTorch tensors in and out of dnnkit's ops: views, streams, the backend name.

In: a CUDA ``torch.Tensor`` becomes a Numba view of the same memory (dnnkit/foreign.py: a
template per buffer, ~1 us, the view holding the tensor alive, except the kept views of
parameters and statistics below); the op runs on PyTorch's
current stream of that device, passed as ``stream=`` (a raw handle read by one C call), so the
work is ordered with PyTorch's own kernels and nothing waits. Tensors are made contiguous (a
no-op when they are); one that requires grad is viewed as it is (the view reads its memory).
(foreign.torch_view: the view without foreign.as_array's general dispatch, several hundred
times a training step.) A forward keeps its views for its backward (:func:`keep`), and the
views of parameters and batch-norm statistics are kept from step to step (:func:`held`).

What a converted layer costs the host (NVIDIA H100 host, a 3x3 convolution's forward and
backward inside a training loop): the ops' memoised calls are about a third, PyTorch's
autograd engine (the Function's node, the hand-over to its backward thread and back) another
third, and the views, output tensors and wrappers here the rest; everything runs 2-3x slower
than in a tight loop of one call, as a step's ~120 calls share the CPU's caches with the
autograd engine's thread.

Out: an op's output is a Numba array from dnnkit's caching pool, allocated on that stream. It
becomes a ``torch.Tensor`` through ``__cuda_array_interface__`` (``torch.as_tensor``): PyTorch
keeps a reference to the object that exported the interface until the tensor's storage dies,
and that object holds the Numba array, so the pool block is not reused while PyTorch reads it.
The pool reuses a block only on the stream it was allocated on, PyTorch's current stream at
the call: a tensor handed to another stream needs ``torch.cuda.current_stream().wait_stream``
ordering as any PyTorch tensor does, and must stay referenced until that work is done
(``Tensor.record_stream`` does not reach dnnkit's pool).

On Numba's CUDA simulator (no GPU; the tests) device memory is host memory: CPU tensors are
passed as NumPy views (no copy) and outputs come back as CPU tensors (one host copy each).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref

import numpy as np
import torch

from .. import arrays, config, device, foreign, memory, ops
from ..errors import CaptureError
from ..profile import joined as join_profiles, open_profiles, profile_state
from ..tracing import joined as join_traces, open_traces, trace_state

BACKENDS = ("auto", "cudnn", "numba")

# raw stream being captured by dnnkit.torch.graph -> dnnkit's pool private to that graph
CAPTURES = {}


def op_backend(backend):
    """The ``backend=`` of dnnkit's ops for a converted module's backend: "auto" is the policy's
    choice per call (``dnn.enabled``), so None."""
    return None if backend == "auto" else backend


def check_backend(where, backend):
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {', '.join(BACKENDS)}; got "
                         f"{backend!r}")
    return backend


def stream_of(t):
    """The raw stream dnnkit's ops run on for tensor ``t``: PyTorch's current stream on its
    device; None on the simulator (its one stream) and for CPU tensors there."""
    if device.simulator():
        if t.is_cuda:
            raise TypeError("dnnkit.torch: a CUDA tensor cannot be read by Numba's CUDA "
                            "simulator")
        return None
    if not t.is_cuda:
        raise TypeError(f"dnnkit.torch: the tensors must be on a CUDA device (dnnkit runs on "
                        f"the GPU); got a tensor on {t.device}. Move the model and its inputs "
                        f"with .cuda()")
    return foreign.torch_stream(t.get_device())


def view(t, stream):
    """Tensor ``t`` (or None) as an op argument: a Numba view of its memory ordered on
    ``stream``, or on the simulator a NumPy view of the CPU tensor. A ``Parameter``'s view is
    kept from call to call (:func:`held`)."""
    if t is None:
        return None
    if type(t) is _Parameter and stream is not None:
        return held(t, stream)
    if not t.is_contiguous():
        t = t.contiguous()
    if stream is None:
        return t.detach().numpy()
    return foreign.torch_view(t, stream)


_Parameter = torch.nn.Parameter


# id(tensor) -> (a weak reference to it, what its view was made for, the view): held()'s
# views, kept outside the tensors (a tensor's __dict__ is pickled with it, and torch.load's
# weights_only unpickler refuses any class of dnnkit's); an entry goes when its tensor dies
_HELD = {}


def _forget(ref, i):
    e = _HELD.get(i)
    if e is not None and e[0] is ref:
        del _HELD[i]


def held(t, stream):
    """:func:`view` of a long-lived tensor -- a layer's parameters and buffers, viewed every
    step -- kept for the next call on ``stream`` while the tensor lives and keeps its
    address, shape and strides (a parameter replaced through ``.data`` or resized gets a new
    view). The kept view does not hold the tensor (the tensor would then never die, or with
    the view kept on it, only when the garbage collector runs): an op call that reads it holds
    the tensor itself, and a Function that keeps it for its backward keeps the tensor beside
    it (saved-tensor hooks may hand the backward a copy instead of the tensor). A new view
    cost 3.8 us in a loop on an NVIDIA H200 host (8 in a training step), a kept one is a dict
    lookup and a key (0.6 us on the CI machine); a converted ResNet-18 views ~100 parameters
    and statistics a step."""
    if stream is None or t is None:      # (the simulator: NumPy views, nothing kept)
        return view(t, stream)
    # (the strides count elements, and .half() or .to() of a module swaps its parameters'
    # memory, which PyTorch's allocator can hand back at the same address: the dtype is part
    # of the key; raw stream 0 names every device's legacy stream: so is the device)
    key = (stream, t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device())
    i = id(t)
    e = _HELD.get(i)
    if e is not None and e[1] == key and e[0]() is t:
        return e[2]
    if not t.is_contiguous():       # a copy per call, held by nothing else: not kept
        return foreign.torch_view(t.contiguous(), stream)
    v = foreign.torch_view(t, stream, owned=False)
    _HELD[i] = (weakref.ref(t, functools.partial(_forget, i=i)), key, v)
    return v


# torch.autograd.graph.saved_tensors_hooks' innermost (pack, unpack) pair, or None
_saved_hooks = getattr(getattr(torch._C, "_autograd", None), "_top_saved_tensors_default_hooks",
                       None)


def keep(ctx, stream, views, tensors):
    """Keep a forward's op arguments ``views`` on ``ctx`` for the backward (:func:`kept`): a
    backward on the forward's stream need not view its saved ``tensors`` again. ``views[i]``
    stands for ``tensors[i]``: a view of an input, or for an output the op's own array (a view
    of the output tensor would hold it, and an output's node holding its output is a reference
    cycle). Kept with each tensor's address; not kept for an input ``view`` copied (not
    contiguous: the copy would live until the backward), and nothing is kept while saved-tensor
    hooks are active (``save_on_cpu``, checkpointing: they release the tensors' memory, and
    PyTorch then skips the in-place check the backward relies on)."""
    if _saved_hooks is not None and _saved_hooks(False) is not None:
        ctx.dnnkit_views = None
        return
    ctx.dnnkit_views = (stream, tuple(v if t.is_contiguous() else None
                                      for v, t in zip(views, tensors)),
                        tuple(t.data_ptr() for t in tensors))


def kept(ctx, stream, *tensors):
    """The views :func:`keep` kept for ``tensors`` (the same tensors, from
    ``ctx.saved_tensors``), where the backward runs on the forward's stream and the tensor
    still has the address it had (its storage was not swapped, as FSDP does); else new views.
    Either way ``ctx`` lets go of them: PyTorch frees saved tensors after the backward, and
    the views must not keep their memory any longer (the graph's nodes live until its output
    dies)."""
    k = ctx.dnnkit_views
    ctx.dnnkit_views = None
    if k is None or k[0] != stream:
        return tuple(view(t, stream) for t in tensors)
    return tuple(v if v is not None and t.data_ptr() == p else view(t, stream)
                 for v, t, p in zip(k[1], tensors, k[2]))


class _Exported:
    """A Numba array's ``__cuda_array_interface__`` as a plain attribute (Numba's is a property
    computed in Python each read); PyTorch holds this object, so the array, while the tensor
    lives."""

    __slots__ = ("__cuda_array_interface__", "array")

    def __init__(self, a):
        self.array = a
        self.__cuda_array_interface__ = {
            "shape": tuple(a.shape), "typestr": a.dtype.str, "strides": tuple(a.strides),
            # a pool array carries its address (dnnkit/memory.py); Numba's
            # device_ctypes_pointer makes a ctypes object per read
            "data": (a.__dict__.get("_dnnkit_ptr") or a.device_ctypes_pointer.value or 0,
                     False), "version": 2}


def tensor(a, like):
    """dnnkit output ``a`` (a Numba device array) as a torch tensor on ``like``'s device,
    sharing its memory (module docstring)."""
    if device.simulator():
        return torch.from_numpy(np.ascontiguousarray(a.copy_to_host()))
    if a.size == 0:
        return torch.empty(tuple(a.shape), dtype=like.dtype, device=like.device)
    return torch.as_tensor(_Exported(a), device=like.device)


def through_relu(activation, y, g, backend, stream):
    """Upstream gradient ``g`` (an op argument) taken through a fused relu's slope, 1 where
    the forward's output ``y`` > 0; ``g`` itself when nothing was fused (``activation``
    None). The backward of every converted layer that took ``activation=``."""
    if activation is None:
        return g
    return ops.activation_backward(y, y, g, activation, 0.0, backend=backend, stream=stream)


def maybe(a, like):
    return None if a is None else tensor(a, like)


def seed():
    """A 63-bit dropout seed drawn from PyTorch's default CPU generator, so that
    ``torch.manual_seed`` makes dnnkit's masks repeatable as it makes PyTorch's."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())


def constant(values, like):
    """A cached read-only device array of ``values`` in ``like``'s dtype (dnnkit's constants);
    on the simulator a NumPy array."""
    dt = np.dtype(str(like.dtype).replace("torch.", ""))
    if device.simulator():
        return np.asarray(values, dt)
    return arrays.constant(values, dt)


# torch.compiler.is_compiling (PyTorch >= 2.3; a constant True to Dynamo while it traces)
compiling = getattr(torch.compiler, "is_compiling", None) or (lambda: False)


# PyTorch's Function.apply in C (``_FunctionBase.apply``), bound to each of dnnkit.torch's
# Functions. The Python classmethod in front of it binds default arguments for a Function
# that defines setup_context (none of dnnkit's does), asks whether functorch transforms are
# active (then it takes their path: so does function()) and unwraps dead functorch wrappers
# (so does function()): ~2 us a call more, on a CPU where the whole apply costs 7.
_c_apply = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
try:
    from torch._C._functorch import unwrap_if_dead as _unwrap_if_dead
except ImportError:     # a PyTorch without them: every call takes fn.apply
    _c_apply = None
_applies = {}           # Function class -> its C apply, or None (then fn.apply)
# PyTorch's Python apply as imported: a class that overrides it, or a patched one (an
# instrumented torch.autograd.Function.apply), takes fn.apply
_function_dict = torch.autograd.Function.__dict__
_python_apply = _function_dict["apply"]


def _apply_of(fn):
    ap = None
    if _c_apply is not None and _transforms_active is not None and \
            fn.setup_context is torch.autograd.Function.setup_context and \
            getattr(fn.apply, "__func__", None) is _python_apply.__func__:
        ap = _c_apply.__get__(None, fn)
    _applies[fn] = ap
    return ap


def function(fn, *args):
    """``fn.apply(*args)`` for a ``torch.autograd.Function`` of dnnkit.torch (through the C
    apply: above); while ``torch.compile`` traces, run outside the graph (a graph break):
    Dynamo cannot trace into a function that hands tensors' memory to Numba."""
    if compiling():
        return _outside(fn, *args)
    ap = _applies.get(fn, 0)
    if ap == 0:
        ap = _apply_of(fn)
    if ap is None or _transforms_active() or _function_dict["apply"] is not _python_apply:
        return fn.apply(*args)
    return ap(*[_unwrap_if_dead(a) if isinstance(a, _Tensor) else a for a in args])


_Tensor = torch.Tensor


@torch.compiler.disable
def _outside(fn, *args):
    return fn.apply(*args)


@contextlib.contextmanager
def graph_pool():
    """dnnkit's allocations inside served by the private pool of the graph that PyTorch's
    current stream is capturing, if any (dnnkit/torch/graph.py); the custom operators'
    kernels (dnnkit/torch/library.py) run under it, as ``pooled`` functions do. A capture
    dnnkit does not know of (``torch.compile``'s ``reduce-overhead`` graphs) is refused."""
    pool = _graph_pool() if CAPTURES else None
    if pool is None:
        if _capturing():            # torch.compile's CUDA graphs, or torch.cuda.graph
            _refuse("library (a custom operator)")
        yield
        return
    with memory.private_pool(pool):
        yield


def caller_context():
    """What of this thread's dnnkit state an op call made for it on another thread must see:
    its ``change_flags`` layers, open traces and open profiles (all per thread); None when
    there are none (every converted layer's forward asks: the thread-locals' dicts are read
    directly)."""
    if config.state.local.__dict__.get("stack") or trace_state.__dict__.get("traces") or \
            profile_state.__dict__.get("stack"):
        return (config.thread_layers(), open_traces(), open_profiles())
    return None


@contextlib.contextmanager
def within(context):
    """The block's op calls see ``context`` (:func:`caller_context` of another thread)."""
    if context is None:
        yield
        return
    layers, traces, profiles = context
    with config.joined(layers), join_traces(traces), join_profiles(profiles):
        yield


def pooled(fn):
    """``fn`` (an autograd.Function's ``forward`` or ``backward``) with dnnkit's allocations
    served by the private pool of the graph that PyTorch's current stream is capturing, if any
    (dnnkit/torch/graph.py), and, in a backward, the forward caller's flags, traces and
    profiles. PyTorch runs the backward of CUDA tensors on its own autograd thread, which
    neither the capturing thread's pool nor the caller's ``change_flags``, ``trace()`` and
    ``profile()`` (all per thread) reach: the pool is found by the stream, the rest is kept
    on ``ctx`` by the forward (the same object in both) and entered by the backward when it
    runs on another thread. Two wrappers, chosen by ``fn``'s name, so that the common call (no
    capture, no flags, traces or profiles open) costs an attribute and a dict check: these
    run twice per converted layer and step."""
    if fn.__name__ == "forward":
        name = fn.__qualname__.split(".")[0]

        @functools.wraps(fn)
        def forward(ctx, *args):
            c = caller_context()
            ctx.dnnkit_caller = None if c is None else (threading.get_ident(), c)
            if not CAPTURES:
                if _capturing():
                    _refuse(name)
                return fn(ctx, *args)
            return _in_graph_pool(fn, ctx, args, name)
        return forward
    if fn.__name__ != "backward":
        raise TypeError(f"bridge.pooled wraps an autograd.Function's forward or backward; got "
                        f"{fn.__name__!r}")
    name = fn.__qualname__.split(".")[0]

    @functools.wraps(fn)
    def backward(ctx, *args):
        if _grad_enabled():         # create_graph=True (grad mode is off in a plain backward)
            _no_second(name)
        saved = ctx.dnnkit_caller
        if saved is not None and saved[0] != threading.get_ident():
            with within(saved[1]):
                return _in_graph_pool(fn, ctx, args)
        if not CAPTURES:
            return fn(ctx, *args)
        return _in_graph_pool(fn, ctx, args)
    return backward


_grad_enabled = torch.is_grad_enabled


def _no_second(name):
    """A backward asked to build a graph of itself (``create_graph=True``): its op calls are
    not PyTorch operations autograd could record, so the gradient would come back without a
    graph and every second-order term through the layer would be silently zero."""
    raise RuntimeError(
        f"dnnkit.torch.{name}: the backward of a converted layer cannot be differentiated "
        f"(create_graph=True: second derivatives, gradient penalties): its gradient would "
        f"carry no second-order terms. Leave the layers on that path to PyTorch "
        f"(convert(..., exclude=...)) or differentiate once")


def _graph_pool():
    """The private pool of the dnnkit.torch.graph capture that PyTorch's current stream is
    part of: the capturing stream's, or that of the capture a stream was joined into
    (``torch.cuda.stream(side)`` inside it: the side stream shares its capture id)."""
    s = foreign.torch_stream(torch.cuda.current_device())
    pool = CAPTURES.get(s)
    if pool is None and s:
        cid = device.capture_id(s)
        if cid is not None:
            pool = next((p for k, p in list(CAPTURES.items()) if device.capture_id(k) == cid),
                        None)
    return pool


def _in_graph_pool(fn, ctx, args, name=None):
    pool = _graph_pool() if CAPTURES else None
    if pool is None:
        if name is not None and _capturing():
            _refuse(name)
        return fn(ctx, *args)
    with memory.private_pool(pool):
        return fn(ctx, *args)


# torch.cuda.is_current_stream_capturing without its Python frame (a converted layer's
# forward asks once: ~0.3 us)
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _capturing():
    """Whether PyTorch's current stream is being captured into a CUDA graph (never on the
    simulator, whose tensors are CPU tensors)."""
    if device.simulator() or memory.in_private_pool():    # dnnkit.graphs.capture's thread
        return False
    f = _stream_capturing or torch.cuda.is_current_stream_capturing
    try:
        return bool(f())
    except RuntimeError:        # a PyTorch built without CUDA: nothing can be captured
        return False


def _refuse(name):
    """A converted layer called inside ``torch.cuda.graph`` (or ``make_graphed_callables``)
    without dnnkit.torch.graph: its outputs and workspaces would come from dnnkit's shared
    pool, whose blocks go back to eager calls after the capture while the graph keeps writing
    them at every replay. Refused before anything is allocated."""
    raise CaptureError(
        f"dnnkit.torch.{name}: PyTorch's current stream is being captured into a CUDA graph "
        f"that dnnkit does not know of. Capture with dnnkit.torch.graph(g) in place of "
        f"torch.cuda.graph(g): it gives dnnkit's allocations a pool private to the graph (a "
        f"block of the shared pool would be handed to eager calls after the capture while "
        f"every replay still writes it)", what=f"dnnkit.torch.{name}")
