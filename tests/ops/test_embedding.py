"""embedding and embedding_backward: against NumPy for every dtype and index type, the
padding row, out-of-range ids (NaN rows on the device, ValueError from a host array), the
float16 gradient's single rounding, gradients through dnnkit.Tensor, bad input."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.device import numba_cuda
from tests.conftest import DTYPES, REL_TOL

NUM, DIM = 7, 5


def _ids(rng, shape, dtype=np.int64, device=True):
    ids = rng.integers(0, NUM, shape).astype(dtype)
    return numba_cuda().to_device(ids) if device else ids, ids


def _scatter(ids, dy, pad=None):
    dw = np.zeros((NUM, dy.shape[-1]))
    np.add.at(dw, ids.reshape(-1), dy.reshape(-1, dy.shape[-1]).astype(np.float64))
    if pad is not None:
        dw[pad] = 0
    return dw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(6,), (2, 3), (2, 1, 4)])
def test_lookup_and_scatter_add_match_numpy(rng, shape, id_dtype, dtype):
    w = rng.standard_normal((NUM, DIM)).astype(dtype)
    d_ids, ids = _ids(rng, shape, id_dtype)
    with dnnkit.trace() as t:
        y = dnnkit.embedding(d_ids, w)
    assert t[0].backend == "numba"
    got = y.copy_to_host()
    assert got.shape == shape + (DIM,) and got.dtype == np.dtype(dtype)
    assert np.array_equal(got, w[ids])          # a gather is exact
    dy = rng.standard_normal(shape + (DIM,)).astype(dtype)
    dw = dnnkit.embedding_backward(d_ids, dy, NUM).copy_to_host()
    assert dw.shape == (NUM, DIM) and dw.dtype == np.dtype(dtype)
    assert reference.rel_error(dw, _scatter(ids, dy)) <= REL_TOL[dtype]


def test_float16_gradient_is_rounded_once(rng):
    """Many repeats of one id: summed in float32, rounded once (float16 adds would drift)."""
    ids = np.zeros(300, np.int64)
    dy = np.full((300, 2), 0.1, np.float16)
    dw = dnnkit.embedding_backward(ids, dy, 3).copy_to_host()
    exact = np.float16(300 * np.float32(np.float16(0.1)))
    assert np.array_equal(dw[0], [exact, exact]) and not dw[1:].any()


@pytest.mark.parametrize("padding_idx,row", [(2, 2), (-1, NUM - 1)])
def test_padding_row_is_looked_up_but_gets_no_gradient(rng, padding_idx, row):
    w = rng.standard_normal((NUM, DIM))
    ids = np.array([row, 0, row, 3])
    y = dnnkit.embedding(ids, w, padding_idx).copy_to_host()
    assert np.array_equal(y, w[ids])
    dy = rng.standard_normal((4, DIM))
    dw = dnnkit.embedding_backward(ids, dy, NUM, padding_idx).copy_to_host()
    assert np.allclose(dw, _scatter(ids, dy, pad=row))


def test_out_of_range_device_ids_give_nan_rows_and_no_gradient(rng):
    w = rng.standard_normal((NUM, DIM)).astype(np.float32)
    ids = numba_cuda().to_device(np.array([1, NUM, -1, 4], np.int32))
    y = dnnkit.embedding(ids, w).copy_to_host()
    assert np.array_equal(y[[0, 3]], w[[1, 4]]) and np.isnan(y[[1, 2]]).all()
    dw = dnnkit.embedding_backward(ids, np.ones((4, DIM), np.float32), NUM).copy_to_host()
    assert dw.sum() == 2 * DIM and dw[1].sum() == DIM and dw[4].sum() == DIM


def test_no_cudnn_path():
    w, ids = np.ones((3, 2), np.float32), np.array([0, 2])
    assert dnnkit.select_backend("embedding", ids, w, backend="cudnn") == "numba"
    with dnnkit.trace() as t:
        dnnkit.embedding_backward(ids, np.ones((2, 2), np.float32), 3, backend="cudnn")
    assert t[0].backend == "numba" and "no embedding" in t[0].reason


def test_gradient_through_tensors(rng):
    """The weight's gradient of sum(dy * embedding(ids, W)), a shared row counted twice,
    against finite differences."""
    w = rng.standard_normal((4, 3))
    ids = np.array([[1, 3], [1, 0]])
    dy = rng.standard_normal((2, 2, 3))
    tw = dnnkit.tensor(w, requires_grad=True)
    dnnkit.embedding(ids, tw).backward(dnnkit.tensor(dy))
    fd = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        p, m = w.copy(), w.copy()
        p[i] += 1e-6
        m[i] -= 1e-6
        fd[i] = (np.sum(dy * p[ids]) - np.sum(dy * m[ids])) / 2e-6
    assert np.allclose(tw.grad.numpy(), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("op,call,exc,words", [
    ("embedding", lambda: dnnkit.embedding([0, 7], np.ones((7, 2))), ValueError,
     "got 7 at (1,)"),
    ("embedding", lambda: dnnkit.embedding([0.0, 1.0], np.ones((7, 2))), TypeError, "integer"),
    ("embedding", lambda: dnnkit.embedding(numba_cuda().to_device(np.zeros(2, np.int16)),
                                           np.ones((7, 2))), TypeError, "int32 or int64"),
    ("embedding", lambda: dnnkit.embedding([0], np.ones(7)), ValueError, "2-D"),
    ("embedding", lambda: dnnkit.embedding([0], np.ones((7, 2)), padding_idx=7), ValueError,
     "padding_idx"),
    ("embedding", lambda: dnnkit.embedding([0], np.ones((7, 2)), padding_idx=1.0), TypeError,
     "padding_idx"),
    ("embedding_backward", lambda: dnnkit.embedding_backward([0, 1], np.ones((3, 2)), 7),
     ValueError, "ids.shape + (dim,)"),
    ("embedding_backward", lambda: dnnkit.embedding_backward([0], np.ones((1, 2)), -1),
     ValueError, "num"),
])
def test_bad_input_names_the_op(op, call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert str(e.value).startswith(op + ":") and words in str(e.value)
