"""`reflective-memory serve`: check the options, open the store, build the app, run uvicorn.

Every option is checked before the store directory is created or a model is loaded: an open
(token-less) app may only bind to a loopback address, the port must be free, and the `--llm`
factory must load.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

from reflective_memory.embed import Embedder
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.serve.answer import make_answerer
from reflective_memory.serve.app import create_app
from reflective_memory.serve.limits import check_body_limit
from reflective_memory.serve.llm_spec import load_llm
from reflective_memory.serve.security import (
    LOOPBACK_HOSTS,
    AccessPolicy,
    check_bind,
    check_port,
    is_loopback,
    parse_user_tokens,
    token_from_env,
)

__all__ = ["prepare", "run", "load_demo", "Prepared", "DEMO_USER"]

logger = logging.getLogger(__name__)

#: The user id of the bundled demo conversation.
DEMO_USER = "maya"


@dataclass
class Prepared:
    """Everything `run` needs, built and checked."""

    app: Any
    memory: ReflectiveMemory
    host: str
    port: int
    url: str


def load_demo(memory: ReflectiveMemory) -> str:
    """Ingest the bundled demo conversation unless its user is already stored; return a note."""
    from reflective_memory.io import ingest_conversations, load_conversations

    if DEMO_USER in memory.users():
        return f"demo user {DEMO_USER!r} is already in the store; left as it is"
    src = resources.files("reflective_memory") / "data" / "demo_conversation.json"
    with resources.as_file(src) as path:
        conv = load_conversations(path)[0]
    ingest_conversations(memory, [conv], progress=False)
    stats = memory.stats(conv.user_id)
    return (
        f"loaded the demo: user {conv.user_id!r}, {len(conv.sessions)} sessions, "
        f"{stats['memories']} memories"
    )


def prepare(args: argparse.Namespace, *, embedder: Embedder | None = None) -> Prepared:
    """Check the options, open the store (loading the demo if asked) and build the app.

    Raises:
        ConfigError: A bad option; nothing has been created yet.
    """
    admin = args.token if args.token is not None else token_from_env()
    policy = AccessPolicy(admin, parse_user_tokens(args.user_token))
    check_bind(args.host, policy)
    if args.k < 1 or args.k > 50:
        raise ConfigError(f"--k must be between 1 and 50, got {args.k}")
    if args.llm_timeout <= 0:
        raise ConfigError(f"--llm-timeout must be positive, got {args.llm_timeout}")
    check_body_limit(args.max_body_bytes)
    check_port(args.host, args.port)
    llm = None if args.llm is None else load_llm(args.llm)
    memory = ReflectiveMemory(args.db, embedder=embedder)
    try:
        answerer = make_answerer(llm, embedder=memory.embedder, timeout_s=args.llm_timeout)
        if args.demo:
            logger.info("%s", load_demo(memory))  # what was asked for: no warning
        allowed = None
        if policy.open and is_loopback(args.host):
            allowed = [*LOOPBACK_HOSTS, args.host]
        app = create_app(
            memory,
            answerer=answerer,
            policy=policy,
            allowed_hosts=allowed,
            k=args.k,
            max_body_bytes=args.max_body_bytes,
        )
    except BaseException:
        memory.close()
        raise
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{args.port}/"
    if admin is not None:
        url += f"?token={admin}"
    return Prepared(app, memory, args.host, args.port, url)


def run(args: argparse.Namespace, *, embedder: Embedder | None = None) -> int:
    """Serve until interrupted; return the exit code."""
    import uvicorn

    prepared = prepare(args, embedder=embedder)
    sys.stderr.write(f"reflective-memory inspector: {prepared.url}\n")
    if args.db is None:
        sys.stderr.write("(in-memory store: nothing is kept after the server stops; use --db)\n")
    try:
        uvicorn.run(prepared.app, host=prepared.host, port=prepared.port, log_level="warning")
    finally:
        prepared.memory.close()
    return 0
