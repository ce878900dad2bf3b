"""A throwaway PostgreSQL cluster for tests and local benchmarks (initdb + pg_ctl, free port).

Used by the `pg_cluster` / `pg_dsn` fixtures in `tests/conftest.py`. When the process runs as
root, the server runs as the unprivileged `postgres` user (PostgreSQL refuses to run as root).
The cluster lives in a temporary directory and is stopped and removed by `stop()`.

Run it by hand to get a server for `reflective-memory bench storage`:
`python tests/pg_cluster.py` prints a DSN and keeps the server up until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

VECTOR_MISSING = "pgvector is not installed for this PostgreSQL (run .ci/install-postgres.sh)"


def pg_schema() -> str:
    """A fresh schema name (tests that need an empty store use one per test)."""
    return f"t_{uuid.uuid4().hex[:12]}"


def find_bindir() -> Path | None:
    """The bin directory of the newest local PostgreSQL server (env `REFLECTIVE_PG_BIN` first)."""
    env = os.environ.get("REFLECTIVE_PG_BIN")
    candidates = [env] if env else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def missing_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    bindir = find_bindir()
    if bindir is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found (run .ci/install-postgres.sh)"
    pg_config = bindir / "pg_config"
    if pg_config.exists():
        share = subprocess.run([str(pg_config), "--sharedir"], capture_output=True, text=True)
        ext = Path(share.stdout.strip()) / "extension" / "vector.control"
        if not ext.exists():
            return VECTOR_MISSING
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run the server as"
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg / psycopg_pool / pgvector are not installed (pip install '.[postgres]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One temporary PostgreSQL cluster.

    Args:
        bindir: PostgreSQL bin directory (`None`: `find_bindir()`).
        fsync: Keep fsync on (off makes bulk loads faster; crash safety of the host is then
            not tested, commits still are).
    """

    def __init__(self, bindir: Path | None = None, *, fsync: bool = True) -> None:
        found = bindir if bindir is not None else find_bindir()
        if found is None:
            raise RuntimeError("PostgreSQL binaries not found")
        self.bindir = found
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="rm-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.user = "postgres"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, cwd="/")

    @property
    def dsn(self) -> str:
        """DSN of the `postgres` database."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        """DSN of one database of this cluster."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> Cluster:
        """initdb, start the server and put `vector` into template1 (so every new DB has it)."""
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o755)
        self._run(
            str(self.bindir / "initdb"),
            "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c shared_buffers=256MB "
            f"-c fsync={'on' if self.fsync else 'off'}"
        )
        res = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts,
            "-l", str(self.root / "server.log"), "-w", "-t", "60", "start",
            check=False,
        )  # fmt: skip
        if res.returncode != 0:
            log = (
                (self.root / "server.log").read_text()
                if (self.root / "server.log").exists()
                else ""
            )
            raise RuntimeError(f"pg_ctl start failed: {res.stderr}\n{log[-2000:]}")
        import psycopg

        deadline = time.time() + 30
        while True:
            try:
                with psycopg.connect(self.dsn_for("template1"), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
                break
            except psycopg.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        return self

    def create_database(self, name: str) -> str:
        """Create a fresh database (with pgvector) and return its DSN."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)

    def stop(self) -> None:
        """Stop the server immediately and delete its files."""
        if self.data.exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                      "-w", "stop", check=False)  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover - manual use
    import sys

    reason = missing_reason()
    if reason:
        sys.exit(reason)
    import signal

    def _stop(*_: object) -> None:
        raise KeyboardInterrupt

    # a background job starts with SIGINT ignored: stop cleanly on SIGINT and SIGTERM alike
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    c = Cluster(fsync="--no-fsync" not in sys.argv).start()
    print(c.dsn, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
