"""The only part of dnnkit that talks to cuDNN (through ctypes).

The core, used by every op family:
``loader`` finds, checks and loads the library; ``api`` holds the prototypes every family
uses, ``check()``/``call()`` and the device-pointer helpers; ``handle`` keeps one handle per
(device, thread); ``descriptors`` is the base of the legacy descriptors, their caches and the
alpha/beta scalars; ``enums`` the C enum values; ``workspace`` scratch blocks for workspaces;
``graph`` the graph (backend) API.

One module per op family, each declaring its own prototypes and descriptors and running whole
operations on device arrays: ``activation``, ``softmax``, ``pool``, ``batchnorm``,
``dropout``, ``spatial``, ``rnn``; convolutions in ``conv`` (the calls), ``conv_algos``
(algorithm tables and choosing), ``conv_plans`` (descriptors kept per shape), ``conv_graph``
(the graph-API route) and ``algo_cache`` (the algorithms chosen, saved and loaded).

Arrays are validated by the ops (dnnkit/ops) before they reach this layer; ``stream`` is the
raw ``cudaStream_t`` value (0 = the legacy default stream).
"""

from .loader import CudnnStatus, status  # noqa: F401
