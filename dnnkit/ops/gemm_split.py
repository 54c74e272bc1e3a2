"""Split-k for the Numba backend's matmul and linear: a product whose m x n output makes too
few GEMM blocks to fill the GPU, and whose k is long, runs as p GEMMs of k/p each.

A language model's decoder gradient (m 1,120 rows, n 650, k 10,000) makes 108 blocks of
64 x 128 for an H100's 132 multiprocessors: a third of a wave (two blocks per SM), each block
walking all of k. Cut k into p equal slices and each slice's product is one batch entry of a
single GEMM launch (batch offsets: the slice's first column of op(A), first row of op(B), its
own m x n of the workspace), written into a workspace of p x m x n in the accumulation type;
kernels/conv.py's ``conv_partsum_fwd_kernel`` then adds the p partial products in a fixed
order (deterministic), adds the bias per column where there is one, and casts to C's type.

The rule is the convolution's (conv_launch.fill_parts): p divides k, each slice at least
MIN_K_PER_PART deep, at most MAX_PARTS, the workspace within ``conv_tuning.settings``'s column
budget; no split unless the split's last wave is 0.02 fuller. Traffic added: the workspace,
written once and read once (p x m x n x 4 bytes), against the GEMM's own reads of A and B.
"""

from .. import arrays
from ..launch import launch
from . import conv_launch, gemm
from .conv_tuning import settings

MIN_K_PER_PART = 256
MAX_PARTS = 8


def parts(m, n, k, dtype):
    """How many k-slices an m x n x k product of ``dtype`` data runs as (1: no split)."""
    top = min(MAX_PARTS, k // MIN_K_PER_PART,
              settings.col_budget_bytes // max(1, m * n * arrays.acc_dtype(dtype).itemsize))
    if top < 2:
        return 1
    return conv_launch.fill_parts(m, n, 1, k, top)


def gemm_parts(layout, a, b, c, dims, lds, p, *, bias=None, stream, math="3xtf32", relu=False):
    """c (m x n, row-major with ldc = n, flat) = op(a) . op(b) (+ bias[j] on column j) (then
    relu when ``relu``, in the sum's pass) as ``p``
    k-slices (``parts``); ``layout``, ``dims`` and the leading dimensions of a and b as
    ops/gemm.py's ``gemm`` takes them (plain, ungrouped indices)."""
    m, n, k = dims
    ks = k // p
    lda, ldb, _ = lds
    acc = arrays.acc_array(c.dtype)
    ws = arrays.cuda_empty((p * m * n,), acc.dtype, stream)
    # slice z reads op(A)[:, z*ks:] and op(B)[z*ks:, :]: A[i, k] at k (k fast) or k*lda,
    # B[k, j] at k*ldb (j fast) or k (k fast) -- kernels/gemm.py's addressing
    a_step = ks * lda if layout[0] == "1" else ks
    b_step = ks if layout[1] == "1" else ks * ldb
    gemm.gemm(layout, a, b, ws, (m, n, ks), (lda, ldb, n), gemm.PLAIN * 3,
              (p, 1, a_step, 0, b_step, 0, m * n, 0), stream=stream, math=math)
    from ..kernels import conv_partsum_fwd_kernel
    threads = conv_launch.elem_threads()
    # out[i] = sum_z ws[z*m*n + i] (+ bias[i % n]: per 1, k n)
    launch(conv_partsum_fwd_kernel, arrays.grid_1d(m * n, threads)[0], threads, stream,
           (ws, c, p, m * n, c if bias is None else bias, 1, n,
            gemm.epilogue(bias is not None, relu), acc))
