"""The pipelined float16 GEMM (kernels/hmma.py) on a real GPU, through ops/gemm.py: every layout
and both tile heights, edges in m, n and k, batches, grouped C, bias and beta, and operands
that are not 16-byte aligned (the element-by-element staging), against float64. C in float32
is the accumulation itself: errors of float32 sums (~1e-6), float16 products being exact."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _need_tensor_cores():
    from numba import cuda
    if tuple(cuda.get_current_device().compute_capability) < (8, 0):
        pytest.skip("HMMA needs compute capability 8.0")


def _rel(got, ref):
    assert np.isfinite(got).all()
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _stored(a, b, layout):
    sa = a.T.copy() if layout[0] == "1" else a      # stored k x m
    sb = b.T.copy() if layout[1] == "1" else b      # stored n x k
    return sa, sb


def _plan_kernel(layout, dims):
    """The name of the pipelined kernel (kernels/hmma.py VARIANTS) of the last float16 plan
    for (layout, dims); None when that plan took another kernel."""
    from dnnkit.kernels import hmma
    from dnnkit.ops import gemm
    plans = [p for key, p in gemm._plans.items() if key[0] == layout and key[1] == dims
             and key[4] == np.float16]
    names = {k: name for name, k in hmma.VARIANTS.items() if not name.endswith("_acc_kernel")}
    return names.get(plans[-1][0]) if plans else None


def _narrow(*values):
    """Whether strides and extents ``values`` take the narrow-copy variant (ops/gemm.py):
    multiples of 4, not all of 8."""
    return int(np.bitwise_or.reduce(np.array(values, np.int64)) & 7) == 4


@pytest.mark.parametrize("layout", ["00", "10", "01"])
@pytest.mark.parametrize("m, n, k", [(128, 128, 32), (64, 96, 40), (257, 136, 104),
                                     (1000, 520, 264), (33, 8, 8), (4096, 256, 64),
                                     (100, 196, 68), (66, 130, 34)])
@pytest.mark.parametrize("shift_a, shift_b", [(0, 0), (1, 1), (1, 0), (0, 1), (4, 2)])
def test_pipelined_hmma_against_float64(rng, layout, m, n, k, shift_a, shift_b):
    from numba import cuda

    from dnnkit.ops import gemm
    _need_tensor_cores()
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    sa, sb = _stored(a, b, layout)
    # shift 1: the operand one element past a 16-byte boundary (staged element by element);
    # 4: 8-byte aligned (8-byte copies where m, n and k are multiples of 4, not all of 8: the
    # narrow variant; else element by element), 2: element by element; (100, 196, 68): the
    # narrow variant's 8-byte copies, (66, 130, 34): element by element
    da = cuda.to_device(np.concatenate([np.zeros(shift_a, np.float16), sa.ravel()]))
    db = cuda.to_device(np.concatenate([np.zeros(shift_b, np.float16), sb.ravel()]))
    lda, ldb = (m if layout[0] == "1" else k), (k if layout[1] == "1" else n)
    c = cuda.to_device(np.full(m * n, np.nan, np.float32))
    gemm.gemm(layout, da[shift_a:], db[shift_b:], c, (m, n, k), (lda, ldb, n), gemm.PLAIN * 3,
              gemm.NO_BATCH, stream=cuda.default_stream())
    assert _rel(c.copy_to_host().reshape(m, n), ref) < 1e-5
    name = _plan_kernel(layout, (m, n, k))
    assert name and name.endswith("n_kernel") == _narrow(m, n, k, lda, ldb)


@pytest.mark.parametrize("layout", ["00", "01"])
def test_batch_grouped_c_bias_and_beta(rng, layout):
    # two batch entries, C's columns grouped as a convolution's (n, position) into NCHW
    # (groups of 48 columns, 96 apart... C[i, j] at i*48 + (j // 48)*m*48 + j % 48), a bias
    # per row of each entry, and beta = 0.5 of C's old values
    from numba import cuda

    from dnnkit.ops import gemm
    _need_tensor_cores()
    nz, m, n, k, grp = 2, 72, 144, 80, 48
    a = rng.standard_normal((nz, m, k)).astype(np.float16)
    b = rng.standard_normal((nz, k, n)).astype(np.float16)
    bias = rng.standard_normal(nz * m).astype(np.float16)
    old = rng.standard_normal((nz, n // grp, m, grp)).astype(np.float32)
    prod = np.einsum("zmk,zkn->zmn", a.astype(np.float64), b.astype(np.float64))
    prod += bias.astype(np.float64).reshape(nz, m, 1)
    want = 0.5 * old.astype(np.float64)
    for z in range(nz):
        for j in range(n):
            want[z, j // grp, :, j % grp] += prod[z, :, j]
    sb = np.ascontiguousarray(b.transpose(0, 2, 1)) if layout == "01" else b
    c = cuda.to_device(old.ravel())
    size_c = m * n
    gemm.gemm(layout, cuda.to_device(a.ravel()), cuda.to_device(sb.ravel()), c, (m, n, k),
              (k, k if layout == "01" else n, grp), (1 << 62, 0, 1 << 62, 0, grp, m * grp),
              (nz, 1, m * k, 0, k * n, 0, size_c, 0), beta=0.5, bias=cuda.to_device(bias),
              stream=cuda.default_stream())
    assert _rel(c.copy_to_host().reshape(want.shape), want) < 1e-5
    assert _plan_kernel(layout, (m, n, k))


def test_grouped_k_keeps_the_staged_kernel(rng):
    # a grouped k (here B's, layout 01): not the pipelined kernel's
    from numba import cuda

    from dnnkit.kernels import hmma
    from dnnkit.ops import gemm
    _need_tensor_cores()
    m, n, k, grp = 64, 96, 96, 48
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, 2, 64)).astype(np.float16)     # B[k, j] = b[j, k // 48, k % 48]
    ref = a.astype(np.float64) @ b[:, :, :grp].reshape(n, k).T.astype(np.float64)
    c = cuda.device_array(m * n, np.float32)
    gemm.gemm("01", cuda.to_device(a.ravel()), cuda.to_device(b.ravel()), c, (m, n, k),
              (k, 128, n), (1 << 62, 0, grp, 64, 1 << 62, 0), gemm.NO_BATCH,
              stream=cuda.default_stream())
    assert _rel(c.copy_to_host().reshape(m, n), ref) < 1e-5
    plans = [p for key, p in gemm._plans.items() if key[1] == (m, n, k) and not key[-2]]
    assert plans and plans[-1][0] not in hmma.VARIANTS.values()


@pytest.mark.parametrize("grp, short", [(48, 0), (49, 0), (48, 4), (52, 0), (50, 0), (52, 2),
                                        (52, 1)])
def test_grouped_columns_of_b_and_a(rng, grp, short):
    # layout 10 (the convolution's data gradient): A stored k x m with m grouped, B's columns
    # grouped as a convolution's (n, position) in NCHW: 48 a multiple of 8 (16-byte copies),
    # 49 not (element by element); ``short``: B's last group cut short (n not a multiple of
    # 8: element by element, no chunk read past column n); 52: 8-byte copies (a chunk of 8
    # columns may straddle two groups), short by 2 or 1 (element by element); 50: element by
    # element
    from numba import cuda

    from dnnkit.ops import gemm
    _need_tensor_cores()
    m, k, groups = 2 * grp, 40, 3
    n = groups * grp - short
    a = rng.standard_normal((k, 2, grp + 8)).astype(np.float16)       # A[i, k] grouped in i
    # B[k, j] at (j // grp, k, j % grp)
    b = rng.standard_normal((groups, k, grp)).astype(np.float16)
    am = a[:, :, :grp].reshape(k, m).T.astype(np.float64)
    bm = b.transpose(1, 0, 2).reshape(k, groups * grp)[:, :n].astype(np.float64)
    c = cuda.to_device(np.full(m * n, np.nan, np.float32))
    gemm.gemm("10", cuda.to_device(a.ravel()), cuda.to_device(b.ravel()), c, (m, n, k),
              (2 * (grp + 8), grp, n), (grp, grp + 8, grp, k * grp, 1 << 62, 0),
              gemm.NO_BATCH, stream=cuda.default_stream())
    assert _rel(c.copy_to_host().reshape(m, n), am @ bm) < 1e-5
    name = _plan_kernel("10", (m, n, k))
    assert name and name.endswith("n_kernel") == _narrow(m, n, k, 2 * (grp + 8), grp, grp + 8,
                                                         k * grp)
