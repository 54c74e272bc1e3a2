"""global_avg_pool: the spatial mean against float64 NumPy on both backends, 2-D and 3-D, its
gradient through dnnkit.Tensor, bad input."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from tests.conftest import DTYPES, REL_TOL, backend_params


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 3, 1, 4), (2, 2, 1, 1)])
def test_mean_over_space_matches_float64(rng, shape, dtype, backend):
    x = rng.standard_normal(shape).astype(dtype)
    with dnnkit.trace() as t:
        y = dnnkit.global_avg_pool(x, backend=backend)
    assert t[0].backend == backend
    ref = x.astype(np.float64).mean(axis=tuple(range(2, len(shape))))
    assert y.shape == shape[:2]
    assert reference.rel_error(y.copy_to_host(), ref) <= REL_TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("shape", [(2, 3, 2, 3), (1, 2, 2, 1, 2)])
def test_gradient_spreads_dy_evenly(rng, shape, backend):
    x = rng.standard_normal(shape)
    dy = rng.standard_normal(shape[:2])
    tx = dnnkit.tensor(x, requires_grad=True)
    dnnkit.global_avg_pool(tx, backend=backend).backward(dnnkit.tensor(dy))
    size = np.prod(shape[2:])
    want = np.broadcast_to(dy.reshape(shape[:2] + (1,) * (len(shape) - 2)) / size, shape)
    assert np.allclose(tx.grad.numpy(), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("x,exc,words", [
    (np.ones((2, 3, 4)), ValueError, "4-D or 5-D"),
    (np.ones((2, 3, 0, 4)), ValueError, "empty spatial"),
    (np.ones((2, 3, 4, 4), np.int32), TypeError, "floating-point"),
])
def test_bad_input_names_the_op(x, exc, words):
    with pytest.raises(exc) as e:
        dnnkit.global_avg_pool(x)
    assert str(e.value).startswith("global_avg_pool:") and words in str(e.value)
