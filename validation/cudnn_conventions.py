"""Probe cuDNN's conventions where the maths leaves a choice, so the Numba kernels can match:
the activation slope at the kinks (x == 0, x == coef), whether the backward reads x or y to
decide, and NaN in the backward. Prints one line per probe. Needs a GPU with cuDNN.

    python -m validation.cudnn_conventions
"""

import numpy as np

import dnnkit

COEF = 2.0


def probe(mode, x, y, dy, coef=COEF):
    dx = dnnkit.activation_backward(x, y, dy, mode, coef, backend="cudnn").copy_to_host()
    return dx


def main():
    print(dnnkit.backends.status(), "\n")
    x = np.array([-1.0, 0.0, 0.5, COEF, COEF + 1, np.nan, 1.0], np.float32)
    dy = np.ones_like(x)
    dy[-1] = np.nan
    for mode in ("relu", "clipped_relu", "elu", "tanh", "sigmoid", "swish"):
        y = dnnkit.activation(x, mode, COEF, backend="cudnn").copy_to_host()
        dx = probe(mode, x, y, dy)
        print(f"{mode:<13} x  ={x}\n{'':13} y  ={y}\n{'':13} dx ={dx}")
    # x or y? Feed a y inconsistent with x and see which one the slope follows.
    xs = np.array([-1.0, 1.0, 3.0], np.float32)
    for mode in ("relu", "clipped_relu"):
        y_flip = np.array([1.0, 0.0, 1.0], np.float32)  # opposite of what x says
        dx = probe(mode, xs, y_flip, np.ones(3, np.float32))
        print(f"{mode:<13} x={xs} y(inconsistent)={y_flip} -> dx={dx}")
    # A NaN or Inf dy where the slope is 0 (x < 0, x > coef, NaN x, saturated tanh/sigmoid):
    # does cuDNN multiply (0 * Inf = NaN) or select (0)? PyTorch's relu backward selects.
    x0 = np.array([-1.0, -1.0, COEF + 1, COEF + 1, np.nan, np.nan, 50.0, -50.0], np.float32)
    d0 = np.array([np.nan, np.inf, np.nan, np.inf, np.nan, np.inf, np.inf, np.inf], np.float32)
    torch = _torch()
    for mode in ("relu", "clipped_relu", "tanh", "sigmoid", "elu", "swish"):
        y = dnnkit.activation(x0, mode, COEF, backend="cudnn").copy_to_host()
        dx = probe(mode, x0, y, d0)
        line = f"{mode:<13} x={x0} dy={d0} -> cuDNN dx={dx}"
        if torch is not None and mode in _TORCH:
            t = torch.tensor(x0, device="cuda", requires_grad=True)
            _TORCH[mode](torch, t).backward(torch.tensor(d0, device="cuda"))
            line += f" torch dx={t.grad.cpu().numpy()}"
        print(line)


_TORCH = {"relu": lambda torch, t: torch.relu(t),
          "clipped_relu": lambda torch, t: torch.clamp(t, 0.0, COEF),
          "tanh": lambda torch, t: torch.tanh(t), "sigmoid": lambda torch, t: torch.sigmoid(t)}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


if __name__ == "__main__":
    main()
