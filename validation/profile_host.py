"""cProfile of many small calls (host overhead):

    python -m validation.profile_host [backend] [relu|conv]

relu: a 1,024-element ReLU; conv: a 3x3 convolution of a (1, 8, 8, 8) input (the small-call
shapes of the benchmark's host-overhead rows)."""

import cProfile
import pstats
import sys

import numpy as np

import dnnkit


def main():
    from numba import cuda
    backend = sys.argv[1] if len(sys.argv) > 1 else "numba"
    op = sys.argv[2] if len(sys.argv) > 2 else "relu"
    if op == "conv":
        x = cuda.to_device(np.ones((1, 8, 8, 8), np.float32))
        w = cuda.to_device(np.ones((8, 8, 3, 3), np.float32))
        call = lambda: dnnkit.conv2d(x, w, padding=1, backend=backend)  # noqa: E731
    else:
        x = cuda.to_device(np.ones(1024, np.float32))
        call = lambda: dnnkit.relu(x, backend=backend)  # noqa: E731
    for _ in range(10):
        call()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        call()
    cuda.synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(18)
    st.sort_stats("cumulative").print_stats(35)


if __name__ == "__main__":
    main()
