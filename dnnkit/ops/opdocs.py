"""Paragraphs that several public ops' docstrings share, filled in once the families are
imported (``complete``, called by dnnkit/ops/__init__.py).

A docstring line that is only ``{NAME}`` (a key of ``SHARED``) becomes that paragraph, at the
line's indentation: one text for the conv options of six ops, the pooling modes of four, a
loss's reductions, so that ``help()`` of each op lists every value while the family files stay
short. The lists of names are built from the families' own tuples, so a new algorithm or mode
appears in every docstring that lists them (tests/test_help.py checks each op's values).
"""

import re
import textwrap

from ..hints import OP_FOOTER
from .conv_args import ALGOS, CHOICES, PRECISIONS


def _quoted(names):
    return ", ".join(f'"{n}"' for n in names)


def _algos(direction):
    named = [a for a in ALGOS[direction] if a not in CHOICES]
    return textwrap.fill(f"``algo`` (cuDNN's; None: the dnn.conv.algo_{direction} flag): "
                         f"{_quoted(named)}, or a choice at run time: {_quoted(CHOICES)}.", 92)


SHARED = {
    # the plain functions that are not public_op's (relu, log_softmax, ...) end with it too
    "OP_FOOTER": OP_FOOTER.strip(),
    "CONV_OPTIONS": """\
``mode``: "cross" (default: cross-correlation, what every framework computes) or "conv"
(true convolution, the taps reversed; Theano's default). ``stride``, ``dilation``: an int or
one per spatial dim, >= 1. ``padding``: an int or one per spatial dim, >= 0, or "valid" (0),
"full" ((k-1)*d) or "half" (((k-1)*d + 1) // 2: "same" for odd kernels). ``groups``: a
positive int dividing C and K.""",
    "CONV_ACTIVATION": """\
``activation``: None (default) or "relu": y = max(y, 0) after the bias, in the same call (the
gradient then takes dy through relu's slope from y). On the Numba kernels the relu happens in
the pass that writes y; on cuDNN the op makes cudnnActivationForward's call on y in place.""",
    "CONV_ALGO_FWD": _algos("fwd"),
    "CONV_ALGO_BWD_DATA": _algos("bwd_data"),
    "CONV_ALGO_BWD_FILTER": _algos("bwd_filter"),
    "CONV_PRECISION": textwrap.fill(
        f"``precision`` (None: the dnn.conv.precision flag): {_quoted(PRECISIONS)}; "
        '"as_input_f32" computes float16 in float32, "as_input" in the data type.', 92),
    "CONV_RAISES": """\
Raises ValueError for a bad stride, padding, dilation, groups, mode, algo or precision, a
filter window without taps, channels that do not match, a dilated kernel larger than the
padded input, a bias that is not (K,) or an activation not listed; TypeError for mixed
dtypes or sizes that are not ints.""",
    "POOL_MODES": """\
``mode``: "max" (default: the window's maximum; NaN propagates), "max_deterministic" (the
same; on cuDNN its deterministic backward), "average_inc_pad" (alias "average": the sum over
the whole window, padding counted as zeros), "average_exc_pad" (the sum over the window's
inputs only) or "sum". Padding never enters a maximum or a sum.""",
    "POOL_WINDOW": """\
``window``: an int or one per spatial dim ((kh, kw); (kd, kh, kw) in 3-D), >= 1. ``stride``:
likewise, >= 1 (None, default: the window). ``padding``: likewise, 0 <= p < the window, on
both sides.""",
    "POOL_BACKWARD": """\
Max modes route each dy to its window's first maximum in scan order, or its first NaN (cuDNN's
"max" picks among tied maxima its own way); the average modes spread dy / divisor over the
window's inputs, "sum" spreads dy. The other arguments are the forward's; y and dy have its
output's shape and dtype (else ValueError, TypeError).""",
    "POOL_RAISES": """\
Raises ValueError for a window, stride or padding out of range (padding must be smaller
than the window), a window larger than the padded input, an empty spatial dimension, a
mode not listed or x of the wrong rank; TypeError for sizes that are not ints.""",
    "BN_OPTIONS": """\
``mode``: "spatial" (default: one statistic per channel over (N, *spatial); parameters
(C,) or (1, C, 1, ...)) or "per-activation" (one per position of x.shape[1:], over N;
parameters x.shape[1:] or (1,) + x.shape[1:]). Parameters and statistics are float32 for
float16 and float32 x, float64 for float64 x (host arrays of another dtype are converted).
``epsilon``: > 0 and finite (default 1e-5; cuDNN is not used below 1e-5).""",
    "LOSS_REDUCTION": """\
``reduction``: "mean" (default: the sum over the counted positions divided by their
number; NaN when none counts), "sum" (both a 0-d device array in the input's dtype, never
read back to the host) or "none" (per position, shaped like the target; 0 where ignored).""",
    "LOSS_TARGET": """\
``target``: int32 or int64 class indices; positions whose target equals ``ignore_index`` (an
int, default -100) do not count; another target outside [0, C) gives NaN on the device (a
host target is checked first: ValueError). Raises ValueError for a reduction not listed or
shapes that do not match; TypeError for a non-integer target or ignore_index, or mixed
dtypes.""",
    "LOSS_GRAD": """\
g = dy / count ("mean"), dy ("sum") or dy per position ("none"), 0 at ignored positions;
``dy``: the upstream gradient, 0-d for "mean" and "sum", else shaped like the target.""",
    "ARITH": """\
``a``, ``b``: arrays of one float dtype (float16, float32 or float64), or one of them a
Python scalar. Shapes broadcast by NumPy's rule (aligned at the right; each dimension equal,
or 1 and stretched); y is a new C-contiguous array of the broadcast shape, computed in the
accumulation type (float32 for float16) and rounded once.
Raises ValueError for shapes that do not broadcast; TypeError for two scalars, two arrays of
different dtypes or a non-float array.""",
    "REDUCE_AXIS": """\
``axis``: None (default: every axis), an int or a tuple of ints (negative from the end);
``keepdims``: False (default: the reduced axes are dropped) or True (kept with size 1).""",
}

_LINE = re.compile(r"^([ \t]*)\{([A-Z_0-9]+)\}[ \t]*$", re.MULTILINE)


def fill(doc):
    """``doc`` with each ``{NAME}`` line replaced by ``SHARED[NAME]`` at its indentation."""
    def sub(m):
        indent, name = m.groups()
        if name not in SHARED:          # left as it is: tests/test_help.py reports it
            return m.group(0)
        return "\n".join(indent + ln if ln else "" for ln in SHARED[name].splitlines())
    return _LINE.sub(sub, doc) if doc else doc


def complete(functions):
    """Fill in the shared paragraphs of these functions' docstrings (each function once)."""
    for fn in set(functions):
        if callable(fn) and fn.__doc__ and "{" in fn.__doc__:
            fn.__doc__ = fill(fn.__doc__)
