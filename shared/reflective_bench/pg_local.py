"""A throwaway local PostgreSQL cluster (initdb + pg_ctl on a free port), its hot standbys.

For the test fixtures (`tests/pg_cluster.py`, `tests/conftest.py`) and the benchmarks that need
servers of their own (`reflective-memory bench replicas` kills and promotes them). When the
process runs as root, the server runs as the unprivileged `postgres` user (PostgreSQL refuses
to run as root). A cluster lives in a temporary directory and is stopped and removed by
`stop()`.

`Cluster.standby()` starts a hot standby of a running cluster (`pg_basebackup -R`, streaming
replication; `sync=True` makes it the primary's synchronous standby); `kill()` SIGKILLs a
server and everything it started, `promote()` turns a standby into a primary (`pg_ctl
promote`).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["VECTOR_MISSING", "Cluster", "find_bindir", "free_port", "missing_reason"]

VECTOR_MISSING = "pgvector is not installed for this PostgreSQL (run .ci/install-postgres.sh)"


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


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(Path(stat).parent.name))
    return out


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
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

    def __init__(
        self, bindir: Path | None = None, *, fsync: bool = True, port: int | None = None
    ) -> None:
        found = bindir if bindir is not None else find_bindir()
        if found is None:
            raise RuntimeError("PostgreSQL binaries not found")
        self.bindir = found
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="rm-pg-"))
        self.data = self.root / "data"
        self.port = port if port is not None else free_port()
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

    def _own_root(self) -> None:
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o755)

    def _launch(self) -> None:
        """Start the server of `self.data` and wait until it accepts connections."""
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
            raise RuntimeError(f"pg_ctl start failed: {res.stderr}\n{self.log()[-2000:]}")

    def log(self) -> str:
        """The server's log so far."""
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> Cluster:
        """initdb, start the server and put `vector` into template1 (so every new DB has it)."""
        self._own_root()
        self._run(
            str(self.bindir / "initdb"),
            "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        self._launch()
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

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple]:
        """Run one statement (autocommit) and return its rows (none for a command)."""
        import psycopg

        with psycopg.connect(self.dsn_for(dbname), autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def standby(self, *, sync: bool = False, port: int | None = None) -> Cluster:
        """A hot standby of this (running) cluster, started: `pg_basebackup -R` and streaming.

        Args:
            sync: Make it this cluster's synchronous standby (`synchronous_standby_names`
                `'*'` here, with the default `synchronous_commit=on`: a commit returns once
                the standby has the WAL on disk).
            port: Its port (default: a free one).
        """
        replica = Cluster(self.bindir, fsync=self.fsync, port=port)
        replica._own_root()
        replica._run(
            str(self.bindir / "pg_basebackup"), "-D", str(replica.data), "-R",
            "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-X", "stream",
            "-c", "fast", "--no-sync",
        )  # fmt: skip
        # What this cluster asked of its standbys is not the new standby's to ask (it may be
        # promoted one day): it starts with no synchronous standby of its own.
        with (replica.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("synchronous_standby_names = ''\n")
        replica._launch()
        replica.wait_caught_up(self)
        if sync:
            self.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.sql("SELECT pg_reload_conf()")
            deadline = time.time() + 30
            while not self.sql("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"):
                if time.time() > deadline:
                    raise RuntimeError("the standby did not become synchronous")
                time.sleep(0.05)
        return replica

    def wait_caught_up(self, primary: Cluster, timeout: float = 30.0) -> None:
        """Wait until this standby has replayed everything `primary` has written so far."""
        (target,) = primary.sql("SELECT pg_current_wal_flush_lsn()")[0]
        deadline = time.time() + timeout
        while True:
            try:
                rows = self.sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")
                if rows and rows[0][0]:
                    return
            except Exception:  # noqa: BLE001 - still starting up
                pass
            if time.time() > deadline:
                raise RuntimeError(f"the standby did not reach {target}\n{self.log()[-2000:]}")
            time.sleep(0.02)

    def promote(self) -> None:
        """Turn this standby into a primary (`pg_ctl promote`, waiting until it is one)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def kill(self) -> None:
        """SIGKILL the server's postmaster and every process it started (a crashed machine)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        for victim in [pid, *_children(pid)]:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)

    def pause(self) -> None:
        """Stop the server (`pg_ctl stop -m fast`), keeping its files for `resume`."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start a server stopped by `pause` again."""
        self._launch()

    def stop(self) -> None:
        """Stop the server immediately and delete its files.

        The files go in the background (`rm -rf` of the renamed directory): deleting a
        cluster's thousands of files takes seconds on some file systems, and nothing waits for
        them.
        """
        if self.data.exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                      "-w", "stop", check=False)  # fmt: skip
        if not self.root.exists():
            return
        doomed = self.root.with_name(self.root.name + ".deleted")
        try:
            self.root.rename(doomed)
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        subprocess.Popen(  # noqa: S603 - our own temporary directory
            ["rm", "-rf", "--", str(doomed)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
