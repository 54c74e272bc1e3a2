"""dnnkit's own exceptions.

Bad *user arguments* raise the built-in ``ValueError``/``TypeError`` (naming the op and the
values). Failures of the *environment or a library* raise the classes below.
"""


class DnnkitError(RuntimeError):
    """Base class of every error dnnkit raises about its environment or a library."""


class CudnnUnavailableError(DnnkitError):
    """cuDNN is required (``dnn.enabled=forced`` or ``backend="cudnn"``) but cannot be used.

    ``op`` is the op that asked for it (or None) and ``reason`` says why cuDNN is unusable.
    """

    def __init__(self, message, *, op=None, reason=None):
        super().__init__(message)
        self.op = op
        self.reason = reason


class CudnnError(DnnkitError):
    """A cuDNN call returned a status other than CUDNN_STATUS_SUCCESS.

    Attributes: ``function`` (the C function), ``status`` (the integer), ``status_name``
    (e.g. ``"CUDNN_STATUS_BAD_PARAM"``) and ``context`` (the shapes and values involved).
    """

    def __init__(self, function, status, status_name, context=""):
        self.function = function
        self.status = int(status)
        self.status_name = status_name
        self.context = context
        msg = f"{function} failed with {status_name} ({self.status})"
        if context:
            msg += f": {context}"
        super().__init__(msg)

    @property
    def not_supported(self):
        """True for CUDNN_STATUS_NOT_SUPPORTED and its sub-codes (3000-3999 in cuDNN 9)."""
        return 3000 <= self.status < 4000


class CaptureError(DnnkitError):
    """Work that cannot be recorded into a CUDA graph (a host read, an algorithm timing, a
    synchronisation) was asked for while its stream was being captured (dnnkit.graphs), or
    the capture itself failed. ``what`` names the call."""

    def __init__(self, message, *, what=None):
        super().__init__(message)
        self.what = what


class NumbaUnavailableError(DnnkitError):
    """No CUDA device for the Numba kernels (no driver and the simulator is not enabled)."""


class CrosscheckError(DnnkitError):
    """Two backends disagreed beyond the op's tolerance (``dnn.crosscheck`` or
    ``dnnkit.testing.assert_backends_agree``)."""

    def __init__(self, message, *, op=None, max_abs=None, max_rel=None):
        super().__init__(message)
        self.op = op
        self.max_abs = max_abs
        self.max_rel = max_rel
