"""Splitting a cuDNN call into pieces under cuDNN's 32-bit tensor limit.

cuDNN's legacy API indexes every tensor with 32-bit integers: a tensor it is given holds at
most ``LIMIT`` = 2**31 - 1 elements (so every dimension and stride is below that too). An op
whose arrays are larger runs as several cuDNN calls on contiguous views of them (no copy):

- activation: flat pieces of the elements (``flat``);
- softmax, pooling, LRN, convolution: pieces of the batch, dimension 0 (``batch``); an item (a
  softmax row, an image) is never split, so when one item alone is over the limit the op's
  ``supports()`` returns the reason (``too_big``) and the dispatcher runs Numba under ``auto``
  and raises under ``forced``;
- reductions over the batch (a convolution's filter and bias gradients): each piece writes its
  partial sum and the pieces are added on the device (``summed``).

Pieces are balanced: the fewest that fit, ``ceil(count / pieces)`` items each (the last one
shorter), so a convolution sees at most two piece shapes (two algorithm choices and
workspace sizes). Flat pieces are multiples of ``ALIGN`` elements, so each starts on an
aligned address for cuDNN's vector loads.

``LIMIT`` is read at every call: tests lower it to split tiny arrays. ``last_pieces()`` says
how many pieces the latest split call of this thread used (1: not split).
"""

import threading

from ..arrays import cuda_empty, flat as flat_view, rows as row_view
from .elementwise import axpy

LIMIT = 2**31 - 1     # elements per cuDNN tensor (cuDNN's INT_MAX)
ALIGN = 256           # flat pieces: multiples of this many elements (512 bytes in float16)

_local = threading.local()


def bounds(count, per_item=1, limit=None, align=1):
    """``[(start, stop), ...]``: balanced pieces of ``count`` items of ``per_item`` elements,
    each at most ``limit`` elements (default ``LIMIT``) and, where the limit allows, a
    multiple of ``align`` items; None when one item alone is over the limit (pure)."""
    limit = LIMIT if limit is None else limit
    if per_item > limit:
        return None
    most = count if per_item == 0 else limit // per_item       # items per piece, at most
    if most >= align:
        most -= most % align
    if count <= most:
        return [(0, count)]
    pieces = -(-count // most)
    size = -(-count // pieces)                 # <= most, since pieces >= count / most
    if most >= align:
        size = min(most, -(-size // align) * align)
    return [(a, min(a + size, count)) for a in range(0, count, size)]


def too_big(elements, what):
    """None when ``elements`` fit one cuDNN tensor, else the reason, naming ``what`` (a string,
    or a function giving it: supports() runs on every call, so the text is built only when
    it is needed)."""
    if elements <= LIMIT:
        return None
    return (f"{what() if callable(what) else what} holds {elements} elements, over cuDNN's "
            f"32-bit limit of {LIMIT} per tensor, and cannot be split further")


def _pieces(count, per_item, align):
    b = bounds(count, per_item, align=align)
    if b is None:   # supports() refuses such calls: reaching here is a dnnkit bug
        raise AssertionError(f"split: an item of {per_item} elements is over {LIMIT}")
    _local.pieces = len(b)
    return b


def last_pieces():
    """How many pieces the latest split cuDNN call of this thread ran as (1: not split)."""
    return getattr(_local, "pieces", 1)


def _views(b, arrays, view):
    if len(b) == 1:         # the common case: the arrays themselves, no view built
        return (tuple(arrays),)
    return [tuple(row_view(view(a), start, stop) for a in arrays) for start, stop in b]


def batch(per_item, *arrays):
    """Per piece of the batch (dimension 0, items of ``per_item`` elements), the arrays'
    views on it."""
    return _views(_pieces(arrays[0].shape[0], per_item, 1), arrays, lambda a: a)


def flat(*arrays):
    """Per flat piece of the arrays' elements, their 1-D views on it."""
    return _views(_pieces(arrays[0].size, 1, ALIGN), arrays, flat_view)


def summed(out, pieces, run, stream):
    """``out`` = the sum over ``pieces`` of what ``run(piece, dest)`` writes into ``dest``: the
    first piece writes ``out`` itself, each later one a scratch array added to ``out`` on the
    device (dnnkit.ops.elementwise.axpy: in the accumulation type, rounded once per piece)."""
    scratch = None
    for i, piece in enumerate(pieces):
        if i == 0:
            run(piece, out)
            continue
        if scratch is None:
            scratch = cuda_empty(out.shape, out.dtype, stream)
        run(piece, scratch)
        axpy(1.0, scratch, out, stream=stream)
    return out
