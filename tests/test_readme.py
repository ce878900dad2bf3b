"""Every code block of README.md and docs/*.md runs as written, so they and the code cannot drift.

A block is preceded by an HTML comment that says how the test runs it (invisible on GitHub):

* `<!-- readme-test: embedder=hashing -->` before a ```python block: run it in a fresh
  directory with the deterministic hashing embedder standing in for MiniLM (fast, offline);
* `<!-- readme-test: cli -->` before a ```bash block: run each `reflective-memory ...` line
  through the CLI's `main`, in order, in one fresh directory (hashing embedder too); every line
  must exit 0.

Every python block of the README runs. The quick start also runs with the real MiniLM
(integration). Install blocks (`pip ...`) and blocks that need a server are not run. A python
block that starts the `reflective-memory` command (the MCP server over stdio) finds this
checkout's CLI, with the hashing embedder, first on PATH (`tests/hashing_cli.py`). The block
that sends traces to OTLP runs in a subprocess (it sets the process's tracer provider) against a
local collector.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from reflective_memory import HashingEmbedder

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"(?:<!--\s*readme-test:\s*(?P<marker>[^>]*?)\s*-->\s*\n)?```(?P<lang>\w+)\n(?P<code>.*?)```",
    re.S,
)


def _blocks(lang: str, pages: list[Path] = PAGES) -> list[tuple[str, str, str]]:
    """(page:line, marker, code) of every ```lang block of `pages`."""
    out = []
    for page in pages:
        text = page.read_text("utf-8")
        for m in _BLOCK.finditer(text):
            if m.group("lang") == lang:
                line = text.count("\n", 0, m.start("code")) + 1
                out.append(
                    (f"{page.relative_to(ROOT)}:{line}", m.group("marker") or "", m.group("code"))
                )
    return out


README_PYTHON = _blocks("python", [README])
PYTHON_BLOCKS = [b for b in _blocks("python") if b[1] == "embedder=hashing"]
CLI_BLOCKS = [b for b in _blocks("bash") if b[1] == "cli"]


def _use_hashing_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    import reflective_memory.embed as embed_mod
    import reflective_memory.engine as engine_mod

    monkeypatch.setattr(engine_mod, "default_embedder", lambda: HashingEmbedder(256))
    # `bench ingest` builds MiniLM embedders itself
    monkeypatch.setattr(
        embed_mod, "SentenceTransformerEmbedder", lambda *a, **kw: HashingEmbedder()
    )


def _cli_on_path(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put a `reflective-memory` that runs this checkout with the hashing embedder first on PATH."""
    folder.mkdir()
    shim = folder / "reflective-memory"
    cli = ROOT / "tests" / "hashing_cli.py"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{cli}" "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def _needs(code: str) -> None:
    if "langchain_mcp_adapters" in code:
        pytest.importorskip("langchain_mcp_adapters")
    if "langchain" in code:
        pytest.importorskip("langchain")
        pytest.importorskip("langchain_classic")
    if "llama_index" in code:
        pytest.importorskip("llama_index.core")
    if "opentelemetry" in code:
        pytest.importorskip("opentelemetry.exporter.otlp.proto.http")


@contextlib.contextmanager
def _otlp_collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A local OTLP/HTTP endpoint that keeps what it is sent: its URL and `(path, body)` pairs."""
    received: list[tuple[str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's name
            body = self.rfile.read(int(self.headers["content-length"]))
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


#: Work after the README's tracing block: a write and a retrieval, then the batch is flushed.
_TRACED_WORK = """
from reflective_memory import HashingEmbedder, ReflectiveMemory
with ReflectiveMemory(embedder=HashingEmbedder(64)) as mem:
    mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
    mem.retrieve("ana", "What is my dog called?", k=1)
provider.shutdown()
"""


def _sends_traces_to_a_collector(where: str, code: str) -> None:
    """Run the tracing block (it sets the process's provider: in a subprocess) against a
    local collector; the collector receives the spans of the work that follows, no user text."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from reflective_memory import tracing

    with _otlp_collector() as (url, received):
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)]),
        }
        run = subprocess.run(
            [sys.executable, "-c", code + _TRACED_WORK],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert run.returncode == 0, f"{where}: {run.stderr}"
    assert received and all(path == "/v1/traces" for path, _ in received)
    names = set()
    for _, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                names |= {s.name for s in scope.spans}
    assert {"add_turns", tracing.RETRIEVAL_SPAN, "dense"} <= names
    assert not [body for _, body in received if b"Pixel" in body or b"dog" in body]


def test_the_readme_has_runnable_blocks() -> None:
    assert len(README_PYTHON) >= 4 and len(CLI_BLOCKS) == 1
    for where, marker, _ in README_PYTHON:
        assert marker == "embedder=hashing", f"{where}: unknown marker {marker!r}"
    for where, marker, _ in _blocks("python"):  # docs/ may say why a block cannot run here
        assert marker == "embedder=hashing" or marker.startswith("not run:"), (
            f"{where}: mark the block `embedder=hashing` or `not run: <why>`, got {marker!r}"
        )


@pytest.mark.parametrize("where,marker,code", PYTHON_BLOCKS, ids=[b[0] for b in PYTHON_BLOCKS])
def test_python_block_runs(where, marker, code, tmp_path, monkeypatch, capfd) -> None:
    """Each block runs; capfd, so a subprocess the block starts gets a real stderr."""
    _needs(code)
    if "OTLPSpanExporter" in code:  # sets the global tracer provider: not in this process
        _sends_traces_to_a_collector(where, code)
        return
    _use_hashing_embedder(monkeypatch)
    if '"command": "reflective-memory"' in code:
        _cli_on_path(tmp_path / "bin", monkeypatch)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__readme__"})  # noqa: S102
    out = capfd.readouterr().out
    if "MultiServerMCPClient" in code:  # the recalled passage, dated, from the stdio server
        assert "Lisbon" in out and "'text': '[0] [" in out  # numbered and dated, as everywhere
    if "MockLLM" in code:  # what the block's comment promises
        assert "False the answer has no citation" in out
    if "FakeListChatModel" in code:
        assert "(0,) True" in out


def test_the_export_block_run_again_adds_nothing(tmp_path, monkeypatch, capsys) -> None:
    """Its comment says a second run adds nothing: no second turn, nothing imported."""
    from reflective_memory import ReflectiveMemory

    (where, _, code), *others = [b for b in README_PYTHON if "export_memory(mem" in b[2]]
    assert not others and "run again: adds nothing" in code
    _use_hashing_embedder(monkeypatch)
    monkeypatch.chdir(tmp_path)
    printed = []
    for _ in range(2):
        exec(compile(code, where, "exec"), {"__name__": "__readme__"})  # noqa: S102
        printed.append(capsys.readouterr().out.strip())
    assert "'turn': 1" in printed[0] and printed[1] == "Counter()"
    for folder in ("laptop", "desktop"):
        with ReflectiveMemory(tmp_path / folder) as mem:
            assert [t.text for t in mem.turns("dan")] == ["I moved to Lisbon in March."]


def _quick_start_output(tmp_path, monkeypatch, capsys) -> list[str]:
    where, _, code = README_PYTHON[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__readme__"})  # noqa: S102
    return capsys.readouterr().out.splitlines()


@pytest.mark.integration
def test_quick_start_runs_with_minilm(tmp_path, monkeypatch, capsys) -> None:
    out = _quick_start_output(tmp_path, monkeypatch, capsys)
    assert out[0] == "0 2025-03-01 ('2025-03-01:0',)" and "Berlin" in out[2]


def test_quick_start_prints_ranked_hits_and_a_short_summary(tmp_path, monkeypatch, capsys) -> None:
    """Issue 49: hits in rank order (no relevance beside them), no feature matrices dumped."""
    code = README_PYTHON[0][2]
    assert "ReflectiveMemory(" in code and "print(r.diagnostics)" not in code
    _use_hashing_embedder(monkeypatch)
    out = _quick_start_output(tmp_path, monkeypatch, capsys)
    ranks = [line.split()[0] for line in out if line.split()[-1].endswith(",)")]
    assert ranks == [str(i) for i in range(len(ranks))] and len(ranks) >= 1
    assert out[0].startswith("0 2025-03-01 ")
    path, ms = out[-1].split()
    assert path in ("familiarity", "recollection") and float(ms) > 0


def _names(code: str) -> tuple[set[str], set[str]]:
    """The store folders and user ids a README block uses."""
    folders = set(re.findall(r'ReflectiveMemory\("([^"]+)"', code))
    folders |= set(re.findall(r'"--db", "([^"]+)"', code))
    users = set(re.findall(r'user_id="([^"]+)"', code))
    users |= set(re.findall(r'add_turn\("([^"]+)"', code))
    users |= set(re.findall(r'"--user", "([^"]+)"', code))
    return {str(Path(f)) for f in folders}, users


def test_readme_blocks_use_their_own_folders_and_users() -> None:
    """Issue 49: run in turn in one folder, the blocks must not mix their data."""
    seen_folders: dict[str, str] = {}
    seen_users: dict[str, str] = {}
    for where, _, code in README_PYTHON:
        folders, users = _names(code)
        if "ReflectiveMemory(" in code or "--db" in code:
            assert folders and users, f"{where}: no store folder or user found"
        for name, seen in [
            *((f, seen_folders) for f in folders),
            *((u, seen_users) for u in users),
        ]:
            assert name not in seen, f"{where} uses {name!r}, as {seen.get(name)} does"
            seen[name] = where
    assert len(seen_folders) >= 5 and len(seen_users) >= 5


def test_cli_block_runs_line_by_line(tmp_path, monkeypatch, capsys) -> None:
    from reflective_memory.cli import main

    _use_hashing_embedder(monkeypatch)
    monkeypatch.chdir(tmp_path)
    _, _, code = CLI_BLOCKS[0]
    lines = [ln for ln in code.splitlines() if ln.strip()]
    assert all(ln.startswith("reflective-memory ") for ln in lines)
    for ln in lines:
        argv = shlex.split(ln, comments=True)[1:]
        rc = main(argv)
        out = capsys.readouterr()
        assert rc == 0, f"{ln!r} exited {rc}: {out.err}"
        if argv[0] == "search":
            assert '"relevance"' in out.out and '"turn_ids"' in out.out
        if argv[0] == "stats":
            assert out.out.startswith("maya: ")
    assert (tmp_path / "conv.json").is_file() and (tmp_path / "memory" / "memory.sqlite3").is_file()


def _requirements(extras: list[str]) -> set[str]:
    """The distributions `pip install -e ".[extras]"` brings: the closure over what is installed."""
    from importlib import metadata

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    Requirement = pytest.importorskip("packaging.requirements").Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    done: set[str] = set()
    wanted = list(extras)
    while wanted:
        for r in map(Requirement, project["optional-dependencies"][wanted.pop()]):
            if r.name == project["name"]:
                wanted += sorted(r.extras)
            else:
                todo.append(r)
    while todo:
        r = todo.pop()
        name = re.sub(r"[-_.]+", "-", r.name).lower()
        if name in done or (r.marker is not None and not r.marker.evaluate({"extra": ""})):
            continue
        done.add(name)
        with contextlib.suppress(metadata.PackageNotFoundError):
            todo += [Requirement(x) for x in metadata.requires(r.name) or []]
    return done


#: Runs the demo as if the named top-level modules were not installed (no finder finds them).
_DEMO_WITHOUT = """
import contextlib, io, json, sys
BLOCKED = set(json.loads(sys.argv[1]))
class Hidden:
    def __init__(self, finder):
        self.finder = finder
    def __getattr__(self, name):
        return getattr(self.finder, name)
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        return self.finder.find_spec(name, path, target)
sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from reflective_memory.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["demo", "--quiet", "--questions", "2"])
print(json.dumps({"rc": rc, "out": out.getvalue(), "hidden": sorted(BLOCKED & set(sys.modules))}))
"""


@pytest.mark.integration
def test_the_demo_install_line_brings_all_the_demo_needs() -> None:
    """Issue 49: the demo line installed `.[all]` (~150 packages); the demo needs the core alone.

    Every module only the extras bring (LangChain, LlamaIndex, the web app, PostgreSQL, MCP,
    OpenTelemetry, the dev tools) is made impossible to import; the demo still runs, on MiniLM.
    """
    from importlib import metadata

    (line,) = [
        ln for _, _, code in _blocks("bash", [README]) for ln in code.splitlines() if " demo" in ln
    ]
    install = re.search(r"pip install -e (\S+) && reflective-memory demo$", line.strip())
    assert install, line
    extras = re.findall(r"\[([^\]]*)\]", install.group(1))
    demo = _requirements([e for group in extras for e in group.split(",") if e])
    only_extras = _requirements(["all"]) - demo
    assert {"langchain-core", "llama-index-core", "fastapi", "psycopg", "mcp"} <= only_extras
    blocked = sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if all(re.sub(r"[-_.]+", "-", d).lower() in only_extras for d in dists)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-c", _DEMO_WITHOUT, json.dumps(blocked)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0 and "questions got an evidence turn" in result["out"], result
    assert result["hidden"] == []
