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


if __name__ == "__main__":
    main()
