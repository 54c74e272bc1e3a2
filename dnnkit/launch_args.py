"""Kernel arguments without Numba objects: ``At(array, offset)`` and ``flat(array)`` stand for
a C-contiguous device array read as flat from an element offset (dnnkit.launch packs the data
pointer plus the offset; a Numba view would cost microseconds of host time each), and the
block-size helper ``pow2_at_most``. dnnkit.launch exports them."""


def pow2_at_most(v, cap):
    """The smallest power of two >= v, but at most ``cap`` (block-dimension sizing)."""
    p = 1
    while p < v and p < cap:
        p *= 2
    return p


class At:
    """A C-contiguous device array (of any rank), read as flat (1-D) from element ``offset`` on,
    for kernel arguments: the launch adds the offset to the data pointer, so no Numba view is
    built (several us of host time each: an RNN's per-step slices, an optimizer's gradients)."""
    __slots__ = ("base", "offset")

    def __init__(self, base, offset):
        if isinstance(base, At):
            base, offset = base.base, base.offset + offset
        self.base, self.offset = base, int(offset)

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def size(self):
        return self.base.size - self.offset

    def view(self):
        """The Numba view this stands for (the simulator's path, and Numba's first launch)."""
        b = self.base
        if b.ndim != 1:
            from .memory import reshaped
            b = reshaped(b, (b.size,))
        return b[self.offset:] if self.offset else b


def at(a, offset):
    return At(a, offset) if offset else a     # (a itself for offset 0)


def flat(a):
    """A C-contiguous device array as a flat kernel argument: ``a`` itself when 1-D, else
    ``At(a, 0)`` (no Numba view object: a reshape's view costs microseconds of host time, and
    a convolution flattens four or five arrays a call)."""
    return a if a.ndim == 1 else At(a, 0)
