"""The code base stays ruff clean: lint rules and formatting (pyproject.toml's settings)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["shared", "tests", "langchain_reflective", "llamaindex_reflective", "examples", "docs"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed (it comes with the `dev` extra)")
    return subprocess.run(
        [exe, *args, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_lint_is_clean():
    res = _ruff("check", "--no-cache")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_is_clean():
    res = _ruff("format", "--check", "--no-cache")
    assert res.returncode == 0, res.stdout + res.stderr
