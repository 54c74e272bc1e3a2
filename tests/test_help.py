"""``help()`` of every public op: its real signature (the checking body's parameters plus a
keyword-only ``backend=``, and ``stream=``) and a docstring that documents every parameter,
lists every option's values, says what raises, and ends with what all ops share
(dnnkit/hints.py's OP_FOOTER; dnnkit/ops/opdocs.py's shared paragraphs filled in)."""

import importlib
import inspect
import pydoc
import re

import pytest

import dnnkit
from dnnkit import hints, ops
from dnnkit.ops import conv_args, opdocs
from dnnkit.rnn_layout import INPUT_MODES, MODES as RNN_MODES

# (by module name: the package's attributes activation, softmax, ... are the functions)
activation, batchnorm, loss, pool, softmax = (
    importlib.import_module(f"dnnkit.ops.{m}")
    for m in ("activation", "batchnorm", "loss", "pool", "softmax"))

# every public function: dnnkit.ops.__all__ and dnnkit.split (dnnkit.ops.split is the module
# that splits cuDNN calls)
NAMES = sorted({n for n in ops.__all__ if inspect.isfunction(getattr(ops, n))} | {"split"})
CLASSES = [n for n in ops.__all__ if inspect.isclass(getattr(ops, n))]
FOOTER = hints.OP_FOOTER.strip()
MIN_OWN_LINES = 3          # the op's own text, before the shared footer

_PADDING = ("valid", "full", "half")


def _conv(direction):
    return ("cross", "conv") + _PADDING + conv_args.ALGOS[direction] + conv_args.PRECISIONS


# {op: the values its docstring must list}, from the families' own tuples: a new mode, algorithm
# or reduction fails here until it is documented
VALUES = {
    "activation": activation.MODES, "activation_backward": activation.MODES,
    "softmax": softmax.ALGOS + softmax.MODES, "softmax_backward": softmax.ALGOS + softmax.MODES,
    "log_softmax": softmax.MODES,
    "conv2d": _conv("fwd"), "conv3d": _conv("fwd"),
    "conv2d_backward_data": _conv("bwd_data"), "conv3d_backward_data": _conv("bwd_data"),
    "conv2d_backward_filter": _conv("bwd_filter"), "conv3d_backward_filter": _conv("bwd_filter"),
    **{op: pool.MODES + tuple(pool.ALIASES) for op in
       ("pool2d", "pool3d", "pool2d_backward", "pool3d_backward")},
    **{op: batchnorm.MODES for op in
       ("batch_norm_train", "batch_norm_inference", "batch_norm_backward")},
    "rnn_forward": RNN_MODES + INPUT_MODES, "rnn_backward": RNN_MODES,
    **{op: loss.REDUCTIONS for op in ("cross_entropy", "cross_entropy_backward", "nll_loss",
                                      "nll_loss_backward", "mse_loss", "mse_loss_backward")},
    "matmul": ("False", "True"),
    **{op: ("None", "False", "True") for op in ("sum", "mean", "mean_backward")},
}


def _fn(name):
    return getattr(dnnkit, name)


def _word(text, word):
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_the_list_is_complete():
    assert len(NAMES) >= 50, NAMES
    assert set(VALUES) <= set(NAMES), set(VALUES) - set(NAMES)
    for name in ops.__all__:
        assert getattr(dnnkit, name) is getattr(ops, name), name


@pytest.mark.parametrize("name", NAMES)
def test_signature_has_backend_and_stream(name):
    params = inspect.signature(_fn(name)).parameters
    for kw in ("backend", "stream"):
        assert kw in params, f"{name}{inspect.signature(_fn(name))} has no {kw}="
        assert params[kw].kind is inspect.Parameter.KEYWORD_ONLY, (name, kw)
        assert params[kw].default is None, (name, kw)


@pytest.mark.parametrize("name", NAMES)
def test_signature_is_the_real_one(name):
    """A decorated op shows its checking body's parameters, not ``(*args, backend, **kw)``: the
    body's own ``backend`` (declared for type checkers, dnnkit/hints.py), else one added last."""
    fn = _fn(name)
    params = inspect.signature(fn).parameters
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()), name
    body = getattr(fn, "__wrapped__", None)
    if body is not None:
        own = list(inspect.signature(body).parameters)
        assert list(params) == (own if "backend" in own else own + ["backend"])


@pytest.mark.parametrize("name", NAMES)
def test_docstring_documents_the_op(name):
    fn = _fn(name)
    doc = inspect.getdoc(fn) or ""
    assert FOOTER in doc, f"{name}: the docstring lacks the shared backend/stream paragraph"
    own = doc.replace(FOOTER, "").strip()
    assert len(own.splitlines()) >= MIN_OWN_LINES, f"{name}: {own!r}"
    assert "raises" in own.lower(), f"{name}: the docstring does not say what raises"
    assert not re.search(r"^\s*\{[A-Z_0-9]+\}\s*$", doc, re.M), \
        f"{name}: an unfilled placeholder (dnnkit/ops/opdocs.py SHARED)"
    for p in inspect.signature(fn).parameters:
        if p not in ("backend", "stream"):
            assert _word(own, p), f"{name}: parameter {p!r} is not documented"
    missing = [v for v in VALUES.get(name, ()) if not _word(doc, v)]
    assert not missing, f"{name}: the docstring does not list {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_help_shows_signature_and_docstring(name):
    text = pydoc.render_doc(_fn(name), renderer=pydoc.plaintext)
    first = next(iter(inspect.signature(_fn(name)).parameters))
    assert re.search(rf"\b{name}\({first}\b", text), text[:300]
    assert "backend" in text and "stream" in text and "Raises" in text


@pytest.mark.parametrize("name", CLASSES)
def test_public_classes_have_docstrings(name):
    assert len((inspect.getdoc(getattr(ops, name)) or "").splitlines()) >= 2


def test_with_backend_keeps_the_parameters_and_adds_backend():
    def body(x, mode="a", *, stream=None):
        """x."""

    def body_kw(x, **kw):
        """x."""
    assert str(hints.with_backend(body)) == (
        "(x, mode='a', *, stream=None, backend: "
        "Optional[Literal['auto', 'cudnn', 'numba']] = None)")
    params = list(hints.with_backend(body_kw).parameters)
    assert params == ["x", "backend", "kw"]          # backend before **kw


def test_fill_replaces_only_known_placeholder_lines():
    doc = "Title.\n\n    {LOSS_REDUCTION}\n    {NOT_A_KEY}\n    text {LOSS_REDUCTION} inline"
    out = opdocs.fill(doc)
    first = opdocs.SHARED["LOSS_REDUCTION"].splitlines()[0]
    assert f"\n    {first}\n" in out
    assert "    {NOT_A_KEY}" in out and "text {LOSS_REDUCTION} inline" in out
