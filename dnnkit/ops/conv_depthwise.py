"""Depthwise convolution for the Numba backend: groups = C, one input channel per filter
(K = mult x C filters, filter k reading channel k // mult), 2-D and 3-D, any stride, padding,
dilation and flip, by direct kernels (kernels/conv_direct.py ``conv_depthwise_*``; trace algo
``depthwise``).

Why not the GEMM path: it runs one GEMM per group, and a depthwise group's product has mult
rows and T*R*S columns: tiles of 64 x 128 almost empty, plus a column buffer T*R*S times x's
size. DeepBench's MobileNet layer (16 x 256 x 28 x 28, 3x3, groups 256) ran at 0.03-0.07 of
cuDNN's throughput that way on an H100 (validation/bench_tensorcore_h100.md); the direct
kernels run 0.4-1.2 of it (validation/notes/conv-numba.md). The forward and the data
gradient read their input about once from memory (each tap from cache) and write their
output once, a thread on DW_IMAGES images at once for independent loads; the filter gradient
sums dy x x over images and positions in parts (image slices x position slices) and tap
chunks of kernels/conv_direct.py DW_TAPS, each part's sums kept apart and added in a fixed order
(conv_partsum_fwd_kernel): deterministic, as every pass. Sums in the accumulation type
(float32 for float16 data).
"""

from .. import arrays, device
from ..launch import flat, launch
from . import conv_launch, gemm


def _kernels():
    """dnnkit.kernels, imported on first use (it imports numba)."""
    from .. import kernels
    return kernels


def applies(geom):
    """Whether the depthwise kernels compute this convolution: one input channel per group
    and more than one group (a single-channel ungrouped convolution keeps the GEMM)."""
    c = geom.x_shape[1]
    return geom.groups == c > 1 and geom.w_shape[1] == 1


def _filter_threads():
    """The filter gradient's threads per block: 128 (its shared partial sums, DW_TAPS x 128 in
    the accumulation type: 16 KB in float32, 32 KB in float64); 32 on the simulator."""
    return 32 if device.simulator() else 128


def _groups(n):
    """The image groups of n images: a thread works on kernels/conv_direct.py DW_IMAGES at once."""
    return -(-n // _kernels().conv_direct.DW_IMAGES)


def _sizes(geom):
    """(N, C, K, mult = K / C, output positions) of a depthwise geometry."""
    n, c = geom.x_shape[:2]
    k = geom.w_shape[0]
    out = geom.out_spatial[0] * geom.out_spatial[1] * geom.out_spatial[2]
    return n, c, k, k // c, out


def forward(x, w, bias, geom, geo, y, stream, relu=False):
    """y = the depthwise convolution of x with w (+ bias) (then relu), into ``y``; ``geo``: kernels/
    conv.py's geometry tuple of ``geom``."""
    n, _, k, mult, out = _sizes(geom)
    grid, threads = conv_launch.columns_grid(out, _groups(n) * k)
    yf = flat(y)
    launch(_kernels().conv_depthwise_fwd_kernel, grid, threads, stream,
           (flat(x), flat(w), yf, yf if bias is None else flat(bias), geo, n, mult,
            gemm.epilogue(bias is not None, relu), arrays.acc_array(x.dtype)))
    return y


def backward_data(dy, w, geom, geo, dx, stream):
    """dx, the gradient of sum(y * dy) with respect to x, into ``dx``."""
    n, c, _, mult, _ = _sizes(geom)
    d, h, wd = geom.x_shape[2:]
    grid, threads = conv_launch.columns_grid(d * h * wd, _groups(n) * c)
    launch(_kernels().conv_depthwise_bwd_data_kernel, grid, threads, stream,
           (flat(dy), flat(w), flat(dx), geo, n, mult, arrays.acc_array(dy.dtype)))
    return dx


def filter_parts(n, k, chunks, positions, threads):
    """(image slices, positions per position slice) of the filter gradient: enough (k x
    slices x chunks) blocks for two waves of the GPU's blocks -- image slices first, at most
    one per image group (kernels/conv_direct.py DW_IMAGES), then the output positions cut into
    slices of at least one position per thread (a batch of 8 images of 64 channels had 128
    blocks of 128 threads for 132 SMs without them: 0.12 of cuDNN on a 5x5 filter
    gradient)."""
    want = 2 * conv_launch.wave_blocks()
    blocks = max(1, min(k, 65535) * chunks)
    images = max(1, min(_groups(n), -(-want // blocks)))
    slices = max(1, min(positions // threads, -(-want // (blocks * images))))
    return images, -(-positions // slices)


def backward_filter(x, dy, geom, geo, dw, stream):
    """dw, the gradient of sum(y * dy) with respect to w, into ``dw``."""
    kern = _kernels()
    n, _, k, mult, out = _sizes(geom)
    taps = dw.size // k
    chunks = -(-taps // kern.conv_direct.DW_TAPS)
    threads = _filter_threads()
    images, per_pos = filter_parts(n, k, chunks, out, threads)
    # slices of whole image groups
    per_part = -(-_groups(n) // images) * kern.conv_direct.DW_IMAGES
    parts = -(-n // per_part) * -(-out // per_pos)
    acc = arrays.acc_array(x.dtype)
    ws = arrays.cuda_empty((parts * dw.size,), acc.dtype, stream)
    launch(kern.conv_depthwise_bwd_filter_kernel, (min(k, 65535), parts, chunks), threads,
           stream, (flat(x), flat(dy), ws, geo, n, mult, per_part, per_pos, acc),
           kern.conv_direct.DW_TAPS * threads * acc.dtype.itemsize)
    dwf = flat(dw)
    launch(kern.conv_partsum_fwd_kernel, *arrays.grid_1d(dw.size, conv_launch.elem_threads()),
           stream, (ws, dwf, parts, dw.size, dwf, 0, k, 0, acc))
    return dw
