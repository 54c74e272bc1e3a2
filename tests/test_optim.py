"""dnnkit.optim (SGD, Adam) and ops.elementwise.axpy against float64 NumPy references written
from PyTorch's update equations (tiny arrays: the simulator runs a thread per CUDA thread);
gradients as Tensors (from backward) or device arrays; the version bump; malformed state
dicts; a step that reads nothing back from the device."""

import numpy as np
import pytest
from numba import cuda

import dnnkit
from dnnkit.nn.parameter import Parameter
from dnnkit.ops.elementwise import axpy
from dnnkit.optim import SGD, Adam

TOL = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-12}
SHAPES = [(3, 5), (7,)]


def rel_err(got, ref):
    return np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30)


def make(rng, dtype, shapes=SHAPES):
    hosts = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return hosts, [Parameter(h) for h in hosts]


def grads(rng, shapes, steps, dtype):
    return [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]


def set_grads(params, gs):
    # half as Tensors (what backward leaves), half as device arrays: both are read
    for i, (p, g) in enumerate(zip(params, gs)):
        p.grad = dnnkit.tensor(g) if i % 2 == 0 else cuda.to_device(g)


class SGDRef:
    """torch.optim.SGD in float64 NumPy."""

    def __init__(self, lr, momentum=0.0, weight_decay=0.0, nesterov=False, dampening=0.0):
        self.lr, self.mom, self.wd = lr, momentum, weight_decay
        self.nesterov, self.damp, self.buf = nesterov, dampening, {}

    def step(self, i, p, grad):
        g = grad + self.wd * p
        if self.mom:
            b = self.buf.get(i)
            b = g.copy() if b is None else self.mom * b + (1 - self.damp) * g
            self.buf[i] = b
            g = g + self.mom * b if self.nesterov else b
        return p - self.lr * g


class AdamRef:
    """torch.optim.Adam (amsgrad off) in float64 NumPy."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m, self.v, self.t = {}, {}, {}

    def step(self, i, p, grad):
        t = self.t[i] = self.t.get(i, 0) + 1
        g = grad + self.wd * p
        m = self.m[i] = self.b1 * self.m.get(i, 0.0) + (1 - self.b1) * g
        v = self.v[i] = self.b2 * self.v.get(i, 0.0) + (1 - self.b2) * g * g
        mhat, vhat = m / (1 - self.b1 ** t), v / (1 - self.b2 ** t)
        return p - self.lr * mhat / (np.sqrt(vhat) + self.eps)


def run_both(rng, dtype, make_opt, ref, steps=4):
    hosts, params = make(rng, dtype)
    opt = make_opt(params)
    refs = [h.astype(np.float64) for h in hosts]
    for gs in grads(rng, SHAPES, steps, dtype):
        set_grads(params, gs)
        opt.step()
        refs = [ref.step(i, r, g.astype(np.float64)) for i, (r, g) in enumerate(zip(refs, gs))]
        if dtype == "float16":
            # the parameter is stored in float16 after every step (its state stays float32):
            # model that rounding, else it compounds past the tolerance over the steps
            refs = [r.astype(np.float16).astype(np.float64) for r in refs]
        for p, r in zip(params, refs):
            assert p.dtype == np.dtype(dtype)
            assert rel_err(p.numpy(), r) <= TOL[dtype]


SGD_CASES = [dict(lr=0.1), dict(lr=0.1, weight_decay=0.01), dict(lr=0.05, momentum=0.9),
             dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.02),
             dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("kw", SGD_CASES, ids=lambda kw: "-".join(kw))
def test_sgd_matches_reference(rng, dtype, kw):
    run_both(rng, dtype, lambda ps: SGD(ps, **kw), SGDRef(**kw))


ADAM_CASES = [dict(), dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
              dict(lr=0.02, betas=(0.0, 0.5))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kw", ADAM_CASES, ids=["default", "wd", "b1zero"])
def test_adam_matches_reference(rng, dtype, kw):
    run_both(rng, dtype, lambda ps: Adam(ps, **kw), AdamRef(**kw), steps=5)


def test_adam_bias_correction_first_step(rng):
    # step 1: mhat = g, vhat = g^2, so each element moves by lr * g / (|g| + eps) ~ lr * sign(g)
    hosts, params = make(rng, "float64", [(9,)])
    g = rng.standard_normal(9)
    set_grads(params, [g])
    Adam(params, lr=0.01).step()
    np.testing.assert_allclose(params[0].numpy(), hosts[0] - 0.01 * g / (np.abs(g) + 1e-8),
                               rtol=1e-13)


def test_zero_grad_and_missing_grads(rng):
    hosts, params = make(rng, "float32")
    opt = Adam(params, lr=0.1)
    params[0].grad = cuda.to_device(np.ones(SHAPES[0], np.float32))
    opt.step()
    assert not np.array_equal(params[0].numpy(), hosts[0])
    np.testing.assert_array_equal(params[1].numpy(), hosts[1])      # no grad: untouched
    assert 1 not in opt.state_dict()["state"]                      # and no state made
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    before = [p.numpy() for p in params]
    opt.step()                                                      # nothing to do
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.numpy(), b)


def test_skipped_parameter_keeps_its_own_step_count(rng):
    # Adam counts steps per parameter: a parameter first updated at step 3 gets step-1 bias
    # correction then, as in PyTorch
    hosts, params = make(rng, "float64")
    opt, ref = Adam(params, lr=0.01), AdamRef(lr=0.01)
    refs = [h.astype(np.float64) for h in hosts]
    for k, gs in enumerate(grads(rng, SHAPES, 4, "float64")):
        live = [0, 1] if k >= 2 else [0]
        opt.zero_grad()
        set_grads([params[i] for i in live], [gs[i] for i in live])
        opt.step()
        for i in live:
            refs[i] = ref.step(i, refs[i], gs[i])
    for p, r in zip(params, refs):
        assert rel_err(p.numpy(), r) <= 1e-12
    assert [opt.state[i]["step"] for i in (0, 1)] == [4, 2]


@pytest.mark.parametrize("make_opt", [
    lambda ps: SGD(ps, lr=0.05, momentum=0.9, dampening=0.1),
    lambda ps: Adam(ps, lr=0.01, weight_decay=0.01)], ids=["sgd", "adam"])
def test_state_dict_round_trip(rng, make_opt):
    hosts, params = make(rng, "float32")
    opt = make_opt(params)
    gs = grads(rng, SHAPES, 4, "float32")
    for k in range(2):
        set_grads(params, gs[k])
        opt.step()
    saved = opt.state_dict()
    snapshot = [p.numpy() for p in params]
    for k in (2, 3):
        set_grads(params, gs[k])
        opt.step()
    first = [p.numpy() for p in params]
    # a fresh optimizer on parameters restored to the snapshot continues identically
    params2 = [Parameter(s) for s in snapshot]
    opt2 = make_opt(params2)
    opt2.load_state_dict(saved)
    for k in (2, 3):
        set_grads(params2, gs[k])
        opt2.step()
    for a, b in zip(first, (p.numpy() for p in params2)):
        np.testing.assert_array_equal(a, b)
    # the saved copies are the host's: later steps did not change them
    s2 = opt.state_dict()
    assert any(not np.array_equal(v, s2["state"][0][k]) for k, v in saved["state"][0].items()
               if isinstance(v, np.ndarray))


def test_state_dict_contents(rng):
    _, params = make(rng, "float16")
    opt = SGD(params, lr=0.1, momentum=0.5)
    set_grads(params, grads(rng, SHAPES, 1, "float16")[0])
    opt.step()
    d = opt.state_dict()
    assert d["param_groups"][0]["lr"] == 0.1 and d["param_groups"][0]["params"] == [0, 1]
    buf = d["state"][0]["momentum_buffer"]
    assert buf.shape == SHAPES[0] and buf.dtype == np.float32      # accumulation dtype
    with pytest.raises(ValueError, match="SGD.load_state_dict"):
        SGD(params[:1], lr=0.1, momentum=0.5).load_state_dict(d)
    bad = {"state": {0: {"momentum_buffer": np.zeros(4, np.float32)}},
           "param_groups": d["param_groups"]}
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)


def test_lr_setter(rng):
    hosts, params = make(rng, "float64", [(4,)])
    opt = SGD(params, lr=0.1)
    opt.lr = 0.5
    g = rng.standard_normal(4)
    set_grads(params, [g])
    opt.step()
    np.testing.assert_allclose(params[0].numpy(), hosts[0] - 0.5 * g, rtol=1e-14)
    with pytest.raises(ValueError, match="SGD.*lr -1"):
        opt.lr = -1


@pytest.mark.parametrize("cls, kw, match", [
    (SGD, dict(lr=-0.1), r"SGD: invalid lr -0\.1"),
    (SGD, dict(lr=float("nan")), r"SGD: invalid lr nan"),
    (SGD, dict(lr=0.1, momentum=-0.5), r"SGD: invalid momentum -0\.5"),
    (SGD, dict(lr=0.1, weight_decay=-1), r"SGD: invalid weight_decay -1"),
    (SGD, dict(lr=0.1, nesterov=True), r"SGD: nesterov needs momentum > 0.*momentum=0\.0"),
    (SGD, dict(lr=0.1, momentum=0.9, nesterov=True, dampening=0.1),
     r"SGD: nesterov .*dampening=0\.1"),
    (Adam, dict(lr=-1e-3), r"Adam: invalid lr -0\.001"),
    (Adam, dict(betas=(1.0, 0.999)), r"Adam: invalid beta1 1\.0"),
    (Adam, dict(betas=(0.9, -0.1)), r"Adam: invalid beta2 -0\.1"),
    (Adam, dict(betas=0.9), r"Adam: betas must be a pair"),
    (Adam, dict(eps=0.0), r"Adam: invalid eps 0\.0"),
    (Adam, dict(eps=-1e-8), r"Adam: invalid eps -1e-08"),
])
def test_argument_errors(rng, cls, kw, match):
    _, params = make(rng, "float32", [(2,)])
    with pytest.raises(ValueError, match=match):
        cls(params, **kw)


def test_parameter_list_errors(rng):
    _, params = make(rng, "float32", [(2,)])
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        Adam(params + params)
    with pytest.raises(TypeError, match="iterable"):
        Adam(params[0])
    with pytest.raises(TypeError, match="lr must be a real number"):
        SGD(params, lr="0.1")
    p = params[0]
    p.grad = cuda.to_device(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="shape"):
        SGD(params, lr=0.1).step()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_axpy(rng, dtype):
    x, y = (rng.standard_normal((4, 6)).astype(dtype) for _ in range(2))
    dy = cuda.to_device(y)
    out = axpy(-0.75, cuda.to_device(x), dy)
    ref = y.astype(np.float64) - 0.75 * x.astype(np.float64)
    got = dy.copy_to_host()
    assert out is dy and got.dtype == np.dtype(dtype)
    assert rel_err(got, ref) <= TOL[dtype]


def test_axpy_errors(rng):
    y = cuda.to_device(np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="in place"):
        axpy(1.0, cuda.to_device(np.ones(5, np.float32)), np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="shape"):
        axpy(1.0, cuda.to_device(np.ones(4, np.float32)), y)
    with pytest.raises(TypeError, match="dtype"):
        axpy(1.0, cuda.to_device(np.ones(5, np.float64)), y)


def test_step_from_backward_bumps_versions(rng):
    """The gradients backward leaves are Tensors; the step changes the parameters in place and
    bumps their versions, so a graph recorded before the step cannot differentiate the old
    value silently."""
    w = Parameter(rng.standard_normal((2, 3)))
    x = dnnkit.tensor(rng.standard_normal((4, 3)))
    y = dnnkit.linear(x, w)
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.ones((4, 2)).T @ x.numpy(), rtol=1e-13)
    before, v0 = w.numpy(), w.version
    stale = dnnkit.linear(x, w)
    SGD([w], lr=0.5).step()
    assert w.version == v0 + 1
    np.testing.assert_allclose(w.numpy(), before - 0.5 * w.grad.numpy(), rtol=1e-13)
    with pytest.raises(RuntimeError, match="changed in place"):
        stale.sum().backward()


def test_frozen_and_non_leaf_parameters(rng):
    w = Parameter(np.ones(3)).requires_grad_(False)
    opt = SGD([w], lr=1.0)
    opt.step()                                        # no grad: nothing happens
    np.testing.assert_array_equal(w.numpy(), np.ones(3))
    made = dnnkit.tensor(np.ones(3), requires_grad=True) * 2.0
    with pytest.raises(ValueError, match="made by an op.*leaf"):
        SGD([made], lr=0.1)


@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_step_reads_nothing_back(rng, monkeypatch, opt_cls):
    """A step queues its kernels: no copy to the host, no synchronisation (once the state
    buffers exist: the first step makes them)."""
    _, params = make(rng, "float32")
    opt = opt_cls(params, lr=0.1, **({"momentum": 0.9} if opt_cls is SGD else {}))
    set_grads(params, grads(rng, SHAPES, 1, "float32")[0])
    opt.step()

    def refuse(*a, **k):
        raise AssertionError("the optimizer step read from the device")
    arr = type(params[0].data)
    monkeypatch.setattr(arr, "copy_to_host", refuse)
    monkeypatch.setattr(cuda, "synchronize", refuse)
    opt.step()


MALFORMED = [
    ("not a dict", [], "expected a dict"),
    ("no state", {"param_groups": [{}]}, "no 'state' key"),
    ("groups", {"state": {}, "param_groups": {"lr": 1}}, "'param_groups' must be a list"),
    ("hyper", {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}, "no 'betas' key"),
    ("state type", {"state": [1], "param_groups": None}, "'param_groups' must be a list"),
    ("index", {"state": {5: {}}, "param_groups": "G"}, "state key 5"),
    ("entry", {"state": {0: 3}, "param_groups": "G"}, r"state\[0\] must be a dict"),
    ("unknown", {"state": {0: {"momentum": 1}}, "param_groups": "G"}, "unknown key 'momentum'"),
    ("partial", {"state": {0: {"step": 1}}, "param_groups": "G"}, "lacks 'exp_avg'"),
    ("step", {"state": {0: {"step": -1, "exp_avg": "B", "exp_avg_sq": "B"}},
     "param_groups": "G"}, r"state\[0\]\['step'\] must be a count"),
    ("buffer", {"state": {0: {"step": 1, "exp_avg": "B", "exp_avg_sq": np.array(["x"] * 15)
                              .reshape(3, 5)}}, "param_groups": "G"},
     r"state\[0\]\['exp_avg_sq'\] must be a real array"),
]


@pytest.mark.parametrize("name, bad, match", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_adam_load_state_dict_malformed(rng, name, bad, match):
    _, params = make(rng, "float32")
    opt = Adam(params, lr=0.01)
    set_grads(params, grads(rng, SHAPES, 1, "float32")[0])
    opt.step()
    good = opt.state_dict()
    if isinstance(bad, dict):
        if bad.get("param_groups") == "G":
            bad["param_groups"] = good["param_groups"]
        for st in bad.get("state", {}).values() if isinstance(bad.get("state"), dict) else ():
            if isinstance(st, dict):
                for k, v in st.items():
                    if isinstance(v, str) and v == "B":
                        st[k] = good["state"][0][k]
    saved = [dict(st) for st in opt.state]
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(bad)
    assert opt.defaults["lr"] == 0.01 and len(opt.state) == len(saved)
    for st, was in zip(opt.state, saved):
        assert st.keys() == was.keys() and all(st[k] is was[k] for k in st)


@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_one_launch_steps_up_to_twelve_parameters(rng, monkeypatch, opt_cls):
    """Multi-tensor step: 27 parameters of one dtype and state take ceil(27 / 12) = 3
    launches; a parameter whose state differs (Adam's step count, SGD's first momentum step)
    goes in a launch of its own group. Every parameter still matches the float64 reference."""
    from dnnkit import launch
    shapes = [(1 + i % 5, 2 + i % 3) for i in range(27)]
    hosts, params = make(rng, "float64", shapes)
    kw = dict(lr=0.05, momentum=0.9) if opt_cls is SGD else dict(lr=0.01)
    opt, ref = opt_cls(params, **kw), (SGDRef(**kw) if opt_cls is SGD else AdamRef(**kw))
    launches = []
    real = launch.Prepared.__call__

    def counted(self, stream):
        # the tensors of a launch: the distinct block ends (every parameter has a block; the
        # padding repeats the last end)
        ends = next(a for a in self.args if type(a) is list and type(a[0]) is int)
        launches.append(len(set(ends)))
        return real(self, stream)
    monkeypatch.setattr(launch.Prepared, "__call__", counted)
    made = []
    real_init = launch.Prepared.__init__
    monkeypatch.setattr(launch.Prepared, "__init__",
                        lambda self, *a, **kw: made.append(1) or real_init(self, *a, **kw))
    refs = [h.astype(np.float64) for h in hosts]
    for k, gs in enumerate(grads(rng, shapes, 4, "float64")):
        live = range(27) if k else range(1, 27)       # parameter 0 starts a step late
        opt.zero_grad()
        set_grads([params[i] for i in live], [gs[i] for i in live])
        launches.clear()
        made.clear()
        opt.step()
        for i in live:
            refs[i] = ref.step(i, refs[i], gs[i])
        # later steps: parameter 0 stays one step behind the others (Adam), or is past its
        # first momentum step like them (SGD)
        want = [2, 12, 12] if k == 0 else [3, 12, 12] if opt_cls is SGD and k >= 2 else \
            [1, 2, 12, 12]
        assert sorted(launches) == want and opt.launches_per_step == len(want)
        # a step of the same shape as the last repeats its packed launches: none is made
        # (SGD's second step makes new ones: its first momentum step was a group of its own)
        reused = k >= 2 if opt_cls is Adam else k >= 3
        assert len(made) == (0 if reused else len(want))
    for p, r in zip(params, refs):
        assert rel_err(p.numpy(), r) <= 1e-12


@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_a_kept_step_follows_every_change_between_steps(rng, opt_cls):
    """A step of the same shape as the last repeats its packed launches (Optimizer.step):
    whatever changes between steps must still be seen. Against the float64 reference, step
    by step: a new learning rate, a parameter's array replaced, a gradient from the host, a
    parameter without a gradient, a non-contiguous gradient (refused), the state reloaded."""
    hosts, params = make(rng, "float64")
    kw = dict(lr=0.05, momentum=0.9) if opt_cls is SGD else dict(lr=0.01)
    opt, ref = opt_cls(params, **kw), (SGDRef(**kw) if opt_cls is SGD else AdamRef(**kw))
    refs = [h.astype(np.float64) for h in hosts]
    gs = grads(rng, SHAPES, 9, "float64")
    for k in range(9):
        live = [0] if k == 5 else [0, 1]
        opt.zero_grad()
        set_grads([params[i] for i in live], [gs[k][i] for i in live])
        if k == 3:
            opt.lr = ref.lr = 0.02
        if k == 4:              # the parameter's array replaced, the gradient a host array
            new = rng.standard_normal(SHAPES[0])
            params[0].data = cuda.to_device(new)
            refs[0] = new.copy()
            params[1].grad = gs[k][1]
        if k == 6:              # a non-contiguous gradient: refused, nothing stepped
            # (every other column of a wider array: Numba's .T copies on a GPU)
            wide = np.repeat(gs[k][0], 2, axis=1)
            params[0].grad = cuda.to_device(wide)[:, ::2]
            with pytest.raises(ValueError, match="C-contiguous"):
                opt.step()
            params[0].grad = cuda.to_device(gs[k][0])
        if k == 7:              # the state saved and loaded into the same optimizer
            opt.load_state_dict(opt.state_dict())
        opt.step()
        for i in live:
            refs[i] = ref.step(i, refs[i], gs[k][i])
        for i, (p, r) in enumerate(zip(params, refs)):
            assert rel_err(p.numpy(), r) <= 1e-12, (k, i)


def test_a_state_dict_replaced_in_place_takes_the_full_path(rng):
    """A parameter's state dict swapped for a copy (same buffers) between steps: the kept
    launches are not reused, so the step count advances in the dict the optimizer holds."""
    hosts, params = make(rng, "float64")
    opt, ref = Adam(params, lr=0.01), AdamRef(lr=0.01)
    refs = [h.astype(np.float64) for h in hosts]
    for k, gs in enumerate(grads(rng, SHAPES, 4, "float64")):
        if k == 2:
            opt.state[0] = dict(opt.state[0])
        set_grads(params, gs)
        opt.step()
        refs = [ref.step(i, r, g) for i, (r, g) in enumerate(zip(refs, gs))]
    assert [opt.state_dict()["state"][i]["step"] for i in (0, 1)] == [4, 4]
    for p, r in zip(params, refs):
        assert rel_err(p.numpy(), r) <= 1e-12
