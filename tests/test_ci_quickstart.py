""".ci/run runs README.md's quick start as written: .ci/quickstart.py reads its two commands out of the
README, and a README without them is an error, not a CI run that silently skips them."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "quickstart.py"


def _commands(readme: Path):
    return subprocess.run([sys.executable, str(SCRIPT), str(readme)], capture_output=True, text=True)


def test_the_two_commands_are_the_readmes():
    proc = _commands(ROOT / "README.md")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    block = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```")[0]
    assert [first, second] == [line.strip() for line in block.splitlines() if line.strip()]
    assert first.startswith("pip install -e . && python -m hps.train")  # the base install, no extra
    assert "tests/run_all.sh" in second


@pytest.mark.parametrize("quickstart, why", [
    ("text, no code\n", "no '## Quick start' section with a ```bash block"),
    ("```bash\npip install -e . && python -m hps.train\n```\n", "holds 1 command(s), not 2"),
    ("```bash\npip install -e .\npython -m hps.train\nbash tests/run_all.sh\n```\n", "holds 3 command(s)"),
    ("```bash\npip install -e . && python -m hps.train\npytest tests\n```\n", "does not run tests/run_all.sh"),
])
def test_a_readme_without_them_fails_loudly(tmp_path, quickstart, why):
    readme = tmp_path / "README.md"
    readme.write_text(f"# hps\n\n## Quick start\n\n{quickstart}\n## Install\n\n```bash\npip install -e .\n```\n")
    proc = _commands(readme)
    assert proc.returncode == 1 and why in proc.stderr and proc.stdout == ""
