"""dnnkit.Tensor and the autograd engine: graph semantics against finite differences in float64
(fan-out, a shared parameter, two outputs, a dead branch, a residual block, concatenate and
split), the errors of bad use, no_grad, retain_graph, the version counter, the release of saved
arrays, the memo on Tensor calls, and compare_backends. Tiny shapes: the simulator runs one
Python thread per CUDA thread."""

import numpy as np
import pytest

import dnnkit
from dnnkit import autograd, fastpath
from dnnkit.errors import CrosscheckError


def t(rng, shape, grad=True):
    return dnnkit.tensor(rng.standard_normal(shape), requires_grad=grad)


def numeric_grad(f, x, idx, eps=1e-6):
    """d f / d x[idx] by central differences; f() returns a float computed without grad."""
    base = x.numpy()
    out = []
    for sign in (1, -1):
        v = base.copy()
        v[idx] += sign * eps
        x.data.copy_to_device(v)
        with dnnkit.no_grad():
            out.append(f())
    x.data.copy_to_device(base)
    return (out[0] - out[1]) / (2 * eps)


def check_grads(loss_of, leaves, rng, points=4, rtol=1e-6):
    """Backpropagate ``loss_of()`` (outputs and their upstream gradients) and compare every
    leaf's gradient at a few random elements with central differences of the same scalar."""
    outs, gys = loss_of()
    for leaf in leaves:
        leaf.grad = None
    dnnkit.backward(outs, gys)

    def scalar():
        o, g = loss_of()
        return float(sum((oi.numpy() * gi).sum() for oi, gi in zip(o, g)))
    for leaf in leaves:
        assert leaf.grad is not None, "a leaf on the path to the loss got no gradient"
        got = leaf.grad.numpy()
        assert got.shape == leaf.shape and np.isfinite(got).all()
        for _ in range(points):
            idx = tuple(int(rng.integers(n)) for n in leaf.shape)
            want = numeric_grad(scalar, leaf, idx)
            assert abs(got[idx] - want) <= rtol * max(1.0, abs(want)), (idx, got[idx], want)


def fixed(rng, *shapes):
    return [rng.standard_normal(s) for s in shapes]


def test_fan_out_and_two_outputs(rng):
    """x feeds two convolutions (fan-out) whose outputs are two roots of one backward."""
    x, w1, w2 = t(rng, (1, 2, 4, 4)), t(rng, (3, 2, 3, 3)), t(rng, (2, 2, 1, 1))
    g1, g2 = fixed(rng, (1, 3, 4, 4), (1, 2, 4, 4))

    def loss_of():
        h = dnnkit.relu(x)
        return [dnnkit.conv2d(h, w1, padding=1), dnnkit.conv2d(h, w2)], [g1, g2]
    check_grads(loss_of, [x, w1, w2], rng)


def test_shared_parameter_gets_the_sum(rng):
    x, w = t(rng, (1, 2, 5, 5)), t(rng, (2, 2, 3, 3))
    g = fixed(rng, (1, 2, 5, 5))

    def loss_of():
        return [dnnkit.conv2d(dnnkit.tanh(dnnkit.conv2d(x, w, padding=1)), w, padding=1)], g
    check_grads(loss_of, [x, w], rng)


def test_dead_branch_gets_no_gradient(rng):
    x, w, w_dead = t(rng, (1, 2, 4, 4)), t(rng, (2, 2, 3, 3)), t(rng, (2, 2, 3, 3))
    dead = dnnkit.conv2d(x, w_dead, padding=1)          # computed, never reaches the loss
    y = dnnkit.conv2d(x, w, padding=1)
    y.backward(rng.standard_normal(y.shape))
    assert w_dead.grad is None and w.grad is not None and x.grad is not None
    assert dead.grad_fn is not None and not dead.grad_fn.released   # never run, never freed


def test_residual_block(rng):
    """relu(bn(conv(relu(bn(conv(x))))) + x): the skip connection adds two gradients of x."""
    x = t(rng, (2, 2, 4, 4))
    w1, w2 = t(rng, (2, 2, 3, 3)), t(rng, (2, 2, 3, 3))
    gammas = [dnnkit.tensor(rng.uniform(0.5, 1.5, 2), requires_grad=True) for _ in range(2)]
    betas = [t(rng, (2,)) for _ in range(2)]
    g = fixed(rng, (2, 2, 4, 4))

    def loss_of():
        h = dnnkit.conv2d(x, w1, padding=1)
        h = dnnkit.relu(dnnkit.batch_norm_train(h, gammas[0], betas[0])[0])
        h = dnnkit.conv2d(h, w2, padding=1)
        h = dnnkit.batch_norm_train(h, gammas[1], betas[1])[0]
        return [dnnkit.tanh(h + x)], g
    check_grads(loss_of, [x, w1, w2, *gammas, *betas], rng, points=3, rtol=1e-5)


def test_concatenate_and_split(rng):
    a, b = t(rng, (2, 3, 2)), t(rng, (2, 1, 2))
    g1, g2 = fixed(rng, (2, 2, 2), (2, 2, 2))

    def loss_of():
        c = dnnkit.concatenate([dnnkit.tanh(a), b], axis=1)      # (2, 4, 2)
        p, q = dnnkit.split(c, 2, axis=1)
        return [p * q, q], [g1, g2]
    check_grads(loss_of, [a, b], rng)


def test_broadcast_arithmetic_and_reductions(rng):
    x, scale, shift = t(rng, (2, 3, 2, 2)), t(rng, (1, 3, 1, 1)), t(rng, (3, 1, 1))
    g = fixed(rng, ())

    def loss_of():
        y = (x * scale + shift) / (scale * scale + 2.0) - x
        return [(y * y).mean()], g
    check_grads(loss_of, [x, scale, shift], rng)


def test_retain_graph_and_a_second_backward(rng):
    x, w = t(rng, (1, 1, 3, 3)), t(rng, (1, 1, 3, 3))
    y = dnnkit.conv2d(x, w, padding=1)
    gy = rng.standard_normal(y.shape)
    y.backward(gy, retain_graph=True)
    first = w.grad.numpy()
    y.backward(gy)                                   # the kept graph: gradients add up
    np.testing.assert_allclose(w.grad.numpy(), 2 * first, rtol=1e-12)
    assert y.grad_fn.released and y.grad_fn.args is None      # freed after the second
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward(gy)


def test_bad_use_raises_clear_errors(rng):
    x = t(rng, (2, 3))
    y = dnnkit.relu(x)
    with pytest.raises(RuntimeError, match=r"without grad on a tensor of shape \(2, 3\)"):
        y.backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        dnnkit.tensor(np.ones(1)).backward()
    with pytest.raises(ValueError, match=r"grad has shape \(3,\), the tensor \(2, 3\)"):
        y.backward(np.ones(3))
    with pytest.raises(TypeError, match="activation.*float32.*float64|dtype"):
        dnnkit.activation_backward(x, y, dnnkit.tensor(np.ones((2, 3), np.float32)))
    with pytest.raises(TypeError, match="requires_grad needs a floating-point"):
        dnnkit.tensor(np.arange(3), requires_grad=True)


def test_in_place_change_of_a_saved_tensor_is_detected(rng):
    x, w = t(rng, (1, 1, 3, 3)), t(rng, (1, 1, 3, 3))
    y = dnnkit.conv2d(x, w, padding=1)
    w.data.copy_to_device(np.zeros((1, 1, 3, 3)))      # an optimizer step, say
    w.bump_version()
    with pytest.raises(RuntimeError, match=r"conv2d: its input 'w' .* changed in place"):
        y.backward(rng.standard_normal(y.shape))


def test_no_grad_records_nothing_and_arrays_stay_arrays(rng):
    x = t(rng, (2, 3))
    with dnnkit.no_grad():
        y = dnnkit.relu(x)
        with dnnkit.enable_grad():
            z = dnnkit.relu(x)
    assert isinstance(y, dnnkit.Tensor) and not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn.op == "activation"
    plain = dnnkit.relu(x.numpy())
    assert not isinstance(plain, dnnkit.Tensor) and hasattr(plain, "copy_to_host")
    c = dnnkit.relu(dnnkit.tensor(x.numpy()))           # no input requires grad: no node
    assert isinstance(c, dnnkit.Tensor) and c.grad_fn is None


def test_an_op_without_a_rule_refuses_to_record(rng):
    x = t(rng, (2, 3))
    y = dnnkit.relu(x)
    with pytest.raises(RuntimeError, match="activation_backward has no gradient rule"):
        dnnkit.activation_backward(x, y, y)
    with dnnkit.no_grad():
        assert dnnkit.activation_backward(x, y, y).shape == (2, 3)


def test_backend_of_the_forward_runs_the_gradient(rng):
    x = t(rng, (1, 2, 4, 4))
    with dnnkit.trace() as tr:
        y = dnnkit.pool2d(x, 2, backend="numba")
        y.backward(rng.standard_normal(y.shape))
    assert tr.ops() == ["pool2d", "pool2d_backward"] and set(tr.backends()) == {"numba"}
    assert y.grad_fn.backend == "numba"


def test_tensor_calls_take_the_memo(rng):
    x = dnnkit.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    dnnkit.relu(x)
    hits = fastpath.stats["hits"]
    for _ in range(3):
        dnnkit.relu(x)
    assert fastpath.stats["hits"] == hits + 3


def test_tensor_basics(rng):
    h = rng.standard_normal((3, 2))
    x = dnnkit.tensor(h)
    assert x.shape == (3, 2) and x.ndim == 2 and x.dtype == np.float64 and len(x) == 3
    if not dnnkit.device.simulator():        # the simulator's arrays export no interface
        assert x.__cuda_array_interface__["shape"] == (3, 2)
    np.testing.assert_array_equal(x.numpy(), h)
    assert dnnkit.tensor(np.array([2.5])).item() == 2.5
    with pytest.raises(ValueError, match="one element"):
        x.item()
    d = t(rng, (2,)).detach()
    assert not d.requires_grad and d.grad_fn is None
    assert "grad_fn=activation" in repr(dnnkit.relu(t(rng, (2,))))


def test_saved_arrays_are_released_after_backward(rng):
    import gc
    import weakref
    x, w = t(rng, (1, 1, 3, 3)), t(rng, (1, 1, 3, 3))
    h = dnnkit.relu(dnnkit.conv2d(x, w, padding=1))
    inner = weakref.ref(h.grad_fn.args["x"])          # conv's output, saved by relu
    node = h.grad_fn
    y = dnnkit.conv2d(h, w, padding=1)
    del h
    y.backward(rng.standard_normal(y.shape))
    gc.collect()
    assert node.released and inner() is None


def test_saved_arrays_are_released_during_backward(rng):
    """Each node's saved arrays go back as soon as its rule has run, not when backward ends:
    a chain's activations die one by one while backward walks it (counted from a recorder,
    which runs after each rule)."""
    import weakref
    h = t(rng, (64,))
    acts = []
    for _ in range(6):
        h = dnnkit.tanh(h * h)
        acts.append(weakref.ref(h.data))
    alive = []
    with autograd.recording(lambda phase, *a: alive.append(sum(r() is not None for r in acts))
                            if phase == "backward" else None):
        h.backward(rng.standard_normal(h.shape))
    del h
    assert alive[0] == 6 and alive[-1] < alive[0] - 3, alive


def _perturb_when_auto(monkeypatch, op):
    """Make ``op``'s Numba implementation add 1e-3 to its output when dnn.enabled is auto."""
    from dnnkit import config, registry
    impl = registry.REGISTRY[op]["numba"]
    plain = impl.fn

    def perturbed(*a, **k):
        out = plain(*a, **k)
        if config.get("dnn.enabled") == "auto":
            h = out.copy_to_host()
            out.copy_to_device(h + 1e-3 * np.abs(h).max())
        return out
    monkeypatch.setattr(impl, "fn", perturbed)
    monkeypatch.setattr(impl, "bind", None)
    fastpath.invalidate()


def test_compare_backends_names_the_first_differing_op(rng, monkeypatch):
    x = t(rng, (1, 2, 4, 4), grad=False)
    w1, w2 = t(rng, (2, 2, 3, 3)), t(rng, (2, 2, 3, 3))

    def step(x):
        h = dnnkit.relu(dnnkit.conv2d(x, w1, padding=1))
        y = dnnkit.pool2d(dnnkit.conv2d(h, w2, padding=1), 2)
        y.backward(np.ones(y.shape))
        return y
    # on the simulator both runs are Numba; the comparison machinery is the same
    rep = dnnkit.testing.compare_backends(step, x, model=[w1, w2], backends=("auto", "numba"))
    assert rep.max_error < 1e-12 and len(rep.errors) >= 8      # float64 (cuDNN on a GPU)
    before = w1.numpy()
    on_cudnn = dnnkit.select_backend("pool2d", x.data, 2) == "cudnn"
    _perturb_when_auto(monkeypatch, "pool2d")
    if on_cudnn:
        # a GPU: run 1 runs every op on both backends from the same inputs, and the perturbed
        # Numba pool2d disagrees with cuDNN's there: named and raised, whatever the tolerance
        with pytest.raises(CrosscheckError, match=r"no module: pool2d forward \(the same "
                                                  r"inputs on both backends\)"):
            dnnkit.testing.compare_backends(step, x, model=[w1, w2], backends=("auto", "numba"))
        np.testing.assert_array_equal(w1.numpy(), before)
        return
    # the simulator: both runs are Numba, the perturbation is end-to-end drift only
    rep = dnnkit.testing.compare_backends(step, x, model=[w1, w2], backends=("auto", "numba"))
    assert rep.max_error > 1e-4                 # the drift is reported, not raised by default
    with pytest.raises(CrosscheckError,
                       match=r"no module: pool2d forward, max rel error .* end to end"):
        dnnkit.testing.compare_backends(step, x, model=[w1, w2], backends=("auto", "numba"),
                                        rtol=1e-10)
    np.testing.assert_array_equal(w1.numpy(), before)      # parameters restored
    assert w1.grad is None


def test_recording_sees_forward_and_backward(rng):
    seen = []
    x = t(rng, (2, 2))
    with autograd.recording(lambda phase, op, *rest: seen.append((phase, op))):
        dnnkit.relu(x).backward(np.ones((2, 2)))
    assert seen == [("forward", "activation"), ("backward", "activation")]


@pytest.mark.parametrize("mode,pshape", [("spatial", (3,)), ("spatial", (1, 3, 1, 1)),
                                         ("per-activation", (1, 3, 2, 2))])
def test_batch_norm_inference_gradient(rng, mode, pshape):
    """Frozen statistics: gradients wrt x, gamma and beta (shaped as given) by central
    differences; the statistics get none."""
    x = t(rng, (2, 3, 2, 2))
    gamma, beta = t(rng, pshape), t(rng, pshape)
    mean = rng.standard_normal(pshape)
    var = rng.random(pshape) + 0.5
    r = fixed(rng, (2, 3, 2, 2))

    def loss_of():
        return [dnnkit.batch_norm_inference(x, gamma, beta, mean, var, mode=mode)], r
    check_grads(loss_of, [x, gamma, beta], rng)
    assert gamma.grad.shape == pshape and beta.grad.shape == pshape


# ---------------------------------------------------------------- post-accumulate hooks

def _hooked(*named):
    """Register a hook on each (name, leaf) that records (name, a host copy of its grad)."""
    seen = []
    handles = [leaf.register_post_accumulate_grad_hook(
        lambda t, n=name: seen.append((n, t.grad.numpy()))) for name, leaf in named]
    return seen, handles


def test_post_accumulate_hook_runs_as_soon_as_the_leaf_is_final(rng):
    """loss = sum((x * a) * b): backward reaches b's last (only) consumer before a's, so b's
    hook runs while a has no gradient yet; each hook sees its leaf's complete gradient."""
    x, a, b = t(rng, (2, 3), grad=False), t(rng, (2, 3)), t(rng, (2, 3))
    order = []
    a.register_post_accumulate_grad_hook(lambda leaf: order.append(("a", leaf.grad.numpy())))
    b.register_post_accumulate_grad_hook(
        lambda leaf: order.append(("b", leaf.grad.numpy(), a.grad)))
    ((x * a) * b).sum().backward()
    assert [o[0] for o in order] == ["b", "a"]
    assert order[0][2] is None                  # a's gradient not made yet when b's hook ran
    xh, ah, bh = x.numpy(), a.numpy(), b.numpy()
    np.testing.assert_allclose(order[0][1], xh * ah, rtol=1e-12)
    np.testing.assert_allclose(order[1][1], xh * bh, rtol=1e-12)


def test_post_accumulate_hook_runs_once_after_every_contribution(rng):
    """w feeds two ops: its hook runs once per backward, after both contributions were added
    (the sum of the two), and again on the next backward."""
    x, z, w = t(rng, (3,), grad=False), t(rng, (3,), grad=False), t(rng, (3,))
    seen, _ = _hooked(("w", w))
    (x * w + (z * w) * 2.0).sum().backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0][1], x.numpy() + 2.0 * z.numpy(), rtol=1e-12)
    (x * w).sum().backward()                     # accumulates: one more call, the new total
    assert len(seen) == 2
    np.testing.assert_allclose(seen[1][1], 2.0 * x.numpy() + 2.0 * z.numpy(), rtol=1e-12)


def test_post_accumulate_hook_on_a_root_leaf_and_a_leaf_without_gradient(rng):
    w, unused = t(rng, (2,)), t(rng, (2,))
    seen, _ = _hooked(("w", w), ("unused", unused))
    w.backward(np.ones(2))                        # a leaf as the root: its hook runs at once
    assert [s[0] for s in seen] == ["w"]
    np.testing.assert_array_equal(seen[0][1], np.ones(2))
    dnnkit.backward([w, w * 3.0], [np.ones(2), np.ones(2)])    # root and consumer: once, 1 + 1 + 3
    assert [s[0] for s in seen] == ["w", "w"]
    np.testing.assert_allclose(seen[1][1], np.full(2, 5.0))
    x = t(rng, (2,))
    (x * 2.0).sum().backward()                     # `unused` is on no path: never called
    assert "unused" not in [s[0] for s in seen]


def test_post_accumulate_hook_remove_and_errors(rng):
    w = t(rng, (2,))
    seen, (handle,) = _hooked(("w", w))
    handle.remove()
    (w * 2.0).sum().backward()
    assert seen == []
    with pytest.raises(TypeError, match="must be callable"):
        w.register_post_accumulate_grad_hook(3)
    with pytest.raises(RuntimeError, match="only a leaf"):
        (w * 2.0).register_post_accumulate_grad_hook(lambda leaf: None)


def test_gradient_sums_of_a_model_pinned_to_numba_stay_on_numba(rng):
    """Two gradients of one tensor (a value used twice) and a leaf used twice are added by the
    backward: after nodes that ran on Numba, on Numba (a pinned model's backward stays on its
    backend); the trace shows every add of the backward with backend numba."""
    from dnnkit import trace
    x = dnnkit.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    with trace() as t:
        y = dnnkit.activation(x, "relu", backend="numba")
        z = dnnkit.add(y, y, backend="numba")             # y used twice: its gradients sum
        w = dnnkit.activation(x, "tanh", backend="numba")  # x used twice: accumulated
        dnnkit.add(z, w, backend="numba").sum().backward()
    adds = [e for e in t if e.op == "add"]
    assert len(adds) >= 3 and {e.backend for e in adds} == {"numba"}
    assert all(e.reason == "backend='numba'" for e in adds[1:]), [e.reason for e in adds]
    from dnnkit import autograd
    assert autograd.pin(None) is None


def test_the_backward_of_a_view_follows_a_numba_producer(rng):
    """take_batch (t[i]) is a view; its backward's copy runs where the viewed tensor was made
    when that was Numba (a pinned model stays on Numba), else by the policy."""
    from dnnkit import trace
    x = dnnkit.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    with trace() as t:
        y = dnnkit.activation(x, "relu", backend="numba")
        y[1].sum().backward()
    back = [e for e in t if e.op == "take_batch_backward"]
    assert len(back) == 1 and back[0].reason == "backend='numba'", [e.reason for e in back]
    with trace() as t:
        x[1].sum().backward()                     # a leaf: no producer, the policy decides
    back = [e for e in t if e.op == "take_batch_backward"]
    assert len(back) == 1 and back[0].reason != "backend='numba'"
