"""``python -m dnnkit demo`` end to end (on the simulator: tiny models, a few steps): the
report, per-epoch lines for the three models, held-out accuracies, the per-op table (without
times on the simulator), progress bars on stderr only; the data generators; the LastStep
layer's gradient; the plot leaves matplotlib's backend alone."""

import sys

import numpy as np
import pytest

import dnnkit
from dnnkit import demo
from tests.conftest import SIMULATOR


def test_demo_runs_end_to_end_and_reports(capsys):
    """The whole demo, as one rank of a data-parallel job (alone here: rank 0 of 1, so the
    DataParallel wrapping and the batch sharding run; ``python -m dnnkit demo`` in
    tests/test_cli.py runs it without them)."""
    lines = []
    results = demo.run(backend="numba", log=lines.append, data_parallel=True)
    text = "\n".join(lines)
    assert "cnn: DataParallel over 1 GPU(s), 1 gradient bucket(s)" in text
    assert set(results) == {"cnn", "resnet", "lstm"} and demo.finite(results)
    for name in ("cnn", "resnet", "lstm"):
        assert f"{name} [numba] epoch 2: loss" in text
        assert f"{name} [numba] held-out accuracy" in text
    assert "conv2d" in text and "rnn_forward" in text and "global_avg_pool" in text
    if SIMULATOR:
        assert "simulator" in text and "no times are shown" in text
        assert "per-op time" not in text and "ms/call" not in text
    else:
        assert "per-op time (dnnkit.profile)" in text and "ms/call" in text
    out = capsys.readouterr()
    assert out.out == ""                       # everything went through log, bars to stderr
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return
    assert "resnet epoch 1" in out.err


def test_shards_cover_a_batch_once():
    idx = np.arange(10)
    parts = [demo.shard(idx, r, 3) for r in range(3)]
    assert [len(p) for p in parts] == [4, 3, 3]
    np.testing.assert_array_equal(np.concatenate(parts), idx)
    assert demo.shard(idx, 0, 1) is idx


def test_generated_data():
    rng = np.random.default_rng(0)
    x, y = demo.shapes(rng, 40)
    assert x.shape == (40, 1, 8, 8) and set(y) <= {0, 1, 2, 3} and x.max() == 1
    bits, maj = demo.majority(rng, 30, 5)
    assert bits.shape == (5, 30, 1)
    np.testing.assert_array_equal(maj, bits.sum(axis=0)[:, 0] >= 3)


def test_last_step_layer():
    y = dnnkit.tensor(np.arange(24, dtype=np.float32).reshape(3, 2, 4), requires_grad=True)
    out = demo.LastStep()(y)
    np.testing.assert_array_equal(out.numpy(), y.numpy()[2])
    out.sum().backward()
    d = y.grad.numpy()
    assert d[2].sum() == 8 and not d[:2].any()


def test_plot_keeps_the_users_backend(tmp_path):
    mpl = pytest.importorskip("matplotlib")
    had_pyplot = "matplotlib.pyplot" in sys.modules
    before = mpl.rcParams._get_backend_or_none() if hasattr(mpl.rcParams,
                                                              "_get_backend_or_none") else None
    lines = []
    demo._plot({"cnn": {"numba": [1.0, 0.5]}, "lstm": {"numba": [0.7, 0.6]}},
               tmp_path / "curves.png", lines.append)
    assert (tmp_path / "curves.png").stat().st_size > 0 and "written" in lines[-1]
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot
    if hasattr(mpl.rcParams, "_get_backend_or_none"):
        assert mpl.rcParams._get_backend_or_none() == before
