"""Shared by the dnnkit.torch tests: the device their tensors live on (the CPU on Numba's CUDA
simulator, whose device memory is host memory; CUDA on a GPU) and a module check against
PyTorch's own."""

import copy

import numpy as np
import torch

from tests.conftest import SIMULATOR

import dnnkit.torch as dt

DEVICE = "cpu" if SIMULATOR else "cuda"


def outputs(value):
    if isinstance(value, torch.Tensor):
        return [value]
    out = []
    for v in value:
        out += outputs(v)
    return out


def weighted_sum(value, seed=7):
    g = torch.Generator().manual_seed(seed)
    total = 0
    for t in outputs(value):
        if t.numel():
            total = total + (t * torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
                             ).sum()
    return total


def close(a, b, tol, what):
    a, b = a.detach().cpu().double().numpy(), b.detach().cpu().double().numpy()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    scale = max(float(np.abs(b).max()) if b.size else 0.0, 1.0)
    err = float(np.abs(a - b).max()) if a.size else 0.0
    assert err <= tol * scale, f"{what}: max |difference| {err:g} > {tol * scale:g}"


def check_half_dropout(y, y2, x, g):
    """``y`` and ``y2`` (two dropouts of ``x`` with p = 0.5 and one seed) are one mask: kept
    elements doubled, the others 0, some of each; after ``y.backward(g)``, x.grad is g under
    the same mask."""
    close(y, y2, 0, "the same seed, the same mask")
    kept = y != 0
    assert 0 < int(kept.sum()) < x.numel()
    close(y, torch.where(kept, x * 2, torch.zeros_like(x)), 1e-12, "y = x * mask / (1 - p)")
    y.backward(g)
    close(x.grad, torch.where(kept, g * 2, torch.zeros_like(g)), 1e-12, "dx = dy * mask / 0.5")


def check_module(make, x, backend, *, tol=1e-9, args=(), steps=1, train=True,
                 custom_ops=None):
    """A module from ``make()`` converted to ``backend`` (``custom_ops`` as convert's) against
    an unconverted copy: outputs, the input's gradient, every parameter's gradient and every
    buffer after ``steps`` forward/backward passes."""
    torch.manual_seed(0)
    ref = make().to(DEVICE, x.dtype).train(train)
    m = copy.deepcopy(ref)
    report = dt.convert(m, backend, custom_ops=custom_ops)
    assert report.converted and not report.skipped, str(report)
    for _ in range(steps):
        xa = x.detach().clone().to(DEVICE).requires_grad_()
        xr = x.detach().clone().to(DEVICE).requires_grad_()
        y, yr = m(xa, *args), ref(xr, *args)
        for i, (a, b) in enumerate(zip(outputs(y), outputs(yr))):
            close(a, b, tol, f"output {i}")
        weighted_sum(y).backward()
        weighted_sum(yr).backward()
        close(xa.grad, xr.grad, tol, "input gradient")
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        close(p.grad, q.grad, tol, f"gradient of {n}")
    for (n, b), (_, c) in zip(m.named_buffers(), ref.named_buffers()):
        close(b, c, tol, f"buffer {n}")
    return m
