"""Property-based fuzzer over every public op: bad input must be refused, good input computed.

Each example is either a valid call, which must match the float64 reference within the op's
tolerance (NaN and Inf propagating as IEEE says where the op is elementwise), or a mistake
from the family's catalogue (bad dtype, non-array, non-contiguous device view, mismatched
shapes, negative padding, stride 0, window larger than the input, groups not dividing C, p
outside [0, 1), unknown modes, ...), which must raise ValueError or TypeError naming the op.
Anything else fails. Inputs come as host arrays, non-contiguous host views, device arrays,
offset device views and non-contiguous device views; sizes include zero. Every output buffer
from dnnkit's allocator is filled with NaN first, so an element an op forgets to write shows up
as a wrong result.

Example counts are small here (the CUDA simulator runs one Python thread per CUDA thread);
DNNKIT_FUZZ_EXAMPLES=k multiplies them. On a GPU: ``bash validation/fuzz_gpu.sh [k]`` (both
backends, then a sample under compute-sanitizer memcheck). The run's count is printed
in the terminal summary ("fuzz: N cases (V valid, I invalid) over K ops") and written to the
file named by DNNKIT_FUZZ_REPORT, if set.
"""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit import config
from tests.conftest import backend_params
from tests.fuzz import (cases_conv, cases_elementwise, cases_norm, cases_seq, cases_tensor,
                        common)
from tests.fuzz import cases_lrn
from tests.fuzz import cases_conv_transpose

# family -> (case builder, examples per op and backend here, the ops it covers)
FAMILIES = {
    "activation": (cases_elementwise.activation_case, 60,
                   ("activation", "activation_backward")),
    "softmax": (cases_elementwise.softmax_case, 50,
                ("softmax", "log_softmax", "softmax_backward")),
    "dropout": (cases_elementwise.dropout_case, 50, ("dropout", "dropout_backward")),
    "conv": (cases_conv.conv_case, 40,
             ("conv2d", "conv3d", "conv2d_backward_data", "conv3d_backward_data",
              "conv2d_backward_filter", "conv3d_backward_filter", "conv_backward_bias")),
    "pool": (cases_conv.pool_case, 50,
             ("pool2d", "pool3d", "pool2d_backward", "pool3d_backward")),
    "batchnorm": (cases_norm.batchnorm_case, 40,
                  ("batch_norm_train", "batch_norm_inference", "batch_norm_backward")),
    "spatial": (cases_norm.spatial_case, 50,
                ("affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
                 "spatial_transformer")),
    "rnn": (cases_seq.rnn_case, 25, ("rnn_forward", "rnn_backward")),
    "lrn": (cases_lrn.lrn_case, 40, ("lrn", "lrn_backward")),
    "conv_transpose": (cases_conv_transpose.conv_transpose_case, 40,
                       cases_conv_transpose.CT_OPS),
    "loss": (cases_seq.loss_case, 40, cases_seq.LOSS_OPS),
    "arith": (cases_tensor.arith_case, 40, tuple(cases_tensor.ARITH)),
    "reduce": (cases_tensor.reduce_case, 40, tuple(cases_tensor.REDUCE_MISTAKES)),
    "shape": (cases_tensor.shape_case, 40, tuple(cases_tensor.SHAPE_MISTAKES)),
    "matmul": (cases_tensor.matmul_case, 40, ("matmul", "linear")),
    "embedding": (cases_tensor.embedding_case, 40, ("embedding", "embedding_backward")),
    "global_pool": (cases_tensor.global_pool_case, 30, ("global_avg_pool",)),
}


@pytest.fixture(scope="module", autouse=True)
def _fuzz_report():
    """The case count: printed (pytest -s), in the terminal summary (tests/conftest.py, which
    gathers the counts of every xdist worker) and in $DNNKIT_FUZZ_REPORT."""
    yield
    head, rows = common.summary()
    print("\n" + head)
    path = os.environ.get("DNNKIT_FUZZ_REPORT")
    if path:
        with open(path, "a") as f:
            f.write("\n".join([head] + rows) + "\n")


@pytest.fixture(autouse=True)
def _poisoned_outputs():
    """Every array from dnnkit's allocator starts as NaN (integers: all bits set;
    ``dnn.debug.fill_uninitialized``), so that an output element the op does not write cannot
    pass for a right answer. (Set per test: tests/conftest.py resets the flags around each.)"""
    config.set("dnn.debug.fill_uninitialized", "nan")
    yield


def test_every_public_op_is_fuzzed():
    covered = {op for _, _, ops in FAMILIES.values() for op in ops}
    public = set(dnnkit.ops.__all__) - {"DropoutState", "relu", "sigmoid", "tanh"}
    assert public <= covered, f"not fuzzed: {sorted(public - covered)}"


def _fuzz_test(family):
    build, n, ops = FAMILIES[family]

    @pytest.mark.parametrize("op", ops)
    @pytest.mark.parametrize("backend", backend_params())
    @common.fuzz_settings(n)
    @given(data=st.data())
    def test(backend, op, data):
        common.run(build(data, backend, op))
    test.__name__ = f"test_fuzz_{family}"
    return test


for _family in FAMILIES:
    globals()[f"test_fuzz_{_family}"] = _fuzz_test(_family)
