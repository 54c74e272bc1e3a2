"""cuDNN's graph (backend) API: descriptors, heuristics, execution plans and execution.

Why dnnkit uses it: cuDNN 9 implements its legacy calls (cudnnConvolutionForward, ...) on top
of this API and builds an execution plan from the legacy descriptors on *every* call, which
cost 60-90 us of host time per convolution on an H100 (validation/host_cost.py). An execution
plan built here once per shape, kept, and run with ``cudnnBackendExecute`` costs one variant
pack (the device pointers) per call: what PyTorch and cuDNN's frontend do. The engines come
from cuDNN's heuristics (mode A, then the fallback list), filtered by their numerical notes
(no TF32 tensor cores for float32 unless allowed, nothing nondeterministic when determinism
is asked for) and behaviour notes (no engine that compiles kernels at run time).

Every backend descriptor is counted in ``descriptors`` under the kind ``Backend<Type>`` (e.g.
``BackendExecutionPlan``), like the legacy descriptors, so leak tests see them.
"""

import ctypes
import weakref
from ctypes import POINTER, c_double, c_float, c_int, c_int64, c_void_p

from ..errors import CudnnError
from . import api
from .descriptors import count
from .enums import ATTR, ATTR_TYPE, BACKEND_DESCRIPTOR, BEHAVIOR_NOTE, HEUR_MODE, NUMERICAL_NOTE

_p = c_void_p

PROTOTYPES = {
    # cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
    #     cudnnBackendDescriptor_t *descriptor);
    "cudnnBackendCreateDescriptor": [c_int, POINTER(_p)],
    # cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor);
    "cudnnBackendDestroyDescriptor": [_p],
    # cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor);
    "cudnnBackendFinalize": [_p],
    # cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
    #     cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
    #     int64_t elementCount, const void *arrayOfElements);
    "cudnnBackendSetAttribute": [_p, c_int, c_int, c_int64, _p],
    # cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
    #     cudnnBackendAttributeName_t attributeName, cudnnBackendAttributeType_t attributeType,
    #     int64_t requestedElementCount, int64_t *elementCount, void *arrayOfElements);
    "cudnnBackendGetAttribute": [_p, c_int, c_int, c_int64, POINTER(c_int64), _p],
    # cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle,
    #     cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack);
    "cudnnBackendExecute": [_p, _p, _p],
}
api.register_prototypes(PROTOTYPES)

# The C element type of each attribute type we set or read (enums are C ints).
_CTYPE = {"HANDLE": c_void_p, "DATA_TYPE": c_int, "INT64": c_int64, "FLOAT": c_float,
          "DOUBLE": c_double, "VOID_PTR": c_void_p, "CONVOLUTION_MODE": c_int,
          "HEUR_MODE": c_int, "KNOB_TYPE": c_int, "NUMERICAL_NOTE": c_int,
          "BEHAVIOR_NOTE": c_int, "BACKEND_DESCRIPTOR": c_void_p}
_NOTES_MAX = 16   # more than cuDNN 9 defines of either kind of note


def backend_kind(type_name):
    """'EXECUTION_PLAN_DESCRIPTOR' -> 'BackendExecutionPlan' (the leak counter's kind)."""
    words = type_name[:-len("_DESCRIPTOR")].split("_")
    return "Backend" + "".join(w.capitalize() for w in words)


def _destroy(ptr, kind):
    try:
        api.function("cudnnBackendDestroyDescriptor")(ptr)
    except Exception:  # pragma: no cover - best effort (the library is gone at exit)
        pass
    count(kind, destroyed=1)


class Backend:
    """One backend descriptor of ``type_name`` (a BACKEND_DESCRIPTOR key), destroyed by
    ``close()`` or when collected. ``set``/``get`` take attribute names (ATTR keys) and type
    names (ATTR_TYPE keys); a BACKEND_DESCRIPTOR value is a Backend."""
    __slots__ = ("ptr", "type_name", "_fin", "__weakref__")

    def __init__(self, type_name):
        self.type_name = type_name
        self.ptr = c_void_p()
        api.call("cudnnBackendCreateDescriptor", BACKEND_DESCRIPTOR[type_name],
                 ctypes.byref(self.ptr), context=type_name)
        kind = backend_kind(type_name)
        count(kind, created=1)
        self._fin = weakref.finalize(self, _destroy, self.ptr, kind)

    @property
    def _as_parameter_(self):
        return self.ptr

    def close(self):
        self._fin()

    def set(self, attr, type_name, values):
        t = _CTYPE[type_name]
        if type_name == "BACKEND_DESCRIPTOR":
            values = [v.ptr for v in values]
        arr = (t * len(values))(*values)
        self._checked("cudnnBackendSetAttribute", self.ptr, ATTR[attr], ATTR_TYPE[type_name],
                      len(values), arr, context=lambda: f"{self.type_name}: set {attr}")
        return self

    def _checked(self, fn, *args, context):
        """A cuDNN call that, when it fails, also destroys this descriptor at once (it is
        unusable; an exception's traceback would otherwise keep it alive)."""
        try:
            api.call(fn, *args, context=context)
        except Exception:
            self.close()
            raise

    def get(self, attr, type_name, n=1):
        """Up to ``n`` elements of an attribute, as a list (ints or floats)."""
        arr = (_CTYPE[type_name] * max(n, 1))()
        got = c_int64()
        api.call("cudnnBackendGetAttribute", self.ptr, ATTR[attr], ATTR_TYPE[type_name], n,
                 ctypes.byref(got), arr, context=lambda: f"{self.type_name}: get {attr}")
        return list(arr[:got.value])

    def get_descriptors(self, attr, type_name, n=None):
        """A BACKEND_DESCRIPTOR attribute, as new Backend objects of ``type_name`` filled in
        by cuDNN; ``n=None`` asks cuDNN how many there are first."""
        if n is None:
            got = c_int64()
            api.call("cudnnBackendGetAttribute", self.ptr, ATTR[attr],
                     ATTR_TYPE["BACKEND_DESCRIPTOR"], 0, ctypes.byref(got), None,
                     context=lambda: f"{self.type_name}: count {attr}")
            n = got.value
        if n <= 0:
            return []
        out = [Backend(type_name) for _ in range(n)]
        arr = (c_void_p * n)(*[d.ptr for d in out])
        got = c_int64()
        api.call("cudnnBackendGetAttribute", self.ptr, ATTR[attr],
                 ATTR_TYPE["BACKEND_DESCRIPTOR"], n, ctypes.byref(got), arr,
                 context=lambda: f"{self.type_name}: get {attr}")
        for d in out[got.value:]:
            d.close()
        return out[:got.value]

    def finalize(self):
        self._checked("cudnnBackendFinalize", self.ptr,
                      context=lambda: f"{self.type_name}: finalize")
        return self


def packed_strides(dims):
    """C-order strides (in elements) of ``dims``."""
    out, step = [], 1
    for d in reversed(dims):
        out.append(step)
        step *= d
    return out[::-1]


def tensor(uid, dims, data_type, alignment):
    """A finalized tensor: packed ``dims``, ``data_type`` (cudnnDataType_t), its unique id, and
    the byte alignment every pointer bound to it will have."""
    t = Backend("TENSOR_DESCRIPTOR")
    t.set("TENSOR_DATA_TYPE", "DATA_TYPE", [data_type])
    t.set("TENSOR_DIMENSIONS", "INT64", list(dims))
    t.set("TENSOR_STRIDES", "INT64", packed_strides(dims))
    t.set("TENSOR_UNIQUE_ID", "INT64", [uid])
    t.set("TENSOR_BYTE_ALIGNMENT", "INT64", [alignment])
    return t.finalize()


def operation_graph(handle, ops):
    g = Backend("OPERATIONGRAPH_DESCRIPTOR")
    g.set("OPERATIONGRAPH_HANDLE", "HANDLE", [handle])
    g.set("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", list(ops))
    return g.finalize()


class EngineConfig:
    """An engine configuration from the heuristics, with what the filters read of it."""

    def __init__(self, cfg):
        self.cfg = cfg
        engine = cfg.get_descriptors("ENGINECFG_ENGINE", "ENGINE_DESCRIPTOR", 1)[0]
        self.index = engine.get("ENGINE_GLOBAL_INDEX", "INT64")[0]
        self.numerical = set(engine.get("ENGINE_NUMERICAL_NOTE", "NUMERICAL_NOTE", _NOTES_MAX))
        self.behavior = set(engine.get("ENGINE_BEHAVIOR_NOTE", "BEHAVIOR_NOTE", _NOTES_MAX))
        knobs = []
        for k in cfg.get_descriptors("ENGINECFG_KNOB_CHOICES", "KNOB_CHOICE_DESCRIPTOR"):
            knobs.append((k.get("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE")[0],
                          k.get("KNOB_CHOICE_KNOB_VALUE", "INT64")[0]))
            k.close()
        engine.close()
        # the name the algorithm cache stores and traces report: engine and knob choices
        self.name = f"engine{self.index}" + "".join(f"_k{t}={v}" for t, v in sorted(knobs))

    def has(self, note):
        return NUMERICAL_NOTE[note] in self.numerical

    def usable(self, allow_tensor_cores, deterministic):
        """The filters: tensor-core engines (and those that convert their inputs down) only
        when allowed; no atomics-based engine under determinism; nothing compiled at run
        time (NVRTC may be absent, and compiling takes seconds)."""
        if BEHAVIOR_NOTE["RUNTIME_COMPILATION"] in self.behavior:
            return False
        if not allow_tensor_cores and (self.has("TENSOR_CORE") or
                                       self.has("DOWN_CONVERT_INPUTS")):
            return False
        return not (deterministic and self.has("NONDETERMINISTIC"))


def engine_configs(graph, modes=("A", "FALLBACK")):
    """Engine configurations for ``graph``, heuristics mode A's order first, then the
    fallback list's that mode A did not name (each name once)."""
    out, seen = [], set()
    for mode in modes:
        heur = Backend("ENGINEHEUR_DESCRIPTOR")
        heur.set("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", [graph])
        heur.set("ENGINEHEUR_MODE", "HEUR_MODE", [HEUR_MODE[mode]])
        try:
            heur.finalize()
            cfgs = heur.get_descriptors("ENGINEHEUR_RESULTS", "ENGINECFG_DESCRIPTOR")
        except CudnnError:
            continue            # a mode with nothing for this graph
        finally:
            heur.close()
        for cfg in cfgs:
            ec = EngineConfig(cfg)
            if ec.name in seen:
                cfg.close()
                continue
            seen.add(ec.name)
            out.append(ec)
    return out


class Plan:
    """A finalized execution plan with its workspace size and the unique ids of its tensors
    in variant-pack order. Plans belong to one handle, so to one thread: ``execute`` needs no
    lock."""

    # A loop that rotates its inputs (or a benchmark) cycles through several address sets;
    # a cache of 16 emptied on overflow rebuilds a pack on every call of such a loop (float16
    # convolutions on an H100: ~20 us of host time per call). The oldest goes first.
    PACKS_MAX = 64

    def __init__(self, handle, config, uids):
        self.config, self.name = config, config.name
        p = Backend("EXECUTION_PLAN_DESCRIPTOR")
        try:
            p.set("EXECUTION_PLAN_HANDLE", "HANDLE", [handle])
            p.set("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", [config.cfg])
            p.finalize()
            self.workspace = int(p.get("EXECUTION_PLAN_WORKSPACE_SIZE", "INT64")[0])
        except Exception:
            p.close()
            raise
        self.plan = p
        self._execute = api.function("cudnnBackendExecute")   # of the library that made p
        self.uids = (c_int64 * len(uids))(*uids)
        self.n = len(uids)
        # variant packs by (pointers, workspace): a training loop's arrays come back at the
        # same addresses from the caching allocator, so most calls reuse a finalized pack
        # (six cuDNN calls saved per call)
        self.packs = {}

    def close(self):
        self.plan.close()
        self.drop_packs()

    def drop_packs(self):
        # each pack is destroyed by its finalizer once no call holds it (another thread's
        # empty_cache() may run while this plan's thread is inside execute())
        self.packs = {}

    def _pack(self, key):
        vp = Backend("VARIANT_PACK_DESCRIPTOR")
        ptrs = (c_void_p * self.n)(*key[:-1])
        ws = c_void_p(key[-1])
        for attr, t, n, arr in ((_VP_UIDS, _T_INT64, self.n, self.uids),
                                (_VP_PTRS, _T_VOID_PTR, self.n, ptrs),
                                (_VP_WS, _T_VOID_PTR, 1, ctypes.byref(ws))):
            vp._checked("cudnnBackendSetAttribute", vp.ptr, attr, t, n, arr,
                        context="VARIANT_PACK_DESCRIPTOR: set")
        vp.finalize()
        packs = self.packs
        if len(packs) >= self.PACKS_MAX:
            packs.pop(next(iter(packs)), None)
        packs[key] = vp
        return vp

    def execute(self, handle, pointers, workspace, context=""):
        """Run the plan on ``pointers`` (ints, in uid order) with a ``workspace`` pointer
        (the host cost of a repeated convolution: a pack lookup and one cuDNN call)."""
        key = (*pointers, workspace)
        vp = self.packs.get(key) or self._pack(key)
        status = self._execute(handle, self.plan.ptr, vp.ptr)
        if status:
            api.check("cudnnBackendExecute", status, context)


_VP_UIDS, _VP_PTRS, _VP_WS = (ATTR["VARIANT_PACK_UNIQUE_IDS"], ATTR["VARIANT_PACK_DATA_POINTERS"],
                              ATTR["VARIANT_PACK_WORKSPACE"])
_T_INT64, _T_VOID_PTR = ATTR_TYPE["INT64"], ATTR_TYPE["VOID_PTR"]


def alignment(pointers):
    """The largest power of two up to 16 dividing every pointer (a tensor's byte alignment
    is part of its descriptor, so of the plan's key)."""
    bits = 16
    for p in pointers:
        bits |= p or 0
    return min(16, bits & -bits)      # the lowest set bit of all of them
