"""The README's Python examples run as written (paths moved into a temporary directory)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[i].replace('"/tmp/', f'"{tmp_path}/'), f"README block {i}", "exec"), {})


def test_there_are_examples():
    assert len(BLOCKS) >= 2
