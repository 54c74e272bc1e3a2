"""The only part of dnnkit that talks to cuDNN (through ctypes).

``loader`` finds and checks the library, ``api`` holds the prototypes and ``check()``,
``handle`` keeps one handle per (device, thread), ``descriptors`` wraps descriptors, and
``calls`` runs whole operations on device arrays.
"""

from .loader import CudnnStatus, status  # noqa: F401
