"""What this process can run on: ``dnnkit.backends.status()``."""

import dataclasses
import os

from . import config
from .cudnn import loader
from .device import driver


@dataclasses.dataclass(frozen=True)
class NumbaStatus:
    available: bool
    simulator: bool
    device: str | None = None
    compute_capability: tuple | None = None
    reason: str = ""

    def describe(self):
        if self.simulator:
            return "Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1): correct but very slow"
        if self.available:
            cc = ".".join(map(str, self.compute_capability or ()))
            return f"{self.device} (compute capability {cc})"
        return self.reason


@dataclasses.dataclass(frozen=True)
class Status:
    cudnn_available: bool
    cudnn_version: str | None
    cudnn_path: str | None
    cudnn_found_via: str | None
    cudnn_reason: str
    numba: NumbaStatus
    policy: str

    def __str__(self):
        c = "available" if self.cudnn_available else "unavailable"
        lines = [f"dnn.enabled : {self.policy}",
                 f"cuDNN       : {c}",
                 f"  version   : {self.cudnn_version or '-'}",
                 f"  path      : {self.cudnn_path or '-'}",
                 f"  found via : {self.cudnn_found_via or '-'}"]
        if not self.cudnn_available:
            lines.append(f"  reason    : {self.cudnn_reason}")
        lines.append(f"Numba       : {self.numba.describe()}")
        return "\n".join(lines)


def numba_status():
    # numba is imported here: conftest.py and `python -m dnnkit` import this module to decide
    # on the simulator, which must be chosen before numba is first imported
    from numba.core import config as nconfig
    if nconfig.ENABLE_CUDASIM:
        return NumbaStatus(True, True, "simulator")
    from numba import cuda
    try:
        if not cuda.is_available():
            return NumbaStatus(False, False, reason="no CUDA driver or GPU found "
                               "(set NUMBA_ENABLE_CUDASIM=1 to use the simulator)")
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        return NumbaStatus(True, False, name, tuple(dev.compute_capability))
    except Exception as e:  # driver present but broken
        return NumbaStatus(False, False, reason=f"CUDA error: {e}")


def status():
    """A record of both backends. Probes (loads) cuDNN unless ``dnn.enabled=disabled``."""
    policy = config.get("dnn.enabled")
    if policy == "disabled":
        cud = dict(cudnn_available=False, cudnn_version=None, cudnn_path=None,
                   cudnn_found_via=None, cudnn_reason="not probed: dnn.enabled=disabled")
    else:
        st = loader.status()
        cud = dict(cudnn_available=st.available, cudnn_version=st.version_string,
                   cudnn_path=st.path and os.fspath(st.path), cudnn_found_via=st.found_via,
                   cudnn_reason=st.reason)
    return Status(numba=numba_status(), policy=policy, **cud)


def driver_available():
    """True when a CUDA driver with at least one device is present. Uses cuda-bindings, so it
    neither imports numba.cuda (which fixes simulator-or-not at import) nor touches ctypes."""
    try:
        drv = driver()
        err, = drv.cuInit(0)
        if int(err) != 0:
            return False
        err, count = drv.cuDeviceGetCount()
        return int(err) == 0 and count > 0
    except Exception:
        return False
