"""Winograd F(2x2, 3x3) for the Numba convolution backend (non-fused: transform, GEMM,
transform): 2-D 3x3 kernels at stride 1, undilated and ungrouped, all three passes.

Each 2x2 output tile takes 16 multiplications per (filter, channel) pair where the direct sum
takes 36 (kernels/winograd.py has the math): the forward is 16 GEMMs batched on the GEMM of
kernels/gemm.py, M[xi] = U[xi] . V[xi] (K x C times C x tiles), between an input and an output
transform; the data gradient is the forward of dy with the filters transposed and reversed
(a stride-1 convolution's data gradient is a correlation of dy with them, padding 2 - p);
the filter gradient transforms dy and x to dM and V and sums dU[xi] = dM[xi] . V[xi]^T over
the tiles, split into ``parts`` slices reduced by separate blocks, then dg = G^T dU G.

The products' operands U, V and dM are in the data type for float16 (``operand_dtype``: the
GEMMs then run on the pipelined HMMA kernel of kernels/hmma.py with float32 sums, as the direct
path's do) and in the accumulation type otherwise; M and dU, the sums, in the accumulation
type. Rows of V, M and dM are padded to a multiple of ``ALIGN`` tiles (zeros), so every
operand row starts on 16 bytes, as the pipelined kernel's copies need. float32's products
follow the call's ``math`` (3xTF32, or one TF32 product with ``dnn.conv.allow_tf32``).

Cost: V, M (or dM) are 16/4 = 4x the size of x and y (a tile of 4 outputs takes 16 values):
memory traffic for fewer flops, which pays where the GEMM is the bottleneck (``pays``;
measured by validation/winograd_bench.py). The batch goes through in chunks of images whose
transformed arrays fit ``conv_tuning.settings.col_budget_bytes``.
``conv_tuning.settings.winograd`` and ``winograd_parts`` force the choices of the rules below.
"""

import functools

import numpy as np

from .. import arrays, device
from ..launch import At, launch
from . import conv_launch, gemm
from .conv_tuning import settings

MIN_TILES_PER_PART = 256     # each slice at least this long (a GEMM k of 16 slabs)
MAX_PARTS = 64
ALIGN = 8                    # tile columns per 16 bytes of float16 (module docstring)


def _aligned(p):
    """p rounded up to a multiple of ALIGN."""
    return -(-p // ALIGN) * ALIGN


def operand_dtype(dtype):
    """The type of U, V and dM for data of ``dtype``: float16 stays float16 (rounding a
    transformed value, a sum of up to 4 inputs or of halves of 9 filter taps, costs 2^-11 of
    it: an input rounding, as the direct path's float16 operands have; the products are then
    exact in float32), else the accumulation type."""
    acc = arrays.acc_array(dtype).dtype
    return np.dtype(np.float16) if arrays.float_name(dtype) == "float16" else acc


# float16 operands are stored times F16_SCALE: a transformed value is a sum of up to 4 inputs
# (B^T d B, A e A^T; G g G^T at most 9/4 of g), so unscaled, data above ~16384 made Inf
# where the direct path, whose float16 operands are the data themselves, stays finite. A
# power of two is exact; the sums are read back times 1 / F16_SCALE^2 in float32. The cost:
# values below 4 x 2^-14 lose bits to float16's subnormals a little earlier.
F16_SCALE = 0.25


@functools.lru_cache(maxsize=8)
def _scales(dtype):
    """(scale of the operands, unscale of the sums) as the accumulation type's scalars, per
    data type (each transform's launch asks)."""
    acc = arrays.acc_dtype(dtype).type
    f16 = operand_dtype(dtype) == np.float16
    return acc(F16_SCALE if f16 else 1.0), acc(1.0 / F16_SCALE ** 2 if f16 else 1.0)


def _threads():
    """Threads per block of the transforms: the elementwise blocks of ops/conv_launch.py."""
    return conv_launch.elem_threads()


def _kernels():
    """dnnkit.kernels, imported on first use: it imports numba, which ``import dnnkit`` must
    not pay for."""
    from .. import kernels
    return kernels


def applies(geom):
    """Whether F(2x2, 3x3) computes this convolution: 2-D, 3x3, stride 1, undilated,
    ungrouped, and one image's arrays within the transforms' 32-bit indexing (below 2**31
    elements: x's and y's planes of all channels, and the transformed tiles of one image with
    the padding of the filter gradient's slices, each rounded up to ALIGN tiles)."""
    if not (geom.x_shape[2] == 1 and tuple(geom.w_shape[2:]) == (1, 3, 3)
            and geom.groups == 1 and max(geom.stride) == 1 and max(geom.dilation) == 1):
        return False
    (c, h, w), (k, oh, ow) = geom.x_shape[1:2] + geom.x_shape[3:], \
        geom.w_shape[:1] + geom.out_spatial[1:]
    tiles = max(-(-oh // 2) * -(-ow // 2), -(-h // 2) * -(-w // 2)) + ALIGN * MAX_PARTS
    return max(c * h * w, k * oh * ow, 16 * (c + k) * tiles) < 2**31


# The rule (settings.winograd None): Winograd for these data types where the direct
# convolution takes at least MIN_FLOPS flops (2 x multiply-adds). See ``pays``.
DTYPES = ("float32", "float16")
MIN_FLOPS = 1 << 32


def pays(geom, dtype):
    """Whether the Numba backend takes Winograd here: ``settings.winograd`` when set, else the
    measured rule. validation/winograd_bench.py on an H100, ResNet-50's four 3x3 layers, every
    pass: at batch 32 (7.4 GFLOP a call) Winograd took 0.36-0.72x the direct path's GPU time in
    float32 and 0.36-0.73x in float16, and less time per call. Whatever the call's math: its
    products take the direct GEMM's (float16 on the pipelined HMMA kernel, one TF32 product
    with allow_tf32), and it took 0.24-0.72x the direct path's time in float16 and 0.39-0.86x
    with TF32 (every pass, batch 32 and 128: validation/notes/winograd.md). At batch 2 (0.46
    GFLOP) its GPU time was mostly lower too, but a call's time is then its host time (four or five
    launches against one or two), and it lost 4 of 12 passes per call (0.16-0.30 ms against
    0.12-0.29). MIN_FLOPS (4.3 GFLOP) lies between. float64 (not timed) takes it only when
    asked."""
    if not applies(geom):
        return False
    if settings.winograd is not None:
        return bool(settings.winograd)
    n, c = geom.x_shape[:2]
    flops = 2 * 9 * n * c * geom.w_shape[0] * geom.out_spatial[1] * geom.out_spatial[2]
    return arrays.float_name(dtype) in DTYPES and flops >= MIN_FLOPS


class Tiles:
    """The tiling of one transform pass: ``cin`` channels of ``hw_in`` in, ``cout`` of
    ``hw_out`` out, 2x2 output tiles (th x tw per image), ``chunk`` images per pass."""

    def __init__(self, n, cin, hw_in, cout, hw_out, itemsize):
        self.n, self.cin, self.cout = n, cin, cout
        self.hw_in, self.hw_out = hw_in, hw_out
        self.th, self.tw = -(-hw_out[0] // 2), -(-hw_out[1] // 2)
        self.tiles = self.th * self.tw
        per_image = 16 * (cin + cout) * self.tiles * itemsize
        # within the budget, and every array of a chunk below 2**31 elements (32-bit indices;
        # one image always fits: ``applies``)
        planes = max(cin * hw_in[0] * hw_in[1], cout * hw_out[0] * hw_out[1], 1)
        self.chunk = max(1, min(n, settings.col_budget_bytes // max(1, per_image),
                                (2**31 - 1) // planes))

    def chunks(self):
        for n0 in range(0, self.n, self.chunk):
            yield n0, min(self.chunk, self.n - n0)


# The transforms' blocks: about 4 waves (4 blocks of 256 threads per SM at their <= 64
# registers), tuned on an H100 as 2048 for its 132 SMs and scaled by the SM count; a thread
# decodes its tile once for the channels it visits.
TRANSFORM_BLOCKS_H100 = 2048


def _transform_blocks():
    return max(1, TRANSFORM_BLOCKS_H100 * conv_launch.sm_count() // conv_launch.H100_SMS)


def _grid(cols, rows):
    """(tile blocks, channel blocks) of a transform over ``cols`` tiles x ``rows`` channels."""
    gx = min(-(-cols // _threads()), 4096)
    return gx, max(1, min(rows, 65535, -(-_transform_blocks() // gx)))


def _filter(w, k, c, flip, transpose, stream):
    """U[xi] = G g G^T of every filter of w (k x c filters), in ``operand_dtype``."""
    acc = arrays.acc_array(w.dtype)
    u = arrays.cuda_empty((16 * k * c,), operand_dtype(w.dtype), stream)
    launch(_kernels().winograd_filter_fwd_kernel, *arrays.grid_1d(k * c, _threads()), stream,
           (arrays.flat(w), u, (k, c, int(flip), int(transpose)), _scales(w.dtype)[0], acc))
    return u


def _input(x, v, t, pad, n0, nc, ps, stream):
    """V of images n0 .. n0 + nc of x (columns P .. ps-1 zero)."""
    acc = arrays.acc_array(x.dtype)
    image = t.cin * t.hw_in[0] * t.hw_in[1]
    dims = (t.cin,) + tuple(t.hw_in) + (t.th, t.tw) + tuple(pad) + (nc * t.tiles, ps)
    launch(_kernels().winograd_input_fwd_kernel, _grid(ps, t.cin), _threads(), stream,
           (At(arrays.flat(x), n0 * image), v, dims, _scales(x.dtype)[0], acc))


def _run_forward(x, w, bias, out, t, pad, flip, transpose, stream, math, relu=False):
    """out = the stride-1 3x3 correlation of x (t.cin channels) with the filters (reversed
    when ``flip``; w[c, k] read as filter (k, c) when ``transpose``), padding ``pad``."""
    acc = arrays.acc_array(x.dtype)
    k, c = t.cout, t.cin
    u = _filter(w, *((c, k) if transpose else (k, c)), flip, transpose, stream)    # w's shape
    width = _aligned(t.chunk * t.tiles)
    v = arrays.cuda_empty((16 * c * width,), operand_dtype(x.dtype), stream)
    m = arrays.cuda_empty((16 * k * width,), acc.dtype, stream)
    oimage = k * t.hw_out[0] * t.hw_out[1]
    outf = arrays.flat(out)
    for n0, nc in t.chunks():
        p = nc * t.tiles
        ps = _aligned(p)        # columns P .. ps-1 of V zero, of M unread
        _input(x, v, t, pad, n0, nc, ps, stream)
        # M[xi] (K x ps) = U[xi] (K x C) . V[xi] (C x ps), the 16 xi batched
        gemm.gemm("00", u, v, m, (k, ps, c), (c, ps, ps), gemm.PLAIN * 3,
                  (16, 1, k * c, 0, c * ps, 0, k * ps, 0), stream=stream, math=math)
        launch(_kernels().winograd_output_fwd_kernel, _grid(p, k), _threads(), stream,
               (m, At(outf, n0 * oimage),
                outf if bias is None else arrays.flat(bias),
                (k,) + tuple(t.hw_out) + (t.th, t.tw, p, ps),
                gemm.epilogue(bias is not None, relu),
                _scales(x.dtype)[1], acc))
    return out


def _spatial(geom):
    """(H, W), (OH, OW), (ph, pw) of a 2-D geometry (5-D shapes, depth 1)."""
    return tuple(geom.x_shape[3:]), tuple(geom.out_spatial[1:]), tuple(geom.padding[1:])


def forward(x, w, bias, geom, y, stream, math="3xtf32", relu=False):
    """y = conv(x, w) (+ bias) (then relu) by Winograd, into ``y`` (``applies(geom)`` must
    hold); ``math``: float32's products (ops/gemm.py)."""
    hw, ohw, pad = _spatial(geom)
    acc = arrays.acc_array(x.dtype)
    t = Tiles(geom.x_shape[0], geom.x_shape[1], hw, geom.w_shape[0], ohw, acc.dtype.itemsize)
    return _run_forward(x, w, bias, y, t, pad, geom.flip, False, stream, math, relu)


def backward_data(dy, w, geom, dx, stream, math="3xtf32"):
    """dx by Winograd, into ``dx``: the correlation of dy with w[k, c] transposed to (c, k)
    and reversed, padding 2 - p (kernels/winograd.py)."""
    hw, ohw, pad = _spatial(geom)
    acc = arrays.acc_array(dy.dtype)
    t = Tiles(geom.x_shape[0], geom.w_shape[0], ohw, geom.x_shape[1], hw, acc.dtype.itemsize)
    return _run_forward(dy, w, None, dx, t, (2 - pad[0], 2 - pad[1]), not geom.flip, True,
                        stream, math)


def filter_parts(k, c, tiles):
    """Slices of the filter gradient's sum over ``tiles`` tile columns: the fewest (at least
    2) whose 16 x slices K x C GEMMs fill one wave of the GPU's blocks (at the tile the GEMM
    takes for that batch), each slice at least MIN_TILES_PER_PART long. Measured
    (validation/winograd_bench.py --parts and the benchmark report, H100, batch 32, ms):
    64 channels at 56^2: 16 slices 0.339 GPU time (33: 0.427, 4: 0.637); 128 at 28^2: 8
    slices 0.188 (17: 0.269); 256 at 14^2: 4 slices 0.174 (8: 0.206, 5: 0.196); 512 at 7^2:
    2 slices 0.226 (4: 0.282), and unsplit 0.513 ms a call against 0.233 with 2 slices. The
    rule gives 17, 9, 3 and 2."""
    if settings.winograd_parts is not None:       # (MAX_PARTS: ``applies``'s 32-bit bound)
        return max(1, min(settings.winograd_parts, tiles, MAX_PARTS))
    return _filter_parts_of(k, c, tiles, device.simulator(), conv_launch.wave_blocks())


@functools.lru_cache(maxsize=1024)
def _filter_parts_of(k, c, tiles, _simulator, wave):
    """The rule of ``filter_parts``, remembered per shape (and per simulator/GPU and its
    wave, whose GEMM tiles and sizes differ): every filter gradient asks, and each count tried
    costs a tile choice."""
    top = max(1, min(MAX_PARTS, tiles // MIN_TILES_PER_PART))
    p = 2
    while p < top and conv_launch.gemm_blocks(k, c, 16 * p) < wave:
        p += 1
    return min(p, top)


def backward_filter(x, dy, geom, dw, stream, math="3xtf32"):
    """dw by Winograd, into ``dw``: dU[xi] = sum over tiles of dM[xi] . V[xi]^T, then
    G^T dU G."""
    hw, ohw, pad = _spatial(geom)
    acc = arrays.acc_array(x.dtype)
    k, c = geom.w_shape[:2]
    t = Tiles(geom.x_shape[0], c, hw, k, ohw, acc.dtype.itemsize)
    parts = filter_parts(k, c, t.chunk * t.tiles)
    ps_max = parts * _aligned(-(-(t.chunk * t.tiles) // parts))
    v = arrays.cuda_empty((16 * c * ps_max,), operand_dtype(x.dtype), stream)
    dm = arrays.cuda_empty((16 * k * ps_max,), operand_dtype(x.dtype), stream)
    du = arrays.cuda_empty((parts * 16 * k * c,), acc.dtype, stream)
    oimage = k * ohw[0] * ohw[1]
    dyf = arrays.flat(dy)
    for i, (n0, nc) in enumerate(t.chunks()):
        p = nc * t.tiles
        pp = _aligned(-(-p // parts))   # each slice's tiles; zeros past the chunk's
        ps = parts * pp
        _input(x, v, t, pad, n0, nc, ps, stream)
        launch(_kernels().winograd_grad_bwd_kernel, _grid(ps, k), _threads(), stream,
               (At(dyf, n0 * oimage), dm,
                (k,) + tuple(ohw) + (t.th, t.tw, p, ps), _scales(x.dtype)[0], acc))
        # du[q, xi] (K x C) (+)= dM[xi] (K x pp) . V[xi]^T (pp x C) over slice q's tiles
        gemm.gemm("01", dm, v, du, (k, c, pp), (ps, ps, c), gemm.PLAIN * 3,
                  (16, parts, k * ps, pp, c * ps, pp, k * c, 16 * k * c),
                  beta=0.0 if i == 0 else 1.0, stream=stream, math=math)
    launch(_kernels().winograd_filter_bwd_kernel, *arrays.grid_1d(k * c, _threads()), stream,
           (du, arrays.flat(dw), (k, c, int(geom.flip), parts), _scales(x.dtype)[1], acc))
    return dw
