"""Fuzz cases: rnn_forward/rnn_backward through dnnkit.RNN, CrossEntropyLoss, MSELoss."""

import numpy as np
from hypothesis import strategies as st

import dnnkit
from dnnkit import reference
from dnnkit.nn.loss import CrossEntropyLoss, MSELoss
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

LOSS_TOL = {"float16": 1e-2, "float32": 1e-6, "float64": 1e-12}   # tests/nn/test_loss.py
CE_MISTAKES = ("unknown reduction", "ignore_index float", "logits 1-D", "target shape",
               "target float", "target out of range", "logits int", "logits not an array",
               "device target out of range")
MSE_MISTAKES = ("unknown reduction", "target shape", "target str", "x int", "dtype mismatch")


def ce_ref(x, target, reduction, ignore):
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    keep = target != ignore
    t = np.where(keep, target, 0)
    picked = np.take_along_axis(logp, t[:, None], axis=1)[:, 0]
    k = keep.sum() if reduction == "mean" else 1
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = -(picked * keep).sum() / k
    onehot = np.zeros_like(x)
    np.put_along_axis(onehot, t[:, None], 1.0, axis=1)
    grad = (np.exp(logp) - onehot) * keep[:, None] / (k if k else 1)
    return loss, grad


def loss_case(data, backend, op):
    from numba import cuda
    rng = seed_rng(data)
    which = op
    dtype = draw_dtype(data)
    reduction = data.draw(st.sampled_from(["mean", "sum"]), label="reduction")
    n = draw_size(data, 0, 3, "N")
    mistake = draw_mistake(data, CE_MISTAKES if which == "CrossEntropyLoss" else MSE_MISTAKES)
    red = pick(data, ["avg", "none", None]) if mistake == "unknown reduction" else reduction
    present = Presenter(data)
    tol = LOSS_TOL[dtype]
    if which == "MSELoss":
        shape = (n,) + draw_dims(data, data.draw(st.integers(0, 3), label="rank"), 0, 3)
        x, tgt = normal(rng, shape, dtype), normal(rng, shape, dtype)
        xc, tc = x, tgt
        if mistake == "target shape":
            tc = normal(rng, shape + (2,), dtype)
        elif mistake == "target str":
            tc = np.full(shape, "a")
        elif mistake == "x int":
            xc = rng.integers(0, 3, shape)
        elif mistake == "dtype mismatch":
            tc = cuda.to_device(tgt.astype("float64" if dtype != "float64" else "float32"))
        xi, ti = present(xc, "x"), present(tc, "target")

        def call_mse():
            loss = MSELoss(red)
            return loss.forward(xi, ti), loss.backward()

        def check_mse(out):
            val, dx = out
            d = x.astype(np.float64) - tgt.astype(np.float64)
            k = d.size if reduction == "mean" else 1
            want = (d * d).sum() / k if k else np.nan
            assert (np.isnan(val) and np.isnan(want)) or \
                abs(val - want) <= tol * max(abs(want), 1e-30), (val, want)
            compare("MSELoss backward", dx, 2 * d / (k if k else 1), tol, dtype=dtype)
        return expect(which, call_mse, check_mse, mistake, present.bad)
    c = data.draw(st.integers(1, 4), label="C")
    spatial = draw_dims(data, data.draw(st.integers(0, 2), label="rank"), 0, 3)
    ignore = data.draw(st.sampled_from([-100, 0, 2]), label="ignore_index")
    x = normal(rng, (n, c) + spatial, dtype, 2.0)
    tgt = rng.integers(0, c, (n,) + spatial)
    if data.draw(st.booleans(), label="some ignored"):
        tgt[rng.random(tgt.shape) < 0.3] = ignore
    xc, tc, ig = x, tgt, ignore
    if mistake == "ignore_index float":
        ig = pick(data, [1.5, "0", None, True])
    elif mistake == "logits 1-D":
        xc = normal(rng, (c,), dtype)
    elif mistake == "target shape":
        tc = rng.integers(0, c, (n + 1,) + spatial)
    elif mistake == "target float":
        tc = tgt.astype(np.float32)
    elif mistake in ("target out of range", "device target out of range"):
        tc = np.full((max(n, 1),) + spatial, pick(data, [c, c + 3, -1, -7]))
        xc = normal(rng, (max(n, 1), c) + spatial, dtype)
        if tc.size == 0 or ig == tc.flat[0]:   # ignore_index is allowed; an empty target too
            tc = np.full((max(n, 1),) + tuple(max(s, 1) for s in spatial), c + 3)
            xc = normal(rng, (max(n, 1), c) + tuple(max(s, 1) for s in spatial), dtype)
        if mistake.startswith("device"):
            tc = cuda.to_device(tc)
    elif mistake == "logits int":
        xc = rng.integers(0, 3, x.shape)
    elif mistake == "logits not an array":
        xc = pick(data, ["logits", None])
    xi = present(xc, "logits") if isinstance(xc, np.ndarray) else xc
    ti = present(tc, "target") if isinstance(tc, np.ndarray) else tc

    def call_ce():
        loss = CrossEntropyLoss(red, ig)
        return loss.forward(xi, ti), loss.backward()

    def check_ce(out):
        val, dx = out
        want, grad = ce_ref(x, tgt, reduction, ignore)
        assert (np.isnan(val) and np.isnan(want)) or \
            abs(val - want) <= tol * max(abs(want), 1.0), (val, want)
        compare("CrossEntropyLoss backward", dx, grad, tol, floor=1e-30, dtype=dtype)
    return expect(which, call_ce, check_ce, mistake, present.bad)
