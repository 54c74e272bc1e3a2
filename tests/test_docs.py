"""The user guide is tested: every ```python block in docs/ and README.md runs, and every
relative Markdown link points to a file that exists.

Each block runs twice: unmarked (on the simulator in CI, on the GPU wherever there is one) and
marked ``gpu`` so that ``pytest -m gpu`` on a GPU machine runs the guide as well (the gpu copy
is skipped on the simulator by tests/conftest.py). Blocks run in a fresh namespace with the
flags reset by conftest's autouse fixture, so each one must be self-contained.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BLOCKS = [(p, i, code) for p in PAGES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(), re.S))]
IDS = [f"{p.name}-{i}" for p, i, _ in BLOCKS]

# [text](target) outside code: the target up to a space, ')' or '#'.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s#]*)(#[^)\s]*)?\)")
FENCE = re.compile(r"```.*?```", re.S)


def _run(path, index, code):
    exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__docs__"})


def test_docs_have_examples():
    assert len(BLOCKS) >= 40
    # Every page of the guide but the table of contents shows runnable code.
    without = {p.name for p in PAGES if p.parent.name == "docs"} - {p.name for p, _, _ in BLOCKS}
    assert without <= {"performance.md", "migration.md"}, without


@pytest.mark.parametrize("path,index,code", BLOCKS, ids=IDS)
def test_example_runs(path, index, code):
    _run(path, index, code)


@pytest.mark.gpu
@pytest.mark.parametrize("path,index,code", BLOCKS, ids=IDS)
def test_example_runs_on_gpu(path, index, code):
    _run(path, index, code)


def _links(path):
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)      # inline code is not a link
    return [m.group(1) for m in LINK.finditer(text)]


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(path):
    broken = []
    for target in _links(path):
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):   # anchor-only or a URL
            continue
        if not (path.parent / target).exists():
            broken.append(target)
    assert not broken, f"{path.name}: links to missing files: {broken}"


def test_link_checker_sees_links():
    # The checker would pass vacuously if the pattern stopped matching.
    assert "docs/index.md" in _links(ROOT / "README.md")
    assert len(_links(ROOT / "docs" / "index.md")) >= 15
