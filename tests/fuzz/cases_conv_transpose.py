"""Fuzz cases: conv_transpose2d and conv_transpose3d (strides, padding, output_padding up to
max(stride, dilation) - 1 -- beyond the stride too, the zero-extended path -- dilation, groups,
both modes, with and without bias; sizes as ints, tuples, lists or NumPy ints) against the
float64 scatter reference of tests/ops/test_conv_transpose.py.

A mistake must raise the documented exception (ValueError or TypeError, as the docstring says)
whose message names the op and the offending value, and the good call after it must work and
match the reference (a refused call leaves nothing behind: no memo entry, no half-made output).

Hypothesis draws its examples in clumps (mutations of a few earlier ones): 40 examples reach a
handful of the catalogue's mistakes and rarely a zero size. So every example also runs, on its
own geometry, each mistake of the catalogue (argument checks only: host arrays, no kernel runs
before the refusal) and, when valid, the same call with N = 0, C_in = 0 (y = bias) and
C_out = 0: each run covers the whole catalogue and the empty sizes on many geometries.
"""

import types

import numpy as np
from hypothesis import strategies as st

import dnnkit
from tests.ops.test_conv_transpose import ref_transpose

from .common import (COMMON, NOT_ARRAYS, Presenter, bad_dtype_array, compare, draw_dims,
                     draw_dtype, draw_mistake, draw_size, expect, normal, pick, seed_rng)

CT_TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-12}   # conv*_backward_data's
CT_OPS = ("conv_transpose2d", "conv_transpose3d")
SIZE_ARGS = ("stride", "padding", "output_padding", "dilation")
BAD_BACKENDS = ("gpu", "CUDNN", 1, "numba ")
CT_MISTAKES = COMMON + (
    "output_padding >= max(stride, dilation)", "negative output_padding", "stride 0",
    "negative padding", "dilation 0", "size not an int", "size tuple of the wrong length",
    "padding a border mode", "groups not dividing C_in", "groups < 1", "groups not an int",
    "w channels mismatch", "x wrong rank", "w wrong rank", "dtype mismatch", "bias shape",
    "bias dtype", "bias not 1-D", "unknown mode", "unknown algo", "unknown precision",
    "w without taps", "x empty spatial dim", "output below 1")


def _shown(v, nd):
    """A size argument as the op's message shows it: an int as the tuple it stands for."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return repr((int(v),) * nd)
    return repr(v)


def _size_arg(data, t, label):
    """The valid tuple ``t`` as the caller may spell it: an int (when its entries agree), a
    tuple, a list or a tuple of NumPy ints."""
    forms = ["tuple", "list", "numpy"] + (["int"] if len(set(t)) == 1 else [])
    form = data.draw(st.sampled_from(forms), label=f"{label} as")
    return {"int": lambda: t[0], "tuple": lambda: t, "list": lambda: list(t),
            "numpy": lambda: tuple(np.int64(v) for v in t)}[form]()


def _check(op, g, y, x, w, bias):
    """y against the float64 scatter reference of x, w, bias with g's geometry."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    b64 = None if bias is None else bias.astype(np.float64)
    geom = dict(stride=g.stride, padding=g.pad, output_padding=g.opad, dilation=g.dil,
                groups=g.groups, flip=g.mode == "conv")
    ref = ref_transpose(x64, w64, b64, **geom)
    # a sum of products: its rounding scales with the sum of their sizes, not with the
    # (possibly cancelled) result
    size = ref_transpose(np.abs(x64), np.abs(w64), None if b64 is None else np.abs(b64), **geom)
    compare(op, y, ref, 2 * CT_TOL[g.dtype], dtype=g.dtype,
            floor=float(np.abs(size).max(initial=0.0)))


def _mistake(m, g, rng, choose):
    """The call's arguments with mistake ``m`` made -- (x, w, bias, keywords, backend) -- and
    the errors it may raise: [(exception types, words the message contains)]. ``choose(seq,
    label)`` picks the mistake's details (hypothesis for the drawn mistake, an rng for the
    sweep)."""
    op, nd, dtype, kw, be = g.op, g.nd, g.dtype, dict(g.kw), g.backend
    x, w, bias = g.x, g.w, g.bias
    if m == "int dtype":
        x = bad_dtype_array(rng, g.x.shape, choose(["int", "bool", "complex"], "bad dtype"))
        return (x, w, bias, kw, be), [(TypeError, [op, "x", str(x.dtype)])]
    if m == "not an array":
        return (choose(NOT_ARRAYS, "x"), w, bias, kw, be), [(TypeError, [op, "x"])]
    if m == "bad backend":
        be = choose(BAD_BACKENDS, "backend")
        return (x, w, bias, kw, be), [(ValueError, [op, "backend", repr(be)])]
    if m == "output_padding >= max(stride, dilation)":
        i = choose(range(nd), "dim")
        o = list(g.opad)
        o[i] = max(g.stride[i], g.dil[i]) + choose([0, 1], "beyond")
        kw["output_padding"] = tuple(o)
        return (x, w, bias, kw, be), [(ValueError, [op, f"output_padding={tuple(o)}",
                                                    f"stride={g.stride}", f"dilation={g.dil}"])]
    if m in ("negative output_padding", "stride 0", "negative padding", "dilation 0"):
        name = {"negative output_padding": "output_padding", "stride 0": "stride",
                "negative padding": "padding", "dilation 0": "dilation"}[m]
        low = -1 if name in ("padding", "output_padding") else choose([0, -1], "value")
        kw[name] = choose([low, (1,) * (nd - 1) + (low,), (low,) + (0,) * (nd - 1)], name)
        return (x, w, bias, kw, be), [(ValueError, [op, name, _shown(kw[name], nd)])]
    if m == "size not an int":
        name = choose(SIZE_ARGS, "argument")
        kw[name] = choose([1.5, "2", None, True, (1,) * (nd - 1) + ("2",), (1.0,) * nd,
                           (True,) * nd], name)
        return (x, w, bias, kw, be), [(TypeError, [op, name, _shown(kw[name], nd)])]
    if m == "size tuple of the wrong length":
        name = choose(SIZE_ARGS, "argument")
        kw[name] = choose([(1,) * (nd - 1), (0,) * (nd + 1), ()], name)
        return (x, w, bias, kw, be), [(TypeError, [op, name, repr(kw[name])])]
    if m == "padding a border mode":       # conv2d's, not the transposed op's
        kw["padding"] = choose(["valid", "full", "half", "same"], "padding")
        return (x, w, bias, kw, be), [(TypeError, [op, "padding", repr(kw["padding"])])]
    if m == "groups not dividing C_in":
        c = 2 * max(g.cig, 1) + 1
        x, w = normal(rng, (g.n, c) + g.sp, dtype), normal(rng, (c, g.cog) + g.ks, dtype)
        kw["groups"], bias = 2, None if bias is None else normal(rng, (2 * g.cog,), dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, "groups=2", f"C_in={c}"])]
    if m == "groups < 1":
        kw["groups"] = choose([0, -1, np.int64(0)], "groups")
        return (x, w, bias, kw, be), [(ValueError, [op, "groups", repr(kw["groups"])])]
    if m == "groups not an int":   # a bad groups is a ValueError (the docstring)
        kw["groups"] = choose([1.0, 2.5, True, "1", None, (1,)], "groups")
        return (x, w, bias, kw, be), [(ValueError, [op, "groups", repr(kw["groups"])])]
    if m == "w channels mismatch":
        w = normal(rng, (g.cin + choose([1, 2], "extra"), g.cog) + g.ks, dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, f"C_in={g.cin}", repr(w.shape)])]
    if m in ("x wrong rank", "w wrong rank"):
        a = g.x if m[0] == "x" else g.w
        shape = choose([a.shape[:-1], a.shape + (1,), a.shape[1:]], "shape")
        if m[0] == "x":
            x = normal(rng, shape, dtype)
        else:
            w = normal(rng, shape, dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, m[0], f"{nd + 2}-D", repr(shape)])]
    if m == "dtype mismatch":
        other = "float64" if dtype != "float64" else choose(["float32", "float16"], "dtype")
        if choose([True, False], "change x"):
            x = x.astype(other)
        else:
            w = w.astype(other)
        return (x, w, bias, kw, be), [(TypeError, [op, str(w.dtype), str(x.dtype)])]
    if m == "bias shape":
        shape = (g.cout + choose([1, 2], "extra"),)
        bias = normal(rng, shape, dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, "bias", f"({g.cout},)", repr(shape)])]
    if m == "bias dtype":
        other = "float64" if dtype != "float64" else "float32"
        bias = normal(rng, (g.cout,), other)
        return (x, w, bias, kw, be), [(TypeError, [op, "bias", other])]
    if m == "bias not 1-D":
        shape = choose([(g.cout, 1), (1, g.cout), ()], "shape")
        bias = normal(rng, shape, dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, "bias", "1-D", repr(shape)])]
    if m in ("unknown mode", "unknown algo", "unknown precision"):
        name = m.split()[1]
        kw[name] = choose({
            "mode": ["correlation", "CROSS", "full", None, ["cross"], {"conv": 1}],
            # "small" is a forward / filter-gradient algorithm, not a data-gradient one
            "algo": ["fastest", "implicit_gemm", "small", 3, ["none"]],
            "precision": ["bfloat16", "half", "int8", 32, ["float32"]]}[name], name)
        return (x, w, bias, kw, be), [(ValueError, [op, name, repr(kw[name])])]
    if m == "w without taps":
        i = choose(range(nd), "empty tap dim")
        w = normal(rng, g.w.shape[:2 + i] + (0,) + g.w.shape[3 + i:], dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, "tap", repr(w.shape)])]
    if m == "x empty spatial dim":
        i = choose(range(nd), "empty dim")
        x = normal(rng, g.x.shape[:2 + i] + (0,) + g.x.shape[3 + i:], dtype)
        return (x, w, bias, kw, be), [(ValueError, [op, "empty", repr(x.shape)])]
    if m == "output below 1":
        i = choose(range(nd), "dim")
        p = list(g.pad)
        p[i] = g.full[i] // 2 + choose([1, 2], "beyond")       # full - 2p <= -1
        kw["padding"] = tuple(p)
        out = tuple(f - 2 * q for f, q in zip(g.full, p))
        return (x, w, bias, kw, be), [(ValueError, [op, "output size", repr(out),
                                                    f"padding {tuple(p)}"])]
    raise AssertionError(f"no such mistake: {m}")


def _raises_as(op, call, alternatives, why):
    """``call()`` must raise as one of ``alternatives``; the error, for the caller."""
    try:
        call()
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert any(isinstance(e, t) and all(w in msg for w in words)
                   for t, words in alternatives), \
            f"{op} ({why}): {type(e).__name__}: {msg!r}; expected one of {alternatives}"
        return e
    raise AssertionError(f"{op} ({why}): no error")


def _sweep(fn, g, rng, skip):
    """Every mistake of the catalogue but ``skip`` on g's geometry: each must be refused as
    documented."""
    def choose(seq, label):
        return seq[int(rng.integers(len(seq)))]
    for m in CT_MISTAKES:
        if m != skip:
            (x, w, bias, kw, be), alternatives = _mistake(m, g, rng, choose)
            _raises_as(g.op, lambda: fn(x, w, bias, backend=be, **kw), alternatives, m)


def conv_transpose_case(data, backend, op):
    rng = seed_rng(data)
    nd = 3 if op == "conv_transpose3d" else 2
    fn = dnnkit.conv_transpose3d if nd == 3 else dnnkit.conv_transpose2d
    g = types.SimpleNamespace(op=op, nd=nd, backend=backend, dtype=draw_dtype(data))
    g.groups = data.draw(st.integers(1, 2), label="groups")
    g.cig = draw_size(data, 0, 2, "C_in/g", zero_pct=8)
    g.cog = draw_size(data, 0, 2, "C_out/g", zero_pct=8)
    g.n = draw_size(data, 0, 2, "N")
    hi = 3 if nd == 2 else 2
    g.ks = draw_dims(data, nd, 1, hi, "kernel")
    g.stride = draw_dims(data, nd, 1, 2, "stride")
    # dilation 3 > stride 2 lets output_padding reach 2 >= stride: x is extended by zeros
    g.dil = draw_dims(data, nd, 1, hi, "dilation")
    g.opad = tuple(data.draw(st.integers(0, max(s, d) - 1), label="output_padding")
                   for s, d in zip(g.stride, g.dil))
    g.sp = draw_dims(data, nd, 1, hi, "input size")
    # the uncropped output; padding crops both ends and must leave >= 1
    g.full = tuple((i - 1) * s + d * (k - 1) + o + 1
                   for i, k, s, d, o in zip(g.sp, g.ks, g.stride, g.dil, g.opad))
    g.pad = tuple(data.draw(st.integers(0, min(2, (f - 1) // 2)), label="padding")
                  for f in g.full)
    g.mode = data.draw(st.sampled_from(["cross", "conv"]), label="mode")
    g.cin, g.cout = g.cig * g.groups, g.cog * g.groups
    g.x = normal(rng, (g.n, g.cin) + g.sp, g.dtype)
    g.w = normal(rng, (g.cin, g.cog) + g.ks, g.dtype)
    g.bias = normal(rng, (g.cout,), g.dtype) if data.draw(st.booleans(), label="bias") else None
    g.kw = dict(stride=_size_arg(data, g.stride, "stride"),
                padding=_size_arg(data, g.pad, "padding"),
                output_padding=_size_arg(data, g.opad, "output_padding"),
                dilation=_size_arg(data, g.dil, "dilation"), groups=g.groups, mode=g.mode)
    sweep_rng = np.random.default_rng(int(rng.integers(2**32)))

    def good():
        return fn(g.x, g.w, g.bias, backend=backend, **g.kw)

    def check(y):
        _check(op, g, y, g.x, g.w, g.bias)

    mistake = draw_mistake(data, CT_MISTAKES)
    if mistake is None:
        (xb, wb, bb, kw, be), expected = (g.x, g.w, g.bias, g.kw, backend), []
    else:
        (xb, wb, bb, kw, be), expected = _mistake(mistake, g, rng,
                                                  lambda seq, label: pick(data, seq, label))
    present = Presenter(data)
    xi, wi, bi = present(xb, "x"), present(wb, "w"), present(bb, "bias")
    if present.bad:     # refused for its layout, which may be checked before the mistake
        expected.append((ValueError, [op, "C-contiguous"]))
    names = tuple(words[0] for _, words in expected) if mistake == "bad backend" else ()
    case = expect(op, lambda: fn(xi, wi, bi, backend=be, **kw), check, mistake, present.bad,
                  names)
    if case.check is None:
        def refused():
            _sweep(fn, g, sweep_rng, mistake)
            e = _raises_as(op, lambda: fn(xi, wi, bi, backend=be, **kw), expected, case.why)
            check(good())          # the state after the errors is usable
            raise e
        case.call = refused
        return case

    def valid():
        _sweep(fn, g, sweep_rng, None)
        y = good()                 # after the sweep's errors: the good call works
        # the same geometry with no samples, no input channels (y = bias), no output channels
        for n, cig, cog in ((0, g.cig, g.cog), (g.n, 0, g.cog), (g.n, g.cig, 0)):
            x = normal(sweep_rng, (n, cig * g.groups) + g.sp, g.dtype)
            w = normal(sweep_rng, (cig * g.groups, cog) + g.ks, g.dtype)
            b = None if g.bias is None else normal(sweep_rng, (cog * g.groups,), g.dtype)
            _check(f"{op} (N, C_in/g, C_out/g = {n}, {cig}, {cog})", g,
                   fn(x, w, b, backend=backend, **g.kw), x, w, b)
        return y
    case.call = valid
    return case
