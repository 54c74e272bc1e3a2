"""Fuzz cases: the tensor ops under autograd -- add/subtract/multiply/divide (broadcasting, a
scalar operand), sum/mean/sum_to/broadcast_to/mean_backward, reshape/concatenate/split/
take_batch(+backward), matmul/linear, embedding(+backward), global_avg_pool -- against NumPy in
float64, sizes from zero."""

import warnings

import numpy as np
from hypothesis import strategies as st

import dnnkit

from .common import (COMMON, REL_TOL, Presenter, common_mistake, compare, draw_dims, draw_dtype,
                     draw_mistake, draw_size, expect, inject_nonfinite, normal, pick, seed_rng)

GEMM_TOL = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-11}    # ops/matmul.py's


def _rank_dims(data, lo_rank, hi_rank, hi=3, label="shape"):
    return draw_dims(data, data.draw(st.integers(lo_rank, hi_rank), label=f"{label} rank"),
                     0, hi, label)


# ---------------------------------------------------------------- arithmetic

ARITH = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide}
ARITH_MISTAKES = COMMON + ("shapes do not broadcast", "dtype mismatch", "two scalars")


def _partner(data, shape):
    """A shape that broadcasts with ``shape`` (NumPy's rule: right-aligned, equal or 1)."""
    k = data.draw(st.integers(0, len(shape)), label="partner dims")
    out = tuple(d if data.draw(st.booleans(), label="keep dim") else 1
                for d in shape[len(shape) - k:])
    if data.draw(st.integers(0, 3), label="extra dim?") == 0:
        out = (draw_size(data, 1, 2, "extra"),) + out
    return out


def arith_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    sa = _rank_dims(data, 0, 3)
    sb = _partner(data, sa)
    if data.draw(st.booleans(), label="swap"):
        sa, sb = sb, sa
    a = normal(rng, sa, dtype)
    b = normal(rng, sb, dtype)
    if op == "divide":         # divisors away from 0: the quotient stays finite in float16
        b = np.asarray((np.sign(b) + (b == 0)) * (0.5 + np.abs(b))).astype(dtype)
    if data.draw(st.integers(0, 3), label="nonfinite?") == 0:
        a = inject_nonfinite(rng, a, 0.2)
    scalar = data.draw(st.sampled_from([None, "a", "b"]), label="scalar")
    if scalar == "a":
        a = float(rng.uniform(-2, 2))
    elif scalar == "b":
        b = float(rng.uniform(0.5, 2))
    mistake = draw_mistake(data, ARITH_MISTAKES)
    first = a if scalar != "a" else b
    bad, be = common_mistake(data, mistake, rng, np.shape(first), backend)
    ai, bi = a, b
    if mistake == "shapes do not broadcast":
        ai, bi = normal(rng, (2, 3), dtype), normal(rng, (4,), dtype)
    elif mistake == "dtype mismatch":
        ai = normal(rng, (2,), dtype)
        bi = normal(rng, (2,), "float64" if dtype != "float64" else "float32")
    elif mistake == "two scalars":
        ai, bi = 1.0, 2.0
    present = Presenter(data)
    if bad:
        if scalar == "a":
            bi = bad[0]
        else:
            ai = bad[0]
    ai = present(ai, "a") if isinstance(ai, np.ndarray) else ai
    bi = present(bi, "b") if isinstance(bi, np.ndarray) else bi
    fn = getattr(dnnkit, op)

    def check(y):
        with np.errstate(all="ignore"):
            ref = ARITH[op](np.asarray(a, np.float64), np.asarray(b, np.float64))
        compare(op, y, ref, REL_TOL[dtype], dtype=dtype)
    return expect(op, lambda: fn(ai, bi, backend=be), check, mistake, present.bad)


# ---------------------------------------------------------------- sums and broadcasting

AXIS_MISTAKES = ("axis out of range", "axis repeated", "axis not an int")
SHAPE_ARG_MISTAKES = ("shape not reachable", "shape not ints", "negative size")
REDUCE_MISTAKES = {"sum": COMMON + AXIS_MISTAKES, "mean": COMMON + AXIS_MISTAKES,
                   "mean_backward": COMMON + AXIS_MISTAKES + SHAPE_ARG_MISTAKES,
                   "sum_to": COMMON + SHAPE_ARG_MISTAKES,
                   "broadcast_to": COMMON + SHAPE_ARG_MISTAKES}


def _axis(data, rank):
    kind = data.draw(st.sampled_from(["none", "int", "tuple"]), label="axis kind")
    if kind == "none" or rank == 0:
        return None
    if kind == "int":
        return data.draw(st.integers(-rank, rank - 1), label="axis")
    chosen = data.draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank),
                       label="axes")
    return tuple(a - rank if data.draw(st.booleans(), label="negative") else a for a in chosen)


def _bad_axis(data, mistake, rank):
    if mistake == "axis out of range":
        return pick(data, [rank, -rank - 1, (0, rank)])
    if mistake == "axis repeated":
        return (0, 0) if data.draw(st.booleans(), label="plain") else (0, -rank)
    return pick(data, [1.0, "0", (0, "1"), {0: 1}, True])


def _norm_axes(axis, rank):
    if axis is None:
        return tuple(range(rank))
    return tuple(sorted(a % rank for a in ((axis,) if isinstance(axis, int) else axis)))


def reduce_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    shape = _rank_dims(data, 1, 4)
    rank = len(shape)
    x = normal(rng, shape, dtype)
    x64 = x.astype(np.float64)
    mistake = draw_mistake(data, REDUCE_MISTAKES[op])
    bad, be = common_mistake(data, mistake, rng, shape, backend)
    present = Presenter(data)
    tol = REL_TOL[dtype]
    axis = _axis(data, rank)
    keep = data.draw(st.booleans(), label="keepdims")
    axes = _norm_axes(axis, rank)
    if mistake in AXIS_MISTAKES:
        axis = _bad_axis(data, mistake, rank)
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    if op in ("sum", "mean"):
        xi = bad[0] if bad else present(x, "x")
        fn = getattr(dnnkit, op)

        def check(y):
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)     # a mean over nothing
                ref = (np.sum if op == "sum" else np.mean)(x64, axis=axes, keepdims=keep)
                floor = (np.sum if op == "sum" else np.mean)(np.abs(x64), axis=axes)
            compare(op, y, ref, tol, floor=float(np.nan_to_num(floor).max(initial=0.0)),
                    dtype=dtype)
        return expect(op, lambda: fn(xi, axis, keep, backend=be), check, mistake, present.bad)
    if op == "mean_backward":
        kept = tuple(1 if i in axes else n for i, n in enumerate(shape))
        dshape = kept if keep else tuple(n for i, n in enumerate(shape) if i not in axes)
        dy = normal(rng, dshape, dtype)
        x_shape, dyc = shape, dy
        if mistake == "shape not ints":
            x_shape = shape[:-1] + (pick(data, ["3", 2.0, None]),)
        elif mistake == "negative size":
            x_shape = (-1,) + shape[1:]
        elif mistake == "shape not reachable":
            dyc = normal(rng, dshape + (2,), dtype)
        dyi = bad[0] if bad else present(dyc, "dy")

        def check_mb(dx):
            ref = np.broadcast_to(dy.astype(np.float64).reshape(kept), shape) / max(count, 1)
            compare(op, dx, ref, tol, dtype=dtype)
        return expect(op, lambda: dnnkit.mean_backward(dyi, x_shape, axis, keep, backend=be),
                      check_mb, mistake, present.bad)
    # sum_to / broadcast_to: ``shape`` and the smaller shape ``small`` that broadcasts to it
    lead = data.draw(st.integers(0, rank - 1), label="leading dims")
    small = tuple(1 if data.draw(st.booleans(), label="to 1") else n for n in shape[lead:])
    if op == "sum_to":
        target = small
        if mistake == "shape not reachable":
            target = small[:-1] + (shape[-1] + 2,)
        elif mistake == "shape not ints":
            target = pick(data, [small[:-1] + ("1",), small[:-1] + (1.0,), "ab", {1: 2}])
        elif mistake == "negative size":
            target = small[:-1] + (-1,)
        xi = bad[0] if bad else present(x, "x")

        def check_st(y):
            lead_sum = x64.sum(axis=tuple(range(lead)))
            ones = tuple(i for i, n in enumerate(small) if n == 1 and lead_sum.shape[i] != 1)
            ref = lead_sum.sum(axis=ones, keepdims=True)
            floor = np.abs(x64).sum(axis=tuple(range(lead))).sum(axis=ones, keepdims=True)
            compare(op, y, ref, tol, floor=float(floor.max(initial=0.0)), dtype=dtype)
        return expect(op, lambda: dnnkit.sum_to(xi, target, backend=be), check_st, mistake,
                      present.bad)
    src, target = normal(rng, small, dtype), shape
    if mistake == "shape not reachable":
        src, target = normal(rng, (3,), dtype), shape[:-1] + (4,)
    elif mistake == "shape not ints":
        target = pick(data, [shape[:-1] + ("2",), shape[:-1] + (2.5,), "ab", {2: 1}])
    elif mistake == "negative size":
        src, target = normal(rng, (1,), dtype), (-2,)
    srci = bad[0] if bad else present(src, "x")

    def check_bt(y):
        compare(op, y, np.broadcast_to(src.astype(np.float64), target), 0.0, dtype=dtype)
    return expect(op, lambda: dnnkit.broadcast_to(srci, target, backend=be), check_bt, mistake,
                  present.bad)


# ---------------------------------------------------------------- shapes

SHAPE_MISTAKES = {
    "reshape": COMMON + ("size mismatch", "not ints", "two -1"),
    "concatenate": COMMON + ("axis out of range", "shapes differ", "dtype mismatch",
                             "not a list", "no arrays"),
    "split": COMMON + ("axis out of range", "sizes do not fit", "not ints", "negative size"),
    "take_batch": COMMON + ("index out of range", "index not an int or slice", "slice step"),
    "take_batch_backward": COMMON + ("index out of range", "dy shape", "x_shape not ints"),
}


def shape_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    mistake = draw_mistake(data, SHAPE_MISTAKES[op])
    present = Presenter(data)
    if op == "reshape":
        shape = _rank_dims(data, 0, 3)
        x = normal(rng, shape, dtype)
        size = x.size
        new = pick(data, [(size,), (-1,), (1, size), (size, 1), tuple(reversed(shape)),
                          (-1, 1)], "new shape")
        if mistake == "size mismatch":
            new = (size + 1,)
        elif mistake == "not ints":
            new = pick(data, [(size, "1"), (float(size),), "a", {size: 1}])
        elif mistake == "two -1":
            new = (-1, -1)
        bad, be = common_mistake(data, mistake, rng, shape, backend)
        xi = bad[0] if bad else present(x, "x")
        return expect(op, lambda: dnnkit.reshape(xi, new, backend=be),
                      lambda y: compare(op, y, x.astype(np.float64).reshape(new), 0.0,
                                        dtype=dtype), mistake, present.bad)
    shape = _rank_dims(data, 1, 3)
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    ax = axis % rank
    bad, be = common_mistake(data, mistake, rng, shape, backend)
    if mistake == "axis out of range":
        axis = pick(data, [rank, -rank - 1, 1.0, "0"])
    if op == "concatenate":
        k = data.draw(st.integers(1, 3), label="arrays")
        parts = [normal(rng, shape[:ax] + (draw_size(data, 0, 2, "rows"),) + shape[ax + 1:],
                        dtype) for _ in range(k)]
        given = list(parts)
        if mistake == "shapes differ":
            s = list(parts[0].shape)
            if rank > 1:
                s[(ax + 1) % rank] += 1
            else:
                s = [1, 1]
            given.append(normal(rng, tuple(s), dtype))
        elif mistake == "dtype mismatch":
            given.append(normal(rng, parts[0].shape, "float64" if dtype != "float64"
                                else "float32"))
        elif mistake == "not a list":
            given = parts[0]
        elif mistake == "no arrays":
            given = []
        if bad:
            given = [bad[0]] + given[1:]
        if isinstance(given, list):
            given = [present(p, f"arrays[{i}]") if isinstance(p, np.ndarray) else p
                     for i, p in enumerate(given)]

        def check_c(y):
            compare(op, y, np.concatenate([p.astype(np.float64) for p in parts], ax), 0.0,
                    dtype=dtype)
        return expect(op, lambda: dnnkit.concatenate(given, axis, backend=be), check_c,
                      mistake, present.bad)
    x = normal(rng, shape, dtype)
    n = shape[ax]
    if op == "split":
        if n and data.draw(st.booleans(), label="sections?"):
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            parts = data.draw(st.sampled_from(divisors), label="sections")
            sizes = [n // parts] * parts
        else:
            cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3), label="cuts"))
            edges = [0] + cuts + [n]
            sizes = [b - a for a, b in zip(edges, edges[1:])]
            parts = list(sizes)
        if mistake == "sizes do not fit":
            parts = pick(data, [[n + 1], n + 1 if n else 0, [n, 1]])
        elif mistake == "not ints":
            parts = pick(data, [["1", 1], [1.5], 2.0, None])
        elif mistake == "negative size":
            parts = pick(data, [[-1, n + 1], -2])
        xi = bad[0] if bad else present(x, "x")

        def check_s(ys):
            assert isinstance(ys, tuple) and len(ys) == len(sizes), (len(ys), sizes)
            ref = np.split(x.astype(np.float64), np.cumsum(sizes)[:-1], axis=ax)
            for i, (y, r) in enumerate(zip(ys, ref)):
                compare(f"{op} piece {i}", y, r, 0.0, dtype=dtype)
        return expect(op, lambda: dnnkit.split(xi, parts, axis, backend=be), check_s, mistake,
                      present.bad)
    # take_batch / take_batch_backward: the first dimension
    n = shape[0]
    if n and data.draw(st.booleans(), label="int index?"):
        index = data.draw(st.integers(-n, n - 1), label="index")
    else:
        start = data.draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)), label="start")
        stop = data.draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)), label="stop")
        index = slice(start, stop)
    want = x.astype(np.float64)[index]
    if mistake == "index out of range":
        index = pick(data, [n, -n - 1, n + 3])
    elif mistake == "index not an int or slice":
        index = pick(data, [1.0, "0", [0], None, (0,)])
    elif mistake == "slice step":
        index = pick(data, [slice(0, n, 2), slice(None, None, -1), slice(0, n, 0)])
    if op == "take_batch":
        xi = bad[0] if bad else present(x, "x")
        return expect(op, lambda: dnnkit.take_batch(xi, index, backend=be),
                      lambda y: compare(op, y, want, 0.0, dtype=dtype), mistake, present.bad)
    dy = normal(rng, want.shape, dtype)
    x_shape, dyc = shape, dy
    if mistake == "x_shape not ints":
        x_shape = shape[:-1] + (pick(data, ["2", 1.5]),)
    elif mistake == "dy shape":
        dyc = normal(rng, want.shape + (1,), dtype)
    dyi = bad[0] if bad else present(dyc, "dy")

    def check_tb(dx):
        ref = np.zeros(shape)
        ref[index] = dy
        compare(op, dx, ref, 0.0, dtype=dtype)
    return expect(op, lambda: dnnkit.take_batch_backward(dyi, x_shape, index, backend=be),
                  check_tb, mistake, present.bad)


# ---------------------------------------------------------------- matrix products

MATMUL_MISTAKES = COMMON + ("inner mismatch", "batch mismatch", "1-D operand", "flag not a bool",
                            "dtype mismatch", "bias shape")


def matmul_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    mistake = draw_mistake(data, MATMUL_MISTAKES)
    present = Presenter(data)
    tol = GEMM_TOL[dtype]
    m, k, n = (draw_size(data, 0, 4, lbl) for lbl in ("m", "k", "n"))
    other = "float64" if dtype != "float64" else "float32"
    if op == "linear":
        lead = _rank_dims(data, 0, 2, 3, "leading")
        x, w = normal(rng, lead + (k,), dtype), normal(rng, (n, k), dtype)
        bias = normal(rng, (n,), dtype) if data.draw(st.booleans(), label="bias") else None
        bad, be = common_mistake(data, mistake, rng, x.shape, backend)
        xc, wc, bc = x, w, bias
        if mistake == "inner mismatch":
            wc = normal(rng, (n, k + 1), dtype)
        elif mistake in ("batch mismatch", "bias shape"):
            bc = normal(rng, (n + 1,), dtype)
        elif mistake == "1-D operand":
            wc = normal(rng, (k,), dtype)
        elif mistake in ("dtype mismatch", "flag not a bool"):
            wc = w.astype(other)
        xi = bad[0] if bad else present(xc, "x")
        wi, bi = present(wc, "weight"), None if bc is None else present(bc, "bias")

        def check_l(y):
            x64, w64 = x.astype(np.float64), w.astype(np.float64)
            ref = x64 @ w64.T + (0 if bias is None else bias.astype(np.float64))
            floor = float((np.abs(x64) @ np.abs(w64).T).max(initial=0.0))
            compare(op, y, ref, tol, floor=floor, dtype=dtype)
        return expect(op, lambda: dnnkit.linear(xi, wi, bi, backend=be), check_l, mistake,
                      present.bad)
    ta, tb = (data.draw(st.booleans(), label=lbl) for lbl in ("transpose_a", "transpose_b"))
    batch = data.draw(st.sampled_from([None, 1, 2]), label="batch")
    ba = bb = batch
    if batch == 2 and data.draw(st.booleans(), label="broadcast one"):
        ba, bb = pick(data, [(1, 2), (2, 1), (None, 2), (2, None)], "batches")
    sa = (k, m) if ta else (m, k)
    sb = (n, k) if tb else (k, n)
    a = normal(rng, ((ba,) if ba else ()) + sa, dtype)
    b = normal(rng, ((bb,) if bb else ()) + sb, dtype)
    bad, be = common_mistake(data, mistake, rng, a.shape, backend)
    ac, bc, fa = a, b, ta
    if mistake == "inner mismatch":
        bc = normal(rng, ((bb,) if bb else ()) + ((n, k + 1) if tb else (k + 1, n)), dtype)
    elif mistake == "batch mismatch":
        ac, bc = normal(rng, (2, m, k), dtype), normal(rng, (3, k, n), dtype)
        fa = False
        tb = False
    elif mistake == "1-D operand":
        ac = normal(rng, (k,), dtype)
    elif mistake in ("flag not a bool", "bias shape"):
        fa = pick(data, [1, "yes", None, [True]])
    elif mistake == "dtype mismatch":
        bc = b.astype(other)
    ai = bad[0] if bad else present(ac, "a")
    bi = present(bc, "b")

    def check_m(y):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        oa = np.swapaxes(a64, -1, -2) if ta else a64
        ob = np.swapaxes(b64, -1, -2) if tb else b64
        ref = np.matmul(oa, ob)
        floor = float(np.matmul(np.abs(oa), np.abs(ob)).max(initial=0.0))
        compare(op, y, ref, tol, floor=floor, dtype=dtype)
    return expect(op, lambda: dnnkit.matmul(ai, bi, fa, tb, backend=be), check_m, mistake,
                  present.bad)


# ---------------------------------------------------------------- embedding, global pooling

EMB_MISTAKES = COMMON + ("ids float", "ids out of range", "padding_idx out of range",
                         "padding_idx not an int", "weight 1-D", "dy shape", "num not an int")


def embedding_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    num, dim = draw_size(data, 1, 5, "num"), draw_size(data, 0, 3, "dim")
    ids_shape = _rank_dims(data, 0, 2, 3, "ids")
    ids = rng.integers(0, num, ids_shape).astype(pick(data, [np.int64, np.int32], "ids dtype"))
    pad = data.draw(st.one_of(st.none(), st.integers(-num, num - 1)), label="padding_idx")
    mistake = draw_mistake(data, EMB_MISTAKES)
    present = Presenter(data)
    idc, pc = ids, pad
    if mistake == "ids float":
        idc = ids.astype(np.float32)
    elif mistake == "ids out of range":
        idc = np.full(ids_shape or (1,), pick(data, [num, num + 4, -1]))
    elif mistake == "padding_idx out of range":
        pc = pick(data, [num, -num - 1])
    elif mistake == "padding_idx not an int":
        pc = pick(data, [1.0, "0", [0], True])
    if op == "embedding":
        w = normal(rng, (num, dim), dtype)
        bad, be = common_mistake(data, mistake, rng, w.shape, backend)
        wc = normal(rng, (num,), dtype) if mistake in ("weight 1-D", "dy shape",
                                                       "num not an int") else w
        wi = bad[0] if bad else present(wc, "weight")
        return expect(op, lambda: dnnkit.embedding(idc, wi, pc, backend=be),
                      lambda y: compare(op, y, w.astype(np.float64)[ids], 0.0, dtype=dtype),
                      mistake, present.bad)
    dy = normal(rng, ids_shape + (dim,), dtype)
    bad, be = common_mistake(data, mistake, rng, dy.shape, backend)
    dyc, nc = dy, num
    if mistake in ("dy shape", "weight 1-D"):
        dyc = normal(rng, ids_shape + (dim, 1), dtype)
    elif mistake == "num not an int":
        nc = pick(data, [float(num), str(num), None, [num]])
    dyi = bad[0] if bad else present(dyc, "dy")

    def check_e(dw):
        want = np.zeros((num, dim))
        np.add.at(want, ids.reshape(-1), dy.astype(np.float64).reshape(ids.size, dim))
        if pad is not None:
            want[pad % num] = 0
        floor = np.zeros((num, dim))
        np.add.at(floor, ids.reshape(-1), np.abs(dy.astype(np.float64)).reshape(ids.size, dim))
        compare(op, dw, want, REL_TOL[dtype], floor=float(floor.max(initial=0.0)), dtype=dtype)
    return expect(op, lambda: dnnkit.embedding_backward(idc, dyi, nc, pc, backend=be), check_e,
                  mistake, present.bad)


GAP_MISTAKES = COMMON + ("wrong rank", "empty spatial dim")


def global_pool_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    nd = data.draw(st.sampled_from([2, 3]), label="nd")
    shape = (draw_size(data, 0, 2, "N"), draw_size(data, 0, 3, "C")) + draw_dims(data, nd, 1, 3)
    x = normal(rng, shape, dtype)
    mistake = draw_mistake(data, GAP_MISTAKES)
    bad, be = common_mistake(data, mistake, rng, shape, backend)
    present = Presenter(data)
    xc = x
    if mistake == "wrong rank":
        xc = normal(rng, shape[:2] + (2,), dtype)
    elif mistake == "empty spatial dim":
        xc = normal(rng, shape[:-1] + (0,), dtype)
    xi = bad[0] if bad else present(xc, "x")

    def check(y):
        x64 = x.astype(np.float64)
        axes = tuple(range(2, 2 + nd))
        compare(op, y, x64.mean(axis=axes), REL_TOL[dtype],
                floor=float(np.abs(x64).mean(axis=axes).max(initial=0.0)), dtype=dtype)
    return expect(op, lambda: dnnkit.global_avg_pool(xi, backend=be), check, mistake,
                  present.bad)
