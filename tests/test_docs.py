"""Every ```python block in docs/ and README.md runs."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = [(p, i, code) for p in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(), re.S))]


def test_docs_have_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("path,index,code", BLOCKS,
                         ids=[f"{p.name}-{i}" for p, i, _ in BLOCKS])
def test_example_runs(path, index, code):
    exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__docs__"})
