"""CUDA graphs: record a whole training step once, then replay it with one launch.

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    g = dnnkit.graphs.capture(step, x_static, y_static)     # warm-up, then one recorded call
    for x, y in batches:
        g.replay(x, y)                # copies x, y into x_static, y_static; one cuGraphLaunch
    print(g.outputs.item())           # the last replay's loss, in the captured output

Modelled on PyTorch's ``torch.cuda.graph`` / ``make_graphed_callables``. ``capture`` makes a
stream of its own (non-blocking) and, with it current (``dnnkit.stream``) and a memory pool
private to the graph active (dnnkit/memory.py ``private_pool``):

1. runs ``fn(*static_inputs)`` ``warmup`` times (3) for real, so that everything a first call
   does on the host happens before the capture: backend and algorithm choices (cuDNN timing
   runs), plans and descriptors, kernel compilation, the memo's runners (keyed by this stream),
   cached constants, optimizer state, and the pool's blocks. The warm-up steps are real steps:
   a training step advances the model ``warmup`` times;
2. waits for them (once), then records one call: cuStreamBeginCapture, ``fn``,
   cuStreamEndCapture, cuGraphInstantiate. Nothing runs during the recording: the replays do
   the work.

Capture mode THREAD_LOCAL: an unsafe call made by this thread while it records (a host copy, a
synchronisation, a cuMemAlloc/cuMemFree outside the graph pool) fails at once and invalidates
the capture, instead of leaving a graph that silently differs from the eager step (RELAXED
would let it pass); other threads -- a data loader, PyTorch elsewhere -- are not restricted
(GLOBAL would fail the capture on their calls). The pool's own cuMemAlloc runs with the mode
relaxed for that one call (device.capture_relaxed), as PyTorch's allocator does.

What cannot be captured raises :class:`dnnkit.errors.CaptureError` naming it: ``Tensor.item()``
and ``numpy()``, a cuDNN algorithm timing run (a shape the warm-up did not see under
``time_once``/``time_on_shape_change``), dropout (its seed is fixed on the host: a replay
would repeat the mask). The graph replays exactly the recorded work on the recorded
addresses: host values read at capture time are constants of the graph (a learning rate
changed later is not seen; Adam's step count is a host number, so its bias correction
freezes: use SGD, or re-capture), and ops given an explicit ``stream=`` other than the
current one are not recorded.

Host work that the recorded call does once and every replay needs again registers itself with
``after_replay`` while the call is recorded: its callback runs after each replay's launch
(dnnkit.distributed's watchdog tracks the collectives of each replay that way).

Memory. Every block allocated while recording (and during the warm-up) comes from the graph's
own pool and returns to it: the graph writes those addresses on every replay, so no eager call
may be handed one while the graph lives; ``close()`` (or collecting the graph) gives the pool up.
The driver's stream-ordered allocator (cuMemAllocAsync) is the alternative: it is
capture-aware (an allocation recorded in a capture becomes a memory-alloc node whose address is
fixed for the graph's life) and needs no private pool. It was not taken: (a) its blocks are
owned by the graph and freed by a free node or at relaunch (CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE
_ON_LAUNCH), so outputs that must outlive a replay (parameter gradients, the loss) need a free
node left out and the "auto free" flag off, the same bookkeeping as a pool; (b) eager steps
would then need it too, to match addresses between warm-up and capture, replacing the caching
pool whose reuse rule (per stream, no synchronisation) is already what the capture needs;
(c) on this machine there is no GPU to measure allocation cost, and cudaMallocAsync's pool
differs in cost from the caching allocator's dict lookup (~1 us) by an amount only the GPU
run can show. The caching pool with a private pool per graph (PyTorch's design) keeps one code
path for eager and captured steps.

The simulator cannot capture: ``capture`` raises CaptureError there (the tests replace the
driver calls, ``_cuda``, with a recording fake).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import arrays, config, device, dlpack, memory
from .errors import CaptureError
from .hints import ArrayLike, CudaArray
from .tensors import Tensor

CAPTURE_INVALIDATED = 901          # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED


class _Cuda:
    """The driver calls of a capture and a replay (cuda-bindings), one place to replace."""

    @staticmethod
    def _check(err, what):
        if int(err):
            raise CaptureError(f"{what} failed with {err}", what=what)

    def create_stream(self):
        """(raw handle, Numba stream) of a new non-blocking stream."""
        if device.simulator():
            raise CaptureError("CUDA graphs need a GPU: Numba's simulator cannot capture",
                               what="capture")
        ptr = device.create_stream()
        return ptr, arrays.external(ptr)

    def destroy_stream(self, ptr):
        device.destroy_stream(ptr)

    def synchronize(self, ptr):
        (err,) = device.driver().cuStreamSynchronize(ptr)
        self._check(err, "cuStreamSynchronize")

    def begin(self, ptr):
        drv = device.driver()
        (err,) = drv.cuStreamBeginCapture(
            ptr, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        self._check(err, "cuStreamBeginCapture")

    def end(self, ptr):
        """(CUresult as an int, the graph or None)."""
        err, graph = device.driver().cuStreamEndCapture(ptr)
        return int(err), (graph if not int(err) else None)

    def instantiate(self, graph):
        err, exe = device.driver().cuGraphInstantiate(graph, 0)
        self._check(err, "cuGraphInstantiate")
        return exe

    def node_count(self, graph):
        err, _, n = device.driver().cuGraphGetNodes(graph, 0)
        self._check(err, "cuGraphGetNodes")
        return int(n)

    def launch(self, exe, ptr):
        (err,) = device.driver().cuGraphLaunch(exe, ptr)
        self._check(err, "cuGraphLaunch")

    def destroy(self, graph, exe):
        drv = device.driver()
        if exe is not None:
            drv.cuGraphExecDestroy(exe)
        if graph is not None:
            drv.cuGraphDestroy(graph)

    def copy(self, dst, src, nbytes, ptr):
        """Copy ``nbytes`` into device address ``dst`` from ``src`` (a device address, or a
        C-contiguous host NumPy array), ordered on raw stream ``ptr``."""
        drv = device.driver()
        if isinstance(src, np.ndarray):
            (err,) = drv.cuMemcpyHtoDAsync(dst, src.ctypes.data, nbytes, ptr)
        else:
            (err,) = drv.cuMemcpyDtoDAsync(dst, src, nbytes, ptr)
        self._check(err, "copying a new input into the graph's static input")


_cuda = _Cuda()


def _array(a):
    return a.data if isinstance(a, Tensor) else a


class CUDAGraph:
    """A captured call: ``replay()`` reruns its recorded work; ``outputs`` is what the
    recorded call returned (static Tensors/arrays, rewritten by every replay); ``inputs`` the
    static inputs it reads; ``fn`` the captured function, kept so that what it holds (a model's
    parameters, an optimizer's state: memory every replay writes) lives as long as the graph.
    Built by :func:`capture`."""

    fn: Callable[..., Any] | None       # None once closed

    def __init__(self, fn: Callable[..., Any], exe: Any, graph: Any, stream: tuple[int, Any],
                 pool: Any, inputs: tuple[CudaArray, ...], outputs: Any, nodes: int,
                 hooks: tuple[Callable[[int], None], ...] = ()) -> None:
        self._exe, self._graph, self._stream, self._pool = exe, graph, stream, pool
        self.fn, self.inputs, self.outputs, self.nodes = fn, inputs, outputs, nodes
        self._hooks = hooks          # after_replay callbacks of the recorded call
        self.replays = 0

    @property
    def closed(self) -> bool:
        return self._exe is None

    def replay(self, *new_inputs: ArrayLike | None) -> None:
        """Rerun the recorded work, ordered after what is queued so far on the current stream
        and before what is queued on it later (the host does not wait). ``new_inputs``: none,
        or one per static input (None to keep it): each is copied into its static input first
        (a device array, Tensor or host array of the same shape and dtype)."""
        if self._exe is None:
            raise CaptureError("replay() of a closed CUDA graph", what="replay")
        cur = device.stream_pointer(arrays.as_stream(None))
        if new_inputs:
            self._copy_inputs(new_inputs, cur)
        own = self._stream[0]
        device.stream_wait(own, cur)
        _cuda.launch(self._exe, own)
        for hook in self._hooks:
            hook(own)
        device.stream_wait(cur, own)
        self.replays += 1

    def _copy_inputs(self, new_inputs, stream_ptr):
        if len(new_inputs) != len(self.inputs):
            raise ValueError(f"replay: {len(new_inputs)} inputs given, the graph has "
                             f"{len(self.inputs)} static inputs (pass None to keep one)")
        for i, (static, new) in enumerate(zip(self.inputs, new_inputs)):
            if new is None:
                continue
            dst, src = _array(static), _array(new)
            if not arrays.is_device_array(src):
                src = arrays.host_contiguous(np.asarray(src))
            if tuple(src.shape) != tuple(dst.shape) or np.dtype(src.dtype) != np.dtype(dst.dtype):
                raise ValueError(f"replay: input {i} is {tuple(src.shape)} {np.dtype(src.dtype)}, "
                                 f"the static input {tuple(dst.shape)} {np.dtype(dst.dtype)}")
            nbytes = int(dst.size) * dst.dtype.itemsize
            if nbytes:
                host = isinstance(src, np.ndarray)
                _cuda.copy(dlpack.address(dst), src if host else dlpack.address(src), nbytes,
                           stream_ptr)

    def close(self) -> None:
        """Wait for the replays, then free the graph, its stream and its pool (arrays still
        held -- the outputs -- keep their blocks until they die)."""
        if self._exe is None:
            return
        own = self._stream[0]
        try:
            _cuda.synchronize(own)
        finally:
            _cuda.destroy(self._graph, self._exe)
            _cuda.destroy_stream(own)
            self._exe = self._graph = self._pool = self.fn = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - collected at shutdown or after a device error
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.nodes} nodes, {self.replays} replays"
        return f"<CUDAGraph {state}>"


def capture(fn: Callable[..., Any], *static_inputs: CudaArray, warmup: int = 3) -> CUDAGraph:
    """Capture one call of ``fn(*static_inputs)`` into a CUDA graph (module docstring): run it
    ``warmup`` times, then record it; returns a :class:`CUDAGraph` whose ``outputs`` is the
    recorded call's return value and whose ``replay()`` reruns it. ``static_inputs``: device
    arrays or Tensors the graph reads in place (refill them, or pass new values to
    ``replay``). Raises CaptureError naming what cannot be recorded; TypeError/ValueError for
    bad arguments."""
    if not callable(fn):
        raise TypeError(f"capture: fn must be callable; got {type(fn).__name__}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"capture: warmup must be an int >= 0; got {warmup!r}")
    for i, a in enumerate(static_inputs):
        if not arrays.is_device_array(_array(a)):
            raise TypeError(f"capture: static input {i} must be a device array or a Tensor "
                            f"(the graph reads its address); got {type(a).__name__}")
    if config.get("dnn.allocator") != "caching":
        raise CaptureError("capture needs dnn.allocator = caching: the numba allocator calls "
                           "cuMemAlloc/cuMemFree, which a capture cannot hold", what="capture")
    cur = device.stream_pointer(arrays.as_stream(None))
    ptr, ns = _cuda.create_stream()
    pool = memory.new_pool()
    try:
        device.stream_wait(ptr, cur)      # the static inputs, filled on the current stream
        with memory.private_pool(pool), arrays.stream(ns):
            for _ in range(warmup):
                out = fn(*static_inputs)
                del out
            _cuda.synchronize(ptr)
            graph, outputs, hooks = _record(fn, static_inputs, ptr)
        try:
            exe = _cuda.instantiate(graph)
            nodes = _cuda.node_count(graph)
        except BaseException:
            _cuda.destroy(graph, None)
            raise
    except BaseException:
        _cuda.destroy_stream(ptr)
        raise
    if not nodes:
        _cuda.destroy(graph, exe)
        _cuda.destroy_stream(ptr)
        raise CaptureError("capture: fn queued no work on the capture stream (its ops were "
                           "given another stream=, or it does nothing on the GPU)",
                           what="capture")
    return CUDAGraph(fn, exe, graph, (ptr, ns), pool, static_inputs, outputs, nodes,
                     tuple(hooks))


# Per thread while ``fn`` is being recorded: the callbacks of after_replay()
_recording = threading.local()


def after_replay(hook: Callable[[int], None]) -> bool:
    """Inside a call being recorded by :func:`capture` on this thread: call ``hook(stream)``
    after every replay of the graph, with the raw stream the replay was queued on (host work
    that the recorded call did once and a replay must do again: dnnkit.distributed has its
    watchdog track the collectives a step recorded). Returns False, and keeps nothing,
    outside a recording."""
    hooks = _recording.__dict__.get("hooks")
    if hooks is None:
        return False
    hooks.append(hook)
    return True


def _record(fn, static_inputs, ptr):
    """(graph, fn's return value, its after_replay hooks) of one recorded call on raw stream
    ``ptr``. The garbage collector is off while recording (a finalizer of some unrelated
    object must not free memory into the capture) and Numba defers its frees (cuMemFree is
    not allowed)."""
    from numba import cuda
    was = gc.isenabled()
    gc.disable()
    hooks = _recording.hooks = []
    try:
        with cuda.defer_cleanup():
            _cuda.begin(ptr)
            try:
                outputs = fn(*static_inputs)
            except BaseException as e:
                err, graph = _cuda.end(ptr)
                _cuda.destroy(graph, None)
                if isinstance(e, CaptureError):
                    raise
                raise CaptureError(f"capture: fn raised {type(e).__name__} while being "
                                   f"recorded: {e}", what="capture") from e
            err, graph = _cuda.end(ptr)
    finally:
        _recording.hooks = None
        if was:
            gc.enable()
    if err == CAPTURE_INVALIDATED:
        raise CaptureError(
            "capture: the recording was invalidated by a call a CUDA graph cannot hold, made "
            "while fn ran (a synchronisation, a host copy, a memory allocation or free outside "
            "the graph's pool, work from another stream joined without an event); dnnkit's own "
            "such calls raise CaptureError naming themselves: this one came from elsewhere",
            what="capture")
    if err:
        raise CaptureError(f"capture: cuStreamEndCapture failed with {err}", what="capture")
    return graph, outputs, hooks
