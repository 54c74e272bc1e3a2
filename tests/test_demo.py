"""``python -m dnnkit demo`` end to end (on the simulator: tiny models, a few steps): the
report, per-epoch lines for both models, held-out accuracies, the profile table; the data
generators; the LastStep layer's gradient."""

import numpy as np

from dnnkit import demo


def test_demo_runs_end_to_end_and_reports():
    lines = []
    results = demo.run(backend="numba", log=lines.append)
    text = "\n".join(lines)
    assert set(results) == {"cnn", "lstm"} and demo.finite(results)
    for name in ("cnn", "lstm"):
        assert f"{name} [numba] epoch 2: loss" in text
        assert f"{name} [numba] held-out accuracy" in text
    assert "per-op time (dnnkit.profile)" in text and "conv2d" in text and "rnn_forward" in text
    from tests.conftest import SIMULATOR
    assert ("simulator" in text) == SIMULATOR


def test_generated_data():
    rng = np.random.default_rng(0)
    x, y = demo.shapes(rng, 40)
    assert x.shape == (40, 1, 8, 8) and set(y) <= {0, 1, 2, 3} and x.max() == 1
    bits, maj = demo.majority(rng, 30, 5)
    assert bits.shape == (5, 30, 1)
    np.testing.assert_array_equal(maj, bits.sum(axis=0)[:, 0] >= 3)


def test_last_step_layer():
    from numba import cuda
    y = cuda.to_device(np.arange(24, dtype=np.float32).reshape(3, 2, 4))
    m = demo.LastStep()
    np.testing.assert_array_equal(m.forward(y).copy_to_host(), y.copy_to_host()[2])
    d = m.backward(np.ones((2, 4), np.float32)).copy_to_host()
    assert d[2].sum() == 8 and not d[:2].any()
