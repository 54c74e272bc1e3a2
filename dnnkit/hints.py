"""Type annotations of the public API: the aliases the ops' signatures use, the type of a
public op, and the signature ``help()`` shows for one.

The package ships ``py.typed``, so a type checker run on user code reads these. Numba ships no
type information: its device arrays and streams are ``Any`` to a checker, and the aliases
below say what is meant. A public op is a :class:`PublicOp` to a checker: its ``backend=`` is
checked, its other arguments are checked when it runs (ValueError/TypeError naming the op).
"""

import inspect
from typing import Any, Literal, Optional, Protocol, Union

import numpy as np


class CudaArray(Protocol):
    """Anything that exports ``__cuda_array_interface__``: a Numba device array, a
    ``dnnkit.Tensor``, a CuPy array, a PyTorch CUDA tensor."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...


#: An array argument: a NumPy array (copied to the device first) or a device array. A
#: ``dnnkit.Tensor`` in gives Tensors out (recorded for autograd); arrays in give arrays out.
ArrayLike = Union[np.ndarray, CudaArray]

#: A CUDA stream: a ``numba.cuda`` stream object, or None for the default stream.
Stream = Optional[Any]

#: A per-call backend: None follows the ``dnn.enabled`` flag; "auto" uses cuDNN where it can,
#: else Numba; "cudnn" forces cuDNN (or raises CudnnUnavailableError); "numba" never uses cuDNN.
Backend = Literal["auto", "cudnn", "numba"]


class PublicOp(Protocol):
    """A public op (``@public_op``): its own parameters plus a keyword-only ``backend=``;
    returns device arrays, or Tensors when a Tensor was passed."""

    op_name: str

    def __call__(self, *args: Any, backend: Optional[Backend] = None, **kwargs: Any) -> Any: ...


#: What every public op's docstring ends with (``public_op`` appends it): the parameters and
#: behaviour the decorator adds.
OP_FOOTER = """
Every public op: ``backend`` is None (follow the ``dnn.enabled`` flag: auto, forced or
disabled), "auto" (cuDNN where it can run the call, else the Numba kernel), "cudnn" (cuDNN, or
raise CudnnUnavailableError with the reason) or "numba" (never cuDNN). ``stream``: a
numba.cuda stream to run on (None: the default stream). Array arguments: NumPy arrays (copied
to the device) or C-contiguous device arrays (anything with ``__cuda_array_interface__``);
outputs are device arrays, or Tensors when a ``dnnkit.Tensor`` was passed (recorded for
autograd). A bad argument raises ValueError or TypeError naming the op and the value, before
anything runs.
"""


def op_doc(doc: Optional[str]) -> str:
    """``doc`` (a public op body's docstring) with :data:`OP_FOOTER` appended."""
    return inspect.cleandoc(doc or "") + "\n" + OP_FOOTER


def with_backend(fn: Any) -> inspect.Signature:
    """The signature of the public op whose checking body is ``fn``: ``fn``'s parameters with
    a keyword-only ``backend=None`` added (before ``**kwargs``, if any)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    at = len(params) - (bool(params) and params[-1].kind is inspect.Parameter.VAR_KEYWORD)
    params.insert(at, inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Optional[Backend]))
    # the body returns its checked arguments; the op returns arrays or Tensors
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
