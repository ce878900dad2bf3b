from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_MODULES = [
    "reflective_memory",
    "reflective_memory.types",
    "reflective_memory.errors",
    "reflective_memory.config",
    "reflective_memory.embed",
    "reflective_memory.llm",
    "reflective_memory.text",
    "reflective_memory.storage.sqlite",
    "reflective_memory.storage.index",
    "reflective_memory.segment.base",
    "reflective_memory.engine",
    "reflective_memory.bench.datasets",
    "reflective_memory.bench.retrieval",
    "reflective_memory.cli",
    "reflective_memory.conditional.notes",
    "reflective_memory.conditional.memorize",
    "reflective_memory.conditional.reflection",
    "reflective_memory.bench.conditional",
]


def test_importing_the_core_imports_no_framework() -> None:
    code = (
        "import sys, reflective_memory, reflective_memory.cli, reflective_memory.bench.retrieval\n"
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
