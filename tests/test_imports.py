from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_MODULES = [
    "shared",
    "shared.types",
    "shared.errors",
    "shared.config",
    "shared.embed",
    "shared.llm",
    "shared.text",
    "shared.store",
    "shared.index",
    "shared.segment",
    "shared.engine",
    "shared.formats",
    "shared.bench",
    "shared.cli",
    "shared.conditional",
    "shared.memorize",
    "shared.reflection",
    "shared.bench_conditional",
]


def test_importing_the_core_imports_no_framework() -> None:
    code = (
        "import sys, shared, shared.cli, shared.bench\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('langchain', 'langchain_core', 'langchain_classic', 'llama_index')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("name", CORE_MODULES)
def test_every_module_declares_all_and_exports_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(module.__all__, list) and module.__all__
    for symbol in module.__all__:
        assert hasattr(module, symbol), f"{name}.{symbol}"
