"""Concurrency: eight Python threads, each on its own stream, call every op of every
family at the same time, on each backend; each thread's results equal the serial run of the
same inputs bit for bit (dnn.deterministic on, in every thread: change_flags is per thread),
and each thread used its own cuDNN handle. The streams are either created by each thread or
each thread's per-thread default stream (CU_STREAM_PER_THREAD: one handle value, a different
stream in each thread, so the allocator's blocks, the kept workspaces and the dropout states
cached under it must not be shared between the threads).

Run on a GPU: python -m pytest -q tests/gpu/test_threads.py
"""

import threading

import numpy as np
import pytest

from dnnkit import config, crosscheck
from dnnkit.errors import CudnnUnavailableError
from tests.gpu.test_leaks import FAMILIES, _cases, _device_inputs

# ops whose sums are atomic adds in arrival order: not bitwise reproducible when several
# elements land in one place (docs/determinism.md)
ATOMIC_SUMS = {"embedding_backward"}

THREADS, REPEAT = 8, 3
BACKENDS = ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)]
STREAMS = ["own", "per_thread"]


def _host(out):
    return [np.array(a) for a in crosscheck.outputs(out)]


def _runnable(cases, backend, inputs):
    """The ops that run on ``backend`` (cuDNN has no path for some arguments)."""
    ops = []
    for op in (op for fam in FAMILIES.values() for op in fam):
        try:
            cases[op].run(backend, None, inputs[op])
        except (CudnnUnavailableError, ValueError):
            assert backend == "cudnn", op   # e.g. the deterministic spatial backward
            continue
        ops.append(op)
    return ops


@pytest.mark.gpu
@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_on_their_own_streams_match_the_serial_run(backend, streams):
    from numba import cuda

    from dnnkit.device import stream_pointer
    from dnnkit.cudnn import handle
    cases = _cases()
    inputs = [{op: _device_inputs(cases[op], seed) for op in cases} for seed in range(THREADS)]
    with config.change_flags({"dnn.deterministic": True}):
        ops = _runnable(cases, backend, inputs[0])
        serial = [{op: _host(cases[op].run(backend, None, inputs[i][op])) for op in ops}
                  for i in range(THREADS)]
    results, handles, errors = [None] * THREADS, [None] * THREADS, []
    start = threading.Barrier(THREADS)

    def work(i):
        try:
            with config.change_flags({"dnn.deterministic": True}):
                s = cuda.stream() if streams == "own" else cuda.per_thread_default_stream()
                start.wait()                 # every thread in flight at once
                for _ in range(REPEAT):
                    out = {op: cases[op].run(backend, s, inputs[i][op]) for op in ops}
                s.synchronize()
                results[i] = {op: _host(o) for op, o in out.items()}
                if backend == "cudnn":
                    handles[i] = handle.get(stream_pointer(s)).value
        except Exception as e:  # pragma: no cover - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(THREADS):
        for op in ops:
            for k, (a, b) in enumerate(zip(results[i][op], serial[i][op])):
                if op in ATOMIC_SUMS:    # summed in any order: equal to rounding
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6,
                                               err_msg=f"thread {i}, {op} output {k}")
                else:
                    assert np.array_equal(a, b, equal_nan=True), f"thread {i}, {op} output {k}"
    if backend == "cudnn":
        assert len(set(handles)) == THREADS      # a handle per (device, thread)
