"""Comparing a result with its float64 reference."""

import numpy as np


def rel_error(got, ref):
    """max |got - ref| / max |ref| (inf when got has a NaN where ref does not)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.array_equal(np.isnan(got), np.isnan(ref)):
        return float("inf")
    ok = ~np.isnan(ref)
    if not ok.any():
        return 0.0
    scale = np.abs(ref[ok]).max()
    err = np.abs(got[ok] - ref[ok]).max()
    return float(err / scale) if scale > 0 else float(err)
