"""The only part of dnnkit that talks to cuDNN (through ctypes).

The core, used by every op family:
``loader`` finds, checks and loads the library; ``api`` holds the prototypes every family
uses, ``check()``/``call()`` and the device-pointer helpers; ``handle`` keeps one handle per
(device, thread); ``descriptors`` is the base of the legacy descriptors, their caches and the
alpha/beta scalars; ``enums`` the C enum values; ``workspace`` scratch blocks for workspaces;
``graph`` the graph (backend) API.

One module per op family, each declaring its own prototypes and descriptors and running whole
operations on device arrays: ``activation``, ``softmax``, ``pool``, ``batchnorm``, ``lrn``,
``dropout``, ``spatial``, ``rnn``; convolutions in ``conv`` (the calls), ``conv_algos``
(algorithm tables and choosing), ``conv_plans`` (descriptors kept per shape), ``conv_graph``
(the graph-API route) and ``algo_cache`` (the algorithms chosen, saved and loaded).

Arrays are validated by the ops (dnnkit/ops) before they reach this layer; ``stream`` is the
raw ``cudaStream_t`` value (0 = the legacy default stream).

``is_available()`` and ``version()`` are PyTorch's names (``torch.backends.cudnn``) for what
``status()`` reports in full (Theano's ``dnn_available()`` and ``version()``).
"""

from . import loader
from .loader import CudnnStatus, status  # noqa: F401


def is_available():
    """True when dnnkit's cuDNN backend can run here: the library (for the current
    ``dnn.library_path``) loaded, is cuDNN 9 or later, and made a handle on a CUDA device.
    When False, ``dnnkit.cudnn.status().reason`` says why (e.g. "no CUDA device (cudnnCreate
    returned CUDNN_STATUS_NOT_INITIALIZED)"). The first call probes the library (and imports
    Numba); later calls read the cached answer."""
    return loader.status().available


def version():
    """cudnnGetVersion() of the cuDNN library dnnkit loaded, as an int (91900 for 9.19.0; text
    from ``status().version_string``), or None when no library was loaded and asked: none
    found, or a file refused before loading (a cuDNN 8 or non-cuDNN file by its name, a folder
    missing a sub-library). A loaded library answers without a GPU, so the number is given
    where ``is_available()`` is False for want of a device (PyTorch's ``version()`` too), and
    for a library too old to use."""
    return loader.status().version
