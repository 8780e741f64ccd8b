"""``hps/train`` in layers: no module over 450 lines, and no import cycle between its modules — imports
inside functions count."""

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "hps" / "train"
MAX_LINES = 450


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports (``from . import x``, ``from ._x import y``, anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return out


def _cycle(graph: dict) -> list | None:
    """One cycle of ``graph`` (node -> successors) as a list of nodes, or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_module_of_hps_train_is_over_450_lines():
    long = {p.name: n for p in TRAIN.glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_import_cycle_inside_hps_train():
    mods = {p.stem: p for p in TRAIN.glob("*.py")}
    graph = {m: {x for x in _imports(p) if x in mods and x != m} for m, p in mods.items()}
    assert _cycle(graph) is None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one
