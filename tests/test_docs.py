"""The documentation stays true and whole: the Python examples of README.md and docs/*.md run as
written (paths under /tmp moved into a temporary directory); README.md stays short; every relative
link points at a file (and heading) that exists; every flag, module path and ``hps.`` name the pages
mention exists in the code."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results" / "HISTORY.md",
         ROOT / "bench" / "results" / "README.md"]
#: README.md is the front door: at most this many bytes (the rest lives in docs/).
README_MAX_BYTES = 30_000

BLOCKS = [(p, i, code) for p in PAGES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(), re.S))]


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("page,i,code", BLOCKS, ids=[f"{_rel(p)}:{i}" for p, i, _ in BLOCKS])
def test_example_runs(page, i, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace('"/tmp/', f'"{tmp_path}/'), f"{_rel(page)} block {i}", "exec"), {})


def test_there_are_examples():
    assert sum(1 for p, _, _ in BLOCKS if p == README) >= 2
    assert len({p for p, _, _ in BLOCKS}) >= 4


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (at most {README_MAX_BYTES})"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)}


def _links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    bad = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):          # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            bad.append(f"{link}: no file {target}")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            bad.append(f"{link}: no heading #{anchor} in {_rel(target)}")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


def test_the_slugs_are_githubs():
    assert _slug("Memory: `--mem-budget`") == "memory---mem-budget"
    assert _slug("OP+OSRP: `--op-osrp BINS`") == "oposrp---op-osrp-bins"


# -- names the pages mention ---------------------------------------------------------------------------

DOC_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: Flags the pages quote that no add_argument of hps/ or bench/ defines: argparse's own and pytest-benchmark's.
FOREIGN_FLAGS = {"--help", "--benchmark-only", "--benchmark-json"}


def _code_spans(text: str) -> str:
    """The text of every code block and inline code span."""
    blocks = re.findall(r"```.*?```", text, re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return "\n".join(blocks + inline)


def _known_flags() -> set[str]:
    """Every ``--flag`` some argument parser of hps/ or bench/ defines."""
    flags = set(FOREIGN_FLAGS)
    for path in [*ROOT.joinpath("hps").rglob("*.py"), *ROOT.joinpath("bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                flags.update(a.value for a in node.args if isinstance(a, ast.Constant)
                             and isinstance(a.value, str) and a.value.startswith("--"))
            if isinstance(node, ast.Tuple):      # flags added in a loop: (("--rows", int), ...)
                flags.update(e.value for e in node.elts if isinstance(e, ast.Constant)
                             and isinstance(e.value, str) and re.fullmatch(r"--[a-z][a-z0-9-]+", e.value))
    return flags


@pytest.mark.parametrize("page", DOC_PAGES, ids=_rel)
def test_flags_named_exist(page):
    known = _known_flags()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", _code_spans(page.read_text())))
    assert not named - known, f"{_rel(page)} names flags no parser defines: {sorted(named - known)}"


@pytest.mark.parametrize("page", DOC_PAGES, ids=_rel)
def test_paths_named_exist(page):
    # a path with a pattern in it (bench/bench_{get,insert}.py, results/device-<gpu>.json) is not checked
    named = set(re.findall(r"(?<![\w./-])((?:hps|tests|bench|docs)/[\w./-]*\w)(?![\w./{*<-])",
                           _code_spans(page.read_text())))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"{_rel(page)} names paths that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", DOC_PAGES, ids=_rel)
def test_hps_names_exist(page):
    named = set(re.findall(r"(?<![\w./-])(hps(?:\.[A-Za-z_]\w*)+)", _code_spans(page.read_text())))
    missing = sorted(n for n in named if not _resolves(n))
    assert not missing, f"{_rel(page)} names what hps does not have: {missing}"
