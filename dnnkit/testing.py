"""Helpers for users' own test suites."""

from .crosscheck import compare
from .errors import CudnnUnavailableError


def assert_backends_agree(fn, *args, rtol=None, atol=None, **kw):
    """Call the dnnkit op ``fn`` once with ``backend="numba"`` and once with
    ``backend="cudnn"`` and raise ``CrosscheckError`` (with the max abs/rel error) when the
    outputs differ beyond the op's tolerance (or ``rtol``/``atol``). Raises
    ``CudnnUnavailableError`` when cuDNN cannot run the call. Returns the cuDNN result."""
    if "backend" in kw:
        raise TypeError("assert_backends_agree chooses the backends itself; drop backend=")
    op = getattr(fn, "op_name", None) or getattr(fn, "__name__", str(fn))
    got = fn(*args, backend="cudnn", **kw)
    ref = fn(*args, backend="numba", **kw)
    compare(op, got, ref, labels=("cudnn", "numba"), rtol=rtol, atol=atol)
    return got


__all__ = ["assert_backends_agree", "CudnnUnavailableError"]
