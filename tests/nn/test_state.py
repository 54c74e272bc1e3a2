"""State dicts and files: PyTorch's names and layouts for Conv, Linear, BatchNorm and the
recurrent layers (dicts built by hand in NumPy, checked against the equations PyTorch
documents), all-or-nothing loads, atomic saves (a file-size limit in a subprocess), and the
errors of damaged files."""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dnnkit
from dnnkit import nn

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sig(a):
    return 1 / (1 + np.exp(-a))


# ---------------------------------------------------------------- conv, linear, batchnorm

def _cnn(dtype="float64"):
    return nn.Sequential(nn.Conv2d(2, 3, 2, dtype=dtype, seed=0), nn.BatchNorm2d(3, dtype=dtype),
                         nn.ReLU(), nn.Flatten(), nn.Linear(3 * 2 * 2, 4, dtype=dtype, seed=1))


def test_cnn_state_dict_is_pytorchs(rng):
    """A state dict written by hand with PyTorch's names and layouts -- conv weight (out, in,
    kh, kw), linear weight (out, in), BatchNorm's statistics and batch count -- loads, gives
    PyTorch's equations' output, and comes back unchanged."""
    sd = {"0.weight": rng.standard_normal((3, 2, 2, 2)), "0.bias": rng.standard_normal(3),
          "1.weight": rng.uniform(0.5, 2, 3), "1.bias": rng.standard_normal(3),
          "1.running_mean": rng.standard_normal(3), "1.running_var": rng.uniform(0.5, 2, 3),
          "1.num_batches_tracked": np.array(7, np.int64),
          "4.weight": rng.standard_normal((4, 12)), "4.bias": rng.standard_normal(4)}
    m = _cnn().load_state_dict(sd).eval()
    assert m[1].num_batches_tracked == 7
    x = rng.standard_normal((2, 2, 3, 3))
    # PyTorch's equations on the dict: cross-correlation, BatchNorm with running statistics,
    # ReLU, flatten in (C, H, W) order, x W^T + b
    conv = np.zeros((2, 3, 2, 2))
    for i in range(2):
        for j in range(2):
            conv[:, :, i, j] = np.einsum("ncrs,kcrs->nk", x[:, :, i:i + 2, j:j + 2],
                                         sd["0.weight"]) + sd["0.bias"]
    c = (slice(None), None, None)
    bn = (conv - sd["1.running_mean"][c]) / np.sqrt(sd["1.running_var"][c] + 1e-5) * \
        sd["1.weight"][c] + sd["1.bias"][c]
    want = np.maximum(bn, 0).reshape(2, 12) @ sd["4.weight"].T + sd["4.bias"]
    with dnnkit.no_grad():
        np.testing.assert_allclose(m(x).numpy(), want, rtol=1e-12)
    back = m.state_dict()
    assert list(back) == list(sd)
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])
        assert back[k].dtype == (np.int64 if k.endswith("tracked") else np.float64)
    m.train()
    m(x)
    assert m[1].num_batches_tracked == 8


def test_state_dict_float32_model_takes_float64_arrays(rng):
    m = _cnn("float32")
    sd = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
          for k, v in _cnn("float64").state_dict().items()}
    m.load_state_dict(sd)
    assert m[0].weight.dtype == np.float32
    np.testing.assert_allclose(m[0].weight.numpy(), sd["0.weight"], rtol=1e-7)


# ---------------------------------------------------------------- recurrent layers

def _torch_rnn(mode, sd, x, layers, directions, h):
    """PyTorch's documented RNN/LSTM/GRU equations over its state dict; x (T, N, I).
    Returns y (T, N, D*H) and hy (layers*D, N, H)."""
    hys, inp = [], x
    for layer in range(layers):
        outs = []
        for d in range(directions):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            wi, wh = sd["weight_ih" + sfx], sd["weight_hh" + sfx]
            bi, bh = sd["bias_ih" + sfx], sd["bias_hh" + sfx]
            hcur = np.zeros((x.shape[1], h))
            c = np.zeros_like(hcur)
            ys = [None] * x.shape[0]
            steps = range(x.shape[0]) if d == 0 else reversed(range(x.shape[0]))
            for t in steps:
                gi, gh = inp[t] @ wi.T + bi, hcur @ wh.T + bh
                if mode == "lstm":
                    i, f, g, o = np.split(gi + gh, 4, axis=1)
                    c = _sig(f) * c + _sig(i) * np.tanh(g)
                    hcur = _sig(o) * np.tanh(c)
                elif mode == "gru":
                    ir, iz, in_ = np.split(gi, 3, axis=1)
                    hr, hz, hn = np.split(gh, 3, axis=1)
                    r, z = _sig(ir + hr), _sig(iz + hz)
                    n = np.tanh(in_ + r * hn)
                    hcur = (1 - z) * n + z * hcur
                else:
                    hcur = np.tanh(gi + gh)
                ys[t] = hcur
            outs.append(np.stack(ys))
            hys.append(hcur)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hys)


@pytest.mark.parametrize("cls, mode, gates", [(nn.LSTM, "lstm", 4), (nn.GRU, "gru", 3),
                                              (nn.RNN, "rnn_tanh", 1)])
def test_recurrent_state_dict_is_pytorchs(rng, cls, mode, gates):
    """PyTorch's weight_ih_l{k}{_reverse} (G*H, in), weight_hh (G*H, H), bias_ih, bias_hh with
    the gates stacked in PyTorch's order (LSTM i, f, g, o; GRU r, z, n) map onto the flat
    cuDNN-layout buffer: the layer computes PyTorch's equations on them, and the dict comes
    back as it went in."""
    i_, h, layers = 2, 3, 2
    m = cls(i_, h, layers, bidirectional=True, dtype="float64", seed=0)
    sd = {}
    for layer in range(layers):
        for sfx in ("", "_reverse"):
            s = f"_l{layer}{sfx}"
            sd["weight_ih" + s] = rng.standard_normal((gates * h, i_ if layer == 0 else 2 * h))
            sd["weight_hh" + s] = rng.standard_normal((gates * h, h))
            sd["bias_ih" + s] = rng.standard_normal(gates * h)
            sd["bias_hh" + s] = rng.standard_normal(gates * h)
    assert list(m.state_dict()) == list(sd)          # PyTorch's names, in PyTorch's order
    m.load_state_dict(sd)
    x = rng.standard_normal((3, 2, i_))
    y_ref, hy_ref = _torch_rnn(mode, sd, x, layers, 2, h)
    with dnnkit.no_grad():
        y = m(x)
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(m.hy.numpy(), hy_ref, rtol=1e-11, atol=1e-12)
    back = m.state_dict()
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])
    # the flat parameter is what the optimizers see
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert m.weight.shape == (m.rnn.param_size,)


def test_skip_input_mode_has_no_input_matrix():
    m = nn.GRU(3, 3, input_mode="skip")
    names = list(m.state_dict())
    assert "weight_ih_l0" not in names and names[:3] == ["weight_hh_l0", "bias_ih_l0",
                                                         "bias_hh_l0"]


# ---------------------------------------------------------------- loads: all or nothing

def test_load_checks_everything_before_writing(rng):
    m = _cnn()
    before = m.state_dict()
    bad = dict(before, **{"0.weight": before["0.weight"] + 1, "4.bias": np.zeros(5)})
    with pytest.raises(ValueError, match=r"4\.bias has shape \(5,\).*\(4,\)"):
        m.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"missing keys \['1\.bias'\]"):
        m.load_state_dict({k: v for k, v in before.items() if k != "1.bias"})
    with pytest.raises(ValueError, match=r"unexpected keys \['extra'\]"):
        m.load_state_dict(dict(before, extra=np.zeros(1)))
    with pytest.raises(ValueError, match=r"0\.bias has dtype <U1"):
        m.load_state_dict(dict(before, **{"0.bias": np.array(["a", "b", "c"])}))
    with pytest.raises(ValueError, match=r"num_batches_tracked has dtype float64"):
        m.load_state_dict(dict(before, **{"1.num_batches_tracked": np.array(1.5)}))
    with pytest.raises(TypeError, match="mapping"):
        m.load_state_dict([("0.weight", before["0.weight"])])
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])       # nothing was written
    m.load_state_dict({"0.bias": np.ones(3)}, strict=False)
    np.testing.assert_array_equal(m[0].bias.numpy(), np.ones(3))
    # device arrays and Tensors load too
    m.load_state_dict({"0.bias": dnnkit.tensor(np.full(3, 2.0))}, strict=False)
    np.testing.assert_array_equal(m[0].bias.numpy(), np.full(3, 2.0))


def test_save_and_load_agree_on_the_suffix(rng, tmp_path):
    m = _cnn()
    written = m.save(tmp_path / "model")
    assert written == str(tmp_path / "model.npz") and os.listdir(tmp_path) == ["model.npz"]
    m2 = _cnn().load(tmp_path / "model")
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(m2.state_dict()[k], v)
    m2.load(tmp_path / "model.npz")
    with pytest.raises(FileNotFoundError, match="absent"):
        m2.load(tmp_path / "absent")


def _damaged(tmp_path, good):
    raw = good.read_bytes()
    files = {"empty": b"", "truncated": raw[:len(raw) // 2],
             "random": np.random.default_rng(0).bytes(300)}
    out = {}
    for name, data in files.items():
        p = tmp_path / f"{name}.npz"
        p.write_bytes(data)
        out[name] = (p, None)
    state = dict(np.load(good))
    np.savez(tmp_path / "strings.npz", **dict(state, **{"0.bias": np.array(["a", "b", "c"])}))
    out["strings"] = (tmp_path / "strings.npz", "0.bias")
    obj = np.empty(3, object)
    obj[:] = [1, "x", None]
    np.savez(tmp_path / "pickled.npz", **dict(state, **{"0.bias": obj}))
    out["pickled"] = (tmp_path / "pickled.npz", "0.bias")
    np.save(tmp_path / "single.npy", np.zeros(3))
    out["single"] = (tmp_path / "single.npy", None)
    return out


def test_damaged_files_raise_value_errors_naming_file_and_key(rng, tmp_path):
    m = _cnn()
    good = pathlib.Path(m.save(tmp_path / "good.npz"))
    target = _cnn()
    target[0].bias.data.copy_to_device(np.arange(3.0))
    before = target.state_dict()
    for name, (path, key) in _damaged(tmp_path, good).items():
        with pytest.raises(ValueError) as e:
            target.load(path)
        msg = str(e.value)
        assert str(path) in msg, (name, msg)
        if key is not None:
            assert key in msg, (name, msg)
        for k, v in target.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=name)


_SAVE_UNDER_LIMIT = textwrap.dedent("""
    import os, resource, signal, sys
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    from dnnkit import nn
    path = sys.argv[1]
    m = nn.Linear(64, 64, seed=5)                       # about 17 KB as .npz
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the limit: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        m.save(path)
    except OSError as e:
        print("failed:", e.errno, e.filename)
    else:
        print("saved")
""")


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32",
                    reason="RLIMIT_FSIZE is POSIX")
def test_failed_save_keeps_the_previous_file(tmp_path):
    """A save that fails half-way (a file-size limit: a full disk behaves alike) leaves the
    previous file whole and loadable, and no temporary file behind."""
    old = nn.Linear(64, 64, seed=1)
    path = tmp_path / "model.npz"
    old.save(path)
    before = path.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _SAVE_UNDER_LIMIT, str(path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("failed: 27"), out.stdout          # EFBIG
    assert str(path) in out.stdout
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.npz"]
    m = nn.Linear(64, 64, seed=9).load(path)
    np.testing.assert_array_equal(m.weight.numpy(), old.weight.numpy())
