from __future__ import annotations

import subprocess
import sys
import textwrap

import langchain_reflective


def test_all_names_exist_and_are_unique():
    names = langchain_reflective.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(langchain_reflective, name) is not None
    for expected in (
        "LangChainLLM",
        "ReflectiveRetriever",
        "ReflectiveChatMemory",
        "ReflectiveChatMessageHistory",
        "ReflectiveMemoryMiddleware",
        "create_memory_tool",
        "ReflectiveCompressor",
        "CitationReranker",
        "ReflectiveStore",
    ):
        assert expected in names


def test_every_module_declares_all():
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(langchain_reflective.__path__):
        mod = importlib.import_module(f"langchain_reflective.{info.name}")
        assert isinstance(mod.__all__, list), info.name
        for name in mod.__all__:
            assert hasattr(mod, name), (info.name, name)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_importing_the_core_never_imports_langchain():
    out = _run(
        """
        import sys
        import reflective_memory
        from reflective_memory import ReflectiveMemory, HashingEmbedder
        bad = sorted(m for m in sys.modules if m.split(".")[0] in
                     ("langchain", "langchain_core", "langchain_classic", "langgraph",
                      "langchain_reflective"))
        print(bad)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_langchain_gives_install_message():
    out = _run(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("langchain", "langchain_core", "langchain_classic"):
                    raise ImportError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, Block())
        try:
            import langchain_reflective
        except ImportError as exc:
            print(exc)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "pip install reflective-memory[langchain]" in out.stdout


def test_docstring_examples_run():
    import doctest
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(langchain_reflective.__path__):
        mod = importlib.import_module(f"langchain_reflective.{info.name}")
        assert doctest.testmod(mod).failed == 0, info.name
