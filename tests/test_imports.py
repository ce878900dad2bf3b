"""The core's package structure: import graph, light imports, `__all__`, no shadowing."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "shared" / "reflective_memory"


def _core_modules() -> dict[str, Path]:
    """Every module of the core by dotted name."""
    out: dict[str, Path] = {}
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _core_modules()


def _imports(name: str, path: Path, *, typing: bool = False) -> set[str]:
    """Modules `name` imports at module level or inside functions.

    Imports under `if TYPE_CHECKING:` count only with `typing` (they never run, but a module
    that names another's types there still depends on it).
    """
    tree = ast.parse(path.read_text("utf-8"))
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]

    def visit(node: ast.AST) -> None:
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            for alias in node.names:  # `from pkg import submodule`
                found.add(f"{mod}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found - {name}


#: What every core module imports, and the part of it that is the core (the import graph).
IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}
GRAPH = {name: deps & MODULES.keys() for name, deps in IMPORTS.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the module graph (ignoring edges to a module's own parent packages)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def edges(n: str) -> set[str]:
        # importing `a.b.c` runs `a/__init__` and `a/b/__init__` first; those are not edges
        # of `a.b.c` itself, and a package __init__ importing its own submodules is not a cycle
        # unless the submodule imports the package __init__ back.
        return {m for m in graph[n] if not n.startswith(m + ".")}

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges(n)):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = dfs(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = dfs(n)
            if found:
                return found
    return None


def test_the_core_has_no_import_cycles() -> None:
    cycle = _find_cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle or [])


def test_storage_has_no_import_circle_even_through_type_hints() -> None:
    """No module of `storage/` depends on itself, counting imports made for type hints only.

    The store contract (`base`), the index caches, the PostgreSQL connections, async route,
    search and server index each depend one way: a change to one never needs the other first.
    """
    storage = {n: p for n, p in MODULES.items() if n.startswith("reflective_memory.storage.")}
    graph = {n: _imports(n, p, typing=True) & storage.keys() for n, p in storage.items()}
    assert len(graph) > 15, sorted(graph)
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_typing_import_scan_sees_type_checking_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.b\n")
    assert "p.b" in _imports("p.m", src, typing=True)
    assert "p.b" not in _imports("p.m", src)


def test_the_store_contract_names_no_implementation() -> None:
    """`storage/base.py` (the contract) imports and names no store, index or driver module."""
    base = MODULES["reflective_memory.storage.base"]
    deps = _imports("reflective_memory.storage.base", base, typing=True) & MODULES.keys()
    allowed = {"reflective_memory.storage.state", "reflective_memory.storage.user_index"}
    light = {"reflective_memory.errors", "reflective_memory.text", "reflective_memory.types"}
    assert deps <= allowed | light | {"reflective_memory.embed"}, sorted(deps)
    text = base.read_text("utf-8")
    for name in ("SQLiteStore", "PostgresStore", "PgDatabase", "AsyncPgRoute", "IndexCache"):
        assert name not in text, name


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": set()}
    assert _find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    assert _find_cycle({"p": {"p.a"}, "p.a": set()}) is None


def test_algorithms_never_import_the_engine() -> None:
    front = ("reflective_memory", "reflective_memory.cli", "reflective_memory.engine")
    for name, deps in GRAPH.items():
        if name in front or name.startswith("reflective_memory.serve"):
            continue
        assert "reflective_memory.engine" not in deps, f"{name} imports the engine"


def test_the_library_never_imports_the_benchmarks() -> None:
    """`reflective_bench` is not in the wheel: no core module may import it (the CLI's `bench`
    loads it by name, from a source checkout only)."""
    assert not (CORE / "bench").exists(), "the benchmarks live in shared/reflective_bench"
    for name, deps in IMPORTS.items():
        bench = sorted(d for d in deps if d.split(".")[0] == "reflective_bench")
        assert not bench, f"{name} imports {bench}"


def test_the_import_scan_sees_imports_outside_the_core(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from reflective_bench.systems import DEFAULT\n")
    assert "reflective_bench.systems" in _imports("reflective_memory.m", src)


def _reach(name: str) -> set[str]:
    """Every core module `name` imports, directly or through others (package inits included)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep in GRAPH[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _in(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


_ALGORITHMS = tuple(
    f"reflective_memory.{p}" for p in ("segment", "denoise", "recall", "rmm", "conditional")
)


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if _in(n, *_ALGORITHMS, "reflective_memory.storage"))
)
def test_algorithms_and_storage_never_reach_the_engine(name: str) -> None:
    """Algorithms and storage never import the engine (or its session building), even through
    another module."""
    reached = _reach(name)
    front = {"reflective_memory.engine", "reflective_memory.sessions", "reflective_memory.records"}
    assert not reached & front, f"{name} reaches {sorted(reached & front)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _in(n, "reflective_memory.storage")))
def test_storage_never_reaches_the_algorithms(name: str) -> None:
    """The store of record knows nothing of segmentation, RMM or the engine."""
    bad = {
        d
        for d in _reach(name)
        if _in(d, "reflective_memory.rmm", "reflective_memory.segment", "reflective_memory.engine")
    }
    assert not bad, f"{name} reaches {sorted(bad)}"


def test_the_reach_follows_imports_through_other_modules() -> None:
    assert "reflective_memory.types" in _reach("reflective_memory.storage.sqlite")
    assert "reflective_memory.storage.base" in _reach("reflective_memory.storage.postgres")
    assert "reflective_memory.storage.state" in _reach("reflective_memory.storage.factory")


def _mixin_bases() -> list[str]:
    """`module.Class(Base)` for every class of the core with a base named `...Mixin`."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    text = ast.unparse(base).split("[")[0].rsplit(".", 1)[-1]
                    if text.endswith("Mixin"):
                        found.append(f"{name}.{node.name}({ast.unparse(base)})")
    return found


def test_no_class_of_the_core_inherits_a_mixin() -> None:
    """Composition, not mixins: collaborators are attributes, capabilities are protocols."""
    assert _mixin_bases() == []


def test_importing_the_core_imports_no_framework() -> None:
    code = (
        "import sys, reflective_memory, reflective_memory.cli, reflective_memory.engine\n"
        "import reflective_bench.retrieval\n"
        "from reflective_memory import ReflectiveMemory\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('langchain', 'langchain_core', 'langchain_classic', 'llama_index')]\n"
        "assert not bad, bad\n"
    )
    path = os.pathsep.join(filter(None, [str(CORE.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}  # the benchmarks: from this checkout
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)


def test_the_library_needs_no_pytest_and_testing_says_it_does() -> None:
    """Only `reflective_memory.testing` (the shipped contract tests) needs pytest."""
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None\n"  # as if pytest were not installed
        "import reflective_memory, reflective_memory.engine, reflective_memory.storage\n"
        "import reflective_memory.storage.factory, reflective_memory.storage.state\n"
        "try:\n"
        "    import reflective_memory.testing\n"
        "except ImportError as exc:\n"
        "    assert 'pip install pytest' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('reflective_memory.testing imported without pytest')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize(
    "module",
    [
        "reflective_memory",
        "reflective_memory.errors",
        "reflective_memory.types",
        "reflective_memory.config",
    ],
)
def test_light_modules_load_no_heavy_library(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers', 'faiss', "
        "'sklearn', 'llmlingua', 'dateparser', 'num2words') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_declares_all_and_exports_exist(name: str) -> None:
    if name.endswith("__main__"):
        pytest.skip("entry point")
    module = importlib.import_module(name)
    assert isinstance(module.__all__, list), name
    for symbol in module.__all__:
        assert hasattr(module, symbol), f"{name}.{symbol}"


def test_public_names_resolve_lazily_and_dir_lists_them() -> None:
    import reflective_memory

    for symbol in reflective_memory.__all__:
        assert getattr(reflective_memory, symbol) is not None
    assert set(reflective_memory.__all__) <= set(dir(reflective_memory))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        reflective_memory.nope  # noqa: B018


def test_a_user_project_with_its_own_shared_package_uses_both(tmp_path: Path) -> None:
    """A script beside its own `shared.py` and a `shared/` package imports us and them."""
    (tmp_path / "shared.py").write_text("GREETING = 'from the user'\n")
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import shared
            import langchain_reflective
            import llamaindex_reflective
            from reflective_memory import HashingEmbedder, ReflectiveMemory

            assert shared.GREETING == "from the user"
            with ReflectiveMemory(embedder=HashingEmbedder(64)) as mem:
                mem.add_turn("u", "s", "user", "I keep bees on the roof.")
                mem.end_session("u", "s")
                assert "bees" in mem.retrieve("u", "bees", k=1).hits[0].memory.text
            print("ok")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
    pkg = tmp_path / "pkgcase"
    (pkg / "shared").mkdir(parents=True)
    (pkg / "shared" / "__init__.py").write_text("NAME = 'user package'\n")
    (pkg / "app.py").write_text(
        script.read_text().replace("GREETING", "NAME").replace("from the user", "user package")
    )
    out = subprocess.run(
        [sys.executable, "app.py"], cwd=pkg, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
