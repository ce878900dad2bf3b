"""Plain, JSON-ready views of memories, turns, sessions and retrievals for pages and the API.

Retrieval diagnostics are read defensively (`.get`): the engine's diagnostics grow over time and
an absent field is shown as unknown rather than failing the page.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from reflective_memory.text import format_date
from reflective_memory.types import Hit, Memory, Retrieval, Turn

__all__ = [
    "iso",
    "turn_view",
    "memory_view",
    "session_views",
    "hit_view",
    "retrieval_view",
    "rerank_movement",
    "exchange_view",
    "feedback_view",
]


def iso(ts: datetime | None) -> str | None:
    """ISO-8601 text of a time, or None."""
    return None if ts is None else ts.isoformat()


def _num(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def turn_view(turn: Turn) -> dict[str, Any]:
    """A stored turn."""
    return {
        "turn_id": turn.turn_id,
        "session_id": turn.session_id,
        "position": turn.position,
        "role": turn.role,
        "text": turn.text,
        "timestamp": iso(turn.timestamp),
    }


def memory_view(memory: Memory) -> dict[str, Any]:
    """A memory unit with its provenance (source session and turn ids)."""
    return {
        "memory_id": memory.id,
        "session_id": memory.session_id,
        "granularity": memory.granularity,
        "text": memory.text,
        "key": memory.key,
        "turn_ids": list(memory.turn_ids),
        "date": format_date(memory.start_time) or None,
        "start_time": iso(memory.start_time),
        "end_time": iso(memory.end_time),
        "created_at": iso(memory.created_at),
        "updated_at": iso(memory.updated_at),
        "metadata": dict(memory.metadata),
    }


def session_views(
    turns: Iterable[Turn], open_ids: Iterable[str], memories: Iterable[Memory] = ()
) -> list[dict[str, Any]]:
    """One row per session of a user's turns, in order of first appearance.

    Args:
        turns: All of the user's turns (`ReflectiveMemory.turns(user_id)`).
        open_ids: Sessions not yet turned into memories.
        memories: The user's memories, to count them per session.
    """
    open_set = set(open_ids)
    rows: dict[str, dict[str, Any]] = {}
    for t in turns:
        row = rows.setdefault(
            t.session_id,
            {
                "session_id": t.session_id,
                "status": "open" if t.session_id in open_set else "ended",
                "n_turns": 0,
                "first_time": iso(t.timestamp),
                "last_time": None,
                "n_memories": 0,
            },
        )
        row["n_turns"] += 1
        if t.timestamp is not None:
            row["last_time"] = iso(t.timestamp)
            row["first_time"] = row["first_time"] or iso(t.timestamp)
    for m in memories:
        if m.session_id in rows:
            rows[m.session_id]["n_memories"] += 1
    return list(rows.values())


def rerank_movement(diagnostics: dict[str, Any], memory_id: str) -> dict[str, int | None]:
    """Where the reranker moved a memory: retriever rank, reranked rank, places moved up."""
    info = diagnostics.get("rerank")
    before = after = None
    if isinstance(info, dict):
        retriever = info.get("retriever_order") or []
        reranked = info.get("reranked_order") or []
        if memory_id in retriever:
            before = list(retriever).index(memory_id)
        if memory_id in reranked:
            after = list(reranked).index(memory_id)
    moved = None if before is None or after is None else before - after
    return {"retriever_rank": before, "reranked_rank": after, "moved_up": moved}


def hit_view(
    hit: Hit,
    position: int,
    diagnostics: dict[str, Any],
    *,
    cited: Sequence[int] = (),
    mark: bool | None = None,
) -> dict[str, Any]:
    """A hit with everything that explains it: scores, path, reranker movement, citation."""
    view = memory_view(hit.memory)
    view.update(
        {
            "position": position,
            "rank": hit.rank,
            "score": _num(hit.score),
            "scores": {k: _num(v) for k, v in (hit.scores or {}).items()},
            "path": diagnostics.get("path"),
            "cited": position in set(cited),
            "mark": mark,
        }
    )
    view.update(rerank_movement(diagnostics, hit.memory.id))
    return view


def retrieval_view(
    retrieval: Retrieval,
    *,
    cited: Sequence[int] = (),
    marks: dict[int, bool] | None = None,
) -> dict[str, Any]:
    """A retrieval's hits and diagnostics (path, gate, candidates, reranker, timings, usage)."""
    diag = retrieval.diagnostics if isinstance(retrieval.diagnostics, dict) else {}
    marks = marks or {}
    rerank = diag.get("rerank") if isinstance(diag.get("rerank"), dict) else None
    recall = diag.get("recall") if isinstance(diag.get("recall"), dict) else {}
    timings = diag.get("timings_ms") if isinstance(diag.get("timings_ms"), dict) else {}
    return {
        "retrieval_id": retrieval.retrieval_id,
        "user_id": retrieval.user_id,
        "query": retrieval.query,
        "path": diag.get("path"),
        "mode": diag.get("mode"),
        "index_size": diag.get("index_size"),
        "candidates": diag.get("candidates"),
        "gate": {
            "mean_score": _num(diag.get("mean_score", recall.get("mean_score"))),
            "entropy": _num(diag.get("entropy", recall.get("entropy"))),
            "rounds": diag.get("rounds", recall.get("rounds")),
        },
        "rerank": None
        if rerank is None
        else {k: rerank.get(k) for k in ("scope", "top_k", "top_m", "explored", "updates")},
        "timings_ms": {str(k): _num(v) for k, v in timings.items()},
        "usage": retrieval.usage.as_dict(),
        "hits": [
            hit_view(h, i, diag, cited=cited, mark=marks.get(i))
            for i, h in enumerate(retrieval.hits)
        ],
    }


def exchange_view(ex: Any) -> dict[str, Any]:
    """An exchange for the chat page and the API."""
    ans = ex.answer
    fb = [feedback_view(r) for r in ex.feedback]
    return {
        "exchange_id": ex.exchange_id,
        "session_id": ex.session_id,
        "message": ex.message,
        "reply": ans.text,
        "reply_raw": ans.raw,
        "source": ans.source,
        "cited": list(ans.cited),
        "no_cite": ans.no_cite,
        "fallback_reason": ans.fallback_reason,
        "answer_ms": ans.ms,
        "llm_usage": ans.usage.as_dict(),
        "retrieval": retrieval_view(ex.retrieval, cited=ans.cited, marks=ex.marks),
        "auto_feedback": None if ex.auto_feedback is None else feedback_view(ex.auto_feedback),
        "feedback": fb,
        "judged_cited": ex.judged_cited(),
        "user_turn_id": ex.user_turn_id,
        "assistant_turn_id": ex.assistant_turn_id,
        "created_at": iso(ex.created_at),
    }


def feedback_view(result: Any) -> dict[str, Any]:
    """A `FeedbackResult` as plain data."""
    return {
        "learned": result.learned,
        "cited": list(result.cited),
        "rewards": dict(result.rewards),
        "updates": result.updates,
        "pending": result.pending,
        "loss": result.loss,
        "inferred": result.inferred,
        "no_cite": result.no_cite,
        "reason": result.reason,
    }
