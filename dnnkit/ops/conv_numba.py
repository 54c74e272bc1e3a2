"""The Numba backend of 2-D/3-D convolution: im2col + tiled GEMM, col2im for the data gradient.

The implicit GEMM (kernels/gemm.py ``implicit``: a per-geometry table of tap offsets, no column
buffer, no col2im, every image in one pass; not where a group's channels of one image pass
2**31 elements) reads x as its im2col matrix (or its transpose) inside the GEMM for the
forward and the filter gradient, and dy as the column matrix of the convolution that a
stride-1 data gradient is. ``conv_tuning.settings.implicit`` picks it: True always, False
never, None (default) where it measured faster (``implicit_pays``: stride-1 undilated
ungrouped 2-D 3x3 forward and data gradients with at most 128 channels out).

Depthwise convolutions (groups = C, one input channel per filter) take direct kernels instead
(ops/conv_depthwise.py): a group's GEMM would have a single row; so do the 2-D data gradients
of convolutions with 2-16 channels per group and the forwards of grouped ones with at most 16
channels and filters per group (ops/conv_direct.py: ResNeXt's groups, a first layer's 3
channels), where a group's GEMM would have few rows or short sums; Winograd is asked first.

Every array is 5-D here (dnnkit/geometry.py): x (N, C, D, H, W), w (K, C/G, T, R, S), y (N, K,
OD, OH, OW), one float dtype throughout; kernels/conv.py has the math and kernels/gemm.py the
GEMM. The batch goes through in chunks of images whose column buffer (G*rows x n*O elements;
rows = C/G*T*R*S, O = OD*OH*OW) fits in ``conv_tuning.settings.col_budget_bytes`` (one image at
a time if even one does not fit). Each chunk is one GEMM batched over the groups whose n
dimension runs over every (image, position) column of the chunk, so small images still fill
whole tiles: the GEMM's grouped indexing reads dy and writes y straight in NCHW order. Where
the forward's blocks would leave the GPU's last wave mostly empty, its sum over the rows is
split too (``k_parts``: batched over (group, part) into an accumulation-type workspace, summed
with the bias by conv_partsum_fwd_kernel). The forward and the filter gradient keep the column
buffer in the data type (im2col only copies, so this is exact); the data gradient's buffer, a
GEMM result, is in the accumulation type.

Tensor cores (ops/gemm.py): float16 runs on HMMA with float32 accumulation whatever
``dnn.conv.precision`` says (a float16 compute type is met with more precision, as cuDNN's
float16 paths with float32 accumulation do); float32 runs 3xTF32, or one TF32 product where
``dnn.conv.allow_tf32`` is on (``gemm_math``; the ops layer passes it as ``math``).

The filter gradient is a reduction over the chunk's (image, position) columns: they are split
into ``parts`` equal slices of whole images reduced by separate blocks (enough to fill the GPU
when K x rows alone does not), and where even a slice per image leaves the GPU short of a
wave (a first layer's few filters and taps), each image's positions into equal slices too
(``position_slices``); into a float32/float64 workspace (one w.size per slice, within the
budget), accumulated over chunks, and summed at the end in a fixed order. Every pass is
deterministic.
"""

import math

from .. import arrays, device
from ..launch import at, flat as flat_arg, launch, pow2_at_most
from . import conv_depthwise, conv_direct, conv_launch, conv_winograd, gemm
from .conv_implicit import (implicit_backward_data, implicit_backward_data_gemm,
                            implicit_forward, implicit_forward_gemm, implicit_operand)
from .conv_tuning import settings


def _kernels():
    """dnnkit.kernels, imported on first use: it imports numba, which ``import dnnkit`` must
    not pay for."""
    from .. import kernels
    return kernels


def _kernel_geo(geom):
    """kernels/conv.py's ``geo`` tuple of a ConvGeom."""
    return (geom.x_shape[1],) + tuple(geom.x_shape[2:]) + tuple(geom.w_shape[2:]) \
        + geom.out_spatial + tuple(geom.stride) + tuple(geom.padding) + tuple(geom.dilation) \
        + (int(geom.flip),)


def _prod(t):
    p = 1
    for v in t:
        p *= v
    return p


class ConvSizes:
    """The GEMM dimensions of one convolution: per group Kg filters, Cg*T*R*S = ``rows`` column
    rows, ``out`` output positions per image; ``chunk`` images per column buffer."""

    def __init__(self, geom, itemsize):
        self.n, self.c = geom.x_shape[:2]
        self.k, self.groups = geom.w_shape[0], geom.groups
        self.kg, self.rows = self.k // geom.groups, _prod(geom.w_shape[1:])
        self.out = _prod(geom.out_spatial)
        self.spatial = _prod(geom.x_shape[2:])          # input positions per channel
        self.image = self.c * self.spatial
        per_image = self.rows * geom.groups * self.out * itemsize
        self.chunk = max(1, min(self.n, settings.col_budget_bytes // max(1, per_image)))
        # A 1x1 kernel at stride 1 without padding: the column matrix IS x (col[c, (n, o)] =
        # x[n, c, o]), so the GEMMs read x (and write dx) in place: no im2col, no col2im.
        self.pointwise = (max(geom.w_shape[2:]) == 1 and max(geom.stride) == 1
                          and max(geom.padding) == 0)
        if self.pointwise:
            self.chunk = max(1, self.n)

    def chunks(self):
        for n0 in range(0, self.n, self.chunk):
            yield n0, min(self.chunk, self.n - n0)

    def empty(self):
        return self.n * self.k * self.out * self.rows == 0


def _by_columns(kernel, ncol, channels, stream, args):
    """im2col's and col2im's launch: the chunk's ``ncol`` (image, position) pairs across x,
    channels across y, as many channel blocks as fill about 8 blocks per SM (each thread
    decodes its pair once for the channels it visits). Mapping an image's positions alone
    across x left a block's threads idle past a small image's positions: 16 of 256 busy on
    ResNet-18's 4x4 layers (validation/notes/conv-numba.md)."""
    launch(kernel, *conv_launch.columns_grid(ncol, channels), stream, args)


def _elementwise(kernel, n, stream, args):
    threads = conv_launch.elem_threads()
    launch(kernel, arrays.grid_1d(n, threads)[0], threads, stream, args)


def _im2col(x, col, geom, sz, n0, nc, stream):
    """kernels/conv.py's im2col on a 2-D grid: (image, position) columns x channels
    (``_by_columns``)."""
    src = at(flat_arg(x), n0 * sz.image)
    _by_columns(_kernels().conv_im2col_fwd_kernel, nc * sz.out, sz.c, stream,
                (src, col, _kernel_geo(geom), nc, arrays.acc_array(x.dtype)))


def gemm_math(opts):
    """The GEMM's ``math`` (ops/gemm.py) for a call's options (ops/conv_args.resolve_opts):
    "tf32" for float32 data computed in float32 with ``allow_tf32`` on, else "3xtf32"."""
    tf32 = opts["allow_tf32"] and opts["dtype"] == "float32" == opts["compute_dtype"]
    return "tf32" if tf32 else "3xtf32"


def forward(x, w, bias, geom, stream, math="3xtf32", relu=False):
    """(y, the algorithm's name): y = conv(x, w) (+ bias), then relu when ``relu`` (in each
    algorithm's last pass: kernels/common.py's EPILOGUE), shaped geom.y_shape. ``math``:
    float32's tensor-core products (``gemm_math``)."""
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    sz = ConvSizes(geom, x.dtype.itemsize)
    if sz.empty():
        if y.size:       # a sum over no input channels: y = 0 (+ bias) (then relu)
            _fill_bias(y, bias, sz, stream, relu)
        return y, "im2col+gemm"
    if conv_depthwise.applies(geom):
        geo = _kernel_geo(geom)
        return conv_depthwise.forward(x, w, bias, geom, geo, y, stream, relu), "depthwise"
    if conv_winograd.pays(geom, x.dtype):
        return conv_winograd.forward(x, w, bias, geom, y, stream, math, relu), "winograd"
    if conv_direct.pays(geom, "fwd"):
        return conv_direct.forward(x, w, bias, geom, _kernel_geo(geom), y, stream, relu), \
            "direct"
    conv = implicit_forward(geom, sz)
    if conv is not None:
        args, kw = implicit_forward_gemm(sz, conv, x, w, y, bias, math, relu)
        gemm.gemm(*args, stream=stream, **kw)
        return y, "implicit_gemm"
    col = None if sz.pointwise else arrays.cuda_empty(
        (sz.groups * sz.rows * sz.chunk * sz.out,), x.dtype, stream)
    wf, yf = flat_arg(w), flat_arg(y)
    o, ko = sz.out, sz.k * sz.out
    acc = arrays.acc_array(x.dtype)
    parts = k_parts(sz, acc.dtype.itemsize * y.size)
    kp = sz.rows // parts
    # split k: part q of the sum over rows goes to ws[q] (accumulation type), summed below
    ws = None if parts == 1 else arrays.cuda_empty((parts * y.size,), acc.dtype, stream)
    for n0, nc in sz.chunks():
        if sz.pointwise:    # B = x: column j = (n, o) at (j // O)*C*O + j % O, row c at c*O
            b, ldb, gb, b1 = at(flat_arg(x), n0 * sz.image), o, (o, sz.image), sz.rows * o
        else:
            _im2col(x, col, geom, sz, n0, nc, stream)
            b, ldb, gb, b1 = col, nc * o, gemm.PLAIN, sz.rows * nc * o
        # y[n, g*Kg + i, o] = sum_k W_g[i, k] col[g*rows + k, n*O + o]: C's column j = (n, o)
        # lives at (j // O)*K*O + j % O. Batch entries (group, part): part q sums the k in
        # [q*kp, (q+1)*kp) (A's columns, B's rows from there) into ws[q].
        gemm.gemm("00", wf, b, at(yf if ws is None else ws, n0 * ko),
                  (sz.kg, nc * o, kp), (sz.rows, ldb, o), gemm.PLAIN + gb + (o, ko),
                  (sz.groups, parts, sz.kg * sz.rows, kp, b1, kp * ldb, sz.kg * o, y.size),
                  bias=None if bias is None or ws is not None else flat_arg(bias),
                  stream=stream, math=math, relu=relu and ws is None)
    if ws is not None:
        _elementwise(_kernels().conv_partsum_fwd_kernel, y.size, stream,
                     (ws, yf, parts, y.size, yf if bias is None else flat_arg(bias), o, sz.k,
                      gemm.epilogue(bias is not None, relu), acc))
    return y, "im2col+gemm"


# Split k (the forward's sum over C/G*T*R*S rows) so that the GEMM's blocks fill whole waves:
# part counts p (divisors of rows, up to MAX_PARTS, each part >= MIN_K_PER_PART of the sum)
# are scored by the share of the last wave their blocks fill (counted at the tile
# configuration the batch of groups * p launches with; conv_launch.wave_blocks() per wave,
# 264 on an H100); the best wins,
# ties (within 0.02) going to more parts; no split unless it fills 0.02 more.
# Measured on an H100 (float32, batch 32, validation/implicit_bench.py --split; ms with the
# column buffer for p = 1 / the rule's p, bias included): 512 channels at 7^2
# (104 blocks of 64 x 128 unsplit) 1.317 / 0.959 (p = 8: 416 blocks of 128 x 128, 0.79 of
# their last wave, as p = 2 and 4; p = 3 fills 0.59); 256 at 14^2 (196 blocks) 0.978 / 0.722
# (p = 8); 128 at 28^2 (392) 1.039 / 0.793 (p = 4); 64 at 56^2 (784 blocks, 0.99 of a wave
# filled) stays whole: splitting it measured 10-24% slower. The partial outputs cost p x y in
# the accumulation type, written once and read once. conv_tuning.settings.split_k forces a
# number of parts instead.
MIN_K_PER_PART = 256
MAX_PARTS = 8


def k_parts(sz, part_bytes):
    """How many parts the forward's k = rows splits into (a divisor of rows)."""
    if settings.split_k is not None:
        return _largest_divisor(sz.rows, settings.split_k)
    n = sz.chunk * sz.out
    return conv_launch.fill_parts(sz.kg, n, sz.groups, sz.rows,
                       min(MAX_PARTS, sz.rows // MIN_K_PER_PART,
                           settings.col_budget_bytes // max(1, part_bytes)))


def _fill_bias(y, bias, sz, stream, relu):
    """y = bias broadcast over (n, spatial) (then relu), or 0: the partial-sum kernel over 0
    parts."""
    if bias is None:                      # (relu(0) = 0)
        arrays.zero_fill(y, stream)
        return
    acc = arrays.acc_array(y.dtype)
    _elementwise(_kernels().conv_partsum_fwd_kernel, y.size, stream,
                 (acc, flat_arg(y), 0, y.size, flat_arg(bias), sz.out, sz.k,
                  gemm.epilogue(True, relu), acc))


def backward_data(dy, w, geom, stream, math="3xtf32"):
    """(dx, the algorithm's name): dx = the gradient of sum(conv(x, w) * dy) wrt x, shaped
    geom.x_shape (``math``: as ``forward``'s)."""
    dx = arrays.cuda_empty(geom.x_shape, dy.dtype, stream)
    acc = arrays.acc_array(dy.dtype)
    sz = ConvSizes(geom, acc.dtype.itemsize)
    if dx.size == 0:
        return dx, "gemm+col2im"
    if sz.empty():
        return arrays.zero_fill(dx, stream), "gemm+col2im"
    if conv_depthwise.applies(geom):
        geo = _kernel_geo(geom)
        return conv_depthwise.backward_data(dy, w, geom, geo, dx, stream), "depthwise"
    if conv_winograd.pays(geom, dy.dtype):
        return conv_winograd.backward_data(dy, w, geom, dx, stream, math), "winograd"
    if conv_direct.pays(geom, "bwd_data"):
        return conv_direct.backward_data(dy, w, geom, _kernel_geo(geom), dx, stream), "direct"
    conv = implicit_backward_data(geom, sz)
    if conv is not None:
        args, kw = implicit_backward_data_gemm(sz, conv, dy, w, dx, math)
        gemm.gemm(*args, stream=stream, **kw)
        return dx, "implicit_gemm"
    dcol = None if sz.pointwise else arrays.cuda_empty(
        (sz.groups * sz.rows * sz.chunk * sz.out,), acc.dtype, stream)
    wf, dyf, dxf = flat_arg(w), flat_arg(dy), flat_arg(dx)
    o, ko = sz.out, sz.k * sz.out
    for n0, nc in sz.chunks():
        if sz.pointwise:    # C = dx: column j = (n, o) at (j // O)*C*O + j % O
            c, ldc, gc, c1 = at(dxf, n0 * sz.image), o, (o, sz.image), sz.rows * o
        else:
            c, ldc, gc, c1 = dcol, nc * o, gemm.PLAIN, sz.rows * nc * o
        # dcol[g*rows + i, n*O + o] = sum_k W_g[k, i] dy[n, g*Kg + k, o]: A = W_g transposed,
        # B's column j = (n, o) at (j // O)*K*O + j % O. One batch entry per group.
        gemm.gemm("10", wf, at(dyf, n0 * ko), c, (sz.rows, nc * o, sz.kg), (sz.rows, o, ldc),
                  gemm.PLAIN + (o, ko) + gc,
                  (sz.groups, 1, sz.kg * sz.rows, 0, sz.kg * o, 0, c1, 0), stream=stream,
                  math=math)
        if not sz.pointwise:
            _by_columns(_kernels().conv_col2im_bwd_kernel, nc * sz.spatial, sz.c, stream,
                        (dcol, at(dxf, n0 * sz.image), _kernel_geo(geom), nc, acc))
    return dx, "gemm+col2im"


def _largest_divisor(n, cap):
    d = max(1, min(n, cap))
    while n % d:
        d -= 1
    return d


def filter_parts(sz, dw_bytes, images=None):
    """Image slices reduced by separate blocks, dividing the chunk (or ``images``) evenly: the
    forward's last-wave rule (conv_launch.fill_parts), each slice's sum at least
    MIN_K_PER_PART long (images x output positions) and within the workspace budget (one dw in
    the accumulation type per slice). Measured on an H100 with the tensor-core GEMM (validation/implicit_bench.py
    --split, ms at the rule's count / the best): 128 channels at 28^2 32 slices, 0.827 (best);
    256 at 14^2 16, 0.814 (best); 512 at 7^2 4, 0.849 / 0.832 at 2; a rule of blocks for ~4
    per SM (16 / 4 / 1 slices) took 0.893 / 0.905 / 0.888 ms, and 16 slices at 512 channels
    (no length floor) 1.072. conv_tuning.settings.filter_parts forces a count (the largest
    divisor up to it)."""
    total = images or sz.chunk
    if settings.filter_parts is not None:
        return _largest_divisor(total, settings.filter_parts)
    top = min(total, max(1, settings.col_budget_bytes // dw_bytes),
              total * sz.out // MIN_K_PER_PART)
    return conv_launch.fill_parts(sz.kg, sz.rows, sz.groups, total, top)


def position_slices(sz, dw_bytes):
    """Slices of each image's output positions for the column path's filter gradient (a
    divisor of them; 1: none), taken where a slice per image leaves the GPU less than a wave
    of GEMM blocks: the fewest that make about a wave (15/16 of one), among the counts that
    keep each slice's sum at least MIN_K_PER_PART long, the partial sums (one dw each) within
    the workspace budget, and the slices' starts as aligned as the images' (the pipelined
    float16 GEMM copies 8 elements at once only from aligned rows); else the most of those.
    Measured on an H100 (ms, float32 / float16, every count side by side): DeepBench's first
    speech layer (dw of 32 x 100 from one channel, a 5 x 20 kernel on 161 x 700 maps: 16
    blocks without) 2.43 / 2.20 whole, 0.42 / 0.34 in 31 slices (the rule's; 11: 0.46 /
    0.36, 79: 0.56 / 0.44); the 7x7/2 stem at batch 16 1.22 / 0.28 whole, 0.33 / 0.17 in 8
    (the rule's and the fastest; 28: 0.42 / 0.22), at batch 32 1.30 / 0.38 whole, 0.61 / 0.30
    in 4 (the fastest); the 32-channel speech layer 2.16 / 0.82, 1.46 / 0.82 in 19 (4 slices,
    whose starts are misaligned, 1.06 in float16). Groups of one only (the batch's first index
    is the image)."""
    if sz.groups != 1 or sz.pointwise:
        return 1
    if settings.filter_positions is not None:
        return _largest_divisor(sz.out, settings.filter_positions)
    if settings.filter_parts is not None:       # image slices asked for: those alone
        return 1
    wave = conv_launch.wave_blocks()
    if conv_launch.gemm_blocks(sz.kg, sz.rows, sz.chunk) * 16 >= wave * 15:
        return 1
    top = min(sz.out // MIN_K_PER_PART, settings.col_budget_bytes // (sz.chunk * dw_bytes))
    align = math.gcd(sz.out, 8)
    fits = [d for d in range(2, max(1, top) + 1)
            if sz.out % d == 0 and (sz.out // d) % align == 0]
    for d in fits:
        if conv_launch.gemm_blocks(sz.kg, sz.rows, sz.chunk * d) * 16 >= wave * 15:
            return d
    return fits[-1] if fits else 1


def backward_filter(x, dy, geom, stream, math="3xtf32"):
    """(dw, the algorithm's name): dw = the gradient of sum(conv(x, w) * dy) wrt w, shaped
    geom.w_shape (``math``: as ``forward``'s)."""
    dw = arrays.cuda_empty(geom.w_shape, x.dtype, stream)
    sz = ConvSizes(geom, x.dtype.itemsize)
    if dw.size == 0:
        return dw, "im2col+gemm"
    if sz.empty():
        return arrays.zero_fill(dw, stream), "im2col+gemm"
    if conv_depthwise.applies(geom):
        geo = _kernel_geo(geom)
        return conv_depthwise.backward_filter(x, dy, geom, geo, dw, stream), "depthwise"
    if conv_winograd.pays(geom, x.dtype):
        return conv_winograd.backward_filter(x, dy, geom, dw, stream, math), "winograd"
    acc = arrays.acc_array(x.dtype)
    # the filter gradient: implicit only when asked for (settings.implicit True; implicit_pays)
    conv = None if sz.pointwise or settings.implicit is not True \
        else implicit_operand(geom, sz)
    if conv is not None:
        return _implicit_filter(x, dy, dw, conv, sz, acc, stream, math), "implicit_gemm"
    sub = position_slices(sz, dw.size * acc.dtype.itemsize)
    # a slice per image where its positions are sliced too
    parts = sz.chunk if sub > 1 else filter_parts(sz, dw.size * acc.dtype.itemsize)
    ws = arrays.cuda_empty((parts * sub * dw.size,), acc.dtype, stream)
    col = None if sz.pointwise else arrays.cuda_empty(
        (sz.groups * sz.rows * sz.chunk * sz.out,), x.dtype, stream)
    dyf = flat_arg(dy)
    o, ko = sz.out, sz.k * sz.out
    for i, (n0, nc) in enumerate(sz.chunks()):
        p = _largest_divisor(nc, parts)          # == parts except in a short last chunk
        per = nc // p
        if sz.pointwise:    # B = x^T: k = (n, o) at (k // O)*C*O + k % O, column c at c*O
            b, ldb, gb = at(flat_arg(x), n0 * sz.image), o, (o, sz.image)
            b1, b2 = sz.rows * o, per * sz.image
        else:
            _im2col(x, col, geom, sz, n0, nc, stream)
            b, ldb, gb = col, nc * o, gemm.PLAIN
            b1, b2 = sz.rows * nc * o, per * o
        if sub > 1:
            # one group: ws[n*sub + j] (+)= sum over the O/sub positions of slice j of image
            # n, batched over (n, j): A at n*K*O + j*O/sub, B (col^T) at n*O + j*O/sub
            ln = o // sub
            gemm.gemm("01", at(dyf, n0 * ko), b, ws, (sz.kg, sz.rows, ln), (o, ldb, sz.rows),
                      gemm.PLAIN * 3, (nc, sub, ko, ln, o, ln, sub * dw.size, dw.size),
                      beta=0.0 if i == 0 else 1.0, stream=stream, math=math)
            continue
        # ws[q, g*Kg + i, j] (+)= sum_k dy_g[i, k] col[g*rows + j, q*per*O + k] over the
        # per*O columns k = (n, o) of slice q: A's k at (k // O)*K*O + k % O, B = col^T.
        # Batched over (g, q).
        gemm.gemm("01", at(dyf, n0 * ko), b, ws, (sz.kg, sz.rows, per * o), (o, ldb, sz.rows),
                  (o, ko) + gb + gemm.PLAIN,
                  (sz.groups, p, sz.kg * o, per * ko, b1, b2, sz.kg * sz.rows, dw.size),
                  beta=0.0 if i == 0 else 1.0, stream=stream, math=math)
    _elementwise(_kernels().conv_partsum_fwd_kernel, dw.size, stream,
                 (ws, flat_arg(dw), parts * sub, dw.size, flat_arg(dw), 0, 1, 0, acc))
    return dw, "im2col+gemm"


def _implicit_filter(x, dy, dw, conv, sz, acc, stream, math):
    """The filter gradient through the implicit GEMM (layout 01: B = im2col(x)^T read from x,
    its k = (image, position) walked with ``gb`` = O): every image at once, in ``parts``
    slices of whole images reduced by separate blocks and summed as in the column path."""
    parts = filter_parts(sz, dw.size * acc.dtype.itemsize, images=sz.n)
    per, o, ko = sz.n // parts, sz.out, sz.k * sz.out
    ws = arrays.cuda_empty((parts * dw.size,), acc.dtype, stream)
    # ws[q, g*Kg + i, j] = sum_k dy_g[i, k] x-col[g*rows + j, q*per*O + k]: A's k at
    # (k // O)*K*O + k % O; B's k = (image, position) at image stride C*D*H*W (offset of group
    # g's channels and of slice q in the batch entry)
    gemm.gemm("01", flat_arg(dy), flat_arg(x), ws, (sz.kg, sz.rows, per * o),
              (o, 0, sz.rows), (o, ko) + (o, sz.image) + gemm.PLAIN,
              (sz.groups, parts, sz.kg * o, per * ko, sz.image // sz.groups, per * sz.image,
               sz.kg * sz.rows, dw.size), stream=stream, conv=conv, math=math)
    _elementwise(_kernels().conv_partsum_fwd_kernel, dw.size, stream,
                 (ws, flat_arg(dw), parts, dw.size, flat_arg(dw), 0, 1, 0, acc))
    return dw


def backward_bias(dy, stream):
    """db[k] = sum of dy[:, k] over the batch and every spatial position."""
    from ..kernels.common import MAX_THREADS      # (numba: see _kernels)
    n, k = dy.shape[0], dy.shape[1]
    s = _prod(dy.shape[2:])
    db = arrays.cuda_empty((k,), dy.dtype, stream)
    if k == 0:
        return db
    acc = arrays.acc_array(dy.dtype)
    by = pow2_at_most(n * s, conv_launch.elem_threads() if device.simulator() else MAX_THREADS)
    launch(_kernels().conv_bias_bwd_kernel, min(k, 65535), (1, by), stream,
           (flat_arg(dy), db, n, k, s, acc), by * acc.dtype.itemsize)
    return db
