"""Theano-style dotted flags.

Precedence, highest first: a Python assignment (``dnnkit.config.dnn.enabled = "forced"``, or a
``change_flags`` block on the current thread) > the ``DNNKIT_FLAGS`` environment variable
(``"dnn.enabled=forced,dnn.verbose=True"``) > the rc file (INI, ``~/.dnnkitrc`` or the path in
``DNNKIT_RC``; section ``[dnn]`` holds ``enabled = forced``, ``[dnn.conv]`` holds ``algo_fwd = ...``)
> the defaults. The rc file is UTF-8 text and its values are literal (``library_path =
/opt/100%/lib`` means just that: no interpolation); a file that cannot be used raises
ConfigError naming it and the line.

The environment and the rc file are read on first use; ``reload()`` reads them again (tests use
it). ``change_flags`` is scoped to the calling thread, so concurrent blocks on other threads never
see each other's values; a plain assignment is process-wide.

Theano's old names (dnnkit/flag_aliases.py: ``dnn.conv.algo_bwd``, ``dnn.base_path``, ...) and
the old value ``small`` of ``dnn.conv.algo_bwd_data`` are accepted from every source with a
DeprecationWarning naming what to write instead; within one source a flag given by its own name
wins over the same flag set through an old name. ``dnn.benchmark = True`` moves the default of
the three ``dnn.conv.algo_*`` flags to ``time_once``; one given a value anywhere keeps it.
"""

import contextlib
import os
import re
import threading

from . import files, flag_aliases

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(name, value):
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"flag {name}: bad value {value!r}; allowed: True, False (or 1/0, yes/no)")


def enum(*allowed, aliases=None):
    """A flag parser taking one of ``allowed`` (any case, stripped; returned lower-cased) or
    an alias; anything else raises ValueError naming the flag and the allowed values."""
    aliases = dict(aliases or {})

    def parse(name, value):
        key = value if isinstance(value, bool) else str(value).strip()
        if key in aliases:
            return aliases[key]
        if isinstance(key, str) and key.lower() in allowed:
            return key.lower()
        raise ValueError(f"flag {name}: bad value {value!r}; allowed: {shown}")

    # True and "True" are two keys but one spelling: each alias is shown once
    also = list(dict.fromkeys(map(str, aliases)))
    shown = ", ".join(allowed) + (f" (also {', '.join(also)})" if also else "")

    parse.allowed = allowed
    return parse


_path = flag_aliases.path_value


class Flag:
    def __init__(self, name, default, parse, doc):
        self.name, self.default, self.parse, self.doc = name, default, parse, doc


_THEANO_BOOL = {True: "forced", False: "disabled", "True": "forced", "False": "disabled",
                "true": "forced", "false": "disabled"}

FLAGS = {f.name: f for f in [
    Flag("dnn.enabled", "auto", enum("auto", "forced", "disabled", aliases=_THEANO_BOOL),
         "auto: cuDNN where it can, else Numba (PyTorch's cudnn.enabled = True); forced (True, "
         "Theano's meaning): cuDNN or an error; disabled (False): never cuDNN"),
    Flag("dnn.library_path", "", _path,
         "explicit cuDNN library file or folder; '' searches wheels, conda and system paths"),
    Flag("dnn.deterministic", False, parse_bool,
         "choose bitwise-reproducible algorithms where an op has a choice"),
    Flag("dnn.verbose", False, parse_bool,
         "log each backend decision at INFO level through the 'dnnkit' logger"),
    Flag("dnn.crosscheck", False, parse_bool,
         "run every op on both backends and raise CrosscheckError when they disagree"),
    Flag("dnn.memo", True, parse_bool,
         "repeated calls of one signature skip their setup (checks, backend choice, "
         "descriptors, plans); False: every call takes the full path"),
    Flag("dnn.benchmark", False, parse_bool,
         "time cuDNN's convolution algorithms once per shape: the dnn.conv.algo_* flags given "
         "no value read time_once (PyTorch's and cudnn.torch's cudnn.benchmark)"),
]}

# the flags whose default dnn.benchmark = True moves to BENCHMARK_ALGO (registered by
# dnnkit/ops/conv_args.py)
BENCHMARKED = ("dnn.conv.algo_fwd", "dnn.conv.algo_bwd_data", "dnn.conv.algo_bwd_filter")
BENCHMARK_ALGO = "time_once"


def register_flag(name, default, parse, doc):
    """Add a flag (later op families add their own, e.g. ``dnn.conv.algo_fwd``)."""
    FLAGS[name] = Flag(name, default, parse, doc)
    state.loaded = False
    state.merged = None


class FlagState:
    """The flags' values by source. Besides get(), dnnkit/fastpath.py reads two attributes on
    every call to tell whether its memo is stale: ``merged`` (replaced whenever a flag changes
    process-wide) and ``local.epoch`` (bumped when this thread enters or leaves a
    ``change_flags`` block)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.python = {}      # process-wide assignments
        self.env = {}
        self.rc = {}
        self.loaded = False
        # per thread: .stack (list of dicts from change_flags), .epoch (see the class doc)
        self.local = threading.local()
        # name -> value of every flag outside change_flags blocks (python > env > rc >
        # default), rebuilt after any change: get() runs several times per op call, and one
        # dict lookup is what it can afford
        self.merged = None

    def merge(self):
        with self.lock:
            if not self.loaded:
                reload()
            m = {name: f.default for name, f in FLAGS.items()}
            for layer in (self.rc, self.env, self.python):
                m.update(layer)
            if m["dnn.benchmark"]:
                for name in BENCHMARKED:
                    if name in m and not self.explicit(name):
                        m[name] = BENCHMARK_ALGO
            self.merged = m
            return m

    def explicit(self, name):
        """Whether the rc file, the environment or a Python assignment gives ``name``."""
        return name in self.rc or name in self.env or name in self.python


state = FlagState()


class UnknownFlagError(ValueError, AttributeError):
    """An unknown flag name (a ValueError; also an AttributeError so hasattr() works)."""


class ConfigError(ValueError):
    """The rc file or ``DNNKIT_FLAGS`` cannot be used: unreadable, not UTF-8 text, not INI,
    or holding an unknown flag or a bad value. The message names the file (or the variable)
    and the line. Raised by the first flag read, and by every read after it until the source
    is fixed (nothing is half-loaded)."""


def _flag(name):
    if not isinstance(name, str):      # before the lookup: a list is not hashable
        raise TypeError(f"a flag name is a str such as 'dnn.enabled'; got {name!r}")
    try:
        return FLAGS[name]
    except KeyError:
        if name in flag_aliases.OLD_NAMES:
            _, reads, what = flag_aliases.OLD_NAMES[name]
            then = f"read {' and '.join(reads)}" if reads else "it has no value"
            raise UnknownFlagError(f"flag {name} is a deprecated name ({what}) that can be set "
                                   f"but not read: {then}") from None
        raise UnknownFlagError(
            f"unknown flag {name!r}; known flags: {', '.join(sorted(FLAGS))}") from None


def _expand(name, value):
    """``(values, notes, old)``: the {flag: parsed value} that setting ``name`` to ``value``
    means (an old name sets its new flags), the deprecation notes to warn with, and whether
    ``name`` is an old name."""
    if not isinstance(name, str):
        _flag(name)                 # the TypeError that says what a flag name is
    raw, notes, old = flag_aliases.rename(name, value)
    try:
        return {k: _flag(k).parse(k, v) for k, v in raw.items()}, notes, old
    except ValueError as e:
        if not old:
            raise
        raise ValueError(f"flag {name} (sets {', '.join(raw)}): {e}") from None


def _read_env():
    out, via_old = {}, {}
    text = os.environ.get("DNNKIT_FLAGS", "")
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise ConfigError(f"DNNKIT_FLAGS: {item!r} is not of the form name=value")
        k, v = (s.strip() for s in item.split("=", 1))
        try:
            values, notes, old = _expand(k, v)
        except ValueError as e:
            raise ConfigError(f"DNNKIT_FLAGS: {e}") from None
        (via_old if old else out).update(values)
        for note in notes:
            flag_aliases.warn(f"DNNKIT_FLAGS: {note}")
    return {**via_old, **out}


def rc_path():
    return os.environ.get("DNNKIT_RC") or os.path.join(os.path.expanduser("~"), ".dnnkitrc")


def _key_line(text, section, key):
    """The line number of ``key`` in ``[section]`` of the rc file's text (None if not found:
    a value inherited from [DEFAULT])."""
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        head = re.match(r"\s*\[([^\]]*)\]", line)
        if head:
            current = head.group(1).strip()
        elif current == section and re.match(r"\s*" + re.escape(key) + r"\s*[=:]", line,
                                              re.IGNORECASE):
            return n
    return None


def _ini_problem(e):
    """(line, what) of a configparser error, in one line."""
    import ast
    import configparser
    if isinstance(e, configparser.MissingSectionHeaderError):
        return e.lineno, f"{e.line.strip()!r} comes before any [section] header"
    if isinstance(e, configparser.ParsingError):
        lineno, line = e.errors[0]
        with contextlib.suppress(ValueError, SyntaxError):   # Python 3.11 keeps its repr
            line = ast.literal_eval(line)
        return lineno, f"{str(line).strip()!r} is not a 'name = value' line nor a [section]"
    if isinstance(e, configparser.DuplicateOptionError):
        return e.lineno, f"{e.option!r} appears twice in [{e.section}]"
    if isinstance(e, configparser.DuplicateSectionError):
        return e.lineno, f"section [{e.section}] appears twice"
    return getattr(e, "lineno", None), str(e).splitlines()[0]


def _read_rc():
    """The rc file's flags. Values are literal (no interpolation: ``%`` is a character);
    every problem is one ConfigError naming the file and, where it has one, the line."""
    path = rc_path()
    if not os.path.isfile(path):
        return {}
    try:
        text = files.read_text(path, "rc file")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"rc file {path}: cannot be read ({e.strerror or e})") from None
    # configparser (and its regular expressions, 3 ms) only when there is an rc file to read
    import configparser
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string(text, source=path)
    except configparser.Error as e:
        line, what = _ini_problem(e)
        where = f", line {line}" if line else ""
        raise ConfigError(f"rc file {path}{where}: {what}") from None
    out, via_old, notes = {}, {}, []
    for section in cp.sections():
        for key, value in cp.items(section):
            name = f"{section}.{key}"
            line = _key_line(text, section, key)
            where = f", line {line}" if line else ""
            try:
                values, said, old = _expand(name, value)
            except ValueError as e:
                raise ConfigError(f"rc file {path}{where}: {e}") from None
            (via_old if old else out).update(values)
            notes += [f"rc file {path}{where}: {note}" for note in said]
    for note in notes:            # only for a file that is used
        flag_aliases.warn(note)
    return {**via_old, **out}


def reload():
    """Re-read ``DNNKIT_FLAGS`` and the rc file (Python assignments are kept)."""
    with state.lock:
        state.env, state.rc = _read_env(), _read_rc()
        state.loaded = True
        state.merged = None


def reset():
    """Forget every Python assignment (not ``change_flags`` blocks) and re-read env and rc."""
    with state.lock:
        state.python.clear()
        state.merged = None
    reload()


def get(name):
    try:
        stack = getattr(state.local, "stack", None)
        if stack:
            for layer in reversed(stack):
                if name in layer:
                    return layer[name]
            if name in BENCHMARKED and any("dnn.benchmark" in layer for layer in stack):
                merged = state.merged or state.merge()
                if state.explicit(name):
                    return merged[name]
                return BENCHMARK_ALGO if get("dnn.benchmark") else FLAGS[name].default
        merged = state.merged or state.merge()
        return merged[name]
    except KeyError:
        _flag(name)               # raises UnknownFlagError naming the known flags
        return state.merge()[name]   # registered after the last merge
    except TypeError:
        _flag(name)               # an unhashable name: TypeError saying what a name is
        raise


def source(name):
    """Where the current value of ``name`` comes from: change_flags, python, env, rc,
    dnn.benchmark (an algorithm flag given no value, under ``dnn.benchmark = True``) or
    default."""
    _flag(name)
    if any(name in layer for layer in getattr(state.local, "stack", ())):
        return "change_flags"
    if not state.loaded:
        reload()
    for label, layer in (("python", state.python), ("env", state.env), ("rc", state.rc)):
        if name in layer:
            return label
    return "dnn.benchmark" if name in BENCHMARKED and get("dnn.benchmark") else "default"


def set(name, value):  # noqa: A001 - mirrors get()
    """Set a flag process-wide; an old name (flag_aliases) sets its new flags and warns."""
    values, notes, _ = _expand(name, value)
    for note in notes:
        flag_aliases.warn(note)
    with state.lock:
        state.python.update(values)
        state.merged = None


@contextlib.contextmanager
def change_flags(flags=None, **kwargs):
    """Scope flag changes to a ``with`` block on this thread; restored on exceptions too.

    ``change_flags({"dnn.enabled": "disabled"})`` or ``change_flags(dnn__enabled="disabled")``.
    """
    items = dict(flags or {})
    items.update({k.replace("__", "."): v for k, v in kwargs.items()})
    layer, via_old = {}, {}
    for k, v in items.items():
        values, notes, old = _expand(k, v)
        (via_old if old else layer).update(values)
        for note in notes:
            flag_aliases.warn(note)
    with _pushed({**via_old, **layer}):
        yield


@contextlib.contextmanager
def _pushed(layer):
    """``layer`` (flag name -> parsed value) on this thread's stack inside the block."""
    local = state.local
    stack = getattr(local, "stack", None)
    if stack is None:
        stack = local.stack = []
    stack.append(layer)
    local.epoch = getattr(local, "epoch", 0) + 1     # memoised calls (fastpath) are stale
    try:
        yield
    finally:
        # By identity: nested blocks may hold equal dicts, and they must unwind in order.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is layer:
                del stack[i]
                break
        local.epoch += 1


def thread_layers():
    """This thread's ``change_flags`` layers, outermost first (for :func:`joined`)."""
    return tuple(getattr(state.local, "stack", None) or ())


@contextlib.contextmanager
def joined(layers):
    """Inside the block, this thread sees the flags of ``layers`` (another thread's
    :func:`thread_layers`) as if set by ``change_flags`` here: a thread working for another
    (PyTorch's autograd thread running a backward; dnnkit/torch/bridge.py) follows the
    caller's scoped flags."""
    if not layers:
        yield
        return
    merged = {}
    for layer in layers:
        merged.update(layer)
    with _pushed(merged):
        yield


class _Namespace:
    """``config.dnn.enabled`` reads a flag; assigning to it sets it (process-wide)."""

    def __init__(self, prefix):
        object.__setattr__(self, "_prefix", prefix)

    def _full(self, attr):
        return f"{self._prefix}.{attr}"

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = self._full(attr)
        if full in FLAGS:
            return get(full)
        if any(n.startswith(full + ".") for n in FLAGS):
            return _Namespace(full)
        _flag(full)  # raises the ValueError listing known flags

    def __setattr__(self, attr, value):
        set(self._full(attr), value)

    def __dir__(self):
        n = len(self._prefix) + 1
        return sorted({k[n:].split(".")[0] for k in FLAGS if k.startswith(self._prefix + ".")})

    def __repr__(self):
        names = [k for k in FLAGS if k.startswith(self._prefix + ".")]
        return "\n".join(f"{k} = {get(k)!r}" for k in sorted(names))


dnn = _Namespace("dnn")


def describe():
    """Rows (name, value, source, doc) for every flag."""
    return [(k, get(k), source(k), FLAGS[k].doc) for k in sorted(FLAGS)]
