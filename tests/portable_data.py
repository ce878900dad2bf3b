"""A store with a bit of everything, and a deep comparison of two stores (export/import tests)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.portable import Endpoint

#: Reranker learning happens on every feedback episode, without exploration noise.
CONFIG = {"rerank": {"batch_size": 1, "explore": False}}
QUERIES = ("where does my sister live?", "what is my dog called?", "which city did I move to?")
T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


def embedder() -> HashingEmbedder:
    return HashingEmbedder(dim=64)


def open_memory(path: Path | None = None, *, store: Any = None) -> ReflectiveMemory:
    """A memory with the test settings (idle sessions are never ended on open)."""
    cfg = MemoryConfig(**CONFIG, sessions={"idle_seconds": None})
    return ReflectiveMemory(path, store=store, embedder=embedder(), config=cfg)


def fill(mem: ReflectiveMemory, users: int = 2, sessions: int = 3) -> None:
    """Users with ended and open sessions, timestamps, extras, direct memories, values, state."""
    for u in range(users):
        user = f"user-{u}"
        for s in range(sessions):
            sid = f"s{s}"
            when = T0 + timedelta(days=7 * s, hours=u)
            texts = [
                f"My sister Ana lives in Porto, says {user} in session {s}.",
                "That is lovely, do you visit her?",
                f"My dog is called Pixel {s} and I moved to Lisbon in {2020 + s}.",
                "Noted!",
            ]
            for i, text in enumerate(texts):
                role = ("user", "assistant", "Kate", "assistant")[i]
                stamp = None if s == 1 else when + timedelta(minutes=i)
                mem.add_turn(user, sid, role, text, timestamp=stamp, turn_id=f"{sid}-t{i}")
            mem.store.set_turn_extra(user, sid, {f"{sid}-t2": {"name": "Kate", "n": 2}})
            if s < sessions - 1:  # the last session stays open
                mem.end_session(user, sid)
                mem.store.set_value(f"rmm.reflection/{user}/{sid}", {"topics": s, "ok": True})
        mem.put_memory(
            user,
            "Ana (sister) lives in Porto.",
            granularity="topic",
            session_id="s1",
            turn_ids=["s0-t0", "s1-t0"],
            metadata={"rmm": {"sessions": ["s0", "s1"]}, "as_of": "2024-03-08"},
        )
        mem.put_memory(user, "Prefers short answers.", granularity="note", session_id="s0")
        mem.put_memory(user, "Likes tea.", memory_id=f"item-{u}", metadata={"n": 1.5})
        for q in QUERIES:  # learned state: the shared prior and the user's offsets
            mem.feedback(mem.retrieve(user, q, k=3), cited=[0])


def rankings(mem: ReflectiveMemory, users: list[str]) -> dict[tuple[str, str], list[Any]]:
    """What retrieval returns for the test queries: ids and scores of every hit."""
    out = {}
    for user in users:
        for q in QUERIES:
            r = mem.retrieve(user, q, k=5)
            out[user, q] = [(h.memory.id, round(h.score, 6)) for h in r.hits]
    return out


def snapshot(ep: Endpoint) -> dict[str, Any]:
    """Everything a store holds, comparable across backends (store-wide seqs left out)."""
    store, out = ep.store, {}
    for user in store.users():
        sessions = store.sessions(user)
        out[user] = {
            "sessions": sorted(
                (
                    s.session_id,
                    s.status,
                    s.n_turns,
                    s.first_time,
                    s.last_time,
                    s.created_at,
                    s.ended_at,
                )  # fmt: skip
                for s in sessions
            ),
            "turns": [
                (t.session_id, t.turn_id, t.position, t.role, t.text, t.timestamp)
                for t in store.turns(user)
            ],
            "extras": {s.session_id: store.turn_extra(user, s.session_id) for s in sessions},
            "values": {
                s.session_id: store.get_value(f"rmm.reflection/{user}/{s.session_id}")
                for s in sessions
            },
            "memories": sorted(
                (
                    m.id,
                    m.session_id,
                    m.granularity,
                    m.text,
                    m.key,
                    m.turn_ids,
                    m.created_at,
                    m.updated_at,
                    m.start_time,
                    m.end_time,
                    repr(sorted(m.metadata.items())),
                )  # fmt: skip
                for m in store.memories(user)
            ),
            "vectors": _vectors(ep, user),
            "state": {n: ep.state.get(user, n)[1] for n in ep.state.names(user)},
            "count": store.count(user),
        }
    out["__shared__"] = {n: ep.state.get("__shared__", n)[1] for n in ep.state.names("__shared__")}
    return out


def _vectors(ep: Endpoint, user: str) -> dict[str, tuple[str, bytes]]:
    ids, _, blobs, models = ep.store.embeddings(user)
    return {i: (m, bytes(b)) for i, b, m in zip(ids, blobs, models, strict=True)}
