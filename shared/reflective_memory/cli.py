"""The `reflective-memory` command: demo, ingest, search, stats, serve, mcp, bench and more.

The commands `export`, `import` and `migrate` are defined in `reflective_memory.portable.commands`.

Every argument is checked while the command line is parsed, before any model loads or any file
is created. Heavy modules (the engine, torch, FAISS) are imported inside the commands that need
them, so `--help` and `--version` stay fast. `bench` runs the benchmarks of a source checkout
(`shared/reflective_bench`, beside the library; the wheel does not ship them).

Exit codes: 0 success; 1 nothing to show (e.g. `search` for a user the store does not have,
unless `--allow-empty`); 2 bad arguments or an error (one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import sys
import time
from collections.abc import Collection, Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflective_memory import __version__
from reflective_memory.errors import (
    ConfigError,
    InvalidInputError,
    ReflectiveMemoryError,
    UnknownUserError,
)
from reflective_memory.portable.commands import ArgTypes, read_dsn_argument
from reflective_memory.portable.commands import add_commands as _portable_commands
from reflective_memory.text import parse_timestamp
from reflective_memory.validation import MAX_ID_CHARS

if TYPE_CHECKING:
    from reflective_memory.engine import ReflectiveMemory

__all__ = [
    "main",
    "build_parser",
    "BENCH_MODULES",
    "NO_BENCH",
    "STORE_FILE",
    "DEMO_FILE",
]

logger = logging.getLogger(__name__)

#: Modules of the benchmarks (`reflective_bench`, in a source checkout) that add `bench`
#: sub-commands through a `register(bench_subparsers)` function. They are imported only when the
#: command line asks for `bench`.
BENCH_MODULES = [
    "reflective_bench.retrieval",
    "reflective_bench.gate",
    "reflective_bench.conditional",
    "reflective_bench.feedback",
    "reflective_bench.feedback_cost",
    "reflective_bench.segmentation",
    "reflective_bench.latency",
    "reflective_bench.soak",
    "reflective_bench.ingest",
    "reflective_bench.add_turn",
    "reflective_bench.storage",
    "reflective_bench.chat",
    "reflective_bench.portable",
    "reflective_bench.async_pg",
    "reflective_bench.replicas",
    "reflective_bench.surfaces",
    "reflective_bench.ranker",
    "reflective_bench.starts",
    "reflective_bench.settings_cv",
    "reflective_bench.paired",
    "reflective_bench.attacks",
]

#: What `bench` says (exit code 2) where the benchmarks are not there, e.g. an installed wheel.
NO_BENCH = (
    "benchmarks run from a source checkout of reflective-memory; clone the repository and run "
    "`reflective-memory bench ...` there (or put its shared/ folder on PYTHONPATH)"
)

#: The SQLite file that marks a directory as a store.
STORE_FILE = "memory.sqlite3"

#: The bundled demo conversation (inside the package's `data` folder).
DEMO_FILE = "demo_conversation.json"


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


# -- argument types: each fails at parse time, before any work -------------------------------
def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}") from None
    if not (x > 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
    return x


def _rate(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {value!r}") from None
    if not 0.0 < x <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {value!r}")
    return x


def _user_id(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise argparse.ArgumentTypeError(f"is longer than {MAX_ID_CHARS} characters")
    return value


def _text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def _timestamp(value: str) -> datetime:
    try:
        when = parse_timestamp(value)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if when is None:  # pragma: no cover - a str is never None
        raise argparse.ArgumentTypeError("must not be empty")
    return when


def _input_file(value: str) -> str:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return value


def _file_limit(p: argparse.ArgumentParser) -> None:
    """The `--max-file-mb` option of the commands that read a conversation file."""
    from reflective_memory.jsonfile import MAX_FILE_BYTES

    p.add_argument(
        "--max-file-mb",
        dest="max_file_bytes",
        type=_megabytes,
        default=MAX_FILE_BYTES,
        metavar="MB",
        help=f"largest conversation file read, in MiB (default {MAX_FILE_BYTES // 2**20}; "
        "a .gz counts both on disk and decompressed)",
    )


def _megabytes(value: str) -> int:
    return _positive_int(value) * 2**20


def _gap_minutes(value: str) -> float | None:
    """`--session-gap`: minutes of silence (a positive number), or `0` / `none`: never cut."""
    if value.strip().lower() in ("0", "none"):
        return None
    try:
        return _positive_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of minutes, or 0 / none, got {value!r}"
        ) from None


def _session_gap_argument(p: argparse.ArgumentParser) -> None:
    """The `--session-gap` option of the commands that read a chat log."""
    from reflective_memory.sessions.config import SessionConfig

    idle = SessionConfig.idle_seconds
    default = None if idle is None else idle / 60.0
    p.add_argument(
        "--session-gap",
        type=_gap_minutes,
        default=default,
        metavar="MINUTES",
        help="chat logs: messages that name no session start a new one after this many "
        f"minutes of silence (default {default or 'none'}: sessions.idle_seconds, the idle "
        "time that ends a live session; 0 or none: one session per file)",
    )


def _gap_seconds(args: argparse.Namespace) -> float | None:
    """`--session-gap` in seconds (None: never cut)."""
    return None if args.session_gap is None else args.session_gap * 60.0


def _new_or_store_dir(value: str) -> str:
    """A directory a write command may create (or an existing store)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} exists and is not a directory")
    return value


def _store_dir(value: str) -> str:
    """An existing store directory (read-only commands never create one)."""
    path = Path(value)
    if not (path / STORE_FILE).is_file():
        what = "is not a directory" if path.exists() and not path.is_dir() else "holds no store"
        if not path.exists():
            what = "does not exist"
        raise argparse.ArgumentTypeError(
            f"{value} {what} (no {STORE_FILE}); create a store with `reflective-memory ingest`"
        )
    return value


def _output_file(value: str) -> str:
    if value == "-":  # standard output (`export -o -`)
        return value
    path = Path(value)
    if path.is_symlink():
        raise argparse.ArgumentTypeError(f"{value} is a symbolic link (give the file itself)")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a directory")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{value} is not a regular file (a device or FIFO)")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(path.parent)!r} does not exist")
    return value


# -- shared helpers ----------------------------------------------------------------------------
def _open(db: str | None, **kwargs: Any) -> ReflectiveMemory:
    from reflective_memory.engine import ReflectiveMemory

    return ReflectiveMemory(db, **kwargs)


def _check_user(mem: ReflectiveMemory, user: str, db: str) -> None:
    users = mem.users()
    if user not in users:
        some = ", ".join(repr(u) for u in users[:5]) + (", ..." if len(users) > 5 else "")
        raise UnknownUserError(
            f"the store at {db} has no user {user!r} "
            f"({len(users)} user{'s' if len(users) != 1 else ''}{': ' + some if users else ''})"
        )


# -- commands ----------------------------------------------------------------------------------
def _demo(args: argparse.Namespace) -> int:
    from reflective_memory.io import ingest_conversations, load_conversations

    src = resources.files("reflective_memory") / "data" / DEMO_FILE
    if args.export is not None:
        Path(args.export).write_bytes(src.read_bytes())
        _out(f"wrote the demo conversation to {args.export} (user 'maya')")
        return 0
    with resources.as_file(src) as path:
        convs = load_conversations(path)
    conv = convs[0]
    _out(
        f"reflective-memory demo: {len(conv.sessions)} sessions, {conv.n_turns} turns of "
        f"{conv.user_id}'s conversations with an assistant (offline, CPU)."
    )
    t0 = time.perf_counter()
    with _open(args.db) as mem:
        if args.db is not None and mem.stats(conv.user_id)["turns"]:
            mem.delete_user(conv.user_id)
        ingest_conversations(mem, [conv], progress=not args.quiet)
        stats = mem.stats(conv.user_id)
        _out(
            f"ingested in {time.perf_counter() - t0:.1f}s -> {stats['memories']} memories "
            f"{stats['memories_by_granularity']}"
        )
        found = 0
        asked = conv.questions[: args.questions]
        for q in asked:
            r = mem.retrieve(conv.user_id, q.question, budget_tokens=args.budget, k=args.k)
            ms = r.diagnostics["timings_ms"]["total"]
            _out("")
            _out(f"Q: {q.question}   [{r.diagnostics['path']}, {ms:.1f} ms]")
            got = set()
            for h in r.hits:
                got.update(h.memory.turn_ids)
                first = h.memory.text.splitlines()
                head = first[0] if first else ""
                _out(
                    f"  [{h.rank}] relevance={h.relevance:.2f} session={h.memory.session_id} "
                    f"turns={','.join(h.memory.turn_ids)}  {head}"
                )
                for line in first[1:4]:
                    _out(f"        {line[:110]}")
            hit = bool(set(q.evidence) & got)
            found += hit
            _out(f"  expected answer: {q.answer}")
            _out(f"  evidence turn retrieved: {'yes' if hit else 'no'} ({', '.join(q.evidence)})")
        _out("")
        _out(
            f"{found}/{len(asked)} questions got an evidence turn in the top {args.k} passages "
            f"packed into {args.budget} tokens."
        )
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from reflective_memory.io import ingest_conversations, load_conversations

    # The whole file is read and checked before the store opens: a bad file writes nothing.
    convs = load_conversations(
        args.file,
        default_user=args.user,
        max_bytes=args.max_file_bytes,
        session_gap=_gap_seconds(args),
    )
    with _open(args.db) as mem:
        report = ingest_conversations(mem, convs, user=args.user, progress=not args.quiet)
        for uid in report.users:
            added, skipped = report.added.get(uid, 0), report.skipped.get(uid, 0)
            again = f" ({skipped} already stored, skipped)" if skipped else ""
            _out(f"{uid}: {added} turns{again} -> {mem.stats(uid)['memories']} memories")
    return 0


def _redenoise(args: argparse.Namespace) -> int:
    from reflective_memory.config import MemoryConfig

    cfg = MemoryConfig(denoise={"kind": args.denoiser, "rate": args.rate, "model": args.model})
    with _open(args.db, config=cfg) as mem:
        _check_user(mem, args.user, args.db)
        warm_up = getattr(mem.denoiser, "warm_up", None)
        if callable(warm_up):
            warm_up()  # a denoiser that cannot load fails here, before anything changes
        n = mem.redenoise(args.user, only_stale=args.only_stale)
    _out(f"{args.user}: re-keyed and re-embedded {n} memories with {args.denoiser}")
    return 0


def _hit_payload(h: Any) -> dict[str, Any]:
    return {
        "rank": h.rank,
        "relevance": h.relevance,
        "score": h.score,
        "scores": h.scores,
        "memory_id": h.memory.id,
        "session_id": h.memory.session_id,
        "granularity": h.memory.granularity,
        "turn_ids": list(h.memory.turn_ids),
        "text": h.memory.text,
    }


def _search(args: argparse.Namespace) -> int:
    from reflective_memory.minilm import NumpyMiniLM

    # The store's MiniLM vectors, its query embedded without torch: loads in a fraction of the time.
    with _open(args.db, embedder=NumpyMiniLM()) as mem:
        if not args.allow_empty:
            _check_user(mem, args.user, args.db)
        r = mem.retrieve(args.user, args.query, k=args.k, now=args.now)
    if args.json:
        payload: dict[str, Any] = {
            "query": r.query,
            "user_id": r.user_id,
            "diagnostics": r.diagnostics,
            "hits": [_hit_payload(h) for h in r.hits],
        }
        _out(json.dumps(payload, indent=2, default=str))
        return 0
    if not r.hits:
        _out(f"no memories for user {args.user!r}")
    for h in r.hits:
        _out(
            f"[{h.rank}] relevance={h.relevance:.2f} session={h.memory.session_id} "
            f"turns={','.join(h.memory.turn_ids)}"
        )
        _out("   " + h.memory.text.replace("\n", "\n   "))
    return 0


def _run_server(module: str, what: str, extra: str, args: argparse.Namespace) -> int:
    """`module.run(args)`; without the extra `module` needs, one line on stderr and exit 2."""
    try:
        run = importlib.import_module(module).run
    except ImportError as exc:
        sys.stderr.write(
            f"error: {what} needs its extra: pip install 'reflective-memory[{extra}]' ({exc})\n"
        )
        return 2
    return int(run(args))


def _serve(args: argparse.Namespace) -> int:
    return _run_server("reflective_memory.serve.server", "the web app", "serve", args)


def _body_limit(p: argparse.ArgumentParser, what: str = "") -> None:
    """The `--max-body-bytes` option of the HTTP servers."""
    from reflective_memory.serve.limits import MAX_BODY_BYTES  # no web framework either

    p.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=MAX_BODY_BYTES,
        help=f"{what}largest request body accepted; larger ones get 413 before they are read "
        f"(default {MAX_BODY_BYTES} = 1 MiB)",
    )


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    """The `serve` options (kept here so `--help` imports no web framework)."""
    p.add_argument("--db", default=None, help="store directory (default: in memory, not kept)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765)")
    p.add_argument(
        "--llm",
        default=None,
        metavar="MODULE:FACTORY",
        help="chat model: a factory returning a LangChain chat model, a LlamaIndex LLM or a "
        "callable prompt -> str (default: the offline extractive answerer)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="access token for every user (default: env REFLECTIVE_MEMORY_TOKEN); required "
        "for a non-loopback --host",
    )
    p.add_argument(
        "--user-token",
        action="append",
        default=[],
        metavar="USER=TOKEN",
        help="access token that reaches only USER (repeatable)",
    )
    p.add_argument("--demo", action="store_true", help="load the bundled demo conversation")
    p.add_argument("--k", type=int, default=5, help="memories recalled per message (default 5)")
    p.add_argument(
        "--llm-timeout", type=float, default=60.0, help="seconds to wait for the LLM (default 60)"
    )
    _body_limit(p)


def _mcp(args: argparse.Namespace) -> int:
    return _run_server("reflective_memory.serve.mcp", "the MCP server", "mcp", args)


def _mcp_arguments(p: argparse.ArgumentParser) -> None:
    """The `mcp` options (kept here so `--help` imports no MCP SDK)."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=_new_or_store_dir, default=None, help="store directory")
    where.add_argument("--dsn", default=None, help="PostgreSQL store: postgresql://...")
    read_dsn_argument(p)
    p.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: the client starts this command) or streamable HTTP at /mcp",
    )
    p.add_argument(
        "--user", type=_user_id, default=None, help="stdio: the one user whose memory is served"
    )
    p.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="USER=SECRET",
        help="http: an access token (16+ characters) that reaches only USER (repeatable); "
        "other local users can read command lines, so prefer --tokens-file",
    )
    p.add_argument(
        "--tokens-file",
        type=_input_file,
        default=None,
        metavar="FILE",
        help="http: access tokens, one USER=SECRET per line ('#' comments)",
    )
    p.add_argument("--host", default="127.0.0.1", help="http: bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8766, help="http: port (default 8766)")
    _body_limit(p, "http: ")
    from reflective_memory.serve.limits import (
        BODY_READ_SECONDS,
        MAX_PENDING_BODIES,
        MAX_REQUESTS_PER_MINUTE,
        MAX_SESSIONS_PER_TOKEN,
        SESSION_IDLE_SECONDS,
    )

    p.add_argument(
        "--body-read-seconds",
        type=_positive_float,
        default=BODY_READ_SECONDS,
        metavar="S",
        help="http: a request body must arrive whole within S seconds; a slower one gets 408 "
        f"(default {BODY_READ_SECONDS:g})",
    )
    p.add_argument(
        "--max-pending-bodies",
        type=_positive_int,
        default=MAX_PENDING_BODIES,
        metavar="N",
        help="http: most request bodies read at once; past it a request gets 503 "
        f"(default {MAX_PENDING_BODIES})",
    )

    p.add_argument(
        "--max-sessions-per-token",
        type=_positive_int,
        default=MAX_SESSIONS_PER_TOKEN,
        metavar="N",
        help="http: most MCP sessions one token may hold open; more get 429 "
        f"(default {MAX_SESSIONS_PER_TOKEN})",
    )
    p.add_argument(
        "--session-idle-seconds",
        type=_positive_int,
        default=SESSION_IDLE_SECONDS,
        metavar="S",
        help="http: an MCP session with no request for S seconds is closed "
        f"(default {SESSION_IDLE_SECONDS})",
    )
    p.add_argument(
        "--max-requests-per-minute",
        type=_positive_int,
        default=MAX_REQUESTS_PER_MINUTE,
        metavar="N",
        help="http: most requests one token may make in any 60 seconds; more get 429 "
        f"(default {MAX_REQUESTS_PER_MINUTE})",
    )


def _db_init(args: argparse.Namespace) -> int:
    """Create or migrate the PostgreSQL schema (and HNSW indexes for the given sizes)."""
    from reflective_memory.storage.pg_schema import SCHEMA_VERSION, ensure_vector_index
    from reflective_memory.storage.postgres import PostgresStore, is_postgres_dsn

    if not is_postgres_dsn(args.dsn):
        raise ConfigError("--dsn must be a postgresql://... URI")
    store = PostgresStore(args.dsn, schema=args.schema, pool_max=2)
    try:
        with store.db.connection() as conn:
            made = [d for d in args.dim if ensure_vector_index(conn, store.schema, d)]
    finally:
        store.close()
    _out(f"schema {args.schema!r} is at level {SCHEMA_VERSION}")
    for d in args.dim:
        _out(f"HNSW index for {d}-dim embeddings: {'created' if d in made else 'present'}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from reflective_memory.embed import HashingEmbedder

    # Counting needs no model: a throwaway embedder keeps this command fast.
    with _open(args.db, embedder=HashingEmbedder()) as mem:
        if args.user is not None:
            _check_user(mem, args.user, args.db)
        users = [args.user] if args.user is not None else mem.users()
        rows = {u: mem.stats(u) for u in users}
    if args.json:
        _out(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        _out(f"the store at {args.db} is empty")
    for u, s in rows.items():
        by_kind = sorted(s.get("memories_by_granularity", {}).items())
        kinds = ", ".join(f"{k} {n}" for k, n in by_kind)
        _out(
            f"{u}: {s.get('turns', 0)} turns, {s.get('sessions', 0)} sessions, "
            f"{s.get('memories', 0)} memories" + (f" ({kinds})" if kinds else "")
        )
    return 0


def _weights(args: argparse.Namespace) -> int:
    """Print the turn ranker's weights (a user's, or the memory's) next to the prior's."""
    from reflective_memory.embed import HashingEmbedder
    from reflective_memory.rmm.turn_learning import GATE_SIGMAS

    with _open(args.db, embedder=HashingEmbedder()) as mem:  # weights need no model
        if args.user is not None:
            _check_user(mem, args.user, args.db)
        got = mem.ranker_weights(args.user)
    if args.json:
        _out(json.dumps(got, indent=2))
        return 0
    who = f"user {args.user}" if args.user is not None else "the memory"
    _out(
        f"turn ranker of {who}: {got['episodes']} feedback episodes of all users"
        + (f", {got['user_episodes']} of this user" if args.user is not None else "")
    )
    gates = [("all users", got["shared_gate"])]
    if args.user is not None:
        gates.append(("this user", got["user_gate"]))
    for label, gate in gates:
        state = "ranks" if gate["serves"] else "held back (not yet better than what it replaces)"
        _out(
            f"what {label} taught: {state}; mean gain {gate['mean_gain']:+.4f} "
            f"over {gate['judged']} judged episodes ({gate['t']:+.2f} standard errors, "
            f"ranks above {GATE_SIGMAS})"
        )
    head = ["feature", "prior", "+ all users"] + (["+ user"] if args.user is not None else [])
    _out(" | ".join(head + ["= weight"]))
    for name in got["features"]:
        cells = [got["prior"][name], got["shared"][name]]
        if args.user is not None:
            cells.append(got["user"][name])
        cells.append(got["weights"][name])
        _out(" | ".join([name] + [f"{v:+.4f}" for v in cells]))
    return 0


def _segment(args: argparse.Namespace) -> int:
    """Print (or `--json`) the segments the offline segmenter finds in each session of a file."""
    from reflective_memory.embed import HashingEmbedder, default_embedder
    from reflective_memory.io import load_conversations
    from reflective_memory.segment.base import check_spans
    from reflective_memory.segment.embedding import make_segmenter
    from reflective_memory.types import Turn

    embedder = HashingEmbedder(256) if args.embedder == "hashing" else default_embedder()
    seg = make_segmenter(args.segmenter, embedder=embedder, unit=args.unit, window=args.window)
    rows = []
    convs = load_conversations(
        args.file,
        default_user="user",
        max_bytes=args.max_file_bytes,
        session_gap=_gap_seconds(args),
    )
    for conv in convs:
        for sess in conv.sessions[: args.limit] if args.limit is not None else conv.sessions:
            turns = [
                Turn(
                    conv.user_id,
                    sess.session_id,
                    str(t["role"]),
                    str(t["text"]),
                    str(t.get("turn_id") or f"{sess.session_id}:{i}"),
                    i,
                )
                for i, t in enumerate(sess.turns)
            ]
            spans = check_spans(seg.segment(turns), len(turns)) if turns else []
            rows.append((conv.user_id, sess.session_id, turns, spans))
    if args.json:
        payload = [
            {
                "user_id": u,
                "session_id": s,
                "segments": [
                    {"start": a, "end": b, "turn_ids": [t.turn_id for t in turns[a:b]]}
                    for a, b in spans
                ],
            }
            for u, s, turns, spans in rows
        ]
        _out(json.dumps(payload, indent=2))
        return 0
    for user, sid, turns, spans in rows:
        _out(f"user {user} session {sid}: {len(turns)} turns, {len(spans)} segments")
        for k, (a, b) in enumerate(spans):
            first = turns[a].text.replace("\n", " ")
            first = first if len(first) <= 70 else first[:67] + "..."
            _out(f"  [{k}] turns {a}-{b - 1}: {turns[a].role}: {first}")
    return 0


def _segment_arguments(p: argparse.ArgumentParser) -> None:
    """The `segment` options (the segmenter names import the segmenters, hence only on demand)."""
    from reflective_memory.segment.embedding import SEGMENTER_KINDS

    p.add_argument(
        "file",
        type=_input_file,
        help="conversation file in any format `ingest` reads (.json, .jsonl, optionally .gz)",
    )
    _file_limit(p)
    _session_gap_argument(p)
    p.add_argument(
        "--segmenter",
        choices=SEGMENTER_KINDS,
        default="embedding",
        help="offline segmenter: 'embedding' the learned boundary scorer (the library's), "
        "'texttiling' TextTiling over embeddings, 'fixed' every --window turns "
        "(default embedding)",
    )
    p.add_argument(
        "--unit",
        choices=("exchange", "turn"),
        default="exchange",
        help="what a boundary may fall between: exchanges (a turn and its reply) or single "
        "turns (default exchange)",
    )
    p.add_argument(
        "--embedder",
        choices=("minilm", "hashing"),
        default="minilm",
        help="the embeddings the segmenter compares: all-MiniLM-L6-v2, or the fast, "
        "model-free hashing embedder (default minilm)",
    )
    p.add_argument(
        "--window",
        type=_positive_int,
        default=6,
        help="turns per segment for --segmenter fixed (default 6)",
    )
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        help="only the first N sessions per user (default: all)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_segment)


def _find_benchmarks() -> bool:
    """Whether `reflective_bench` can be imported, looking beside this library if need be.

    The wheel ships no benchmarks; a source checkout has them in `shared/reflective_bench`, next
    to `shared/reflective_memory`. When that folder is there, `shared/` goes on `sys.path`.
    """
    if importlib.util.find_spec("reflective_bench") is not None:
        return True
    shared = Path(__file__).resolve().parents[1]
    if not (shared / "reflective_bench" / "__init__.py").is_file():
        return False
    sys.path.append(str(shared))
    return importlib.util.find_spec("reflective_bench") is not None


# -- parser ------------------------------------------------------------------------------------
#: Commands whose arguments are defined by modules with heavy imports (numpy, the engine, the
#: benchmarks).
_HEAVY_COMMANDS = ("segment", "bench")


def _command(argv: Sequence[str]) -> str | None:
    """The sub-command a command line names (the global options take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(*, define: Collection[str] = _HEAVY_COMMANDS) -> argparse.ArgumentParser:
    """The argument parser of the `reflective-memory` command.

    Args:
        define: Which of the heavy commands (`segment`, `bench`) get their arguments defined,
            which imports their modules (for `bench`, the benchmarks of a source checkout, when
            they are there). `main` names only the command on the command line, so `--help`
            and the other commands pay for none of those imports (every command is still
            listed).
    """
    parser = argparse.ArgumentParser(
        prog="reflective-memory",
        description="Long-term conversational memory for LLM apps (offline, CPU).",
        epilog="Try it: reflective-memory demo --export conv.json && reflective-memory ingest "
        "conv.json --user maya --db ./memory && reflective-memory search 'where do I live now?' "
        "--user maya --db ./memory. Exit codes: 0 ok, 1 unknown user, 2 error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log details, model-loading bars included"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "demo",
        help="ingest a bundled conversation and answer questions from it",
        description="Ingests the bundled 7-session conversation of user 'maya' and retrieves "
        "memories for its questions. `--export FILE` only writes that conversation to FILE "
        "(the reflective-memory/v1 JSON that `ingest` reads).",
    )
    p.add_argument("--db", type=_new_or_store_dir, default=None, help="store directory")
    p.add_argument(
        "--k", type=_positive_int, default=3, help="passages shown per question (default 3)"
    )
    p.add_argument(
        "--budget",
        type=_positive_int,
        default=300,
        help="tokens of passages retrieved per question (default 300)",
    )
    p.add_argument(
        "--questions", type=_positive_int, default=8, help="questions to ask (default 8)"
    )
    p.add_argument(
        "--export",
        type=_output_file,
        default=None,
        metavar="FILE",
        help="write the bundled conversation to FILE and exit",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "ingest",
        help="add a conversation file to a store",
        description="Formats, told apart by shape: reflective-memory/v1 JSON (see "
        "reflective_memory.io; `reflective-memory demo --export conv.json` writes a sample), "
        "LongMemEval, LoCoMo, and chat logs: JSON Lines of messages, a list of role/content "
        'messages or {"messages": [...]} (OpenAI), LangChain messages_to_dict output, LlamaIndex '
        "ChatMessage dumps (docs/cli.md). Each session is ended after ingestion, so it becomes "
        "memories.",
    )
    p.add_argument(
        "file", type=_input_file, help="conversation file (.json, .jsonl, optionally .gz)"
    )
    _file_limit(p)
    _session_gap_argument(p)
    p.add_argument("--user", type=_user_id, required=True, help="user id to store under")
    p.add_argument("--db", type=_new_or_store_dir, required=True, help="store directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_ingest)

    p = sub.add_parser("search", help="retrieve a user's memories for a query")
    p.add_argument("query", type=_text, help="query text")
    p.add_argument("--user", type=_user_id, required=True, help="user id")
    p.add_argument("--db", type=_store_dir, required=True, help="existing store directory")
    p.add_argument("--k", type=_positive_int, default=5, help="number of hits (default 5)")
    p.add_argument(
        "--now",
        type=_timestamp,
        default=None,
        help="when the question is asked, for 'two weeks ago' (ISO-8601, UTC without an "
        "offset; default: the user's newest turn)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--allow-empty", action="store_true", help="an unknown user gives no hits, not exit 1"
    )
    p.set_defaults(func=_search)

    p = sub.add_parser("stats", help="count a store's turns, sessions and memories per user")
    p.add_argument("--db", type=_store_dir, required=True, help="existing store directory")
    p.add_argument("--user", type=_user_id, default=None, help="only this user")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_stats)

    p = sub.add_parser(
        "weights", help="show the turn ranker's weights next to the prior's (what feedback taught)"
    )
    p.add_argument("--db", type=_store_dir, required=True, help="existing store directory")
    p.add_argument("--user", type=_user_id, default=None, help="this user's weights")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_weights)

    p = sub.add_parser(
        "segment",
        help="print the topical segments of each session of a conversation file",
        description="Reads the same conversation formats as `ingest` and prints, per session, "
        "the segments the offline segmenter finds.",
    )
    if "segment" in define:
        _segment_arguments(p)

    p = sub.add_parser(
        "redenoise",
        help="re-key and re-embed a user's memories with another key denoiser",
        description="Rebuilds each turn/session/segment memory's key from its stored raw turns, "
        "denoises it (SeCom compression) and re-embeds it. Texts and ids do not change. A "
        "denoiser that cannot load (e.g. llmlingua without a local model) is an error.",
    )
    p.add_argument("--user", type=_user_id, required=True, help="user id")
    p.add_argument("--db", type=_store_dir, required=True, help="existing store directory")
    p.add_argument(
        "--denoiser",
        default="offline",
        choices=["none", "offline", "llmlingua"],
        help="key denoiser: raw keys, the offline one, or LLMLingua-2 (default offline)",
    )
    p.add_argument(
        "--rate", type=_rate, default=0.75, help="fraction of each key kept (default 0.75)"
    )
    p.add_argument("--model", default=None, help="local LLMLingua-2 model folder")
    p.add_argument("--only-stale", action="store_true", help="only keys made by another denoiser")
    p.set_defaults(func=_redenoise)

    p = sub.add_parser(
        "serve",
        help="web inspector and chat: see what is remembered and why it was recalled",
        description="A local web app over a store: users, sessions, memories with provenance, "
        "search with retrieval diagnostics, chat with cited memories and feedback buttons, and "
        "deletion. JSON API under /api/. Needs the 'serve' extra.",
    )
    _serve_arguments(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser(
        "mcp",
        help="serve a user's memory as MCP tools (stdio or streamable HTTP)",
        description="A Model Context Protocol server with the tools remember, recall, "
        "list_sessions, end_session and forget. stdio serves the one --user; HTTP serves each "
        "--token's user and requires 'Authorization: Bearer SECRET'. Needs the 'mcp' extra.",
    )
    _mcp_arguments(p)
    p.set_defaults(func=_mcp)

    p = sub.add_parser("db", help="database server administration (PostgreSQL store)")
    db = p.add_subparsers(dest="db", required=True)
    p = db.add_parser(
        "init",
        help="create or migrate the PostgreSQL schema",
        description="Creates the vector and btree_gin extensions (needs a role allowed to), "
        "the schema and its tables, or migrates them to this version; idempotent and safe "
        "to run from several hosts at once.",
    )
    p.add_argument("--dsn", required=True, help="postgresql://user@host:5432/db")
    p.add_argument(
        "--schema",
        default="reflective_memory",
        help="schema holding the tables (default reflective_memory)",
    )
    p.add_argument(
        "--dim",
        type=int,
        action="append",
        default=[],
        help="also build the HNSW index for this embedding size (repeatable; e.g. 384)",
    )
    p.set_defaults(func=_db_init)

    types = ArgTypes(_store_dir, _new_or_store_dir, _input_file, _output_file, _megabytes)
    _portable_commands(sub, types)  # export, import, migrate

    p = sub.add_parser(
        "bench",
        help="benchmarks, in a source checkout (reflective-memory bench --help lists them)",
    )
    bench = p.add_subparsers(dest="bench", required=True)
    if "bench" in define and _find_benchmarks():
        for name in BENCH_MODULES:
            importlib.import_module(name).register(bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `reflective-memory` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    if command == "bench" and not _find_benchmarks():
        sys.stderr.write(f"error: {NO_BENCH}\n")
        return 2
    parser = build_parser(define=[c for c in _HEAVY_COMMANDS if c == command])
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad argument (already reported)
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.verbose:
        logging.getLogger("reflective_memory").setLevel(logging.INFO)
    try:
        return int(args.func(args))
    except UnknownUserError as exc:
        _error(exc.args[0] if exc.args else exc)
        return 1
    except (ReflectiveMemoryError, OSError) as exc:  # OSError: a disk or permission problem
        _error(exc)
        return 2


def _error(message: object) -> None:
    """Report an error as one line on stderr (newlines inside the message become spaces)."""
    text = " ".join(str(message).splitlines()) or type(message).__name__
    sys.stderr.write(f"error: {text}\n")


if __name__ == "__main__":
    sys.exit(main())
