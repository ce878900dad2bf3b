"""The `export`, `import` and `migrate` commands of `reflective-memory` (see `cli.py`).

Defining them imports nothing heavy (`--help` stays fast); running them imports the stores.
No engine is opened on either side, so nothing runs on open: open sessions stay open and no
embedding model loads unless `import --embedder` asks for one.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from reflective_memory.errors import ConfigError, StoreError
from reflective_memory.jsonfile import MAX_IMPORT_BYTES

if TYPE_CHECKING:
    from reflective_memory.portable.endpoints import Endpoint
    from reflective_memory.portable.importer import ImportReport

__all__ = ["add_commands", "ArgTypes", "read_dsn_argument", "read_dsn_of"]


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _dsn(value: str) -> str:
    if not value.startswith(("postgresql://", "postgres://")):
        raise argparse.ArgumentTypeError("must be a postgresql://... URI")
    return value


def read_dsn_argument(p: argparse.ArgumentParser, of: str = "--dsn") -> None:
    """Add `--read-dsn` (repeatable): read replicas of the PostgreSQL store `of` names."""
    p.add_argument(
        "--read-dsn",
        type=_dsn,
        action="append",
        default=None,
        metavar="DSN",
        help=f"a hot standby of the {of} database to read from (repeatable); reads see every "
        "write of this process (they wait for the standby, else read the primary)",
    )


def read_dsn_of(args: argparse.Namespace, dsn: str | None) -> list[str] | None:
    """The `--read-dsn` values, checked to go with a PostgreSQL store.

    Raises:
        ConfigError: `--read-dsn` without a PostgreSQL store.
    """
    replicas = getattr(args, "read_dsn", None)
    if replicas and dsn is None:
        raise ConfigError("--read-dsn names replicas of a PostgreSQL store: give --dsn too")
    return replicas or None


def _where(p: argparse.ArgumentParser, db_type: Any) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=db_type, help="embedded store directory")
    where.add_argument("--dsn", type=_dsn, help="PostgreSQL store: postgresql://user@host/db")
    read_dsn_argument(p)
    _schema(p)


def _schema(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--schema",
        default="reflective_memory",
        help="PostgreSQL schema holding the tables (default reflective_memory)",
    )


def _open(
    db: str | None, dsn: str | None, schema: str, read_dsn: list[str] | None = None
) -> Endpoint:
    from reflective_memory.portable.endpoints import open_endpoint

    if dsn is not None:
        return open_endpoint(dsn=dsn, schema=schema, read_dsn=read_dsn)
    return open_endpoint(db)


def _counts(counter: Any) -> str:
    kinds = {"session": "sessions", "turn": "turns", "memory": "memories", "value": "values"}
    kinds["state"] = "learned states"
    return ", ".join(f"{counter[k]} {name}" for k, name in kinds.items() if counter.get(k))


def _export(args: argparse.Namespace) -> int:
    from reflective_memory.portable.files import export_memory

    to_stdout = args.output == "-"
    ep = _open(args.db, args.dsn, args.schema, read_dsn_of(args, args.dsn))
    try:
        users = None if args.user is None else [args.user]
        vectors = not args.no_vectors
        if to_stdout:
            with _stdout_utf8() as out:
                report = export_memory(ep, out, users=users, vectors=vectors)
        else:
            report = export_memory(ep, args.output, users=users, vectors=vectors)
    finally:
        ep.store.close()
    models = ", ".join(f"{n} by {m}" for m, n in report.models.items()) or "none"
    summary = (
        f"exported {len(report.users)} users ({_counts(report.counts) or 'nothing'}) to "
        f"{'standard output' if to_stdout else args.output}; embeddings carried: {models}"
    )
    if to_stdout:  # the summary must not end up inside the export
        sys.stderr.write(summary + "\n")
    else:
        _out(summary)
    return 0


@contextmanager
def _stdout_utf8() -> Iterator[IO[str]]:
    """Standard output as UTF-8 text with Unix line ends, whatever the locale says."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream (an embedding program's own)
        yield sys.stdout
        return
    out = io.TextIOWrapper(buffer, encoding="utf-8", newline="\n")
    try:
        yield out
    finally:
        out.flush()
        out.detach()  # leave sys.stdout's buffer open


def _embedder(kind: str) -> Any:
    if kind == "keep":
        return None
    from reflective_memory.embed import HashingEmbedder, default_embedder

    return HashingEmbedder() if kind == "hashing" else default_embedder()


def _print_import(report: ImportReport) -> None:
    added, skipped = _counts(report.added) or "nothing", _counts(report.skipped)
    vec = ", ".join(f"{n} {how}" for how, n in sorted(report.vectors.items()) if n) or "none"
    _out(
        f"imported {len(report.users)} users: added {added}"
        + (f"; already there, skipped: {skipped}" if skipped else "")
        + f"; embeddings: {vec}"
        + (f" (the file's were made by {report.embedder})" if report.embedder else "")
    )


def _import(args: argparse.Namespace) -> int:
    from reflective_memory.portable.endpoints import endpoint
    from reflective_memory.portable.files import check_import_file, import_memory

    check_import_file(args.file, args.max_file_mb)  # a refused file creates no store
    ep = _open(args.db, args.dsn, args.schema, read_dsn_of(args, args.dsn))
    try:
        target = endpoint(ep, embedder=_embedder(args.embedder))
        report = import_memory(target, args.file, max_bytes=args.max_file_mb, measure=False)
    finally:
        ep.store.close()
    _print_import(report)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from reflective_memory.portable.move import migrate

    src = _open(args.source, None, args.schema)
    try:
        dst = _open(None, args.target, args.schema, read_dsn_of(args, args.target))
        try:
            report = migrate(src, dst)
        finally:
            dst.store.close()
    finally:
        src.store.close()
    _print_import(report.imported)
    for check in report.users:
        _out("  " + check.summary())
    if not report.shared_state_ok:
        _out("  shared learned state: differs in the target (it kept its own)")
    bad = [c.user_id for c in report.users if not c.ok]
    if bad:
        raise StoreError(f"verification failed for {len(bad)} users ({', '.join(bad[:5])})")
    _out(f"verified {len(report.users)} users: counts and checksums match")
    return 0


@dataclass(frozen=True)
class ArgTypes:
    """The command line's argument checks (`cli.py` owns them; they fail at parse time).

    Attributes:
        store_dir: An existing store directory.
        new_dir: A directory a command may create (or an existing store).
        input_file: An existing file.
        output_file: A file that can be written.
        megabytes: A positive whole number of MiB, as bytes.
    """

    store_dir: Callable[[str], str]
    new_dir: Callable[[str], str]
    input_file: Callable[[str], str]
    output_file: Callable[[str], str]
    megabytes: Callable[[str], int]


def add_commands(sub: Any, types: ArgTypes) -> None:
    """Define `export`, `import` and `migrate` on the `reflective-memory` sub-parsers."""
    p = sub.add_parser(
        "export",
        help="write a store's users, turns, memories and learned state to a JSON Lines file",
        description="Streams the store (one user at a time) into a versioned JSON Lines file "
        "(reflective_memory.portable.format); FILE.gz is compressed. Embeddings travel with "
        "their model's name unless --no-vectors. The file holds every exported user's "
        "memory, their words verbatim: a new file is readable by its owner only (mode 0600).",
    )
    _where(p, types.store_dir)
    p.add_argument("--user", default=None, help="only this user")
    p.add_argument(
        "-o",
        "--output",
        type=types.output_file,
        required=True,
        metavar="FILE",
        help="FILE (.gz: compressed), or - for standard output (uncompressed; the summary "
        "then goes to standard error)",
    )
    p.add_argument("--no-vectors", action="store_true", help="leave embeddings out")
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "import",
        help="read an export file into a store (what it holds already is skipped)",
        description="Checks every line before writing it; importing the same file twice adds "
        "nothing. Embeddings: --embedder keep (default) stores the file's as they are; "
        "minilm or hashing reuses those that embedder made and computes the others.",
    )
    _where(p, types.new_dir)
    p.add_argument("file", type=types.input_file, help="export file (.jsonl or .jsonl.gz)")
    p.add_argument(
        "--embedder",
        choices=("keep", "minilm", "hashing"),
        default="keep",
        help="keep the file's embeddings, or embed with all-MiniLM-L6-v2 or the hashing "
        "embedder what that one did not make (default keep)",
    )
    p.add_argument(
        "--max-file-mb",
        type=types.megabytes,
        default=MAX_IMPORT_BYTES,
        metavar="MB",
        help="largest export read, in MiB after decompression (default "
        f"{MAX_IMPORT_BYTES // 2**20}); a larger file is refused before anything is written",
    )
    p.set_defaults(func=_import)

    p = sub.add_parser(
        "migrate",
        help="move an embedded store onto PostgreSQL, verified per user",
        description="Streams the store at --from into the PostgreSQL store at --to (no file in "
        "between), then compares counts and checksums per user. Safe to run again after an "
        "interruption: what was moved is skipped. Do not serve from the target before it ends.",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=types.store_dir,
        required=True,
        metavar="DIR",
        help="the embedded store directory to move",
    )
    p.add_argument(
        "--to",
        dest="target",
        type=_dsn,
        required=True,
        metavar="DSN",
        help="the PostgreSQL store to fill: postgresql://user@host:5432/db",
    )
    read_dsn_argument(p, of="--to")
    _schema(p)
    p.set_defaults(func=_migrate)
