"""Convolutions with few channels per group on the Numba backend, forward and data gradient:
direct kernels (kernels/conv_direct.py ``conv_direct_*``; trace algo ``direct``), 2-D and 3-D,
any stride, padding, dilation and flip.

Why: the GEMM path runs one GEMM per group whose rows are the group's kg filters (forward) or
its cg * T*R*S channel taps (data gradient), behind a column buffer T*R*S times the input.
With ResNeXt's 4-16 channels per group those tiles run mostly empty; a first layer's 3
channels make a data gradient of 27-147 rows and k = K. A thread of the direct kernels holds
a 4 x 4 block of sums (four images by four filters or channels of one position) and walks
the taps and the group's channels (forward) or filters (data gradient) with constant address
steps: every load serves four multiply-adds, nothing goes through memory but x, w and the
output. The sums run in the accumulation type (float32 for float16 data), each output in a
fixed order: deterministic.

``pays`` is the measured rule (validation/notes/conv-numba.md; ``conv_tuning.settings.direct``
overrides it): the data gradients of 2-D convolutions with 2-16 channels per group, and the
forwards of grouped ones. The filter gradient keeps the GEMM path.
"""

from .. import arrays
from ..launch import flat, launch
from . import conv_depthwise, conv_launch, gemm
from .conv_tuning import settings

# The rule's bounds on the channels (and, forward, filters) per group, from the H100 sweep in
# validation/notes/conv-numba.md.
MIN_PER_GROUP = 2       # one channel per group: depthwise kernels, or (ungrouped) the GEMM
MAX_PER_GROUP = 16      # 32 channels per group ran faster on the GEMM path
MAX_GRID_ROWS = 65535   # the grid's y dimension, at most


def _kernels():
    """dnnkit.kernels, imported on first use (it imports numba)."""
    from .. import kernels
    return kernels


def _per_group(geom):
    """(groups, channels per group, filters per group)."""
    g = geom.groups
    return g, geom.x_shape[1] // g, geom.w_shape[0] // g


def pays(geom, direction):
    """Whether the Numba backend takes the direct kernels for ``direction`` ("fwd" or
    "bwd_data") of this convolution, where Winograd does not (ops/conv_numba.py asks
    ``conv_winograd.pays`` first): ``settings.direct`` when set (True: any convolution but a
    depthwise one, which has kernels of its own), else the measured rule, 2-D convolutions
    only (a 3-D data gradient with 3 channels lost to the
    GEMM path, 1.85x its time):

    - the data gradient with MIN_PER_GROUP to MAX_PER_GROUP channels per group, grouped or
      not: ResNeXt's groups of 4-16 channels 0.09-0.31x the GEMM path's time (which runs a
      GEMM of kg-long sums per group), ungrouped layers of 3-16 channels 0.15-0.88x (their
      implicit GEMM has C rows; the 7x7/2 stem's column-buffer GEMM 147);
    - the forward of grouped convolutions with at most MAX_PER_GROUP channels and filters per
      group: 0.10-0.45x in float32, 0.12-0.65x in float16 (a GEMM per group of kg rows).
      Ungrouped forwards keep the GEMM, which has K rows (the stem's: 1.5x the time on the
      direct kernel).
    """
    if conv_depthwise.applies(geom):
        return False
    g, cg, kg = _per_group(geom)
    if settings.direct is not None:
        return bool(settings.direct)
    if geom.x_shape[2] != 1 or geom.w_shape[2] != 1:      # 3-D
        return False
    if direction == "fwd":
        return g > 1 and max(cg, kg) <= MAX_PER_GROUP
    return MIN_PER_GROUP <= cg <= MAX_PER_GROUP


def grid(positions, n, groups, per_group):
    """(grid, threads): a thread per position (x), and a block row (y) per tile of (image
    group, group, four per-group items) up to MAX_GRID_ROWS (grid-stride beyond): every tile
    at once, so no block row does two while others idle (the stem's data gradient has 8)."""
    kern = _kernels().conv_direct
    tiles = -(-n // kern.DW_IMAGES) * groups * -(-per_group // kern.TILE)
    threads = conv_launch.elem_threads()
    return (-(-positions // threads), min(tiles, MAX_GRID_ROWS)), threads


def forward(x, w, bias, geom, geo, y, stream, relu=False):
    """y = conv(x, w) (+ bias) (then relu) into ``y``; ``geo``: kernels/conv.py's geometry
    tuple."""
    n = geom.x_shape[0]
    g, cg, kg = _per_group(geom)
    out = geom.out_spatial[0] * geom.out_spatial[1] * geom.out_spatial[2]
    grid_, threads = grid(out, n, g, kg)
    yf = flat(y)
    launch(_kernels().conv_direct_fwd_kernel, grid_, threads, stream,
           (flat(x), flat(w), yf, yf if bias is None else flat(bias), geo, n, cg, kg,
            gemm.epilogue(bias is not None, relu), arrays.acc_array(x.dtype)))
    return y


def backward_data(dy, w, geom, geo, dx, stream):
    """dx, the gradient of sum(conv(x, w) * dy) with respect to x, into ``dx``."""
    n = geom.x_shape[0]
    g, cg, kg = _per_group(geom)
    d, h, wd = geom.x_shape[2:]
    grid_, threads = grid(d * h * wd, n, g, cg)
    launch(_kernels().conv_direct_bwd_data_kernel, grid_, threads, stream,
           (flat(dy), flat(w), flat(dx), geo, n, cg, kg, arrays.acc_array(dy.dtype)))
    return dx
