"""Print the commands of README.md's quick start, one a line: the ```bash block of its "## Quick start"
section, without blank and comment lines. Exits non-zero with one line saying what is wrong when the
section or the block is missing, when it does not hold exactly two commands, or when the second does
not run the test suite (.ci/run runs these commands as written and relies on both).

    python3 .ci/quickstart.py README.md
"""

import re
import sys

#: What the second command must run: CI's test suite runs through it.
TEST_COMMAND = "tests/run_all.sh"


def quickstart_commands(text: str) -> list[str]:
    section = re.search(r"^## Quick start[ \t]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    block = section and re.search(r"^```(?:bash|sh|shell)[ \t]*\n(.*?)^```", section.group(1), re.S | re.M)
    if not block:
        raise SystemExit("README.md has no '## Quick start' section with a ```bash block: CI runs the quick "
                         "start's commands as written, so it needs them there")
    commands = [line.strip() for line in block.group(1).splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    if len(commands) != 2:
        raise SystemExit(f"the quick-start block of README.md holds {len(commands)} command(s), not 2 (a first "
                         "run with the base install, then the test command); update .ci/run with the README")
    if TEST_COMMAND not in commands[1]:
        raise SystemExit(f"the second quick-start command of README.md does not run {TEST_COMMAND}: CI runs "
                         "the test suite through it")
    return commands


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print("\n".join(quickstart_commands(f.read())))
