"""Reading and deleting for the inspector, shared by the pages and the JSON API.

Deletions are verified after the fact: the store is asked again, and the report says whether
anything of the deleted item can still be found (it must not).
"""

from __future__ import annotations

from typing import Any

from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError, UnknownMemoryError, UnknownSessionError
from reflective_memory.rmm.turn_learning import GATE_SIGMAS
from reflective_memory.serve import views
from reflective_memory.serve.context import ServeState
from reflective_memory.serve.security import Principal
from reflective_memory.types import GRANULARITIES

__all__ = [
    "MAX_K",
    "parse_k",
    "users_overview",
    "user_detail",
    "ranker_table",
    "session_detail",
    "memory_detail",
    "search",
    "delete_user",
    "delete_session",
    "delete_memory",
]

#: Most hits a search may ask for.
MAX_K = 50


def parse_k(raw: Any, default: int) -> int:
    """The `k` of a search: a whole number from 1 to `MAX_K` (`None` gives `default`)."""
    if raw is None or raw == "":
        return default
    try:
        k = int(raw)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"k must be a whole number, got {raw!r}") from exc
    if isinstance(raw, bool) or not 1 <= k <= MAX_K:
        raise InvalidInputError(f"k must be between 1 and {MAX_K}, got {raw!r}")
    return k


def users_overview(memory: ReflectiveMemory, who: Principal) -> list[dict[str, Any]]:
    """Every user `who` may see, with their counts."""
    return [{"user_id": uid, **memory.stats(uid)} for uid in memory.users() if who.may_see(uid)]


def _kind_order(kind: str) -> int:
    return GRANULARITIES.index(kind) if kind in GRANULARITIES else len(GRANULARITIES)


def user_detail(memory: ReflectiveMemory, user_id: str) -> dict[str, Any]:
    """A user's counts, sessions, and memories grouped by kind."""
    turns = memory.turns(user_id)
    mems = memory.memories(user_id)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for m in sorted(mems, key=lambda m: (_kind_order(m.granularity), m.created_at, m.id)):
        by_kind.setdefault(m.granularity, []).append(views.memory_view(m))
    return {
        "stats": memory.stats(user_id),
        "sessions": views.session_views(turns, memory.open_sessions(user_id), mems),
        "memories_by_kind": by_kind,
        "ranker": ranker_table(memory, user_id),
    }


def ranker_table(memory: ReflectiveMemory, user_id: str) -> dict[str, Any]:
    """The turn ranker's weights for a user next to the prior's, one row per feature.

    Returns:
        `{"rows": [{"feature", "prior", "shared", "user", "weight"}, ...], "episodes": n,
        "user_episodes": n, "shared_serves": bool, "user_serves": bool, "shared_t": x,
        "user_t": x, "gate_t": x}`: the fitted prior, what every user's citations added, what
        this user's added, the weight that ranks the user's turns, whether each taught part
        ranks (passed its gate) and its mean gain in standard errors (it ranks above
        `gate_t`).
    """
    got = memory.ranker_weights(user_id)
    rows = [
        {
            "feature": name,
            "prior": round(got["prior"][name], 4),
            "shared": round(got["shared"][name], 4),
            "user": round(got["user"][name], 4),
            "weight": round(got["weights"][name], 4),
        }
        for name in got["features"]
    ]
    return {
        "rows": rows,
        "episodes": got["episodes"],
        "user_episodes": got["user_episodes"],
        "shared_serves": got["shared_gate"]["serves"],
        "user_serves": got["user_gate"]["serves"],
        "shared_t": round(got["shared_gate"]["t"], 2),
        "user_t": round(got["user_gate"]["t"], 2),
        "gate_t": GATE_SIGMAS,
    }


def session_detail(memory: ReflectiveMemory, user_id: str, session_id: str) -> dict[str, Any]:
    """A session's turns and the memories built from it (or citing its turns).

    Raises:
        UnknownSessionError: The user has no turns in that session.
    """
    turns = memory.turns(user_id, session_id)
    if not turns:
        raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
    turn_ids = {t.turn_id for t in turns}
    mems = [
        views.memory_view(m)
        for m in memory.memories(user_id)
        if m.session_id == session_id or turn_ids.intersection(m.turn_ids)
    ]
    return {
        "turns": [views.turn_view(t) for t in turns],
        "memories": mems,
        "open": session_id in memory.open_sessions(user_id),
    }


def memory_detail(memory: ReflectiveMemory, user_id: str, memory_id: str) -> dict[str, Any]:
    """One memory and the stored turns it was built from.

    Raises:
        UnknownMemoryError: The user has no memory with that id.
    """
    m = memory.get_memory(user_id, memory_id)
    wanted = set(m.turn_ids)
    sources = [views.turn_view(t) for t in memory.turns(user_id) if t.turn_id in wanted]
    return {
        "memory": views.memory_view(m),
        "sources": sources,
        "missing_sources": sorted(wanted - {t["turn_id"] for t in sources}),
    }


def search(memory: ReflectiveMemory, user_id: str, query: Any, k: int) -> dict[str, Any]:
    """Retrieve for a query and describe the ranking.

    Raises:
        InvalidInputError: The query is empty.
    """
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("the search query must not be empty")
    return views.retrieval_view(memory.retrieve(user_id, query.strip(), k=k))


def delete_user(st: ServeState, user_id: str) -> dict[str, Any]:
    """Delete a user; verify that no turn, memory or listing of them is left."""
    mem = st.memory
    before = mem.stats(user_id)
    n = mem.delete_user(user_id)
    st.chat.forget(user_id)
    gone = user_id not in mem.users() and not mem.turns(user_id) and not mem.memories(user_id)
    message = f"Deleted user {user_id}: {n} turns and {before['memories']} memories. " + (
        "Verified: nothing of this user is left in the store."
        if gone
        else "WARNING: something of this user is still stored."
    )
    return {
        "deleted": "user",
        "user_id": user_id,
        "turns": n,
        "memories": before["memories"],
        "verified_gone": gone,
        "message": message,
    }


def delete_session(st: ServeState, user_id: str, session_id: str) -> dict[str, Any]:
    """Delete a session; verify that its turns and memories are gone."""
    mem = st.memory
    if not mem.turns(user_id, session_id):
        raise UnknownSessionError(f"user {user_id!r} has no session {session_id!r}")
    n_mem = sum(1 for m in mem.memories(user_id) if m.session_id == session_id)
    n = mem.delete_session(user_id, session_id)
    st.chat.forget(user_id, session_id)
    gone = not mem.turns(user_id, session_id) and not any(
        m.session_id == session_id for m in mem.memories(user_id)
    )
    message = f"Deleted session {session_id}: {n} turns and {n_mem} memories. " + (
        "Verified: the session is gone." if gone else "WARNING: part of it is still stored."
    )
    return {
        "deleted": "session",
        "user_id": user_id,
        "session_id": session_id,
        "turns": n,
        "memories": n_mem,
        "verified_gone": gone,
        "message": message,
    }


def delete_memory(st: ServeState, user_id: str, memory_id: str) -> dict[str, Any]:
    """Delete one memory; verify that it can no longer be read or retrieved."""
    mem = st.memory
    target = mem.get_memory(user_id, memory_id)  # 404 before anything changes
    mem.delete_memory(user_id, memory_id)
    st.chat.forget_memory(user_id, memory_id)
    try:
        mem.get_memory(user_id, memory_id)
        readable = True
    except UnknownMemoryError:
        readable = False
    probe = target.key.strip() or target.text.strip()
    retrieved = bool(probe) and any(
        h.memory.id == memory_id for h in mem.retrieve(user_id, probe[:500], k=MAX_K).hits
    )
    gone = not readable and not retrieved
    message = f"Deleted {target.granularity} memory {memory_id}. " + (
        "Verified: it can no longer be read or retrieved."
        if gone
        else "WARNING: it can still be found."
    )
    return {
        "deleted": "memory",
        "user_id": user_id,
        "memory_id": memory_id,
        "verified_gone": gone,
        "message": message,
    }
