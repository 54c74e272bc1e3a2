"""cuDNN fills (dnnkit/cudnn/optensor.py ``set_tensor``) on a GPU: every element takes the
value, -inf and NaN included, in each float type and rank; ceil-mode max pooling and the empty
reductions rely on them."""

import math

import numpy as np
import pytest

from dnnkit import arrays, device
from dnnkit.cudnn import optensor

pytestmark = pytest.mark.cudnn


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("value", [-math.inf, math.nan, 0.0, -2.5])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 5, 4), (1, 2, 3, 4, 5)])
def test_every_element_takes_the_value(dtype, value, shape):
    s = arrays.as_stream(None)
    c = arrays.cuda_empty(shape, dtype, s)
    c.copy_to_device(np.full(shape, 7, dtype))          # not the value: a fill must change it
    optensor.set_tensor(c, shape, value, device.stream_pointer(s))
    got = c.copy_to_host(stream=s)
    s.synchronize()
    want = np.full(shape, value, dtype)
    np.testing.assert_array_equal(got, want)
