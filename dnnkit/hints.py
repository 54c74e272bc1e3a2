"""Type annotations of the public API: the aliases the signatures use, the type of a public op,
the type of calling a module, and the signature ``help()`` shows for an op.

The package ships ``py.typed``, so a type checker run on user code reads these (``mypy
--strict`` on a user script passes: tests/test_packaging.py). Numba ships no type information:
its device arrays and streams are ``Any`` to a checker, and the aliases below say what is meant.

The choices, and why:

- Array arguments are :data:`ArrayLike`: a NumPy array or anything with
  ``__cuda_array_interface__`` (:class:`CudaArray`: a Numba device array, a ``dnnkit.Tensor``,
  a CuPy array, a PyTorch CUDA tensor). One alias for every op, no overloads.
- An op's result is :data:`OpOutput`, which is ``Any``: a device array when the arguments are
  arrays, a Tensor when any argument is a Tensor (dnnkit/tensors.py), a tuple of either for the
  ops with several outputs. Which one depends on the runtime types of all the array arguments
  together, which a single signature cannot state and sixty sets of overloads would state at
  the cost of keeping them in step with the code; ``Any`` is sound (a checker never rejects a
  correct use) and a user names the type where it matters (``y: dnnkit.Tensor =
  dnnkit.conv2d(t, w)``). The layers (dnnkit.nn) and ``dnnkit.Tensor``'s operators, which
  always return Tensors, say so.
- A public op is a :class:`PublicOp` parametrized by its checking body's parameters
  (``ParamSpec``): every argument is checked against the body's annotations. The body declares
  the keyword-only ``backend`` itself, last, for the checker (a ``ParamSpec`` cannot add a
  keyword parameter to a signature); ``public_op``'s wrapper consumes it before the body runs,
  so inside the body it is always None.
- Calling a module, ``model(x)``, has the type of its ``forward`` (:class:`CallsForward`): the
  arguments are checked against the subclass's ``forward`` and the result has its return type.
  A forward hook that replaces the output is not seen by the checker.
"""

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, ParamSpec, Protocol, \
    TypeVar, Union, overload

import numpy as np

if TYPE_CHECKING:           # numpy.typing costs ~15 ms of `import dnnkit`; checkers read it
    import numpy.typing as npt


class CudaArray(Protocol):
    """Anything that exports ``__cuda_array_interface__``: a Numba device array, a
    ``dnnkit.Tensor``, a CuPy array, a PyTorch CUDA tensor."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...


#: An array argument: a NumPy array (copied to the device first) or a device array. A
#: ``dnnkit.Tensor`` in gives Tensors out (recorded for autograd); arrays in give arrays out.
ArrayLike = Union["npt.NDArray[Any]", CudaArray]

#: Several array arguments (concatenate's): a list or tuple of them.
Arrays = Sequence[ArrayLike]

#: An operand of the elementwise arithmetic (add, subtract, multiply, divide): an array or a
#: real number (Python's or NumPy's; an int is accepted where a float is).
Operand = Union[ArrayLike, float, np.floating[Any], np.integer[Any]]

#: What a public op returns (module docstring): device arrays, or Tensors when a Tensor was
#: passed; a tuple of them for the ops with several outputs.
OpOutput = Any

#: A shape: a sequence of ints (a tuple, a list).
Shape = Sequence[int]

#: A size per spatial dimension, or one int for all of them (kernel, stride, dilation).
Size = Union[int, Sequence[int]]

#: A convolution's padding: a size per spatial dimension, one int for all, or one of "valid",
#: "full", "half" (Theano's names).
Padding = Union[int, Sequence[int], str]

#: The axes a reduction runs over: one, several, or None for all of them.
Axis = Union[int, Sequence[int], None]

#: The sequence lengths of a batch of an RNN: host ints (a list, a NumPy array) or None (every
#: sequence the full length).
Lengths = Union[Sequence[int], "npt.NDArray[np.integer[Any]]", None]

#: A dtype: a NumPy dtype, a scalar type (``np.float32``) or its name ("float32").
DType = Union[np.dtype[Any], type, str]   # (numpy.typing.DTypeLike, narrowed: no nested specs)

#: A CUDA stream: a ``numba.cuda`` stream object, or None for the default stream.
Stream = Optional[Any]

#: A per-call backend: None follows the ``dnn.enabled`` flag; "auto" uses cuDNN where it can,
#: else Numba; "cudnn" forces cuDNN (or raises CudnnUnavailableError); "numba" never uses cuDNN.
Backend = Literal["auto", "cudnn", "numba"]

#: The parameters of a public op's checking body (see :class:`PublicOp`).
OpParams = ParamSpec("OpParams")


class PublicOp(Protocol[OpParams]):
    """A public op (``@public_op``): its checking body's parameters, ``backend=`` among them
    (the body declares it for the checker; the decorator consumes it); returns device arrays,
    or Tensors when a Tensor was passed (:data:`OpOutput`)."""

    op_name: str

    def __call__(self, *args: OpParams.args, **kwargs: OpParams.kwargs) -> OpOutput: ...


_Forward_co = TypeVar("_Forward_co", bound=Callable[..., Any], covariant=True)
_Forward = TypeVar("_Forward", bound=Callable[..., Any])


class _HasForward(Protocol[_Forward_co]):
    @property
    def forward(self) -> _Forward_co: ...


class CallsForward:
    """The type of ``Module.__call__`` to a checker (dnnkit/nn/module.py declares it so under
    ``TYPE_CHECKING``; the real method runs ``forward`` and the hooks): read on a module, it
    is that module's bound ``forward``, so ``model(x)`` is checked as ``model.forward(x)``.
    Nothing uses it at run time."""

    @overload
    def __get__(self, obj: None, owner: Any) -> "CallsForward": ...

    @overload
    def __get__(self, obj: _HasForward[_Forward], owner: Any) -> _Forward: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        return self if obj is None else obj.forward


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


def with_backend(fn: Callable[..., Any]) -> inspect.Signature:
    """The signature of the public op whose checking body is ``fn``: ``fn``'s parameters, with
    a keyword-only ``backend=None`` added (before ``**kwargs``, if any) unless ``fn`` declares
    it, and no return annotation (the body returns its checked arguments, the op arrays or
    Tensors)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if "backend" not in sig.parameters:
        at = len(params) - (bool(params) and params[-1].kind is inspect.Parameter.VAR_KEYWORD)
        params.insert(at, inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY,
                                            default=None, annotation=Optional[Backend]))
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
