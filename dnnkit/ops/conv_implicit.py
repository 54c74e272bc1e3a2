"""The implicit GEMM of the Numba convolution (kernels/gemm.py's implicit variants): where it
pays (a rule measured on an H100), its operand (a table of the filter taps' offsets), and the
forward's one GEMM on it, shared by ops/conv_numba.py's forward and the prepared runner of
repeated calls (ops/conv_prepared.py)."""

import numpy as np

from .. import arrays, device
from ..launch import flat as flat_arg
from . import gemm
from .conv_tuning import settings


def _prod(t):
    p = 1
    for v in t:
        p *= v
    return p


_tables = {}        # (geometry, device) -> (table, cg) of the implicit forward


def implicit_pays(geom, sz, dgrad):
    """Whether the implicit GEMM beat im2col + GEMM here, by validation/implicit_bench.py on an
    H100 (ResNet-50 layers, batch 32, float32): for a stride-1 3x3
    forward or data gradient with at most 128 output channels (64 channels at 56^2:
    0.87x and 0.48x the time; 128 at 28^2: 0.54x and 0.88x), where the column buffer's traffic
    is large next to the GEMM's m = 64..128 rows of work. With 256 or 512 channels at 14^2 or 7^2
    (1.08-1.95x), for the strided 7x7 stem (1.01-1.02x) and for every filter gradient
    (1.18-1.68x) its costlier inner loop (a table read and bounds test per element, ptxas:
    more spills) loses. With the tensor-core GEMM (ops/gemm.py): 64 channels 0.83x / 0.41x,
    128 channels 1.03x / 0.77x (kept: within the runs' noise), 512 channels 1.48x / 1.83x."""
    if settings.implicit is not None:
        return settings.implicit
    # only what was measured: 2-D 3x3, undilated, ungrouped, stride 1 (5x5, 1x3, 3-D, dilated
    # and grouped kernels keep the column buffer until timed)
    rows = sz.c if dgrad else sz.k                    # the GEMM's m: channels it produces
    return (tuple(geom.w_shape[2:]) == (1, 3, 3) and sz.groups == 1
            and max(geom.stride) == 1 and max(geom.dilation) == 1 and rows <= 128)


def implicit_operand(geom, sz, dgrad=False):
    """(table, cg) for kernels/gemm.py's implicit convolution: per filter row (c, t, r, s) of
    a group the tap's offsets (dz, dy, dx) from a window's corner and its address offset in
    the group's channels of the array read (x; for ``dgrad`` dy). None when an offset would not
    fit the table's int32, or (dgrad) for a stride above 1.

    ``dgrad``: the data gradient of a stride-1 convolution is itself a convolution, of dy:
    dx[c, i] = sum over (k, t, r, s) of w[k, c, t, r, s] dy[k, i + p - t'*d], so dy is read as
    the column matrix with rows (k, t, r, s), taps at -t'*d from the corner i + p."""
    key = (geom, dgrad, device.device_id())
    got = _tables.get(key)
    if got is not None or key in _tables:
        return got
    t_, r_, s_ = geom.w_shape[2:]
    if dgrad:
        chans, (d, h, w), sign = sz.kg, geom.out_spatial, -1
        positions, (pd, ph, pw) = geom.x_shape[2:], (-p for p in geom.padding)
        stride, image = (1, 1, 1), sz.k * sz.out
    else:
        chans, (d, h, w), sign = geom.w_shape[1], geom.x_shape[2:], 1
        positions, (pd, ph, pw) = geom.out_spatial, geom.padding
        stride, image = geom.stride, sz.image
    dd, dh, dw = geom.dilation
    if chans * d * h * w >= 2**31 or (dgrad and max(geom.stride) != 1):
        got = None
    else:
        cc, tt, rr, ss = (a.ravel() for a in np.meshgrid(
            np.arange(chans), np.arange(t_), np.arange(r_), np.arange(s_), indexing="ij"))
        if geom.flip:       # a true convolution reads the kernel reversed
            tt, rr, ss = t_ - 1 - tt, r_ - 1 - rr, s_ - 1 - ss
        dz, dy, dx = sign * tt * dd, sign * rr * dh, sign * ss * dw
        off = cc * (d * h * w) + (dz * h + dy) * w + dx
        table = np.stack([dz, dy, dx, off], axis=1).astype(np.int32).ravel()
        _, oh, ow = positions
        got = (arrays.constant(table, np.int32),
               (_prod(positions), oh * ow, ow, d, h, w) + tuple(stride) + (pd, ph, pw)
               + (image,))
    if len(_tables) >= 256:
        _tables.clear()
    _tables[key] = got
    return got


def implicit_forward(geom, sz):
    """The forward's implicit-GEMM operand (``implicit_operand``) where it takes that path."""
    return (None if sz.pointwise or not implicit_pays(geom, sz, False)
            else implicit_operand(geom, sz))


def implicit_forward_gemm(sz, conv, x, w, y, bias, math, relu=False):
    """(arguments, keywords) of the forward's one GEMM, implicit: B = im2col(x) read in place
    (kernels/gemm.py), column j = (n, o) of every image at once, group g's channels from
    g*Cg*D*H*W; C's column j at (j // O)*K*O + j % O."""
    o, ko = sz.out, sz.k * sz.out
    return (("00", flat_arg(w), flat_arg(x), flat_arg(y), (sz.kg, sz.n * o, sz.rows),
             (sz.rows, 0, o), gemm.PLAIN * 2 + (o, ko),
             (sz.groups, 1, sz.kg * sz.rows, 0, sz.image // sz.groups, 0, sz.kg * o, 0)),
            dict(bias=None if bias is None else flat_arg(bias), conv=conv, math=math, relu=relu))



def implicit_backward_data(geom, sz):
    """The data gradient's implicit-GEMM operand where it takes that path."""
    return (None if sz.pointwise or not implicit_pays(geom, sz, True)
            else implicit_operand(geom, sz, dgrad=True))


def implicit_backward_data_gemm(sz, conv, dy, w, dx, math):
    """(arguments, keywords) of the data gradient's one GEMM, implicit: dx_g = W_g^T (Cg x
    Kg*TRS: row c at c*TRS, k = (k', trs) at k'*Cg*TRS + trs) times dy read as the column
    matrix of a stride-1 convolution; dx's column j = (n, i) at (j // DHW)*C*DHW + j % DHW.
    One batch entry per group."""
    dhw, trs = sz.image // sz.c, sz.rows // (sz.c // sz.groups)
    cg_ = sz.c // sz.groups
    return (("00", flat_arg(w), flat_arg(dy), flat_arg(dx), (cg_, sz.n * dhw, sz.kg * trs),
             (trs, 0, dhw), (trs, cg_ * trs) + gemm.PLAIN + (dhw, sz.image),
             (sz.groups, 1, sz.kg * sz.rows, 0, sz.kg * sz.out, 0, cg_ * dhw, 0)),
            dict(conv=conv, math=math))


__all__ = ["implicit_pays", "implicit_operand", "implicit_forward", "implicit_forward_gemm",
           "implicit_backward_data", "implicit_backward_data_gemm"]
