"""CI runs exactly the test command the README gives users."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = [line for b in blocks for line in b.splitlines() if "pytest tests" in line]
    assert len(commands) == 1, commands
    ci = (ROOT / ".ci" / "run").read_text("utf-8").splitlines()
    assert commands[0].strip() in [line.strip() for line in ci]
