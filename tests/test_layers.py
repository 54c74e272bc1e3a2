"""The layer rule of docs/architecture.md, checked on the source with ``ast``.

Every module of dnnkit/ and kernels/ (installed as ``dnnkit.kernels``) gets the layer of the
doc's table. Every import of a dnnkit module, at the top of a file or inside a function, must
go to the same or a lower layer; the imports form no cycle; no module uses another module's
``_private`` name (``from m import _x`` or ``m._x``); no module of dnnkit/ is over 460 lines.
Importing a submodule runs its packages' ``__init__`` too, so those count as imported.
"""

import ast
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 460
RULES = ("unplaced", "layer", "cycle", "private", "length")


def layer_table(doc_text):
    """{name under ``dnnkit.`` (or ``dnnkit`` itself): layer} from the rows ``| N ... | `a`,
    `b` |`` of the doc's table; a package's name covers its modules."""
    table = {}
    for line in doc_text.splitlines():
        m = re.match(r"\|\s*(\d+)\b[^|]*\|([^|]*)\|", line)
        if m:
            for name in re.findall(r"`([^`]+)`", m.group(2)):
                table[name] = int(m.group(1))
    return table


def source_modules(root):
    """{module name: path} of ``root``/dnnkit and ``root``/kernels (as dnnkit.kernels)."""
    found = {}
    for folder, package in ((root / "dnnkit", "dnnkit"), (root / "kernels", "dnnkit.kernels")):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "__pycache__" in parts or (package == "dnnkit" and parts[0] == "kernels"):
                continue      # (a dnnkit/kernels link, where a copy of the tree has one)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package] + parts)] = path
    return found


def layer_of(name, table):
    """The layer of module ``name`` (the longest entry of the table that covers it), or None."""
    rel = "dnnkit" if name == "dnnkit" else name[len("dnnkit."):]
    while rel:
        if rel in table:
            return table[rel]
        rel = rel.rpartition(".")[0]
    return None


def _is_private(attr):
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


class Module:
    """One module's imports of dnnkit modules and its uses of their private names."""

    def __init__(self, name, path, modules):
        self.name, self.path = name, path
        self.is_package = path.name == "__init__.py"
        self.text = path.read_text()
        self.imports = []          # (imported module, line)
        self.private = []          # (line, "module._name")
        self.unknown = []          # (line, module name that is not in the tree)
        self._modules = modules
        bound = {}                 # a local name -> the dnnkit module it is bound to
        tree = ast.parse(self.text, str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "dnnkit" or alias.name.startswith("dnnkit."):
                        self._add(alias.name, node.lineno)
                        if alias.asname:
                            bound[alias.asname] = alias.name
                        else:
                            bound["dnnkit"] = "dnnkit"
            elif isinstance(node, ast.ImportFrom):
                source = self._resolve(node)
                if source is None:
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in modules:              # `from . import x`: the submodule x
                        self._add(sub, node.lineno)
                        bound[alias.asname or alias.name] = sub
                        continue
                    self._add(source, node.lineno)
                    if _is_private(alias.name) and source != name:
                        self.private.append((node.lineno, f"{source}.{alias.name}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = self._module_of(node.value, bound)
                if owner is not None and owner != name:
                    self.private.append((node.lineno, f"{owner}.{node.attr}"))

    def _resolve(self, node):
        """The absolute name of the module an ImportFrom reads from; None: not dnnkit's."""
        if not node.level:
            mod = node.module or ""
            return mod if mod == "dnnkit" or mod.startswith("dnnkit.") else None
        parts = self.name.split(".")
        if not self.is_package:
            parts.pop()
        if node.level > 1:
            parts = parts[:len(parts) - (node.level - 1)]
        if not parts:
            return None
        return ".".join(parts + ([node.module] if node.module else []))

    def _add(self, target, line):
        if target not in self._modules:
            self.unknown.append((line, target))
            return
        self.imports.append((target, line))
        # importing a.b.c runs a/__init__ and a/b/__init__: edges to the packages above the
        # target that are not packages above this module (those are being imported already)
        mine = {self.name.rsplit(".", i)[0] for i in range(self.name.count(".") + 1)}
        parts = target.split(".")
        for i in range(1, len(parts)):
            above = ".".join(parts[:i])
            if above not in mine and above in self._modules:
                self.imports.append((above, line))

    def _module_of(self, expr, bound):
        """The dnnkit module an expression names (``config``, ``dnnkit.cudnn.api``), or None."""
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self._module_of(expr.value, bound)
            if owner is not None and f"{owner}.{expr.attr}" in self._modules:
                return f"{owner}.{expr.attr}"
        return None


def _components(graph):
    """The strongly connected components of ``graph`` {module: {module: line}} with more than
    one module (Tarjan's algorithm), each as a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _shortest_cycle(graph, start):
    """A shortest path start -> ... -> start in ``graph`` (start lies on a cycle)."""
    prev, queue = {start: None}, collections.deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                path = [node]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    return None


def check(root, table):
    """{rule: [message, ...]} for the tree at ``root``; each message names file, line, rule."""
    modules = source_modules(root)
    parsed = {name: Module(name, path, modules) for name, path in modules.items()}
    out = {rule: [] for rule in RULES}

    def where(mod, line=None):
        rel = os.path.relpath(mod.path, root)
        return f"{rel}:{line}" if line is not None else rel

    graph = collections.defaultdict(dict)   # module -> {imported module: first line}
    for name, mod in parsed.items():
        mine = layer_of(name, table)
        if mine is None:
            out["unplaced"].append(f"{where(mod)}: module {name} has no layer in the table of "
                                   f"docs/architecture.md [unplaced]")
        for line, target in mod.unknown:
            out["unplaced"].append(f"{where(mod, line)}: imports {target}, which is not a "
                                   f"module of dnnkit/ or kernels/ [unplaced]")
        for target, line in mod.imports:
            if target == name:
                continue
            graph[name].setdefault(target, line)
            theirs = layer_of(target, table)
            if mine is not None and theirs is not None and theirs > mine:
                out["layer"].append(
                    f"{where(mod, line)}: {name} (layer {mine}) imports {target} (layer "
                    f"{theirs}): an import may only go to the same or a lower layer [layer]")
        for line, what in mod.private:
            out["private"].append(f"{where(mod, line)}: {name} uses {what}, a private name of "
                                  f"another module: give it a public name [private]")
        if root / "dnnkit" in mod.path.parents:
            n = len(mod.text.splitlines())
            if n > MAX_LINES:
                out["length"].append(f"{where(mod)}: {n} lines, over {MAX_LINES}: split it by "
                                     f"job [length]")
    for comp in _components(graph):       # one cycle per knot of modules importing each other
        cycle = _shortest_cycle(graph, comp[0])
        steps = [f"{where(parsed[a], graph[a][b])} {a} imports {b}"
                 for a, b in zip(cycle, cycle[1:])]
        out["cycle"].append("import cycle " + " -> ".join(cycle) + f" (of {len(comp)} modules "
                            "that import each other):\n    " + "\n    ".join(steps) + " [cycle]")
    return out


@pytest.fixture(scope="module")
def found():
    return check(ROOT, layer_table((ROOT / "docs" / "architecture.md").read_text()))


def _report(messages):
    return f"{len(messages)} violation(s):\n" + "\n".join(messages)


def test_every_module_and_import_has_a_layer(found):
    assert not found["unplaced"], _report(found["unplaced"])


def test_no_import_goes_to_a_higher_layer(found):
    assert not found["layer"], _report(found["layer"])


def test_the_imports_form_no_cycle(found):
    assert not found["cycle"], _report(found["cycle"])


def test_no_module_uses_another_modules_private_names(found):
    assert not found["private"], _report(found["private"])


def test_no_module_of_dnnkit_is_over_460_lines(found):
    assert not found["length"], _report(found["length"])


def test_import_dnnkit_does_not_load_numba():
    code = ("import sys, dnnkit; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numba'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"import dnnkit loaded numba: {r.stdout.strip()}"


TABLE = {"kernels": 0, "errors": 1, "config": 1, "memory": 2, "arrays": 2, "ops": 5,
         "demo": 7, "dnnkit": 7}
PLANTED = {
    "dnnkit/__init__.py": "from . import demo, ops\n",
    "dnnkit/errors.py": "import math\n\nfrom .arrays import empty\n",            # up a layer
    "dnnkit/config.py": "_state = 1\n",
    "dnnkit/memory.py": "from . import arrays\n",                                # a cycle
    "dnnkit/arrays.py": "def empty():\n    from .memory import pool\n",
    "dnnkit/ops/__init__.py": "from .. import config\nfrom ..config import _state\n\n\n"
                              "def f():\n    return config._state, config.__name__\n",
    "dnnkit/demo.py": "x = 1\n" * (MAX_LINES + 1),                              # too long
    "kernels/__init__.py": "",
    "dnnkit/stray.py": "from .nowhere import x\n",                               # no layer
}


def test_each_check_catches_a_planted_violation(tmp_path):
    for rel, text in PLANTED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = check(tmp_path, TABLE)
    assert [m.split(": ")[0] for m in found["layer"]] == ["dnnkit/errors.py:3"]
    assert "dnnkit.errors (layer 1) imports dnnkit.arrays (layer 2)" in found["layer"][0]
    assert len(found["cycle"]) == 1
    assert "dnnkit.arrays -> dnnkit.memory -> dnnkit.arrays" in found["cycle"][0]
    assert "dnnkit/arrays.py:2 dnnkit.arrays imports dnnkit.memory" in found["cycle"][0]
    assert "dnnkit/memory.py:1 dnnkit.memory imports dnnkit.arrays" in found["cycle"][0]
    assert sorted(m.split(" [")[0] for m in found["private"]) == [
        "dnnkit/ops/__init__.py:2: dnnkit.ops uses dnnkit.config._state, a private name of "
        "another module: give it a public name",
        "dnnkit/ops/__init__.py:6: dnnkit.ops uses dnnkit.config._state, a private name of "
        "another module: give it a public name"]
    assert found["length"] == [f"dnnkit/demo.py: {MAX_LINES + 1} lines, over {MAX_LINES}: "
                               f"split it by job [length]"]
    assert sorted(m.split(": ")[0] for m in found["unplaced"]) == [
        "dnnkit/stray.py", "dnnkit/stray.py:1"]
