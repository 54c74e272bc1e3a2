"""Fuzz cases: rnn_forward/rnn_backward through dnnkit.RNN; the losses (cross_entropy, nll_loss,
mse_loss and their gradients)."""

import numpy as np
from hypothesis import strategies as st

import dnnkit
from dnnkit import reference
from dnnkit.rnn_layout import MODES

from .common import (COMMON, Presenter, common_mistake, compare, draw_dims, draw_dtype,
                     draw_mistake, draw_size, expect, host, normal, pick, seed_rng)

RNN_TOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}   # tests/ops/test_rnn.py
CTOR_MISTAKES = ("unknown mode", "hidden_size 0", "num_layers 0", "input_size bool",
                 "skip with input_size != hidden_size", "dtype int32", "bidirectional str",
                 "unknown input_mode")
FWD_MISTAKES = COMMON + CTOR_MISTAKES + (
    "x input_size", "x rank 2", "T = 0", "N = 0", "x dtype", "w size", "hx shape",
    "cx for a non-lstm", "lengths > T", "lengths 0", "lengths float", "lengths shape",
    "training not a bool")
BWD_MISTAKES = COMMON + ("state None", "dy shape", "dhy shape", "dy dtype")


def rnn_case(data, backend, op):
    rng = seed_rng(data)
    backward = op == "rnn_backward"
    dtype = draw_dtype(data)
    mode = data.draw(st.sampled_from(MODES), label="mode")
    hsz = data.draw(st.integers(1, 3), label="hidden")
    skip = data.draw(st.booleans(), label="skip")
    isz = hsz if skip else data.draw(st.integers(1, 3), label="input")
    layers = data.draw(st.integers(1, 2), label="layers")
    bidir = data.draw(st.booleans(), label="bidirectional")
    batch_first = data.draw(st.booleans(), label="batch_first")
    t, n = data.draw(st.integers(1, 3), label="T"), data.draw(st.integers(1, 2), label="N")
    lengths = None
    if data.draw(st.booleans(), label="varlen"):
        lengths = [data.draw(st.integers(1, t), label="length") for _ in range(n)]
    with_states = data.draw(st.booleans(), label="hx/cx")
    mistake = draw_mistake(data, BWD_MISTAKES if backward else FWD_MISTAKES)
    bad, be = common_mistake(data, mistake, rng, (t, n, isz), backend)
    ctor = dict(bidirectional=bidir, input_mode="skip" if skip else "linear",
                batch_first=batch_first, dtype=dtype)
    args = [mode, isz, hsz, layers]
    if mistake in CTOR_MISTAKES:
        i = CTOR_MISTAKES.index(mistake)
        if i < 4:
            args[[0, 2, 3, 1][i]] = ["lstm2", 0, 0, True][i]
        elif mistake.startswith("skip"):
            args[1], ctor["input_mode"] = hsz + 1, "skip"
        elif mistake == "dtype int32":
            ctor["dtype"] = pick(data, ["int32", "bfloat16", None])
        elif mistake == "bidirectional str":
            ctor["bidirectional"] = "yes"
        else:
            ctor["input_mode"] = "identity"
        return expect(op, lambda: dnnkit.RNN(*args, **ctor), None, mistake, [],
                      names=("RNN",))
    rnn = dnnkit.RNN(*args, **ctor)
    d = 2 if bidir else 1
    w = (rng.uniform(-1, 1, rnn.param_size) / np.sqrt(hsz)).astype(dtype)
    x = normal(rng, (t, n, isz), dtype)
    sshape = (layers * d, n, hsz)
    hx = normal(rng, sshape, dtype, 0.5) if with_states else None
    cx = normal(rng, sshape, dtype, 0.5) if with_states and mode == "lstm" else None
    bf = (lambda a: a.swapaxes(0, 1)) if batch_first else (lambda a: a)
    training = True
    x_call = x
    if mistake == "x input_size":
        x_call = normal(rng, (t, n, isz + 1), dtype)
    elif mistake == "x rank 2":
        x_call = normal(rng, (t, isz), dtype)
    elif mistake in ("T = 0", "N = 0"):
        x_call = normal(rng, (0, n, isz) if mistake == "T = 0" else (t, 0, isz), dtype)
    elif mistake == "x dtype":
        x_call = x.astype("float64" if dtype != "float64" else "float32")
    elif mistake == "w size":
        w = w[:-1]
    elif mistake == "hx shape":
        hx = normal(rng, (layers * d + 1, n, hsz), dtype)
    elif mistake == "cx for a non-lstm":
        cx = normal(rng, sshape, dtype)
        if mode == "lstm":
            cx = normal(rng, (layers * d, n, hsz + 1), dtype)
    elif mistake == "lengths > T":
        lengths = [t + 1] * n
    elif mistake == "lengths 0":
        lengths = [0] * n
    elif mistake == "lengths float":
        lengths = [1.0] * n
    elif mistake == "lengths shape":
        lengths = [1] * (n + 1)
    elif mistake == "training not a bool":
        training = "yes"
    present = Presenter(data)
    tol = RNN_TOL[dtype] * (5 if backend == "cudnn" else 1)
    names = ("RNN", op)
    wi = present(w, "w")
    xi = bad[0] if bad else present(bf(x_call), "x")
    hxi = present(hx, "hx") if hx is not None else None
    cxi = present(cx, "cx") if cx is not None else None
    if not backward:
        def check(out):
            ry, rhy, rcy = reference.rnn_forward(rnn.cfg, w, x, hx, cx, lengths)
            compare("rnn_forward y", out.y, bf(ry), tol, floor=1e-30, dtype=dtype)
            compare("rnn_forward hy", out.hy, rhy, tol, floor=1e-30, dtype=dtype)
            if mode == "lstm":
                compare("rnn_forward cy", out.cy, rcy, tol, floor=1e-30, dtype=dtype)
            else:
                assert out.cy is None
            assert out.state is not None and out.state.backend in ("numba", "cudnn")
        return expect(op, lambda: rnn.forward(wi, xi, hxi, cxi, training=training,
                                              lengths=lengths, backend=be), check, mistake,
                      present.bad, names=names)
    # backward: the forward first (valid, on the backend under test)
    out = rnn.forward(w, bf(x), hx, cx, training=True, lengths=lengths, backend=backend)
    dy = normal(rng, (t, n, d * hsz), dtype)
    dhy = normal(rng, sshape, dtype, 0.5) if with_states else None
    dcy = normal(rng, sshape, dtype, 0.5) if with_states and mode == "lstm" else None
    state = out.state
    if mistake == "state None":
        state = pick(data, [None, "state", 3])
    elif mistake == "dy shape":
        dy = normal(rng, (t, n, d * hsz + 1), dtype)
    elif mistake == "dhy shape":
        dhy = normal(rng, (layers * d, n + 1, hsz), dtype)
    elif mistake == "dy dtype":
        dy = dy.astype("float64" if dtype != "float64" else "float16")
    y_host = host(out.y)
    yi, dyi = present(y_host, "y"), bad[0] if bad else present(bf(dy), "dy")
    dhyi = present(dhy, "dhy") if dhy is not None else None
    dcyi = present(dcy, "dcy") if dcy is not None else None

    def check_bwd(res):
        dx, dhx, dcx, dw = res
        rdx, rdhx, rdcx, rdw = reference.rnn_backward(rnn.cfg, w, x, dy, dhy, dcy, hx, cx, lengths)
        compare("rnn_backward dx", dx, bf(rdx), 2 * tol, floor=1e-30, dtype=dtype)
        compare("rnn_backward dhx", dhx, rdhx, 2 * tol, floor=1e-30, dtype=dtype)
        compare("rnn_backward dw", dw, rdw, 2 * tol, floor=1e-30, dtype=dtype)
        if mode == "lstm":
            compare("rnn_backward dcx", dcx, rdcx, 2 * tol, floor=1e-30, dtype=dtype)
    return expect(op, lambda: rnn.backward(wi, xi if not bad else bf(x), yi, dyi, dhyi,
                                           dcyi, hxi, cxi, state=state, lengths=lengths,
                                           backend=be), check_bwd, mistake, present.bad,
                  names=names)


# ---------------------------------------------------------------- losses

LOSS_TOL = {"float16": 1e-2, "float32": 1e-6, "float64": 1e-12}   # tests/ops/test_loss.py
LOSS_OPS = ("cross_entropy", "cross_entropy_backward", "nll_loss", "nll_loss_backward",
            "mse_loss", "mse_loss_backward")
NLL_MISTAKES = COMMON + ("unknown reduction", "ignore_index not an int", "input 1-D",
                         "target shape", "target float", "target out of range")
MSE_MISTAKES = COMMON + ("unknown reduction", "target shape", "target str", "dtype mismatch")
DY_MISTAKES = ("dy shape", "dy dtype")


def _reduce(per, counted, reduction, count):
    """The loss from per-position values (float64) under ``reduction``."""
    if reduction == "none":
        return per
    total = per[counted].sum() if per.size else 0.0
    if reduction == "sum":
        return np.float64(total)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.float64(total) / count          # NaN when nothing counts: 0/0, as PyTorch


def _nll_ref(x, target, reduction, ignore, log_softmax, dy):
    """(loss, gradient wrt x) in float64; x (N, C, *s), target (N, *s); device-invalid
    targets (outside [0, C), not ``ignore``) give NaN at their position."""
    x = np.moveaxis(np.asarray(x, np.float64), 1, -1)           # (N, *s, C)
    c = x.shape[-1]
    if log_softmax and x.size:
        m = x.max(axis=-1, keepdims=True)
        x = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    keep = target != ignore
    valid = (target >= 0) & (target < c)
    t = np.where(keep & valid, target, 0)
    picked = np.take_along_axis(x, t[..., None], axis=-1)[..., 0] if x.size else \
        np.zeros(target.shape)
    per = np.where(keep, np.where(valid, -picked, np.nan), 0.0)
    count = int(keep.sum())
    loss = _reduce(per, keep, reduction, count)
    if dy is None:
        return loss, per
    g = np.asarray(dy, np.float64)
    g = g / count if reduction == "mean" and count else g * (reduction != "mean" or count)
    g = np.broadcast_to(g, target.shape) * keep
    onehot = np.zeros_like(x)
    if x.size:
        np.put_along_axis(onehot, t[..., None], 1.0, axis=-1)
    grad = (np.exp(x) - onehot) if log_softmax else -onehot
    grad = grad * g[..., None]
    return loss, np.moveaxis(grad, -1, 1)



def loss_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]), label="reduction")
    n = draw_size(data, 0, 3, "N")
    backward = op.endswith("_backward")
    base = op[:-len("_backward")] if backward else op
    mistake = draw_mistake(data, (MSE_MISTAKES if base == "mse_loss" else NLL_MISTAKES)
                           + (DY_MISTAKES if backward else ()))
    red = pick(data, ["avg", "MEAN", None, ["sum"], {"sum": 1}]) \
        if mistake == "unknown reduction" else reduction
    present = Presenter(data)
    tol = LOSS_TOL[dtype]
    fn = getattr(dnnkit, op)
    if base == "mse_loss":
        shape = (n,) + draw_dims(data, data.draw(st.integers(0, 3), label="rank"), 0, 3)
        x, tgt = normal(rng, shape, dtype), normal(rng, shape, dtype)
        bad, be = common_mistake(data, mistake, rng, shape, backend)
        xc, tc = x, tgt
        if mistake == "target shape":
            tc = normal(rng, shape + (2,), dtype)
        elif mistake == "target str":
            tc = np.full(shape, "a")
        elif mistake == "dtype mismatch":
            tc = tgt.astype("float64" if dtype != "float64" else "float32")
        dy = normal(rng, shape if reduction == "none" else (), dtype)
        dyc = dy
        if mistake == "dy shape":
            dyc = normal(rng, shape + (2,) if reduction == "none" else (2,), dtype)
        elif mistake == "dy dtype":
            dyc = dy.astype("float64" if dtype != "float64" else "float32")
        xi = bad[0] if bad else present(xc, "x")
        ti = present(tc, "target")
        args = (xi, ti, present(dyc, "dy")) if backward else (xi, ti)

        def check_mse(out):
            d = x.astype(np.float64) - tgt.astype(np.float64)
            if not backward:
                want = _reduce(d * d, np.ones(d.shape, bool), reduction, d.size)
                compare(op, out, want, tol, dtype=dtype)
                return
            g = dy.astype(np.float64)
            g = g / d.size if reduction == "mean" and d.size else g
            compare(op, out, 2 * d * g, tol, dtype=dtype)
        return expect(op, lambda: fn(*args, red, backend=be), check_mse, mistake, present.bad)
    c = data.draw(st.integers(1, 4), label="C")
    spatial = draw_dims(data, data.draw(st.integers(0, 2), label="rank"), 0, 3)
    ignore = data.draw(st.sampled_from([-100, 0, 2]), label="ignore_index")
    x = normal(rng, (n, c) + spatial, dtype, 2.0)
    tgt = rng.integers(0, c, (n,) + spatial)
    if data.draw(st.booleans(), label="some ignored"):
        tgt[rng.random(tgt.shape) < 0.3] = ignore
    # a target out of range given on the device: no read back, so no error -- its loss and
    # gradient row are NaN (ops/loss.py)
    device_bad = not backward and tgt.size and data.draw(st.integers(0, 5),
                                                         label="device bad target?") == 0
    if device_bad:
        tgt.flat[0] = c + 1 if ignore != c + 1 else c + 2
    device_bad = device_bad and mistake is None
    bad, be = common_mistake(data, mistake, rng, x.shape, backend)
    xc, tc, ig = x, tgt, ignore
    if mistake == "ignore_index not an int":
        ig = pick(data, [1.5, "0", None, True, [0]])
    elif mistake == "input 1-D":
        xc = normal(rng, (c,), dtype)
    elif mistake == "target shape":
        tc = rng.integers(0, c, (n + 1,) + spatial)
    elif mistake == "target float":
        tc = tgt.astype(np.float32)
    elif mistake == "target out of range":
        tc = np.full((max(n, 1),) + tuple(max(s, 1) for s in spatial),
                     pick(data, [c, c + 3, -1, -7]))
        if ig in np.unique(tc):
            tc[...] = c + 5
        xc = normal(rng, (max(n, 1), c) + tuple(max(s, 1) for s in spatial), dtype)
    dy = normal(rng, tgt.shape if reduction == "none" else (), dtype)
    dyc = dy
    if mistake == "dy shape":
        dyc = normal(rng, tgt.shape + (2,) if reduction == "none" else (2,), dtype)
    elif mistake == "dy dtype":
        dyc = dy.astype("float64" if dtype != "float64" else "float32")
    from numba import cuda
    xi = bad[0] if bad else present(xc, "input")
    # (an out-of-range target is refused only on the host: on the device it gives NaN)
    ti = cuda.to_device(tc) if device_bad else tc if mistake == "target out of range" else \
        present(tc, "target")
    args = (xi, ti, present(dyc, "dy")) if backward else (xi, ti)

    def check_nll(out):
        loss, more = _nll_ref(x, tgt, reduction, ignore, base == "cross_entropy",
                              dy if backward else None)
        if backward:
            compare(op, out, more, tol, floor=1.0, dtype=dtype)
        else:       # a sum's error scales with its terms' magnitudes (they may cancel)
            compare(op, out, loss, tol, floor=float(np.nansum(np.abs(more))), dtype=dtype)
    return expect(op, lambda: fn(*args, red, ig, backend=be), check_nll, mistake, present.bad)
