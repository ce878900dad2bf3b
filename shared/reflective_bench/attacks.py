"""Attack costs (issue 50): what unauthenticated clients cost the MCP server, and a huge gz line.

`reflective-memory bench attacks` measures, each in fresh processes on this machine:

* **starvation**: a legitimate user's p50 latency of a tool call (`list_sessions` over raw
  JSON-RPC in one MCP session) on a live `mcp --transport http` server, idle and while
  `--attackers` clients without a token (each its own process, at nice 19: an attacker is
  another machine) post 1 MiB bodies of 30-deep nested arrays in a loop; the phases alternate
  three times;
* **stalled bodies**: the server's resident memory before and after `--stalled` connections
  without a token each declare 1,048,000 body bytes, send `--stalled-kib` KiB and stall, and how
  long until the server has closed every one;
* **huge line**: the peak resident memory (`VmHWM`) of `ingest --max-file-mb 1` of a
  `.jsonl.gz` holding one line of `--line-mb` MB.

The server runs this checkout's CLI with the hashing embedder (no model to load). Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["starvation", "stalled_bodies", "huge_line", "register"]

_TOKEN = "bench-token-0123456789abcdef"
_SERVER = """
import sys
import reflective_memory.engine as engine
from reflective_memory import HashingEmbedder
from reflective_memory.cli import main
engine.default_embedder = lambda: HashingEmbedder(256)
sys.exit(main(sys.argv[1:]))
"""
_PEAK = """
import sys
from reflective_memory.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(ln.split()[1] for ln in f if ln.startswith("VmHWM:"))
print(code, peak)
"""
#: An attacker (its own process): posts 1 MiB of one array of 30-deep nested arrays (31
#: levels, under the body check's limit, so a check would parse it all) without a token, in a
#: loop; prints how many it posted when stopped.
_FLOOD = """
import os, signal, sys, httpx
os.nice(19)  # an attacker is another machine: its own CPU must not count as the server's
one = b"[" * 30 + b"1" + b"]" * 30
body = b"[" + b",".join([one] * (2**20 // (len(one) + 1))) + b"]"
posted = 0
def stop(*_):
    print(posted)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
with httpx.Client(timeout=60) as client:
    while True:
        try:
            client.post(sys.argv[1], content=body, headers={"Content-Type": "application/json"})
        except httpx.HTTPError:
            pass
        posted += 1
"""
_ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """A live MCP HTTP server (one user, `_TOKEN`) in a subprocess."""

    def __init__(self, folder: Path) -> None:
        self.port = _free_port()
        argv = [sys.executable, "-c", _SERVER, "mcp", "--db", str(folder / "db")]
        argv += ["--transport", "http", "--port", str(self.port), "--token", f"ana={_TOKEN}"]
        argv += ["--max-requests-per-minute", "1000000"]  # the timed user is never limited
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the MCP server did not start") from None
                time.sleep(0.1)
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def cpu_s(self) -> float:
        """CPU seconds the server has used (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _session(url: str) -> dict[str, str]:
    """An initialised MCP session of the user: the headers of its requests."""
    import httpx
    from mcp.types import LATEST_PROTOCOL_VERSION

    client = {"name": "bench", "version": "1"}
    params = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {}, "clientInfo": client}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    auth = {**_ACCEPT, "Authorization": f"Bearer {_TOKEN}"}
    opened = httpx.post(url, content=json.dumps(hello).encode(), headers=auth, timeout=30)
    auth["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    httpx.post(url, content=json.dumps(note).encode(), headers=auth, timeout=30)
    remember = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "remember",
            "arguments": {"session_id": "s", "turns": [{"role": "user", "text": "hello"}]},
        },
    }
    httpx.post(url, content=json.dumps(remember).encode(), headers=auth, timeout=30)
    return auth


def _p50_ms(url: str, headers: dict[str, str], calls: int) -> float:
    import httpx

    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call"}
    body["params"] = {"name": "list_sessions", "arguments": {}}  # type: ignore[assignment]
    raw = json.dumps(body).encode()
    times = []
    with httpx.Client(timeout=60) as client:
        for _ in range(calls):
            started = time.perf_counter()
            answer = client.post(url, content=raw, headers=headers)
            times.append((time.perf_counter() - started) * 1000)
            if answer.status_code != 200 or '"result"' not in answer.text:
                raise RuntimeError(f"the user's call failed: {answer.status_code}")
    return statistics.median(times)


def starvation(
    folder: Path, attackers: int = 2, calls: int = 200, rounds: int = 3
) -> dict[str, Any]:
    """The legitimate user's p50, idle and under `attackers` unauthenticated body floods.

    The phases alternate `rounds` times (the floods paused with SIGSTOP between), so a change
    of the machine's other load falls on both alike; each phase times `calls` calls.
    """
    server = _Server(folder)
    procs: list[subprocess.Popen[str]] = []
    try:
        headers = _session(server.url)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _FLOOD, server.url],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for _ in range(attackers)
        ]
        time.sleep(2.0)  # the floods are running
        idle: list[float] = []
        attacked: list[float] = []
        cpu = took = 0.0
        for _ in range(rounds):
            for proc in procs:
                proc.send_signal(signal.SIGSTOP)
            idle.append(_p50_ms(server.url, headers, calls))
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.5)
            used, started = server.cpu_s(), time.monotonic()
            attacked.append(_p50_ms(server.url, headers, calls))
            cpu, took = cpu + server.cpu_s() - used, took + time.monotonic() - started
        posted = 0
        for proc in procs:
            proc.terminate()
            out, _ = proc.communicate(timeout=60)
            posted += int(out.split()[-1]) if out.split() else 0
        return {
            "idle_p50_ms": [round(x, 2) for x in idle],
            "attacked_p50_ms": [round(x, 2) for x in attacked],
            "ratio_of_medians": round(statistics.median(attacked) / statistics.median(idle), 2),
            "attackers": attackers,
            "attack_bodies_posted": posted,
            "server_cpu_share_under_attack": round(cpu / took, 2),
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        server.close()


def stalled_bodies(folder: Path, count: int = 200, kib: int = 1000) -> dict[str, Any]:
    """Server RSS with `count` stalled unauthenticated bodies, and when all were closed."""
    server = _Server(folder)
    try:
        before = server.rss_kb()
        socks = []
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1048000\r\n\r\n"
        ).encode()
        started = time.monotonic()
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.sendall(head)
            sock.setblocking(False)
            sent = 0
            try:
                while sent < kib * 1024:
                    sent += sock.send(b"[" * min(65536, kib * 1024 - sent))
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed, or stopped reading
            socks.append(sock)
        during = server.rss_kb()
        open_socks = list(socks)
        while open_socks and time.monotonic() - started < 60:
            still = []
            for sock in open_socks:
                try:
                    if sock.recv(65536) == b"":
                        continue
                    still.append(sock)
                except BlockingIOError:
                    still.append(sock)
                except OSError:
                    continue
            open_socks = still
            time.sleep(0.05)
        closed_after = time.monotonic() - started
        for sock in socks:
            sock.close()
        return {
            "connections": count,
            "sent_kib_each": kib,
            "rss_before_mb": round(before / 1024, 1),
            "rss_with_stalled_mb": round(during / 1024, 1),
            "still_open_after_60s": len(open_socks),
            "all_closed_after_s": round(closed_after, 2),
        }
    finally:
        server.close()


def huge_line(folder: Path, line_mb: int = 600) -> dict[str, Any]:
    """Peak RSS of `ingest --max-file-mb 1` of a `.jsonl.gz` holding one `line_mb` MB line."""
    big = folder / "huge.jsonl.gz"
    chunk = b"a" * 2**20
    with gzip.open(big, "wb", compresslevel=9) as out:
        out.write(b'{"role": "user", "content": "')
        for _ in range(line_mb):
            out.write(chunk)
        out.write(b'"}\n')
    argv = ["ingest", "--db", str(folder / "db"), "--user", "ana", str(big), "--max-file-mb", "1"]
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True, timeout=900
    )
    code, peak = map(int, done.stdout.split()[-2:])
    return {
        "line_mb": line_mb,
        "compressed_kb": big.stat().st_size // 1024,
        "exit": code,
        "peak_rss_mb": round(peak / 1024, 1),
        "error": done.stderr.strip().splitlines()[-1][-120:],
    }


def _run(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for name, fn in (
            ("starvation", lambda d: starvation(d, args.attackers, args.calls)),
            ("stalled_bodies", lambda d: stalled_bodies(d, args.stalled, args.stalled_kib)),
            ("huge_line", lambda d: huge_line(d, args.line_mb)),
        ):
            folder = base / name
            folder.mkdir()
            out[name] = fn(folder)
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


def register(bench: Any) -> None:
    """Add `bench attacks` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "attacks",
        help="what unauthenticated MCP clients and a huge gz line cost (issue 50)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, default, what in (
        ("--attackers", 2, "clients posting nested bodies"),
        ("--calls", 200, "timed calls of the user, per phase"),
        ("--stalled", 200, "stalled connections"),
        ("--stalled-kib", 1000, "KiB each stalled one sends"),
        ("--line-mb", 600, "MB of the one gz line"),
    ):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.set_defaults(func=_run)
