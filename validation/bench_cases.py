"""The cases of the benchmark report (validation/bench.py): every op, forward and backward, on
the shapes of the performance targets, each with its dnnkit calls per backend, PyTorch's
equivalent and a float64 reference.

A case holds SETS input sets (fresh random draws, rotated between timed calls so the L2 cache
does not flatter small ops), ``impl[backend](inp)`` -> tuple of outputs, ``torch(T, inp)`` ->
a thunk running PyTorch's equivalent on the same memory (zero-copy through
``__cuda_array_interface__``), and ``ref(T, inp)`` -> tuple of float64 outputs (PyTorch in
float64 on the GPU; without PyTorch the cuDNN result serves as the reference). ``work`` is
("flop", n) for compute-bound ops and ("byte", n) (bytes read + written, each once) for the
memory-bound ones.
"""

import dataclasses
import math

import numpy as np

import dnnkit
from dnnkit import RNN

SETS = 2


@dataclasses.dataclass
class Case:
    op: str
    shape: str
    dtype: str
    make: object                      # rng -> dict of device inputs
    impl: dict                        # backend -> fn(inp) -> tuple of device arrays
    ref: object = None                # (torch, inp) -> tuple of float64 tensors/arrays
    torch: object = None              # (torch, inp) -> thunk
    work: tuple = ("flop", 0.0)
    tol: float = 1e-5
    flags: dict = dataclasses.field(default_factory=dict)   # dnnkit flags while it runs


def _dev(rng, shape, dtype="float32", scale=1.0):
    from numba import cuda
    return cuda.to_device((rng.standard_normal(shape) * scale).astype(dtype))


def _t(T, a):
    return T.as_tensor(a, device="cuda")


def _d(T, a):
    return _t(T, a).double()


# ---------------------------------------------------------------- convolution

RESNET50 = [(3, 64, 224, 7, 2, 3), (64, 64, 56, 3, 1, 1), (256, 64, 56, 1, 1, 0),
            (128, 128, 28, 3, 1, 1), (256, 256, 14, 3, 1, 1), (512, 512, 7, 3, 1, 1)]
CONV_ALGO = {f"dnn.conv.{d}": "guess_once" for d in ("algo_fwd", "algo_bwd_data",
                                                      "algo_bwd_filter")}


def conv_cases(batch=32, dtype="float32", directions=("fwd", "bwd_data", "bwd_filter"),
               tf32=False, backends=("numba", "cudnn")):
    out = []
    for c, k, hw, r, st, pad in RESNET50:
        oh = (hw + 2 * pad - r) // st + 1
        kw = dict(stride=st, padding=pad)

        def make(rng, c=c, k=k, hw=hw, r=r, oh=oh):
            return dict(x=_dev(rng, (batch, c, hw, hw), dtype),
                        w=_dev(rng, (k, c, r, r), dtype, 1 / math.sqrt(c * r * r)),
                        dy=_dev(rng, (batch, k, oh, oh), dtype))
        calls = {
            "fwd": lambda b, kw=kw: lambda i: (dnnkit.conv2d(i["x"], i["w"], backend=b, **kw),),
            "bwd_data": lambda b, kw=kw: lambda i: (dnnkit.conv2d_backward_data(
                i["dy"], i["w"], i["x"].shape, backend=b, **kw),),
            "bwd_filter": lambda b, kw=kw: lambda i: (dnnkit.conv2d_backward_filter(
                i["x"], i["dy"], i["w"].shape, backend=b, **kw),)}

        def torch_fn(direction, st=st, pad=pad, double=False):
            def fn(T, i):
                cv = _d if double else _t
                x, w, dy = cv(T, i["x"]), cv(T, i["w"]), cv(T, i["dy"])
                g = T.nn.grad
                f = {"fwd": lambda: T.nn.functional.conv2d(x, w, stride=st, padding=pad),
                     "bwd_data": lambda: g.conv2d_input(x.shape, w, dy, st, pad),
                     "bwd_filter": lambda: g.conv2d_weight(x, w.shape, dy, st, pad)}[direction]
                return (lambda: (f(),)) if double else f
            return fn
        flop = 2.0 * batch * k * oh * oh * c * r * r
        label = f"{c}->{k} {hw}^2 {r}x{r}/{st}"
        flags = dict(CONV_ALGO, **{"dnn.conv.allow_tf32": tf32})
        tol = {"float16": 1e-2, "float32": 3e-3 if tf32 else 1e-4}.get(dtype, 1e-4)
        suffix = " tf32" if tf32 else ""
        for d in directions:
            ref = torch_fn(d, double=True)
            out.append(Case(f"conv2d {d}{suffix}", label, dtype, make,
                            {b: calls[d](b) for b in backends},
                            ref=lambda T, i, ref=ref: ref(T, i)(), torch=torch_fn(d),
                            work=("flop", flop), tol=tol, flags=flags))
    return out


# ---------------------------------------------------------------- memory-bound ops

ACT = (64, 256, 56, 56)


def pool_cases(dtype="float32"):
    shape, args = (64, 64, 112, 112), (3, 2, 1)
    n = math.prod(shape)
    ny = 64 * 64 * 56 * 56
    isz = np.dtype(dtype).itemsize

    def make(rng):
        i = dict(x=_dev(rng, shape, dtype))
        i["y"] = dnnkit.pool2d(i["x"], *args, backend="numba")
        i["dy"] = _dev(rng, i["y"].shape, dtype)
        return i

    def tfwd(T, i, cv=_t):
        return T.nn.functional.max_pool2d(cv(T, i["x"]), 3, 2, 1, return_indices=True)

    def tbwd(T, i):
        x = _t(T, i["x"])
        _, idx = tfwd(T, i)
        dy = _t(T, i["dy"])
        return lambda: T.ops.aten.max_pool2d_with_indices_backward(dy, x, [3, 3], [2, 2],
                                                                    [1, 1], [1, 1], False, idx)

    def rbwd(T, i):
        x = _d(T, i["x"]).requires_grad_()
        T.nn.functional.max_pool2d(x, 3, 2, 1).backward(_d(T, i["dy"]))
        return (x.grad,)
    return [
        Case("pool2d max 3/2/1 fwd", "64x64x112x112", dtype, make,
             {b: (lambda b: lambda i: (dnnkit.pool2d(i["x"], *args, backend=b),))(b)
              for b in ("numba", "cudnn")},
             ref=lambda T, i: (tfwd(T, i, _d)[0],),
             torch=lambda T, i: lambda: tfwd(T, i), work=("byte", (n + ny) * isz)),
        Case("pool2d max 3/2/1 bwd", "64x64x112x112", dtype, make,
             {b: (lambda b: lambda i: (dnnkit.pool2d_backward(i["x"], i["y"], i["dy"], *args,
                                                              backend=b),))(b)
              for b in ("numba", "cudnn")},
             ref=rbwd, torch=tbwd, work=("byte", (2 * n + ny) * isz))]


def _bn_make(dtype):
    def make(rng):
        c = ACT[1]
        i = dict(x=_dev(rng, ACT, dtype), dy=_dev(rng, ACT, dtype),
                 g=_dev(rng, (c,), "float32"), b=_dev(rng, (c,), "float32"),
                 rm=_dev(rng, (c,), "float32"))
        from numba import cuda
        i["rv"] = cuda.to_device(np.abs(i["rm"].copy_to_host()) + 0.5)
        _, i["mean"], i["invstd"] = dnnkit.batch_norm_train(i["x"], i["g"], i["b"],
                                                             backend="numba")
        return i
    return make


def bn_cases(dtype="float32"):
    n, isz, eps = math.prod(ACT), np.dtype(dtype).itemsize, 1e-5
    make = _bn_make(dtype)

    def tref(T, i, training):
        x = _d(T, i["x"]).requires_grad_(training)
        y = T.nn.functional.batch_norm(x, _d(T, i["rm"]).clone(), _d(T, i["rv"]).clone(),
                                       _d(T, i["g"]), _d(T, i["b"]), training, 0.1, eps)
        if not training:
            return (y,)
        return y, x

    def ref_bwd(T, i):
        y, x = tref(T, i, True)
        y.backward(_d(T, i["dy"]))
        return (x.grad,)

    def torch_train(T, i):
        x, g, b = _t(T, i["x"]), _t(T, i["g"]), _t(T, i["b"])
        rm, rv = _t(T, i["rm"]).clone(), _t(T, i["rv"]).clone()
        return lambda: T.native_batch_norm(x, g, b, rm, rv, True, 0.1, eps)

    def torch_inf(T, i):
        x, g, b, rm, rv = (_t(T, i[k]) for k in ("x", "g", "b", "rm", "rv"))
        return lambda: T.native_batch_norm(x, g, b, rm, rv, False, 0.1, eps)

    def torch_bwd(T, i):
        x, g, dy = _t(T, i["x"]), _t(T, i["g"]), _t(T, i["dy"])
        _, m, s = T.native_batch_norm(x, g, _t(T, i["b"]), None, None, True, 0.1, eps)
        return lambda: T.ops.aten.native_batch_norm_backward(dy, x, g, None, None, m, s, True,
                                                              eps, [True, True, True])

    def train(b):
        return lambda i: dnnkit.batch_norm_train(i["x"], i["g"], i["b"], backend=b)[:1]

    def inference(b):
        return lambda i: (dnnkit.batch_norm_inference(i["x"], i["g"], i["b"], i["rm"], i["rv"],
                                                      backend=b),)

    def backward(b):
        return lambda i: dnnkit.batch_norm_backward(i["x"], i["dy"], i["g"], i["mean"],
                                                    i["invstd"], backend=b)[:1]
    label, bk = "64x256x56x56", ("numba", "cudnn")
    return [
        Case("batch_norm train", label, dtype, make, {b: train(b) for b in bk},
             ref=lambda T, i: tref(T, i, True)[:1], torch=torch_train,
             work=("byte", 3 * n * isz), tol=1e-4),
        Case("batch_norm inference", label, dtype, make, {b: inference(b) for b in bk},
             ref=lambda T, i: tref(T, i, False), torch=torch_inf, work=("byte", 2 * n * isz),
             tol=1e-4),
        Case("batch_norm backward", label, dtype, make, {b: backward(b) for b in bk},
             ref=ref_bwd, torch=torch_bwd, work=("byte", 4 * n * isz), tol=1e-4)]


def relu_cases(dtype="float32"):
    n, isz = math.prod(ACT), np.dtype(dtype).itemsize

    def make(rng):
        i = dict(x=_dev(rng, ACT, dtype), dy=_dev(rng, ACT, dtype))
        i["y"] = dnnkit.relu(i["x"], backend="numba")
        return i
    bk = ("numba", "cudnn")
    return [
        Case("relu fwd", "64x256x56x56", dtype, make,
             {b: (lambda b: lambda i: (dnnkit.relu(i["x"], backend=b),))(b) for b in bk},
             ref=lambda T, i: (T.relu(_d(T, i["x"])),),
             torch=lambda T, i: (lambda x: lambda: T.relu(x))(_t(T, i["x"])),
             work=("byte", 2 * n * isz)),
        Case("relu bwd", "64x256x56x56", dtype, make,
             {b: (lambda b: lambda i: (dnnkit.activation_backward(
                 i["x"], i["y"], i["dy"], "relu", backend=b),))(b) for b in bk},
             ref=lambda T, i: (_d(T, i["dy"]) * (_d(T, i["x"]) > 0),),
             torch=lambda T, i: (lambda x, dy: lambda: T.ops.aten.threshold_backward(
                 dy, x, 0))(_t(T, i["x"]), _t(T, i["dy"])),
             work=("byte", 3 * n * isz))]


def softmax_cases(dtype="float32"):
    shape = (8192, 4096)
    n, isz = math.prod(shape), np.dtype(dtype).itemsize
    out = []
    for algo in ("accurate", "log"):
        def make(rng, algo=algo):
            i = dict(x=_dev(rng, shape, dtype, 3.0), dy=_dev(rng, shape, dtype))
            i["y"] = dnnkit.softmax(i["x"], algo, backend="numba")
            return i
        log = algo == "log"
        tf = "log_softmax" if log else "softmax"

        def ref_fwd(T, i, tf=tf):
            return (getattr(T, tf)(_d(T, i["x"]), 1),)

        def ref_bwd(T, i, tf=tf):
            x = _d(T, i["x"]).requires_grad_()
            getattr(T, tf)(x, 1).backward(_d(T, i["dy"]))
            return (x.grad,)

        def t_bwd(T, i, log=log):
            y, dy = _t(T, i["y"]), _t(T, i["dy"])
            f = T.ops.aten._log_softmax_backward_data if log else \
                T.ops.aten._softmax_backward_data
            return lambda: f(dy, y, 1, y.dtype)
        bk = ("numba", "cudnn")
        out += [
            Case(f"softmax {algo} fwd", "8192x4096", dtype, make,
                 {b: (lambda b, a=algo: lambda i: (dnnkit.softmax(i["x"], a, backend=b),))(b)
                  for b in bk},
                 ref=ref_fwd, torch=lambda T, i, tf=tf: (lambda x: lambda: getattr(T, tf)(
                     x, 1))(_t(T, i["x"])), work=("byte", 2 * n * isz)),
            Case(f"softmax {algo} bwd", "8192x4096", dtype, make,
                 {b: (lambda b, a=algo: lambda i: (dnnkit.softmax_backward(
                     i["y"], i["dy"], a, backend=b),))(b) for b in bk},
                 ref=ref_bwd, torch=t_bwd, work=("byte", 3 * n * isz))]
    return out


def dropout_cases(dtype="float32", p=0.5):
    """The reference is x * kept / (1 - p) with each backend's own mask (read off y: a kept
    element of a nonzero x is nonzero); the keep rate is checked in bench.py's tolerance."""
    n, isz = math.prod(ACT), np.dtype(dtype).itemsize

    def make(rng):
        return dict(x=_dev(rng, ACT, dtype), dy=_dev(rng, ACT, dtype))

    def fwd(b):
        def run(i):
            y, st = dnnkit.dropout(i["x"], p, seed=1234, backend=b)
            i["_state_" + b] = st
            return (y,)
        return run

    def bwd(b):
        def run(i):
            if "_state_" + b not in i:
                fwd(b)(i)
            return (dnnkit.dropout_backward(i["dy"], i["_state_" + b], backend=b),)
        return run
    bk = ("numba", "cudnn")
    return [
        Case("dropout fwd", "64x256x56x56", dtype, make, {b: fwd(b) for b in bk},
             ref="self-mask", torch=lambda T, i: (lambda x: lambda: T.native_dropout(
                 x, p, True))(_t(T, i["x"])), work=("byte", 2 * n * isz)),
        Case("dropout bwd", "64x256x56x56", dtype, make, {b: bwd(b) for b in bk},
             ref="self-mask", torch=lambda T, i: (lambda dy, m: lambda: T.ops.aten.
                                                  native_dropout_backward(dy, m, 2.0))(
                 _t(T, i["dy"]), _t(T, i["x"]) > 0), work=("byte", 2 * n * isz + n // 8))]


# ---------------------------------------------------------------- RNN, spatial transformer

RNN_SHAPES = [("lstm", 512, 64, 50), ("gru", 1024, 32, 50), ("lstm", 1024, 16, 100)]


def rnn_cases(dtype="float32"):
    from validation.rnn_bench import _torch_module
    out = []
    for mode, h, n, t in RNN_SHAPES:
        rnn = RNN(mode, h, h, dtype=dtype)
        gates = {"lstm": 4, "gru": 3}[mode]

        def make(rng, rnn=rnn, h=h, n=n, t=t):
            w = rnn.init_params(seed=int(rng.integers(1 << 30)))
            return dict(w=w, x=_dev(rng, (t, n, h), dtype), dy=_dev(rng, (t, n, h), dtype),
                        w_host=w.copy_to_host())

        def fwd(b, rnn=rnn):
            return lambda i: (rnn.forward(i["w"], i["x"], backend=b)[0],)

        def fwdbwd(b, rnn=rnn):
            def run(i):
                res = rnn.forward(i["w"], i["x"], training=True, backend=b)
                return rnn.backward(i["w"], i["x"], res[0], i["dy"], state=res.state)[:1]
            return run

        def tmod(T, i, rnn=rnn, double=False):
            key = "_tmod64" if double else "_tmod"
            if key not in i:
                i[key] = _torch_module(T, rnn, i["w_host"], "float64" if double else dtype)
            return i[key]

        def ref_fwd(T, i, tmod=tmod):
            with T.no_grad():
                return (tmod(T, i, double=True)(_d(T, i["x"]))[0],)

        def ref_bwd(T, i, tmod=tmod):
            x = _d(T, i["x"]).requires_grad_()
            tmod(T, i, double=True)(x)[0].backward(_d(T, i["dy"]))
            return (x.grad,)

        def t_fwd(T, i, tmod=tmod):
            m, x = tmod(T, i), _t(T, i["x"])

            def run():
                with T.no_grad():
                    return m(x)
            return run

        def t_fwdbwd(T, i, tmod=tmod):
            m, x, dy = tmod(T, i), _t(T, i["x"]).clone().requires_grad_(), _t(T, i["dy"])
            return lambda: m(x)[0].backward(dy)
        flop = 2.0 * t * n * 2 * h * gates * h
        label = f"{mode} H={h} N={n} T={t}"
        bk = ("numba", "cudnn")
        out += [Case("rnn fwd", label, dtype, make, {b: fwd(b) for b in bk}, ref=ref_fwd,
                     torch=t_fwd, work=("flop", flop), tol=1e-4),
                Case("rnn fwd+bwd", label, dtype, make, {b: fwdbwd(b) for b in bk},
                     ref=ref_bwd, torch=t_fwdbwd, work=("flop", 3 * flop), tol=1e-4)]
    return out


def spatial_cases(dtype="float32", shape=(64, 3, 224, 224)):
    n, c, h, w = shape
    isz = np.dtype(dtype).itemsize

    def make(rng):
        from numba import cuda
        theta = np.tile(np.array([[0.9, 0.1, 0.05], [-0.1, 0.9, -0.05]]), (n, 1, 1))
        theta += rng.uniform(-0.05, 0.05, theta.shape)
        i = dict(img=_dev(rng, shape, dtype), theta=cuda.to_device(theta.astype(dtype)),
                 dy=_dev(rng, shape, dtype))
        i["grid"] = dnnkit.affine_grid(i["theta"], shape, backend="numba")
        return i

    def fwd(b):
        # the spatial transformer op (Theano's dnn_spatialtf): cuDNN runs its grid generator
        # and sampler, Numba samples at the grid computed in place
        return lambda i: (dnnkit.spatial_transformer(i["img"], i["theta"], backend=b),)

    def bwd(b):
        def run(i):
            dimg, dgrid = dnnkit.grid_sample_backward(i["img"], i["grid"], i["dy"], backend=b)
            return dimg, dnnkit.affine_grid_backward(dgrid, backend=b)
        return run
    def tref(T, i, cv, grad=False):
        F = T.nn.functional
        img = cv(T, i["img"]).requires_grad_(grad)
        th = cv(T, i["theta"]).requires_grad_(grad)
        y = F.grid_sample(img, F.affine_grid(th, list(shape), align_corners=True),
                          align_corners=True)
        return y, img, th

    def ref_bwd(T, i):
        # dimg only: dtheta sums dgrid, whose every term flips where a sample point sits on a
        # pixel edge (a kink of bilinear sampling), and float32 coordinates land on the other
        # side of some edges than float64 ones (validation/spatial_bench.py compares dgrid
        # off the kinks). The zip in bench.rel_error stops at the reference's outputs.
        y, img, th = tref(T, i, _d, True)
        y.backward(_d(T, i["dy"]))
        return (img.grad,)

    def t_bwd(T, i):
        dy = _t(T, i["dy"])

        def run():
            y, img, th = tref(T, i, _t, True)
            y.backward(dy)
        return run
    bk = ("numba", "cudnn")
    label = "x".join(map(str, shape))
    return [
        Case("spatial_tf fwd", label, dtype, make, {b: fwd(b) for b in bk},
             ref=lambda T, i: tref(T, i, _d)[:1],
             torch=lambda T, i: lambda: tref(T, i, _t)[0],
             work=("byte", 2 * n * c * h * w * isz), tol=1e-4),
        Case("spatial_tf bwd", label, dtype, make, {b: bwd(b) for b in bk}, ref=ref_bwd,
             torch=t_bwd, work=("byte", (3 * n * c * h * w + 2 * n * h * w) * isz), tol=1e-4)]


def all_cases(families=None):
    fam = {"conv": conv_cases, "pool": pool_cases, "bn": bn_cases, "relu": relu_cases,
           "softmax": softmax_cases, "dropout": dropout_cases, "rnn": rnn_cases,
           "spatial": spatial_cases,
           # float16 (Numba on HMMA) and TF32 (dnn.conv.allow_tf32 on), every pass
           "mixed": lambda: conv_cases(dtype="float16") + conv_cases(tf32=True)}
    out = []
    for name, fn in fam.items():
        if families is None or name in families:
            out += fn()
    return out
