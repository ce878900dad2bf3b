"""`reflective-memory serve`: option checks before anything is created, demo loading, startup."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from reflective_memory import HashingEmbedder  # noqa: E402
from reflective_memory.cli import build_parser, main  # noqa: E402
from reflective_memory.errors import ConfigError  # noqa: E402
from reflective_memory.serve import server  # noqa: E402
from reflective_memory.serve.security import (  # noqa: E402
    TOKEN_ENV,
    AccessPolicy,
    check_bind,
    is_loopback,
)

REPO = Path(__file__).resolve().parents[2]


def _args(*argv):
    return build_parser().parse_args(["serve", *argv])


def test_help_imports_no_web_framework():
    code = (
        "import sys; from reflective_memory.cli import build_parser; "
        "build_parser().format_help(); "
        "print([m for m in ('fastapi', 'starlette', 'uvicorn', 'jinja2', 'mcp') "
        "if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'shared'}:{REPO}"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_open_app_refuses_a_public_bind_before_creating_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    db = tmp_path / "db"
    assert main(["serve", "--host", "0.0.0.0", "--db", str(db)]) == 2
    assert "give an access token" in capsys.readouterr().err
    assert not db.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--llm", "nope_module_xyz:f"], "cannot import"),
        (["--user-token", "ana"], "USER=TOKEN"),
        (["--token", "short"], "at least 16"),
        (["--k", "0"], "--k must be"),
        (["--port", "70000"], "--port must be"),
        (["--llm-timeout", "0"], "--llm-timeout"),
    ],
)
def test_bad_options_fail_before_the_store_is_created(tmp_path, argv, message):
    db = tmp_path / "db"
    with pytest.raises(ConfigError, match=message):
        server.prepare(_args("--db", str(db), "--port", "0", *argv))
    assert not db.exists()


def test_busy_port_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            server.prepare(_args("--db", str(tmp_path / "db"), "--port", str(port)))
    assert not (tmp_path / "db").exists()


def test_demo_loads_once_and_serves(tmp_path, caplog):
    db = tmp_path / "db"
    with caplog.at_level(logging.DEBUG, logger="reflective_memory.serve.server"):
        p = server.prepare(
            _args("--demo", "--db", str(db), "--port", "0"), embedder=HashingEmbedder()
        )
    loaded = [r for r in caplog.records if r.getMessage().startswith("loaded the demo")]
    assert [r.levelno for r in loaded] == [logging.INFO]  # asked for: not a warning
    try:
        stats = p.memory.stats("maya")
        assert stats["sessions"] == 7 and stats["memories"] > 0
        c = TestClient(p.app)
        assert 'data-user-id="maya"' in c.get("/", headers={"host": "127.0.0.1"}).text
        assert c.get("/", headers={"host": "attacker.example"}).status_code == 400
        r = c.get(
            "/api/users/maya/search",
            params={"q": "Where do I live now?"},
            headers={"host": "localhost:8765"},
        )
        assert r.status_code == 200 and r.json()["hits"]
    finally:
        p.memory.close()
    p2 = server.prepare(_args("--demo", "--db", str(db), "--port", "0"), embedder=HashingEmbedder())
    try:
        assert p2.memory.stats("maya")["turns"] == stats["turns"]  # not loaded twice
    finally:
        p2.memory.close()


def test_token_from_env_and_url(monkeypatch, tmp_path):
    monkeypatch.setenv(TOKEN_ENV, "env-token-0123456789")
    p = server.prepare(_args("--host", "0.0.0.0", "--port", "0"), embedder=HashingEmbedder())
    try:
        assert p.url.endswith("?token=env-token-0123456789")
        c = TestClient(p.app)
        assert c.get("/api/users").status_code == 401
        ok = c.get("/api/users", headers={"Authorization": "Bearer env-token-0123456789"})
        assert ok.status_code == 200
    finally:
        p.memory.close()


def test_run_starts_uvicorn_and_closes_the_store(monkeypatch, capsys):
    import uvicorn

    seen = {}

    def fake_run(app, host, port, log_level):
        seen.update(app=app, host=host, port=port)
        assert TestClient(app).get("/", headers={"host": "127.0.0.1"}).status_code == 200

    monkeypatch.setattr(uvicorn, "run", fake_run)
    assert server.run(_args("--port", "0"), embedder=HashingEmbedder()) == 0
    assert seen["host"] == "127.0.0.1" and seen["port"] == 0
    assert "reflective-memory inspector: http://127.0.0.1:0/" in capsys.readouterr().err
    mem = seen["app"].state.serve.memory
    assert mem.store.closed


# ------------------------------------------------------------------ security rules
def test_access_policy():
    open_policy = AccessPolicy()
    assert open_policy.open and open_policy.authenticate(None).name == "local"
    p = AccessPolicy("a" * 16, {"ana": "b" * 16})
    assert not p.open
    assert p.authenticate(None) is None and p.authenticate("c" * 16) is None
    admin, ana = p.authenticate("a" * 16), p.authenticate("b" * 16)
    assert admin.may_see("bob") and ana.may_see("ana") and not ana.may_see("bob")
    assert p.csrf_token(admin) != p.csrf_token(ana)
    assert p.check_csrf(ana, p.csrf_token(ana)) and not p.check_csrf(ana, p.csrf_token(admin))
    assert not p.check_csrf(ana, None) and not p.check_csrf(ana, "")
    assert AccessPolicy().csrf_token(admin) != AccessPolicy().csrf_token(admin)  # fresh secret
    with pytest.raises(ConfigError, match="at least 16"):
        AccessPolicy("short")
    with pytest.raises(ConfigError, match="twice"):
        AccessPolicy("a" * 16, {"ana": "a" * 16})


def test_binds():
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.com"):
        assert not is_loopback(host), host
    check_bind("127.0.0.1", AccessPolicy())
    check_bind("0.0.0.0", AccessPolicy("t" * 16))
    with pytest.raises(ConfigError, match="give an access token"):
        check_bind("0.0.0.0", AccessPolicy())


@pytest.mark.parametrize(
    "name",
    [
        "answer",
        "api",
        "app",
        "chat",
        "context",
        "inspect",
        "llm_spec",
        "pages",
        "rendering",
        "security",
        "server",
        "views",
    ],
)
def test_serve_modules_declare_all(name):
    import importlib

    module = importlib.import_module(f"reflective_memory.serve.{name}")
    assert isinstance(module.__all__, list) and module.__all__
    for symbol in module.__all__:
        assert hasattr(module, symbol), f"{name}.{symbol}"
