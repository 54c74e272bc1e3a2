"""nn.LSTM / nn.GRU / nn.RNN options: proj_size with PyTorch's state dict (weight_hr_l{k}),
checked against PyTorch's documented LSTM-with-projection equations; dropout between layers
(training mode only, reproducible with dropout_seed, differentiable); algo."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn, reference
from dnnkit.rnn_layout import param_size


def _sig(a):
    return 1 / (1 + np.exp(-a))


def _torch_lstm_proj(sd, x, layers, directions, h, p):
    """PyTorch's nn.LSTM(proj_size=p) equations over its state dict: h_t = W_hr (o_t *
    tanh(c_t)), the recurrent matrix reads the p-wide h; x (T, N, I). Returns y, hy, cy."""
    hys, cys, inp = [], [], x
    for layer in range(layers):
        outs = []
        for d in range(directions):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            wi, wh, wr = sd["weight_ih" + sfx], sd["weight_hh" + sfx], sd["weight_hr" + sfx]
            b = sd["bias_ih" + sfx] + sd["bias_hh" + sfx]
            hcur, c = np.zeros((x.shape[1], p)), np.zeros((x.shape[1], h))
            ys = [None] * x.shape[0]
            steps = range(x.shape[0]) if d == 0 else reversed(range(x.shape[0]))
            for t in steps:
                i, f, g, o = np.split(inp[t] @ wi.T + hcur @ wh.T + b, 4, axis=1)
                c = _sig(f) * c + _sig(i) * np.tanh(g)
                hcur = (_sig(o) * np.tanh(c)) @ wr.T
                ys[t] = hcur
            outs.append(np.stack(ys))
            hys.append(hcur)
            cys.append(c)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hys), np.stack(cys)


def test_lstm_projection_state_dict_is_pytorchs(rng):
    i_, h, p, layers = 3, 4, 2, 2
    m = nn.LSTM(i_, h, layers, bidirectional=True, proj_size=p, dtype="float64")
    sd = {}
    for layer in range(layers):
        for sfx in ("", "_reverse"):
            s = f"_l{layer}{sfx}"
            sd["weight_ih" + s] = rng.standard_normal((4 * h, i_ if layer == 0 else 2 * p))
            sd["weight_hh" + s] = rng.standard_normal((4 * h, p))
            sd["bias_ih" + s] = rng.standard_normal(4 * h)
            sd["bias_hh" + s] = rng.standard_normal(4 * h)
            sd["weight_hr" + s] = rng.standard_normal((p, h))
    assert list(m.state_dict()) == list(sd)          # PyTorch's names, in PyTorch's order
    assert {k: v.shape for k, v in m.state_dict().items()} == {k: v.shape for k, v in sd.items()}
    m.load_state_dict(sd)
    x = rng.standard_normal((3, 2, i_))
    y_ref, hy_ref, cy_ref = _torch_lstm_proj(sd, x, layers, 2, h, p)
    with dnnkit.no_grad():
        y = m(x)
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(m.hy.numpy(), hy_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(m.cy.numpy(), cy_ref, rtol=1e-11, atol=1e-12)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, sd[k])
    assert m.weight.shape == (param_size(m.rnn.cfg),)
    assert "proj_size=2" in repr(m)


def test_projection_gradients_reach_the_flat_weight(rng):
    m = nn.LSTM(3, 4, proj_size=2, dtype="float64")
    x = rng.standard_normal((3, 2, 3))
    gy = rng.standard_normal((3, 2, 2))
    y = m(x)
    (y * dnnkit.tensor(gy)).sum().backward()
    ref = reference.rnn_backward(m.rnn.cfg, m.weight.numpy(), x, gy)[3]
    np.testing.assert_allclose(m.weight.grad.numpy(), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [nn.GRU, nn.RNN])
def test_projection_is_lstm_only(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: proj_size is an LSTM option"):
        cls(3, 4, proj_size=2)


def test_dropout_in_training_mode_only_and_reproducible(rng):
    kw = dict(dropout=0.5, dropout_seed=11, dtype="float64")
    a, b = nn.GRU(3, 4, 3, **kw), nn.GRU(3, 4, 3, **kw)
    x = rng.standard_normal((3, 2, 3))
    ya1, ya2 = a(x).numpy(), a(x).numpy()
    yb1 = b(x).numpy()
    np.testing.assert_array_equal(ya1, yb1)           # call k of the seed: the same run
    assert not np.array_equal(ya1, ya2)               # the next call: the next masks
    want = a.rnn.forward(a.weight.data, x, training=True, seed=11, offset=1,
                         backend="numba").y.copy_to_host()
    np.testing.assert_array_equal(ya2, want)
    a.eval()
    ref = reference.rnn_forward(a.rnn.cfg, a.weight.numpy(), x)[0]
    np.testing.assert_allclose(a(x).numpy(), ref, rtol=1e-12, atol=1e-13)   # no dropout
    a.train()
    with dnnkit.no_grad():                            # training mode without gradients: drops
        y3 = a(x).numpy()
    np.testing.assert_array_equal(y3, a.rnn.forward(a.weight.data, x, training=True, seed=11,
                                                    offset=2, backend="numba").y.copy_to_host())
    assert "dropout=0.5" in repr(a)


def test_dropout_gradients_use_the_forward_masks(rng):
    m = nn.LSTM(3, 4, 2, dropout=0.3, dropout_seed=5, dtype="float64")
    x = dnnkit.tensor(rng.standard_normal((3, 2, 3)), requires_grad=True)
    gy = rng.standard_normal((3, 2, 4))
    (m(x) * dnnkit.tensor(gy)).sum().backward()
    cfg, w = m.rnn.cfg, m.weight.numpy()
    ones = np.ones((3, 2, 4))
    mask = dnnkit.dropout(ones, 0.3, seed=5, offset=0, backend="numba")[0].copy_to_host()
    dx, _, _, dw = reference.rnn_backward(cfg, w, x.numpy(), gy, masks=[mask])
    np.testing.assert_allclose(x.grad.numpy(), dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(m.weight.grad.numpy(), dw, rtol=1e-10, atol=1e-12)


def test_unseeded_dropout_draws_fresh_masks(rng):
    m = nn.RNN(3, 4, 2, dropout=0.5, dtype="float64")
    x = rng.standard_normal((3, 2, 3))
    assert not np.array_equal(m(x).numpy(), m(x).numpy())


def test_option_arguments_are_checked():
    with pytest.raises(ValueError, match=r"LSTM: dropout must be in \[0, 1\)"):
        nn.LSTM(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="LSTM: dropout_seed must be >= 0"):
        nn.LSTM(3, 4, dropout=0.1, dropout_seed=-1)
    with pytest.raises(ValueError, match="GRU: algo must be one of"):
        nn.GRU(3, 4, algo="fastest")


def test_algo_reaches_the_op(rng):
    m = nn.GRU(3, 4, algo="persist_dynamic")
    x = rng.standard_normal((2, 1, 3)).astype(np.float32)
    m.backend = "numba"
    with dnnkit.trace() as tr:
        m(x)
    assert "persist_dynamic" in str(tr[-1].algo) and "ignored" in str(tr[-1].algo)
