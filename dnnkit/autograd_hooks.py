"""Post-accumulate hooks of leaf Tensors (``Tensor.register_post_accumulate_grad_hook``):
which leaves of one backward have hooks, how many reachable nodes can still send each a
gradient, and running the hooks once its last one has run (dnnkit/autograd.py
``run_backward`` drives it; dnnkit.distributed starts a bucket's all-reduce from them)."""

import itertools


class HookHandle:
    """``handle.remove()`` unregisters the hook it was returned for."""

    _ids = itertools.count()

    def __init__(self, hooks):
        self.hooks, self.id = hooks, next(self._ids)

    def remove(self):
        self.hooks.pop(self.id, None)


class HookedLeaves:
    """One backward's leaves that have post-accumulate hooks: how many reachable nodes can
    still send each a gradient, and which got one. When a leaf's count reaches 0 and it got a
    gradient in this backward, its hooks run (once). Empty, and never consulted per node, when
    no leaf of the graph has a hook."""

    __slots__ = ("feeds", "left", "gotten")

    def __init__(self):
        self.feeds = {}       # node -> [hooked leaf, once per argument it is passed as]
        self.left = {}        # id(leaf) -> edges from nodes not yet run
        self.gotten = {}      # id(leaf) -> leaf, for leaves that got a gradient

    def __bool__(self):
        return bool(self.left)

    def expect(self, node, leaf):
        self.feeds.setdefault(node, []).append(leaf)
        self.left[id(leaf)] = self.left.get(id(leaf), 0) + 1

    def got(self, leaf):
        if leaf.post_accumulate_grad_hooks:
            self.gotten[id(leaf)] = leaf

    def settle(self, node):
        for leaf in self.feeds.pop(node, ()):
            k = id(leaf)
            self.left[k] -= 1
            if not self.left[k] and self.gotten.pop(k, None) is not None:
                run_post_accumulate_hooks(leaf)


def settle_roots(hooked, roots):
    """Roots that are hooked leaves got their gradient before any node ran: their hooks run
    now, or after the last node that feeds them too."""
    done = set()
    for t, _ in roots:
        if t.grad_fn is None and t.requires_grad and t.post_accumulate_grad_hooks and \
                id(t) not in done:
            done.add(id(t))
            if hooked.left.get(id(t)):
                hooked.gotten[id(t)] = t
            else:
                run_post_accumulate_hooks(t)


def run_post_accumulate_hooks(leaf):
    for hook in list((leaf.post_accumulate_grad_hooks or {}).values()):
        hook(leaf)
