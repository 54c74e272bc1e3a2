"""cProfile of many small calls (host overhead): python -m validation.profile_host [backend]"""

import cProfile
import pstats
import sys

import numpy as np

import dnnkit


def main():
    from numba import cuda
    backend = sys.argv[1] if len(sys.argv) > 1 else "numba"
    x = cuda.to_device(np.ones(1024, np.float32))
    for _ in range(10):
        dnnkit.relu(x, backend=backend)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        dnnkit.relu(x, backend=backend)
    cuda.synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(14)
    st.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
