"""Fresh random seeds for the dropout generators (cuDNN's and the Numba kernels').

``os.urandom`` rather than ``secrets.randbits``: the same operating-system entropy, without
importing ``secrets`` (which loads ``hmac`` and ``hashlib``, about 7 ms) at ``import dnnkit``
(tests/test_packaging.py times that import).
"""

import os


def fresh_seed():
    """A uniformly random 64-bit seed, 0 <= seed < 2**64."""
    return int.from_bytes(os.urandom(8), "little")
