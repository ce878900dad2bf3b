"""What the wheel ships: the library and its adapters, typed; no benchmarks, no `shared`.

The wheel is built (offline: `pip wheel --no-build-isolation`, with the machine's setuptools) from
a copy of this checkout that holds the benchmarks (`shared/reflective_bench`), then installed into
a fresh venv that sees the machine's dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our wheel, built from a copy of the checkout (setuptools writes build/ into its source)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for part in ("shared", "langchain_reflective", "llamaindex_reflective"):
        shutil.copytree(ROOT / part, src / part, ignore=ignore)
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, src / part)
    assert (src / "shared" / "reflective_bench" / "__init__.py").is_file()  # there to leave out
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"building the wheel failed: {out.stderr[-2000:]}"
    return next((tmp / "dist").glob("reflective_memory-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    """A fresh venv (seeing the machine's dependencies) with our wheel installed; its python."""
    venv = wheel.parents[1] / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return python


def test_the_wheel_holds_no_benchmarks_and_is_typed(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if n.endswith(".py")]
    bench = [
        n for n in code if "reflective_bench" in n or "/bench/" in n or "bench" in Path(n).stem
    ]
    assert not bench, bench
    assert "reflective_memory/py.typed" in names
    assert "reflective_memory/io.py" in code and "reflective_memory/cli.py" in code


def test_bench_from_an_installed_wheel_says_where_benchmarks_run(installed: Path) -> None:
    """No checkout beside the installed library: `bench` exits 2 with one line, nothing else."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(installed), "-m", "reflective_memory.cli", "bench", "retrieval", "--help"],
        capture_output=True,
        text=True,
        cwd=installed.parents[2],
        env=env,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""
    assert out.stderr.startswith(
        "error: benchmarks run from a source checkout of reflective-memory"
    )
    assert len(out.stderr.splitlines()) == 1, out.stderr


def test_the_wheel_installs_reflective_memory_and_no_top_level_shared(installed: Path) -> None:
    """What `pip install` puts in site-packages: our three packages, typed, and no `shared`."""
    show = subprocess.run(
        [str(installed), "-m", "pip", "show", "-f", "reflective-memory"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = [line.strip() for line in show.split("Files:", 1)[1].splitlines() if line.strip()]
    tops = {f.split("/")[0] for f in files if not f.split("/")[0].endswith(".dist-info")}
    tops.discard("..")  # the console script lives in bin/
    assert tops == {"reflective_memory", "langchain_reflective", "llamaindex_reflective"}, tops
    for needed in (
        "reflective_memory/py.typed",
        "reflective_memory/data/demo_conversation.json",
        "reflective_memory/data/segmenter_weights.json",
        "reflective_memory/data/gate_calibration.json",
    ):
        assert needed in files, needed
    code = "import reflective_memory, sys; print(reflective_memory.__file__)"
    where = subprocess.run(
        [str(installed), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=installed.parents[2],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout
    assert "site-packages" in where and str(ROOT) not in where, where


_MYPY_INI = """
[mypy]
ignore_missing_imports = True
follow_imports = silent
[mypy-torch.*,transformers.*,sentence_transformers.*,faiss.*,sklearn.*,llmlingua.*,scipy.*,bm25s.*,safetensors.*,tqdm.*,huggingface_hub.*]
follow_imports = skip
"""


def test_mypy_accepts_a_user_script_using_the_public_api(installed: Path, tmp_path: Path) -> None:
    """`py.typed` ships: mypy reads our annotations from the install and catches a wrong call."""
    pytest.importorskip("mypy")
    good = tmp_path / "good.py"
    good.write_text(
        textwrap.dedent(
            """
            from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory, Retrieval

            def recall(question: str) -> list[str]:
                with ReflectiveMemory(embedder=HashingEmbedder(), config=MemoryConfig()) as mem:
                    mem.add_turn("ana", "s1", "user", "I moved to Berlin.")
                    mem.end_session("ana", "s1")
                    r: Retrieval = mem.retrieve("ana", question, k=3)
                    return [h.memory.text for h in r.hits]
            """
        )
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from reflective_memory import ReflectiveMemory\nReflectiveMemory().retrieve('ana', 42)\n"
    )
    (tmp_path / "mypy.ini").write_text(_MYPY_INI)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    args = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(tmp_path / "mypy.ini"),
        "--python-executable",
        str(installed),
        "--no-incremental",
    ]
    ok = subprocess.run([*args, str(good)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stdout[-3000:]
    wrong = subprocess.run([*args, str(bad)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert wrong.returncode == 1 and "retrieve" in wrong.stdout, wrong.stdout[-3000:]
