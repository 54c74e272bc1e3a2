"""The switches of the Numba convolution backend (ops/conv_numba.py, ops/conv_winograd.py,
ops/conv_direct.py):
for side-by-side timing (validation/implicit_bench.py, validation/winograd_bench.py) and tests,
not user flags. Every rule reads them at call time; the defaults take the measured rules.
Setting one drops the memo's runners (``fastpath.invalidate``): a runner of repeated calls
(ops/conv_prepared.py) holds the path its first call's rules chose.

    from dnnkit.ops.conv_tuning import settings
    settings.implicit = False           # the column buffer everywhere
    settings.split_k = 4                # the forward's sum in (up to) 4 parts
"""

import dataclasses

from .. import fastpath


@dataclasses.dataclass
class ConvTuning:
    """None in a choice field: the measured rule decides (each rule's docstring)."""

    # The implicit GEMM (kernels/gemm.py ``implicit``): True always, False never (the column
    # buffer), None where it measured faster (conv_implicit.implicit_pays; the filter gradient
    # takes it only when True).
    implicit: object = None
    # The forward's sum over the C/G*T*R*S rows in this many parts (the largest divisor of the
    # rows up to it; the workspace budget and MIN_K_PER_PART are not applied); None: the
    # last-wave rule (conv_numba.k_parts).
    split_k: object = None
    # The filter gradient's slices of whole images (the largest divisor of the chunk up to
    # it); None: the rule (conv_numba.filter_parts).
    filter_parts: object = None
    # The filter gradient's slices of each image's output positions (a divisor of them; 1:
    # whole images only); None: the rule (conv_numba.position_slices).
    filter_positions: object = None
    # Winograd F(2x2, 3x3) where it applies: True always, False never, None where it measured
    # faster (conv_winograd.pays).
    winograd: object = None
    # The Winograd filter gradient's slices of the sum over tiles; None: the rule
    # (conv_winograd.filter_parts).
    winograd_parts: object = None
    # The direct kernels for few channels per group (ops/conv_direct.py): True for every
    # forward and data gradient that neither the depthwise kernels nor Winograd take (they
    # are asked first), False never, None where they measured faster (conv_direct.pays).
    direct: object = None
    # Bytes of one chunk's column buffer (or Winograd transforms, or filter-gradient partial
    # sums): the batch goes through in chunks of images that fit.
    col_budget_bytes: int = 256 << 20

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        fastpath.invalidate()


settings = ConvTuning()
