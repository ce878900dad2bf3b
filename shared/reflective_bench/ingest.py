"""`bench ingest`: ingest throughput (turns/s) next to the bare embedding rate on the same texts.

For every session of the data, in order: the session's raw turn texts are embedded alone by
MiniLM in batches of 64 (no cache: the *bare* rate); the session is ingested in bulk the way the
CLI does (`add_turns`, then `end_session` with the given config); it is ingested again into a
second store message by message, the way a chat app does (`add_turn` per message, timed one by
one, then `end_session`); each text is embedded alone as a query would be (the single-text
reference for `add_turn`); and, with `--peers`, the texts go into LlamaIndex's
`VectorStoreIndex` and LangChain's `InMemoryVectorStore` on the same MiniLM (reference rows, when
installed). Interleaving keeps every row under the same machine load, so their ratios are
meaningful on a busy box even when absolute times drift.

The ingest time is split into stages by timing wrappers around the engine's parts: the
segmenter's embedding call, every other embedding call (unit keys, notes), the segmenter without
its embedding, key denoising, and the store writes; the rest is reported as `other`.

    reflective-memory bench ingest --data ../shared/data/realtalk_dev.json.gz --limit 1 --peers
    reflective-memory bench ingest --data ../shared/data/longmemeval_s_dev100.json.gz --limit 2
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import logging
import pstats
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from reflective_memory.errors import InvalidInputError
from reflective_memory.io import Conversation, load_conversations

__all__ = ["IngestResult", "TimedEmbedder", "run_ingest_bench", "format_result", "register"]

logger = logging.getLogger(__name__)


class TimedEmbedder:
    """An embedder wrapper that adds up the time and texts of every `encode` call.

    Args:
        inner: The embedder to time.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.seconds = 0.0
        self.calls = 0
        self.texts = 0

    @property
    def dim(self) -> int:
        """Vector size of the inner embedder."""
        return int(self.inner.dim)

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed through the inner embedder, timing the call."""
        t0 = time.perf_counter()
        try:
            return self.inner.encode(texts)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            self.texts += 1 if isinstance(texts, str) else len(texts)


def _timed(fn: Callable[..., Any], sink: dict[str, float], key: str) -> Callable[..., Any]:
    # `wraps` keeps the signature visible (the segmenter is asked whether it takes turn vectors)
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - t0

    return run


@dataclass
class IngestResult:
    """Measurements of one `bench ingest` run.

    Attributes:
        conversations: Conversations ingested.
        sessions: Sessions ingested.
        turns: Turns ingested.
        chars: Characters of turn text.
        bare_seconds: Time MiniLM alone took to embed every session's turn texts.
        ingest_seconds: Time `add_turns` + `end_session` took over all sessions.
        stages: Ingest seconds per stage: `embed_segmenter` (the segmenter's embedding call),
            `embed_keys` (every other embedding: unit keys, notes), `segment` (the segmenter
            without its embedding), `denoise`, `store` and `other`.
        embed_calls: Embedder calls made by ingestion.
        embed_texts: Texts given to the embedder by ingestion.
        embedded_texts: Texts the model really embedded (after dedupe and the recent cache).
        memories: Memories built.
        config: The non-default config fields used.
        message_seconds: Time the per-message pattern took (`add_turn` per message, then
            `end_session`), over all sessions.
        add_turn_ms: Each `add_turn` call of the per-message pattern, in ms.
        single_ms: Each text embedded alone (one `str`, no cache), in ms.
        peers: Seconds each reference system took to ingest the same texts.
    """

    conversations: int = 0
    sessions: int = 0
    turns: int = 0
    chars: int = 0
    bare_seconds: float = 0.0
    ingest_seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    embed_calls: int = 0
    embed_texts: int = 0
    embedded_texts: int | None = None
    memories: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    message_seconds: float = 0.0
    add_turn_ms: list[float] = field(default_factory=list)
    single_ms: list[float] = field(default_factory=list)
    peers: dict[str, float] = field(default_factory=dict)

    @property
    def bare_rate(self) -> float:
        """Turns per second of MiniLM alone."""
        return self.turns / self.bare_seconds if self.bare_seconds else 0.0

    @property
    def ingest_rate(self) -> float:
        """Turns per second of ingestion."""
        return self.turns / self.ingest_seconds if self.ingest_seconds else 0.0

    @property
    def ratio(self) -> float:
        """Ingest rate as a fraction of the bare embedding rate."""
        return self.ingest_rate / self.bare_rate if self.bare_rate else 0.0

    @property
    def message_rate(self) -> float:
        """Turns per second of the per-message pattern (0 when it was not run)."""
        return self.turns / self.message_seconds if self.message_seconds else 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary."""

        def pct(xs: list[float], q: float) -> float | None:
            return round(float(np.percentile(xs, q)), 2) if xs else None

        bare = self.bare_rate
        return {
            "conversations": self.conversations,
            "sessions": self.sessions,
            "turns": self.turns,
            "chars": self.chars,
            "bare_seconds": round(self.bare_seconds, 3),
            "ingest_seconds": round(self.ingest_seconds, 3),
            "bare_turns_per_s": round(self.bare_rate, 1),
            "ingest_turns_per_s": round(self.ingest_rate, 1),
            "ratio": round(self.ratio, 3),
            "stages_s": {k: round(v, 3) for k, v in self.stages.items()},
            "embed_calls": self.embed_calls,
            "embed_texts": self.embed_texts,
            "embedded_texts": self.embedded_texts,
            "memories": self.memories,
            "config": self.config,
            "message_seconds": round(self.message_seconds, 3),
            "message_turns_per_s": round(self.message_rate, 1),
            "message_ratio": round(self.message_rate / bare, 3) if bare else 0.0,
            "add_turn_ms": {"p50": pct(self.add_turn_ms, 50), "p95": pct(self.add_turn_ms, 95)},
            "single_embed_ms": {"p50": pct(self.single_ms, 50), "p95": pct(self.single_ms, 95)},
            "add_turn_p50_over_single_p50": (
                round(float(np.median(self.add_turn_ms) / np.median(self.single_ms)), 3)
                if self.add_turn_ms and self.single_ms
                else None
            ),
            "peers": {
                name: {
                    "seconds": round(sec, 3),
                    "turns_per_s": round(self.turns / sec, 1) if sec else 0.0,
                    "ratio": round(self.turns / sec / bare, 3) if sec and bare else 0.0,
                }
                for name, sec in self.peers.items()
            },
        }


def run_ingest_bench(
    conversations: Sequence[Conversation],
    *,
    embedder: Any | None = None,
    bare_embedder: Any | None = None,
    config_overrides: dict[str, Any] | None = None,
    progress: bool = True,
    message_embedder: Any | None = None,
    per_message: bool = True,
    peers: dict[str, Callable[[list[str]], None]] | None = None,
) -> IngestResult:
    """Ingest `conversations` into in-memory stores, timing it against bare embedding.

    Args:
        conversations: Loaded conversations (each goes to its own user).
        embedder: The bulk pattern's embedder (default: the bundled MiniLM).
        bare_embedder: Embeds each session's turn texts alone, in batches of 64, and each text
            alone (default: MiniLM with no cache).
        config_overrides: `MemoryConfig` fields to change from the defaults.
        progress: Show a progress bar over sessions.
        message_embedder: The per-message pattern's embedder, a separate instance so that it
            sees no vector the bulk pattern cached (default: the bundled MiniLM).
        per_message: Also run the per-message pattern and the single-text embeddings.
        peers: Reference systems by name, each ingesting one session's texts per call.

    Returns:
        The measurements.
    """
    from reflective_memory.config import MemoryConfig
    from reflective_memory.embed import SentenceTransformerEmbedder
    from reflective_memory.engine import ReflectiveMemory
    from tqdm import tqdm

    overrides = dict(config_overrides or {})
    config = MemoryConfig(**overrides)
    inner = embedder if embedder is not None else SentenceTransformerEmbedder()
    bare = (
        bare_embedder
        if bare_embedder is not None
        else SentenceTransformerEmbedder(cache_size=0, batch_size=64)
    )
    timed = TimedEmbedder(inner)
    res = IngestResult(conversations=len(conversations), config=overrides)
    stages: dict[str, float] = {}
    counts0 = dict(getattr(inner, "counts", {}) or {})
    bare.encode(["warm up the model"])  # both share the loaded model
    chat = None
    if per_message:
        chat_embedder = (
            message_embedder if message_embedder is not None else SentenceTransformerEmbedder()
        )
        chat = ReflectiveMemory(None, embedder=chat_embedder, config=config)
    with ReflectiveMemory(None, embedder=timed, config=config) as mem:
        seg = mem.segmenter
        seg_segment = seg.segment
        object.__setattr__(seg, "segment", _timed(seg_segment, stages, "segment+embed"))
        writer = mem.sessions
        writer.denoise_keys = _timed(writer.denoise_keys, stages, "denoise")  # type: ignore[method-assign]
        store = mem.store
        for name in ("add_turns", "replace_session_memories", "upsert_memories"):
            setattr(store, name, _timed(getattr(store, name), stages, "store"))
        todo = [(c.user_id, s) for c in conversations for s in c.sessions if s.turns]
        for uid, session in tqdm(todo, desc="bench ingest", unit="session", disable=not progress):
            texts = [t["text"] for t in session.turns]
            t0 = time.perf_counter()
            bare.encode(texts)
            res.bare_seconds += time.perf_counter() - t0
            embed_before = timed.seconds
            seg_before = stages.get("segment+embed", 0.0)
            t0 = time.perf_counter()
            mem.add_turns(
                [{**t, "user_id": uid, "session_id": session.session_id} for t in session.turns]
            )
            mem.end_session(uid, session.session_id)
            res.ingest_seconds += time.perf_counter() - t0
            # the segmenter's own embedding call is counted under `embed`, not `segment`
            seg_embed = min(
                timed.seconds - embed_before, stages.get("segment+embed", 0.0) - seg_before
            )
            stages["segment_embed"] = stages.get("segment_embed", 0.0) + max(seg_embed, 0.0)
            if chat is not None:
                _per_message(chat, uid, session, res)
                for text in texts:
                    t0 = time.perf_counter()
                    bare.encode(text)
                    res.single_ms.append(1000 * (time.perf_counter() - t0))
            for name, ingest in (peers or {}).items():
                t0 = time.perf_counter()
                ingest(texts)
                res.peers[name] = res.peers.get(name, 0.0) + time.perf_counter() - t0
            res.sessions += 1
            res.turns += len(texts)
            res.chars += sum(len(t) for t in texts)
        res.memories = sum(mem.stats(u)["memories"] for u in mem.users())
    if chat is not None:
        chat.close()
    segment_total = stages.pop("segment+embed", 0.0)
    segment_embed = stages.pop("segment_embed", 0.0)
    res.stages = {
        "embed_segmenter": segment_embed,
        "embed_keys": max(timed.seconds - segment_embed, 0.0),
        "segment": max(segment_total - segment_embed, 0.0),
        "denoise": stages.get("denoise", 0.0),
        "store": stages.get("store", 0.0),
    }
    res.stages["other"] = max(res.ingest_seconds - sum(res.stages.values()), 0.0)
    res.embed_calls, res.embed_texts = timed.calls, timed.texts
    counts = getattr(inner, "counts", None)
    if isinstance(counts, dict) and "embedded" in counts:
        res.embedded_texts = int(counts["embedded"]) - int(counts0.get("embedded", 0))
    return res


def _per_message(mem: Any, uid: str, session: Any, res: IngestResult) -> None:
    """Ingest one session message by message, as a chat app does; time each `add_turn`."""
    t_start = time.perf_counter()
    for t in session.turns:
        t0 = time.perf_counter()
        mem.add_turn(
            uid,
            session.session_id,
            t["role"],
            t["text"],
            timestamp=t.get("timestamp"),
            turn_id=t.get("turn_id"),
        )
        res.add_turn_ms.append(1000 * (time.perf_counter() - t0))
    mem.end_session(uid, session.session_id)
    res.message_seconds += time.perf_counter() - t_start


def format_result(res: IngestResult) -> str:
    """A short human-readable report."""
    s = res.summary()
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in res.stages.items())
    lines = [
        f"{s['conversations']} conversations, {s['sessions']} sessions, {s['turns']} turns "
        f"({s['chars'] / max(s['turns'], 1):.0f} chars/turn) -> {s['memories']} memories",
        f"bare MiniLM, batches of 64:        {s['bare_turns_per_s']:.1f} turns/s "
        f"({s['bare_seconds']:.1f}s)",
        f"bulk (add_turns + end_session):    {s['ingest_turns_per_s']:.1f} turns/s "
        f"({s['ingest_seconds']:.1f}s) = {s['ratio']:.2f}x bare",
        f"ingest stages: {stages}",
        f"embedder: {s['embed_calls']} calls, {s['embed_texts']} texts given"
        + (
            f", {s['embedded_texts']} embedded by the model"
            if s["embedded_texts"] is not None
            else ""
        ),
    ]
    if res.message_seconds:
        a, e = s["add_turn_ms"], s["single_embed_ms"]
        lines[3:3] = [
            f"per message (add_turn + end_session): {s['message_turns_per_s']:.1f} turns/s "
            f"({s['message_seconds']:.1f}s) = {s['message_ratio']:.2f}x bare",
            f"add_turn p50 {a['p50']:.1f} ms, p95 {a['p95']:.1f} ms; one text embedded alone "
            f"p50 {e['p50']:.1f} ms, p95 {e['p95']:.1f} ms; add_turn p50 / embedding p50 = "
            f"{s['add_turn_p50_over_single_p50']:.2f}",
        ]
    for name, row in s["peers"].items():
        lines.insert(
            -2,
            f"{name + ':':<34} {row['turns_per_s']:.1f} turns/s ({row['seconds']:.1f}s) = "
            f"{row['ratio']:.2f}x bare",
        )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    overrides = json.loads(args.config) if args.config else {}
    if not isinstance(overrides, dict):
        raise InvalidInputError("--config must be a JSON object of MemoryConfig fields")
    convs = load_conversations(args.data)
    if args.limit is not None:
        convs = convs[: args.limit]
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    peers = None
    if args.peers:
        from reflective_memory.embed import SentenceTransformerEmbedder

        from reflective_bench.ingest_peers import ingest_peers

        peers = ingest_peers(lambda: SentenceTransformerEmbedder(cache_size=0, batch_size=32))
    res = run_ingest_bench(
        convs,
        config_overrides=overrides,
        progress=not args.quiet,
        per_message=not args.bulk_only,
        peers=peers,
    )
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(25)
    print(f"data: {args.data}")  # noqa: T201
    print(format_result(res))  # noqa: T201
    if args.json is not None:
        with open(args.json, "w") as fh:
            json.dump(res.summary(), fh, indent=2)
    return 0


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def register(bench: Any) -> None:
    """Add `bench ingest` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "ingest",
        help="ingest throughput (turns/s) next to the bare MiniLM embedding rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help="conversation file (any format `ingest` reads)")
    p.add_argument("--limit", type=_positive, default=None, help="first N conversations only")
    p.add_argument(
        "--config",
        default=None,
        help='MemoryConfig overrides as JSON, e.g. {"denoise": {"kind": "none"}}',
    )
    p.add_argument("--profile", default=None, help="write cProfile stats here and print the top")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--bulk-only", action="store_true", help="skip the per-message pattern and single texts"
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="add LlamaIndex VectorStoreIndex and LangChain InMemoryVectorStore reference rows",
    )
    p.add_argument("--json", default=None, help="also write the summary as JSON here")
    p.set_defaults(func=_run)
