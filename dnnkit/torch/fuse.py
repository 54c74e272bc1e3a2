"""``fuse(model)``: a converted model's batch norms, convolutions and linear layers with the
relu (and a batch norm's residual add) after them in one op call each.

A ResNet block written in PyTorch ends ``relu(bn(conv(x)))`` and ``relu(bn(conv(y)) + z)``, a
VGG without batch norm ``relu(conv(x))``, a classifier ``relu(linear(x))``: converted
(dnnkit/torch/convert.py), that is two or three autograd Functions and as many op calls each
way, where dnnkit's ops take the add and the relu in the same call (``batch_norm_train(...,
residual=z, activation="relu")``, ``conv2d(..., activation="relu")``, ``linear(...)``). A
converted step's host time goes per Function (docs/torch.md, Speed), so fewer of them is the
lever.

Which calls follow which is in the model's ``forward`` code, not in its modules, so ``fuse``
traces the model with ``torch.fx`` and rewrites the graph: a call of a converted batch norm,
convolution (1-, 2- or 3-D, not transposed) or linear layer whose output goes only to a relu
-- ``nn.ReLU`` (converted or not, in place or not), ``F.relu``, ``torch.relu``, ``.relu()`` --
becomes one call of that layer with ``activation="relu"``; a batch norm's output going only to
an add (``+``, ``torch.add``, ``.add`` without ``alpha``) whose output goes only to such a
relu, one call with ``residual=`` and ``activation="relu"``. It returns the
``torch.fx.GraphModule``, which holds the very modules its graph calls (so the model's
Parameters and buffers: an optimizer made on the model's parameters trains it, and their
state-dict keys are the model's); as any fx trace, it keeps no module the forward never calls,
its containers are plain Modules, and Python control flow (``if self.training:`` in a module
that is not a leaf) is fixed as it was traced. The model itself is not changed.

Left as they are: a relu whose input has other users, an add with another operand pattern,
and a pair with anything in between that the move of the layer's call to the add could
change -- an in-place op, another call of the same layer, a read of its attributes -- or
with hooks on the layer or the ReLU module, or while any global module hook is registered (a
hook would see the fused output or never fire; a hook registered on a fused layer after
``fuse`` sees the fused output, one on a fused pair's ReLU module never fires).
``fused.dnnkit_fused`` lists what was fused. A residual that turns out at run time not to match x (not a tensor, or another
shape, dtype or device) is added with the relu by PyTorch's ops after the batch norm instead
(modules.py), as are the custom operators' calls (``torch.compile``). ``convert(model,
"torch")`` and ``compare`` do not fit the fused graph's calls (PyTorch's layers take no
``activation``): compare the unfused model, and fuse again after converting anew.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from .modules import ORIGINAL, fused_tail

_RELU_FUNCTIONS = (torch.relu, torch.relu_, torch.nn.functional.relu)
_RELU_METHODS = ("relu", "relu_")
_ADD_FUNCTIONS = (operator.add, torch.add)


def fuse(model: nn.Module) -> torch.fx.GraphModule:
    """``model`` (converted by dnnkit.torch.convert) traced by ``torch.fx`` with each call
    of a converted batch norm, convolution or linear layer and the relu (and a batch norm's
    residual add) after it fused into one call (module docstring). Raises TypeError naming the reason when ``torch.fx`` cannot trace the model
    (data-dependent control flow, for instance); nothing is changed then."""
    from torch import fx

    class Tracer(fx.Tracer):
        # converted modules are calls in the graph, as PyTorch's own layers are (fx would
        # trace into their forwards, which hand tensors' memory to Numba)
        def is_leaf_module(self, m, qualname):
            return type(m) in ORIGINAL or super().is_leaf_module(m, qualname)
    try:
        tracer = Tracer()
        graph = tracer.trace(model)
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception as e:      # noqa: BLE001 - fx raises many kinds; all mean "cannot trace"
        raise TypeError(f"dnnkit.torch.fuse: torch.fx cannot trace {type(model).__name__} "
                        f"({type(e).__name__}: {e}); its layers still run converted, unfused")\
            from e
    modules = dict(gm.named_modules())
    done = []
    for node in list(gm.graph.nodes):
        if not _is_relu(node, modules):
            continue
        src = node.args[0]
        found = _bn_and_residual(src, modules)
        if found is None:
            continue
        bn, residual = found
        if not _movable(bn, src, modules) or _hooked(modules[bn.target]) or (
                node.op == "call_module" and _hooked(modules[node.target])):
            continue
        kwargs = {"activation": "relu"} if residual is None else \
            {"residual": residual, "activation": "relu"}
        # inserted where the relu's input was made: the residual exists there (a block's
        # shortcut is often traced after its second batch norm)
        with gm.graph.inserting_before(src):
            new = gm.graph.call_module(bn.target, bn.args, kwargs)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        if src is not bn:
            gm.graph.erase_node(src)
        gm.graph.erase_node(bn)
        done.append(f"{bn.target}{' + add' if residual is not None else ''} + relu")
    gm.graph.lint()
    gm.recompile()
    gm.dnnkit_fused = tuple(done)
    # (kept by GraphModule's deepcopy, which rebuilds the module without other attributes)
    gm.meta.setdefault("_user_preserved_attributes", {})["dnnkit_fused"] = gm.dnnkit_fused
    return gm


def _movable(bn, src, modules):
    """Whether the layer's call ``bn`` can move down to ``src`` (its add, or itself):
    nothing in between is in place, calls that layer again or reads its attributes (a batch
    norm's running statistics change at the call)."""
    n = bn if src is bn else bn.next       # (src follows bn in the graph's order)
    while n is not src:
        target = str(n.target)
        if n.op == "call_module" and (n.target == bn.target or
                                      getattr(modules.get(n.target), "inplace", False)):
            return False
        if n.op == "get_attr" and target.startswith(bn.target + "."):
            return False
        if n.op in ("call_function", "call_method") and (
                n.kwargs.get("inplace") or "out" in n.kwargs or _writes(n.target)):
            return False
        n = n.next
    return True


# operator's in-place functions (fx traces ``y += z`` on a proxy as operator.add; these come
# from code that calls them by name)
_IN_PLACE_OPERATORS = frozenset(getattr(operator, "i" + n) for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
    "rshift", "matmul", "concat"))


def _writes(target):
    """Whether a call of ``target`` may write its arguments: an in-place operator function, a
    name ending in ``_`` (``add_``, ``torch.relu_``, ``aten.relu_.default``), or an ATen
    overload whose schema says it mutates."""
    if target in _IN_PLACE_OPERATORS:
        return True
    schema = getattr(target, "_schema", None)
    if schema is not None and getattr(schema, "is_mutable", False):
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    name = name.split(".")[0]
    return name.endswith("_") and not name.endswith("__")


def _hooked(module):
    """Whether ``module`` has hooks of its own, or any module has global ones."""
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    if any(getattr(module, n, None) for n in names):
        return True
    glob = torch.nn.modules.module
    return any(getattr(glob, "_global" + n, None) for n in names)


def _is_relu(node, modules):
    if node.op == "call_module":
        return isinstance(modules.get(node.target), nn.ReLU) and len(node.args) == 1 and \
            not node.kwargs
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return len(node.args) == 1 and set(node.kwargs) <= {"inplace"}
    return node.op == "call_method" and node.target in _RELU_METHODS and \
        len(node.args) == 1 and not node.kwargs


def _takes(node, modules, keyword):
    """Whether ``node`` is a plain call (x only) of a converted module whose forward takes
    ``keyword`` (modules.fused_tail), its output going to one user."""
    return isinstance(node, torch.fx.Node) and node.op == "call_module" and \
        keyword in fused_tail(modules.get(node.target)) and len(node.args) == 1 and \
        not node.kwargs and len(node.users) == 1


def _bn_and_residual(src, modules):
    """(the node of the layer to fuse, the residual node or None) when ``src``, a relu's
    input, is a call of a converted batch norm, convolution or linear layer, or an add of a
    batch norm's output and another tensor; else None."""
    if not isinstance(src, torch.fx.Node) or len(src.users) != 1:
        return None
    if _takes(src, modules, "activation"):
        return src, None
    add = (src.op == "call_function" and src.target in _ADD_FUNCTIONS) or \
        (src.op == "call_method" and src.target == "add")
    if not add or len(src.args) != 2 or src.kwargs:
        return None
    a, b = src.args
    for bn, z in ((a, b), (b, a)):
        if _takes(bn, modules, "residual") and isinstance(z, torch.fx.Node) and z is not bn:
            return bn, z
    return None
