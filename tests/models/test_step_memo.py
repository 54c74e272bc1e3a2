"""A whole training step's host path, counted instead of timed: after the first step, every
op call of the VGG-style CNN, ResNet-18 and the LSTM language model takes the dispatcher's memo
(dnnkit/fastpath.py) -- no argument checks, backend choice or binding -- except the calls that
must take the full path by design (dropout: dnn docs/dropout.md), and the step's launches are
the same from step to step. The Numba path, with every launch recorded instead of run
(dnnkit.warmup.recording(launch=False)): the host code is the one a GPU runs, at any shape,
in a second.

What it guards: a call style that quietly misses the memo costs 5-10x the host time of a hit
on every step (one array passed in two places, a configuration object, a forward's state
handed to its backward all did once)."""

import collections

import numpy as np
import pytest

import dnnkit
from dnnkit import dispatch, fastpath, models, nn, warmup
from dnnkit.demo import step
from dnnkit.optim import SGD

# ops whose calls take the full path on purpose: dropout draws or continues a mask sequence
# and refuses CUDA-graph capture, checks made on every call
ALWAYS_FULL = {"dropout"}


@pytest.fixture
def full_path(monkeypatch):
    """{op: calls that took the full path} since the last clear()."""
    seen = collections.Counter()
    run = dispatch.run

    def counted(op, *args, **kw):
        seen[op] += 1
        return run(op, *args, **kw)
    monkeypatch.setattr(dispatch, "run", counted)
    return seen


def _steps(one_step, full_path, n=3):
    """[(memo hits, {op: full-path calls}, launches)] of n steps."""
    rows = []
    with warmup.recording(launch=False) as seen:
        for _ in range(n):
            full_path.clear()
            hits, launched = fastpath.stats["hits"], len(seen)
            one_step()
            rows.append((fastpath.stats["hits"] - hits, dict(full_path), len(seen) - launched))
    return rows


@pytest.mark.parametrize("model", ["vgg", "resnet18"])
def test_every_call_of_a_cnn_step_after_the_first_is_memoised(model, full_path):
    parts = warmup.setup(model, "float32", 2, "numba", width=4, image_size=8)
    rows = _steps(lambda: step(*parts), full_path)
    (hits1, full1, launches1), (hits2, full2, launches2), (hits3, full3, launches3) = rows
    assert sum(full1.values()) > 0           # the first step checks and binds
    assert full2 == {} and full3 == {}, f"{model}: full-path calls after the first step"
    # every call of the step: fewer where an op's replay (dnnkit/replay.py) holds the call
    # of another op its implementation made (the loss's softmax, a global pool's pool2d)
    assert hits2 == hits3 and 0 < hits1 + sum(full1.values()) - hits2 <= 4
    assert launches1 == launches2 == launches3 > 0


def test_every_call_of_an_lstm_lm_step_is_memoised_but_dropouts(full_path, rng):
    model = nn.convert(models.LSTMLanguageModel(7, 3, 4, layers=2, dropout=0.2, seed=0),
                       "numba")
    loss_fn = nn.convert(nn.CrossEntropyLoss(), "numba")
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
    ids = rng.integers(0, 7, (5, 2))
    inputs, targets = dnnkit.tensor(ids[:-1]), dnnkit.tensor(ids[1:].reshape(-1))
    model.train()
    state = [(dnnkit.tensor(np.zeros((2, 2, 4), np.float32)),
              dnnkit.tensor(np.zeros((2, 2, 4), np.float32)))]

    def one_step():
        logits, (h, c) = model(inputs, state[0])
        state[0] = (h.detach(), c.detach())          # carried, detached (truncated BPTT)
        loss = loss_fn(logits.reshape(-1, 7), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    rows = _steps(one_step, full_path)
    assert set(rows[0][1]) > ALWAYS_FULL | {"rnn_forward", "rnn_backward", "dropout_backward"}
    for hits, full, _ in rows[1:]:
        assert set(full) == ALWAYS_FULL, f"full-path calls after the first step: {full}"
    assert rows[1][0] == rows[2][0] and rows[1][2] == rows[2][2] > 0


def test_an_rnn_forward_with_an_explicit_dropout_seed_is_checked_every_call(full_path):
    """Whether cuDNN can start a seed's masks at ``offset`` depends on the calls before: such
    a call is never served from the memo. Fresh masks (seed None) and inference are."""
    from numba import cuda
    cfg = dnnkit.ops.rnn.make_config("lstm", 3, 4, 2, dropout=0.5)
    w = cuda.to_device(np.zeros(dnnkit.ops.rnn.param_size(cfg), np.float32))
    x = cuda.to_device(np.zeros((2, 2, 3), np.float32))
    with warmup.recording(launch=False):
        for kw, full in (({"training": True, "seed": 7}, 2), ({"training": True}, 1),
                         ({}, 1)):
            full_path.clear()
            for _ in range(2):
                dnnkit.rnn_forward(cfg, w, x, backend="numba", **kw)
            assert full_path["rnn_forward"] == full, kw
