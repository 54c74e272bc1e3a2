"""Gradient checks of models and layers against central differences, in float64.

One backward pass gives every leaf's gradient g; then, per leaf, a random direction v (the
leaf's shape) and two forward passes give the directional derivative
(f(w + h v) - f(w - h v)) / 2h, which must equal sum(g * v). A wrong gradient -- a missing
term, a wrong element, a transposed layout -- changes sum(g * v) for almost every v; two
forward passes per leaf keep the check affordable on the simulator (a full elementwise check
costs two per element)."""

import numpy as np

import dnnkit


def directional_check(loss_of, leaves, rng, *, h=1e-6, rtol=1e-6, directions=1):
    """``loss_of()`` returns a scalar Tensor computed from ``leaves`` (Tensors that require
    grad: inputs and parameters); its gradient wrt each leaf must match central differences
    along ``directions`` random directions. Returns the largest relative difference."""
    for leaf in leaves:
        leaf.grad = None
    loss_of().backward()
    worst = 0.0
    for i, leaf in enumerate(leaves):
        assert leaf.grad is not None, f"leaf {i} {leaf.shape} got no gradient"
        g = leaf.grad.numpy().astype(np.float64)
        assert g.shape == leaf.shape and np.isfinite(g).all(), f"leaf {i}"
        base = leaf.numpy()
        for _ in range(directions):
            v = rng.standard_normal(base.shape)
            vals = []
            for sign in (1, -1):
                leaf.data.copy_to_device(base + sign * h * v)
                with dnnkit.no_grad():
                    vals.append(loss_of().item())
            leaf.data.copy_to_device(base)
            numeric = (vals[0] - vals[1]) / (2 * h)
            analytic = float((g * v).sum())
            scale = max(1.0, float(np.abs(g * v).sum()))
            err = abs(numeric - analytic) / scale
            assert err <= rtol, (f"leaf {i} {leaf.shape}: directional derivative {numeric} "
                                 f"by differences, {analytic} by backward (rel {err:.2e})")
            worst = max(worst, err)
    return worst


def weighted_sum(y, r):
    """sum(y * r) as a scalar Tensor (r a fixed host array): the loss whose gradient wrt y is
    r, so the check covers every output element."""
    return (y * dnnkit.tensor(r)).sum()
