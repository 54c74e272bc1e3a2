"""Constants that a kernel module and the host side must agree on but cannot share (the kernels
import nothing of dnnkit's host modules): checked equal here."""

import dnnkit.kernels.spatial
from dnnkit.reference import spatial as spatial_reference


def test_spatial_coordinate_convention_is_the_references():
    """kernels/spatial.py's ALIGN_CORNERS and the float64 reference's (dnnkit/reference/
    spatial.py) are one convention."""
    assert dnnkit.kernels.spatial.ALIGN_CORNERS == spatial_reference.ALIGN_CORNERS
