"""Errors stay typed: every error hps raises on purpose is an HpsError, broken invariants included."""

import ast
import builtins
from pathlib import Path

import numpy as np
import pytest

from hps import HashTable, HpsError, InternalError
from hps.mem import MemPS, RowInitializer
from hps.train._collectives import Collectives
from hps.train._hierarchy import ParameterHierarchy
from tests.reference.store import DictStore

PACKAGE = Path(__file__).resolve().parents[1] / "hps"
BUILTIN_ERRORS = {name for name in dir(builtins) if name.endswith(("Error", "Exception"))} | {"BaseException"}
#: Raises the language requires: a module ``__getattr__`` must raise AttributeError.
ALLOWED = {("hps/__init__.py", "AttributeError"), ("hps/gpu/__init__.py", "AttributeError"),
           ("hps/train/__init__.py", "AttributeError")}


def _untyped_raises(package=PACKAGE):
    """(file:line, what) of every ``assert`` and every ``raise <builtin exception>(...)`` in ``package``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(package.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Assert):
                found.append((where, "assert (gone under python -O)"))
            elif isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if (isinstance(exc, ast.Name) and exc.id in BUILTIN_ERRORS and exc.id != "NotImplementedError"
                        and (str(path.relative_to(package.parent)), exc.id) not in ALLOWED):
                    found.append((where, f"raise {exc.id}"))
    return found


def test_no_assert_and_no_bare_builtin_raise_in_the_package():
    assert _untyped_raises() == []


def test_the_scan_sees_builtin_raises_and_asserts(tmp_path):
    """The check itself can fail."""
    pkg = tmp_path / "hps"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f(x):\n    assert x\n    raise RuntimeError('x')\n")
    (pkg / "n.py").write_text("def g():\n    raise NotADirectoryError(20, 'no')\n")
    assert _untyped_raises(pkg) == [("hps/m.py:2", "assert (gone under python -O)"),
                                    ("hps/m.py:3", "raise RuntimeError"), ("hps/n.py:2", "raise NotADirectoryError")]


def _hierarchy():
    store = DictStore(4)
    mem = MemPS(store, 4, initializer=RowInitializer(2, 4, seed=0), capacity_rows=64)
    return ParameterHierarchy(HashTable(64, 4), mem, window=3, owned_mask=Collectives().owned_mask)


@pytest.mark.parametrize("path", ["in place", "host array"])
def test_a_fetched_row_missing_from_hbm_is_an_internal_error(monkeypatch, path):
    hier = _hierarchy()
    keys = np.arange(1, 9, dtype=np.uint64)
    if path == "in place":   # the CPU twin: rows written into the slots the keys claim
        monkeypatch.setattr(hier.hbm, "insert_new", lambda k, fill, b: None)  # "happened" but did nothing
    else:                    # a table without insert_new (the GPU table, parts): insert, then a lookup
        monkeypatch.setattr(hier.hbm, "insert_new", None)
        monkeypatch.setattr(hier.hbm, "insert", lambda k, r: None)
    with pytest.raises(InternalError, match="missing from it") as ei:
        hier.prepare(0, keys)
    assert isinstance(ei.value, HpsError) and isinstance(ei.value, RuntimeError)


def test_memps_room_that_was_not_made_is_an_internal_error(monkeypatch):
    store = DictStore(4)
    mem = MemPS(store, 4, initializer=RowInitializer(2, 4, seed=0), capacity_rows=4)
    mem.push(np.arange(1, 5, dtype=np.uint64), np.ones((4, 4), np.float32))  # the cache is full
    cache = mem.cache
    monkeypatch.setattr(cache, "make_room", lambda n: cache._empty_evicted(0))  # "made" no room
    with pytest.raises(InternalError, match="evicted"):
        mem.push(np.arange(5, 7, dtype=np.uint64), np.ones((2, 4), np.float32))
