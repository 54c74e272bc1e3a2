"""Pure ``@cuda.jit`` kernels (installed as ``dnnkit.kernels``).

Kernels take preallocated outputs, never allocate and never read configuration.

Precision: each kernel takes ``acc``, a one-element device array holding 0 in the accumulation
type (float32 for float16 and float32 data, float64 for float64). ``zero = acc[0]`` and
``x[i] + zero`` promote every load to that type, ``cuda.shared.array(..., dtype=acc.dtype)``
types the scratch, and scalar arguments (``coef``) are passed in that type by the ops. Literal
constants are written ``float32(c)``: a Python literal would promote float32 math to float64.
"""

from .activation import activation_bwd_kernel, activation_fwd_kernel  # noqa: F401
from .conv import (conv_bias_bwd_kernel, conv_col2im_bwd_kernel,  # noqa: F401
                   conv_gemm_bwd_kernel, conv_gemm_fwd_kernel, conv_im2col_fwd_kernel,
                   conv_wsum_bwd_kernel)
from .softmax import softmax_bwd_kernel, softmax_fwd_kernel  # noqa: F401

ALL_KERNELS = ("activation_fwd_kernel", "activation_bwd_kernel",
               "softmax_fwd_kernel", "softmax_bwd_kernel",
               "conv_im2col_fwd_kernel", "conv_col2im_bwd_kernel", "conv_gemm_fwd_kernel",
               "conv_gemm_bwd_kernel", "conv_bias_bwd_kernel", "conv_wsum_bwd_kernel")
