"""Op calls with Tensors: the recording of autograd nodes (dnnkit/dispatch.py calls ``call``).

A public op called with a Tensor anywhere in its arguments comes here: the op runs on the
Tensors' arrays as any call does (the memo, the policy and the backends are the same), its
array outputs come back as Tensors (dnnkit/tensors.py), and when gradients are on and an input
requires one, a node of the graph is recorded (dnnkit/autograd.py). Every op called with a
Tensor runs this module's code, so its common paths are written inline (the profile of a
training step's host time is flat: each frame and generator here is paid ~160 times a step).
"""

import inspect

from . import arrays
from .autograd import (GRADIENTS, PUBLIC, Node, check_destination, current_module,
                       is_grad_enabled, rebase, set_location, thread_mode)
from .tensors import Tensor


def call(op, plain, args, kw, backend):
    """Run public op ``op`` on the arrays of the Tensors among ``args``/``kw`` (``plain(args,
    kw, backend)`` returns the output and the backend that ran it) and record a node when a
    gradient can flow. Array outputs come back as Tensors; a Tensor passed as ``out=`` (the op
    wrote its result into that array) comes back itself, changed in place (``rebase``)."""
    dest = kw.get("out") if kw else None
    if dest is not None:
        if not isinstance(dest, Tensor):
            dest = None
        else:
            kw = dict(kw)
            del kw["out"]           # written, not read: no gradient flows to it
            if is_grad_enabled():
                check_destination(op, dest, _wants_grad(args, kw))
    # (every op called with a Tensor comes through here: _plain, recorder() and
    # is_grad_enabled() inlined)
    plain_args = [a.data if isinstance(a, Tensor) else
                  (_plain(a) if type(a) in _SEQUENCES else a) for a in args]
    plain_kw = {k: (a.data if isinstance(a, Tensor) else a) for k, a in kw.items()} if kw else kw
    if dest is not None:
        plain_kw["out"] = dest.data
    mode = thread_mode()
    rec = mode.get("recorder")
    if rec is not None:
        set_location("forward", op, current_module())
    out, ran_on = plain(plain_args, plain_kw, backend)
    if rec is not None:
        rec("forward", op, ran_on, current_module(), (plain_args, plain_kw), out)
    node = diff = None
    if not mode.get("off") and _wants_grad(args, kw):
        node, diff = _record(op, out, ran_on, plain_args, plain_kw, args, kw)
    res = _wrap(out, node, diff)
    if op in VIEWS and isinstance(args[0], Tensor) and isinstance(res, Tensor):
        res.counter = args[0].counter      # one array: one version counter
        res.counter[1] += 1
    if dest is not None:
        res = _into(dest, res)
    if node is not None:
        _save_outputs(node, res)
    return res


VIEWS = ("reshape", "take_batch")   # ops whose output views their first argument's array


def _wants_grad(args, kw):
    """Whether a Tensor among the arguments (or inside a list or tuple argument) requires
    grad: ``any(t.requires_grad for _, t in _named(...))`` without the generators."""
    for a in (args, kw.values()) if kw else (args,):
        for v in a:
            if isinstance(v, Tensor):
                if v.requires_grad:
                    return True
            elif type(v) in (list, tuple):
                for w in v:
                    if isinstance(w, Tensor) and w.requires_grad:
                        return True
    return False


def _record(op, out, ran_on, plain_args, plain_kw, args, kw):
    """(the node of this call, its differentiable output indices), or (None, None) when no
    input a gradient can flow to requires one."""
    rule = GRADIENTS.get(op)
    if rule is None:
        raise RuntimeError(
            f"{op} has no gradient rule (it is itself a gradient, or not differentiable): call "
            f"it on arrays or detached tensors, or inside dnnkit.no_grad()")
    names, defaults = _signatures.get(op) or _signature(op)
    bound = dict(defaults)
    bound.update(zip(names, plain_args))
    tensors = {}
    for n, a in zip(names, args):
        if isinstance(a, Tensor):
            tensors[n] = a
        elif type(a) in _SEQUENCES:
            tensors.update(_named(((n, a),)))
    if kw:
        bound.update(plain_kw)
        tensors.update((k, a) for k, a in kw.items() if isinstance(a, Tensor))
    if rule.inputs is not None and not any(
            tensors[n].requires_grad for n in rule.inputs if n in tensors):
        return None, None
    if rule.outputs is not None:
        diff = rule.outputs
    elif isinstance(out, tuple):
        diff = tuple(i for i, o in enumerate(out) if arrays.is_device_array(o))
    else:
        diff = _ONE if arrays.is_device_array(out) else ()
    return Node(op, ran_on, rule, bound, out, tensors, len(diff)), diff


def _save_outputs(node, res):
    """Record the version of each output the rule reads (after an in-place write's bump)."""
    which = node.rule.reads_out
    if callable(which):                              # depends on the call (a fused relu's y)
        which = which(node.args)
    if which is None and isinstance(res, Tensor):     # one output (most ops)
        c = res.counter
        node.saved_out = ((0, c, c[0]),)
        return
    outs = res if isinstance(res, tuple) else (res,)
    node.saved_out = tuple((i, outs[i].counter, outs[i].counter[0])
                           for i in (range(len(outs)) if which is None else which)
                           if isinstance(outs[i], Tensor))


def _into(dest, res):
    """``res`` with the Tensor made for ``dest``'s array replaced by ``dest`` itself, rebased."""
    if isinstance(res, tuple):
        parts = [_into(dest, r) if isinstance(r, Tensor) else r for r in res]
        return tuple(parts) if type(res) is tuple else type(res)(*parts)
    if isinstance(res, Tensor) and res.data is dest.data:
        rebase(dest, res.grad_fn, res.output_nr)
        return dest
    return res


_SEQUENCES = (list, tuple)
_ONE = (0,)


def _plain(a):
    """A Tensor's array; a list or tuple holding Tensors (concatenate's ``arrays``) as a list
    of arrays."""
    if isinstance(a, Tensor):
        return a.data
    if type(a) in (list, tuple) and any(isinstance(v, Tensor) for v in a):
        return [v.data if isinstance(v, Tensor) else v for v in a]
    return a


def _named(pairs):
    """(name, Tensor) for each Tensor argument; a Tensor inside a list or tuple argument is
    named ``"arrays[i]"`` (its rule returns its gradient under that name)."""
    for n, a in pairs:
        if isinstance(a, Tensor):
            yield n, a
        elif type(a) in (list, tuple):
            for i, v in enumerate(a):
                if isinstance(v, Tensor):
                    yield f"{n}[{i}]", v


_signatures = {}      # op -> (parameter names in order, {name: default})


def _signature(op):
    sig = _signatures.get(op)
    if sig is None:
        params = inspect.signature(PUBLIC[op]).parameters.values()
        sig = _signatures[op] = (
            tuple(p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)),
            {p.name: p.default for p in params if p.default is not p.empty})
    return sig


def _wrap(out, node, diff):
    """Array outputs as Tensors; the differentiable ones carry ``node``."""
    if isinstance(out, tuple):
        res = []
        for i, o in enumerate(out):
            if arrays.is_device_array(o):
                k = diff.index(i) if node is not None and i in diff else None
                res.append(Tensor(o, k is not None, grad_fn=node if k is not None else None,
                                  output_nr=k or 0))
            else:
                res.append(o)
        return tuple(res) if type(out) is tuple else type(out)(*res)
    if arrays.is_device_array(out):
        if node is not None:
            return Tensor(out, True, grad_fn=node, output_nr=0)
        return Tensor(out)
    return out
