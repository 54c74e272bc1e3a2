"""validation/fusion_bench.py's patterns: each fused variant computes what its unfused one does,
and the bench's float64 reference (its correctness column) what the fused one does, here on
tiny shapes with the Numba kernels."""

import numpy as np
import pytest

from tests.conftest import backend_params
from validation import fusion_bench


def _arrays(pattern, seed):
    make = fusion_bench.conv_arrays_for if pattern in fusion_bench.CONV_PATTERNS else \
        fusion_bench.arrays_for
    return make((2, 3, 2, 4), "float32", np.random.default_rng(seed))


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("pattern", fusion_bench.PATTERNS)
def test_fused_and_unfused_variants_agree(backend, pattern):
    arrs = _arrays(pattern, 0)
    fns = fusion_bench.variants(pattern, backend, arrs)
    fused, plain = ([o.copy_to_host() for o in fns[k]()] for k in ("fused", "unfused"))
    assert len(fused) == len(plain) == {"train": 4, "residual": 5, "inference": 1, "conv": 4,
                                        "conv_inference": 1}[pattern]
    for a, b in zip(fused, plain):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pattern", fusion_bench.PATTERNS)
def test_the_float64_reference_matches_the_fused_variant(pattern):
    arrs = _arrays(pattern, 1)
    ref = fusion_bench.reference(pattern, arrs)
    fused = [o.copy_to_host() for o in fusion_bench.variants(pattern, "numba", arrs)["fused"]()]
    assert len(ref) == len(fused)
    assert fusion_bench.rel_error(fused, ref) < 1e-5
    wrong = [r.copy() for r in ref]
    wrong[-1].flat[0] += 1.0                       # the check sees one wrong value
    assert fusion_bench.rel_error(wrong, ref) > 1e-3
