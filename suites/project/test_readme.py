"""README.md's Python example runs as written: every ```python block,
each in a fresh namespace."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(text: str):
    return re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)


def test_the_blocks_are_found():
    assert python_blocks("x\n```python\na = 1\n```\n```\nnot python\n```\n") == ["a = 1\n"]


def test_every_python_block_of_the_readme_runs_as_written(capsys):
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks, "README.md has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
