"""The Numba backend of 2-D/3-D convolution: im2col + tiled GEMM, col2im for the data gradient.

Every array is 5-D here (dnnkit/geometry.py): x (N, C, D, H, W), w (K, C/G, T, R, S),
y (N, K, OD, OH, OW), one float dtype throughout; kernels/conv.py has the math. The batch goes
through in chunks of images whose column buffer (C*T*R*S x n*OD*OH*OW elements) fits in
``COL_BUDGET_BYTES`` (one image at a time if even one does not fit). The forward and the
filter gradient keep the column buffer in the data type (im2col only copies, so this is exact);
the data gradient's buffer, a GEMM result, is in the accumulation type.

The filter gradient is a reduction over images: each chunk's images are split into ``parts``
equal slices reduced by separate blocks (enough to fill the GPU when K x C*T*R*S alone does
not) into a float32/float64 workspace (parts x w.size, within ``COL_BUDGET_BYTES``),
accumulated over chunks, and summed at the end in a fixed order. Every pass is deterministic.
"""

from numba import config

from .. import arrays
from ..launch import launch, pow2_at_most

COL_BUDGET_BYTES = 256 << 20
_SIM = bool(config.ENABLE_CUDASIM)
# Largest GEMM block (bx, by): bx*TN columns by by*TM rows of C. The simulator runs one Python
# thread per CUDA thread, so there tiles stay 8 to 16 wide.
GEMM_BLOCK_MAX = (2, 2) if _SIM else (32, 16)
GEMM_THREADS = 256
ELEM_THREADS = 32 if _SIM else 256
TARGET_THREADS = 132 * 1024    # filter gradient: split images until ~half an H100/H200 is busy


def _kernels():
    from .. import kernels
    return kernels


def _geo(g):
    """kernels/conv.py's geometry tuple."""
    return (g.x_shape[1],) + tuple(g.x_shape[2:]) + tuple(g.w_shape[2:]) + g.out_spatial \
        + tuple(g.stride) + tuple(g.padding) + tuple(g.dilation) + (int(g.flip),)


def _prod(t):
    p = 1
    for v in t:
        p *= v
    return p


class _Sizes:
    """The GEMM dimensions of one convolution: per group Kg filters, Cg*T*R*S = ``rows`` column
    rows, ``out`` output positions per image; ``chunk`` images per column buffer."""

    def __init__(self, g, itemsize):
        self.n, self.c = g.x_shape[:2]
        self.k, self.groups = g.w_shape[0], g.groups
        self.kg, self.rows = self.k // g.groups, _prod(g.w_shape[1:])
        self.out = _prod(g.out_spatial)
        self.image = self.c * _prod(g.x_shape[2:])
        per_image = self.rows * g.groups * self.out * itemsize
        self.chunk = max(1, min(self.n, COL_BUDGET_BYTES // max(1, per_image)))

    def chunks(self):
        for n0 in range(0, self.n, self.chunk):
            yield n0, min(self.chunk, self.n - n0)

    def empty(self):
        return self.n * self.k * self.out * self.rows == 0


def _gemm_block(m, n):
    """(bx, by): about one row/column of blocks per TM/TN rows/columns, within the caps."""
    from ..kernels.conv import TM, TN
    by = pow2_at_most(-(-m // TM), GEMM_BLOCK_MAX[1])
    bx = pow2_at_most(-(-n // TN), min(GEMM_BLOCK_MAX[0], max(1, GEMM_THREADS // by)))
    return bx, by


def _gemm(kernel, a, b, c, shape, lds, *, trans=(0, 0), batch, red=(1, 0, 0), beta=0.0,
          bias=None, stream):
    """Launch kernels/conv.py's GEMM (see its docstring for the arguments)."""
    from ..kernels.conv import BK, PAD, TM, TN
    m, n, _ = shape
    bx, by = _gemm_block(m, n)
    acc = arrays.acc_array(a.dtype)
    t = acc.dtype.type
    grid = (-(-n // (bx * TN)), min(-(-m // (by * TM)), 65535), min(batch[0] * batch[1], 65535))
    shared = BK * (by * TM + bx * TN + 2 * PAD) * acc.dtype.itemsize
    flags = trans + (int(bias is not None),)
    bias = a if bias is None else bias            # never read without the flag
    launch(kernel, grid, (bx, by), stream, (a, b, c, bias, shape, lds, flags, batch, red,
                                             t(1), t(beta), acc), shared)


def _elementwise(kernel, n, stream, args):
    launch(kernel, arrays.grid_1d(n, ELEM_THREADS)[0], ELEM_THREADS, stream, args)


def _im2col(x, col, geom, sz, n0, nc, stream):
    src = arrays.flat(x)[n0 * sz.image:(n0 + nc) * sz.image]
    _elementwise(_kernels().conv_im2col_fwd_kernel, sz.c * nc * sz.out, stream,
                 (src, col, _geo(geom), nc, arrays.acc_array(x.dtype)))


def forward(x, w, bias, geom, stream):
    """y = conv(x, w) (+ bias), y shaped geom.y_shape."""
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    sz = _Sizes(geom, x.dtype.itemsize)
    if sz.empty():
        return y
    col = arrays.cuda_empty((sz.groups * sz.rows * sz.chunk * sz.out,), x.dtype, stream)
    wf, yf = arrays.flat(w), arrays.flat(y)
    for n0, nc in sz.chunks():
        _im2col(x, col, geom, sz, n0, nc, stream)
        # y[n, g*Kg + k, o] = sum_j W_g[k, j] col[g*rows + j, n*O + o], batched over (g, n)
        _gemm(_kernels().conv_gemm_fwd_kernel, wf, col, yf[n0 * sz.k * sz.out:],
              (sz.kg, sz.out, sz.rows), (sz.rows, nc * sz.out, sz.out),
              batch=(sz.groups, nc, sz.kg * sz.rows, 0, sz.rows * nc * sz.out, sz.out,
                     sz.kg * sz.out, sz.k * sz.out),
              bias=None if bias is None else arrays.flat(bias), stream=stream)
    return y


def backward_data(dy, w, geom, stream):
    """dx = the gradient of sum(conv(x, w) * dy) wrt x, shaped geom.x_shape."""
    dx = arrays.cuda_empty(geom.x_shape, dy.dtype, stream)
    acc = arrays.acc_array(dy.dtype)
    sz = _Sizes(geom, acc.dtype.itemsize)
    if dx.size == 0:
        return dx
    if sz.empty():
        return _zeros(dx, stream)
    dcol = arrays.cuda_empty((sz.groups * sz.rows * sz.chunk * sz.out,), acc.dtype, stream)
    wf, dyf, dxf = arrays.flat(w), arrays.flat(dy), arrays.flat(dx)
    for n0, nc in sz.chunks():
        # dcol[g*rows + j, n*O + o] = sum_k W_g[k, j] dy[n, g*Kg + k, o], batched over (g, n)
        _gemm(_kernels().conv_gemm_bwd_kernel, wf, dyf[n0 * sz.k * sz.out:], dcol,
              (sz.rows, sz.out, sz.kg), (sz.rows, sz.out, nc * sz.out), trans=(1, 0),
              batch=(sz.groups, nc, sz.kg * sz.rows, 0, sz.kg * sz.out, sz.k * sz.out,
                     sz.rows * nc * sz.out, sz.out), stream=stream)
        _elementwise(_kernels().conv_col2im_bwd_kernel, nc * sz.image, stream,
                     (dcol, dxf[n0 * sz.image:(n0 + nc) * sz.image], _geo(geom), nc, acc))
    return dx


def _largest_divisor(n, cap):
    d = max(1, min(n, cap))
    while n % d:
        d -= 1
    return d


def backward_filter(x, dy, geom, stream):
    """dw = the gradient of sum(conv(x, w) * dy) wrt w, shaped geom.w_shape."""
    from ..kernels.conv import TM, TN
    dw = arrays.cuda_empty(geom.w_shape, x.dtype, stream)
    sz = _Sizes(geom, x.dtype.itemsize)
    if dw.size == 0:
        return dw
    if sz.empty():
        return _zeros(dw, stream)
    acc = arrays.acc_array(x.dtype)
    bx, by = _gemm_block(sz.kg, sz.rows)
    threads = -(-sz.kg // (by * TM)) * -(-sz.rows // (bx * TN)) * sz.groups * bx * by
    cap = min(TARGET_THREADS // threads, COL_BUDGET_BYTES // (dw.size * acc.dtype.itemsize))
    parts = _largest_divisor(sz.chunk, cap)
    ws = arrays.cuda_empty((parts * dw.size,), acc.dtype, stream)
    col = arrays.cuda_empty((sz.groups * sz.rows * sz.chunk * sz.out,), x.dtype, stream)
    dyf = arrays.flat(dy)
    for i, (n0, nc) in enumerate(sz.chunks()):
        _im2col(x, col, geom, sz, n0, nc, stream)
        p = _largest_divisor(nc, parts)          # == parts except in a short last chunk
        per = nc // p
        # ws[q, g*Kg + k, j] (+)= sum over the images n of slice q and o of
        #     dy[n, g*Kg + k, o] col[g*rows + j, n*O + o]; batched over (g, q), reduced over n
        _gemm(_kernels().conv_gemm_bwd_kernel, dyf[n0 * sz.k * sz.out:], col, ws,
              (sz.kg, sz.rows, sz.out), (sz.out, nc * sz.out, sz.rows), trans=(0, 1),
              batch=(sz.groups, p, sz.kg * sz.out, per * sz.k * sz.out,
                     sz.rows * nc * sz.out, per * sz.out, sz.kg * sz.rows, dw.size),
              red=(per, sz.k * sz.out, sz.out), beta=0.0 if i == 0 else 1.0, stream=stream)
    _elementwise(_kernels().conv_wsum_bwd_kernel, dw.size, stream,
                 (ws, arrays.flat(dw), parts, dw.size, acc))
    return dw


def backward_bias(dy, stream):
    """db[k] = sum of dy[:, k] over the batch and every spatial position."""
    from ..kernels.softmax import MAX_THREADS
    n, k = dy.shape[0], dy.shape[1]
    s = _prod(dy.shape[2:])
    db = arrays.cuda_empty((k,), dy.dtype, stream)
    if k == 0:
        return db
    acc = arrays.acc_array(dy.dtype)
    by = pow2_at_most(n * s, ELEM_THREADS if _SIM else MAX_THREADS)
    launch(_kernels().conv_bias_bwd_kernel, min(k, 65535), (1, by), stream,
           (arrays.flat(dy), db, n, k, s, acc), by * acc.dtype.itemsize)
    return db


def _zeros(a, stream):
    """Fill ``a`` with zeros (an empty reduction: no images, outputs or filters)."""
    import numpy as np
    a.copy_to_device(np.zeros(a.shape, a.dtype), stream=stream)
    return a
