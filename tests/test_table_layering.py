"""The table package sits below GPU training: ``hps.table`` (the table, its CPU and CUDA backends and its
partitioning) imports nothing from ``hps.gpu``, at module level or inside a function, so the two packages
form no import cycle; ``hps.gpu`` still re-exports what multi-GPU training code imports from it."""

import ast
from pathlib import Path

import hps

ROOT = Path(hps.__file__).parent


def _imports(path: Path, package: str):
    """Absolute names of every module ``path`` imports (relative imports resolved in ``package``)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names)


def test_table_package_never_imports_hps_gpu():
    bad = [(p.name, m) for p in sorted((ROOT / "table").glob("*.py"))
           for m in _imports(p, "hps.table") if m == "hps.gpu" or m.startswith("hps.gpu.")]
    assert not bad, f"hps.table imports hps.gpu (an import cycle): {bad}"


def test_the_table_lives_in_one_package_and_old_names_still_work():
    from hps import HashTable
    from hps.gpu import PartitionedHashTable, Placement, visible_gpus
    from hps.table import HashTable as T, PartitionedHashTable as P, Placement as PL, visible_gpus as V

    assert (HashTable, PartitionedHashTable, Placement, visible_gpus) == (T, P, PL, V)
    assert not (ROOT / "table.py").exists() and not (ROOT / "gpu" / "partitioned.py").exists()
