"""`reflective-memory bench conditional`: conditional notes measured offline on LongMemEval.

Two measurements, both without a real LLM:

1. **Memorize rate** of the offline heuristic: notes kept per 100 turns (and per 100 user turns),
   how many evidence user turns (`has_answer`) it keeps, and the note length. The LLM path's cost
   is measured on the same sessions by running the real note-making code against a scripted LLM
   that answers nothing usable: calls per session and prompt tokens (the code path falls back to
   the heuristic, so nothing else changes).
2. **Evidence coverage under a word budget** (see the data README) for the views `segment`,
   `note+segment` and `note`: rank the question's memories, pack them in rank order into N words
   (a unit that does not fit is skipped, later smaller ones may fill the rest), and count the
   fraction of evidence turns covered, averaged over questions. A segment covers its turns; a note
   covers only the user turn it was written from (not its context turns), so notes get no credit
   for text they do not hold. The self-reflection prompt size is measured with a scripted judge
   that always answers "enough" (one call per query at the default one round).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflective_memory.conditional.notes import build_note_drafts, heuristic_decisions
from reflective_memory.config import MemoryConfig
from reflective_memory.embed import Embedder
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError
from reflective_memory.llm import LLMClient
from reflective_memory.text import parse_timestamp
from reflective_memory.types import Memory, Turn, Usage
from tqdm import tqdm

from reflective_bench.retrieval import add_embedder_arguments, make_embedder

__all__ = ["register", "run", "main", "coverage_at", "VIEWS"]

logger = logging.getLogger(__name__)

BUDGETS = (250, 500, 1000, 2000, 4000)
#: View name -> memory kinds searched.
VIEWS = {"segment": ("segment",), "note+segment": ("note", "segment"), "note": ("note",)}


def _load(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        raise InvalidInputError(f"data file {str(p)!r} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _turns(q: dict[str, Any], s: int) -> list[Turn]:
    ids = q["haystack_session_ids"]
    sid = ids[s] if ids.index(ids[s]) == s else f"{ids[s]}#{s}"  # a haystack may repeat a session
    ts = parse_timestamp(q["haystack_dates"][s])
    return [
        Turn(q["question_id"], sid, t["role"], t["content"], f"{sid}:{i}", i, ts)
        for i, t in enumerate(q["haystack_sessions"][s])
    ]


def memorize_stats(data: Sequence[dict[str, Any]], note_prompt_chars: int) -> dict[str, Any]:
    """Heuristic memorize rate and the LLM path's call cost over every session of `data`."""
    turns = user_turns = kept = evidence = evidence_kept = sessions = 0
    note_words: list[int] = []
    usage = Usage()
    silent = LLMClient(lambda prompt: "")
    quiet = logging.getLogger("reflective_memory.conditional.notes")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # every scripted answer is unusable on purpose
    for q in tqdm(data, desc="memorize", leave=False):
        for s in range(len(q["haystack_sessions"])):
            session = _turns(q, s)
            sessions += 1
            turns += len(session)
            raw = q["haystack_sessions"][s]
            for d in heuristic_decisions(session):
                user_turns += 1
                kept += d.keep
                if raw[d.position].get("has_answer"):
                    evidence += 1
                    evidence_kept += d.keep
            drafts, _ = build_note_drafts(
                session, silent, max_prompt_chars=note_prompt_chars, usage=usage
            )
            note_words.extend(len(d.text.split()) for d in drafts)
    quiet.setLevel(level)
    return {
        "questions": len(data),
        "sessions": sessions,
        "turns": turns,
        "user_turns": user_turns,
        "notes": kept,
        "notes_per_100_turns": 100 * kept / max(turns, 1),
        "notes_per_100_user_turns": 100 * kept / max(user_turns, 1),
        "evidence_user_turns": evidence,
        "evidence_user_turns_kept": evidence_kept,
        "mean_note_words": sum(note_words) / max(len(note_words), 1),
        "llm_calls_per_session": usage.llm_calls / max(sessions, 1),
        "llm_prompt_tokens_per_session": usage.prompt_tokens / max(sessions, 1),
        "llm_prompt_tokens_per_100_turns": 100 * usage.prompt_tokens / max(turns, 1),
    }


def coverage_at(
    memories: Sequence[Memory], evidence: set[str], budgets: Sequence[int]
) -> list[float]:
    """Fraction of `evidence` turn ids covered when packing `memories` into each word budget.

    A note covers only its source turn; any other unit covers all its `turn_ids`.
    """
    out = []
    for budget in budgets:
        used, covered = 0, set()
        for m in memories:
            words = len(m.text.split())
            if used + words > budget:
                continue
            used += words
            if m.granularity == "note":
                covered.add(m.metadata.get("source_turn_id", m.turn_ids[0]))
            else:
                covered.update(m.turn_ids)
        out.append(len(covered & evidence) / len(evidence))
    return out


def coverage(
    data: Sequence[dict[str, Any]],
    embedder: Embedder,
    *,
    segment_window: int,
    candidates: int,
    budgets: Sequence[int] = BUDGETS,
) -> dict[str, Any]:
    """Build segments + notes per question and measure coverage for every view."""
    sums = {v: [0.0] * len(budgets) for v in VIEWS}
    n = 0
    reflect_tokens: list[int] = []
    t0 = time.perf_counter()
    cfg = MemoryConfig(
        units={"granularities": ("segment",)},
        segment={"window": segment_window},
        conditional={"notes": True},
    )
    for q in tqdm(data, desc="coverage", leave=False):
        judge = _EnoughJudge()
        with ReflectiveMemory(embedder=embedder, config=cfg) as mem:  # offline notes
            uid = q["question_id"]
            evidence: set[str] = set()
            for s in range(len(q["haystack_sessions"])):
                session = _turns(q, s)
                mem.add_turns(
                    {
                        "user_id": uid,
                        "session_id": t.session_id,
                        "role": t.role,
                        "text": t.text,
                        "timestamp": t.timestamp,
                        "turn_id": t.turn_id,
                    }
                    for t in session
                )
                mem.end_session(uid, session[0].session_id)
                raw = q["haystack_sessions"][s]
                evidence.update(t.turn_id for t in session if raw[t.position].get("has_answer"))
            if not evidence:
                continue
            n += 1
            for view, kinds in VIEWS.items():
                r = mem.retrieve(uid, q["question"], k=candidates, views=kinds)
                for i, c in enumerate(coverage_at(r.memories, evidence, budgets)):
                    sums[view][i] += c
            mem.llm = LLMClient(judge)
            r = mem.retrieve(uid, q["question"], budget_tokens=1000, reflect=True)
            reflect_tokens.append(r.usage.prompt_tokens)
    return {
        "questions": n,
        "budgets": list(budgets),
        "coverage": {v: [x / max(n, 1) for x in sums[v]] for v in VIEWS},
        "reflection_prompt_tokens_at_1000": sum(reflect_tokens) / max(len(reflect_tokens), 1),
        "seconds": time.perf_counter() - t0,
    }


class _EnoughJudge:
    """Scripted self-reflection judge: always "enough" (measures the call's prompt size)."""

    def __call__(self, prompt: str) -> str:
        return "ENOUGH\n[0] (scripted)"


def _table(result: dict[str, Any]) -> str:
    lines = []
    m = result["memorize"]
    lines.append("| measure | value |")
    lines.append("|---|---|")
    for key in (
        "questions",
        "sessions",
        "turns",
        "user_turns",
        "notes",
        "notes_per_100_turns",
        "notes_per_100_user_turns",
        "evidence_user_turns",
        "evidence_user_turns_kept",
        "mean_note_words",
        "llm_calls_per_session",
        "llm_prompt_tokens_per_session",
        "llm_prompt_tokens_per_100_turns",
    ):
        val = m[key]
        lines.append(f"| {key} | {val:.2f} |" if isinstance(val, float) else f"| {key} | {val} |")
    cov = result.get("coverage")
    if cov:
        lines.append("")
        head = " | ".join(f"@{b}w" for b in cov["budgets"])
        lines.append(f"| view | {head} |")
        lines.append("|---" * (len(cov["budgets"]) + 1) + "|")
        for view, vals in cov["coverage"].items():
            lines.append(f"| {view} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        lines.append("")
        lines.append(
            f"questions: {cov['questions']}; self-reflection prompt tokens per query at a "
            f"1000-token budget: {cov['reflection_prompt_tokens_at_1000']:.0f}; "
            f"time: {cov['seconds']:.0f} s"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed arguments; print a Markdown table (and JSON if asked)."""
    data = _load(args.data)
    if args.limit is not None:
        data = data[: args.limit]
    result: dict[str, Any] = {"data": str(args.data)}
    result["memorize"] = memorize_stats(data, args.note_prompt_chars)
    if not args.skip_coverage:
        embedder = make_embedder(args.embedder, args.cache)
        result["coverage"] = coverage(
            data[:: max(args.coverage_every, 1)],
            embedder,
            segment_window=args.segment_window,
            candidates=args.candidates,
        )
    text = _table(result)
    print(text)  # noqa: T201 - command output
    if args.json is not None:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


def register(bench_subparsers: Any) -> None:
    """Add the `conditional` bench subcommand."""
    p = bench_subparsers.add_parser(
        "conditional",
        help="conditional notes: heuristic memorize rate and coverage with notes vs segments",
    )
    _arguments(p)
    p.set_defaults(func=run)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="longmemeval_s_dev100.json(.gz)")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument(
        "--coverage-every",
        type=int,
        default=1,
        help="coverage on every Nth question only (the memorize statistics use all)",
    )
    p.add_argument("--segment-window", type=int, default=6)
    p.add_argument("--candidates", type=int, default=300, help="ranked units per view")
    p.add_argument("--note-prompt-chars", type=int, default=12_000)
    add_embedder_arguments(p)
    p.add_argument("--skip-coverage", action="store_true", help="memorize statistics only")
    p.add_argument("--json", default=None, help="also write the results here")


def main(argv: Sequence[str] | None = None) -> int:
    """Run standalone: `python -m reflective_bench.conditional --data ...`."""
    p = argparse.ArgumentParser(prog="reflective-memory bench conditional")
    _arguments(p)
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
