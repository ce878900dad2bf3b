"""A throwaway PostgreSQL cluster for tests and local benchmarks (initdb + pg_ctl, free port).

Used by the `pg_cluster` / `pg_dsn` / `pg_pair` fixtures in `tests/conftest.py`; the cluster
itself (and its standbys: `Cluster.standby()`, `kill()`, `promote()`) is
`reflective_bench.pg_local`, shared with the benchmarks that start servers of their own.

Run it by hand to get a server for `reflective-memory bench storage`:
`python tests/pg_cluster.py` prints a DSN and keeps the server up until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import time
import uuid

from reflective_bench.pg_local import (
    VECTOR_MISSING,
    Cluster,
    find_bindir,
    free_port,
    missing_reason,
)

__all__ = ["VECTOR_MISSING", "Cluster", "find_bindir", "free_port", "missing_reason", "pg_schema"]


def pg_schema() -> str:
    """A fresh schema name (tests that need an empty store use one per test)."""
    return f"t_{uuid.uuid4().hex[:12]}"


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
