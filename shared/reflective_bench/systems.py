"""Named retrieval systems for `bench retrieval`: the library default, plain baselines, ablations.

Every system is a `ReflectiveMemory` built from a config; the bench ingests a conversation into
each (add the turns, end each session), asks every question and measures evidence coverage
inside what the system returns for a budget of N words:

* **passage systems** (the default `ReflectiveMemory()` and its ablations) are asked with
  `retrieve(budget_tokens=N)` and a memory that counts its budget in whitespace words
  (`budget_unit="words"`, the bench's unit); coverage is the fraction of evidence turns inside
  the returned passages, which hold those turns whole, headers included in the N words;
* **plain systems** (the baselines a user can write in twenty lines: one unit per turn or per
  5-turn window, raw keys, no reranker) return a ranking that the bench packs in rank order into
  N words (a unit that does not fit is skipped), as in issue 2.

Every question is asked with `now=` its date when the data has one (LongMemEval's
`question_date`), as an app knows when its user asks. Latency is one `retrieve` per question
(a budget of 1,000 words for passage systems, `k=10` for plain ones), after a warm-up query;
the query is always embedded for real.

Two tables follow the budget tables:

* **top-k** (`topk`, 5 by default; 0 leaves it out): what `retrieve(user, question, k=5)` returns:
  the fraction of evidence turns inside the returned hits, their mean word count and the call's
  p50 latency (query embedded for real). Passage systems return their top 5 turns, plain
  systems their top 5 units (turns, or windows). Beside them, the row `default · retrieve()` is
  the call the adapters make by default: `retrieve(user, question)` on the default system as
  shipped (its budget counted in tokens, `search.default_budget_tokens`), a second copy of the
  default ingested for it (in-memory runs only);
* **session recall**: recall_any@k / recall_all@k and NDCG@10 over the first k distinct
  sessions of each system's whole ranking (`retrieve(k=<all units>)`: turns for passage
  systems, units for plain ones), as LongMemEval's session-level recall counts them (its
  R@5 is `any@5`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.config import MemoryConfig
from reflective_memory.embed import Embedder
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.io import Conversation, ingest_conversations
from reflective_memory.segment.base import FixedWindowSegmenter
from reflective_memory.types import Retrieval
from tqdm import tqdm

from reflective_bench.perturb import Copies
from reflective_bench.retrieval import session_ndcg

__all__ = [
    "FOLDS",
    "QUESTION_FOLDS",
    "fold_of",
    "System",
    "BASELINES",
    "ABLATIONS",
    "system_by_name",
    "SystemsResult",
    "run_systems",
    "format_systems",
    "RepeatQuery",
    "covered",
]

#: A system's `passages.ranker` that means: each conversation's fold model (`--ranker-folds`).
FOLDS = "<fold model>"
#: Folds of the conversations that hold one question each (LongMemEval).
QUESTION_FOLDS = 5


def fold_of(conv: Conversation) -> str:
    """The fold a conversation is scored in: itself (many questions) or a question fold.

    A conversation of many questions (a chat) is its own fold: leave one chat out. One of a
    single question (LongMemEval) falls in one of `QUESTION_FOLDS` folds by a hash of its id.
    """
    h = hashlib.sha1(conv.user_id.encode()).hexdigest()
    if len(conv.questions) > 1:
        return f"chat-{h[:10]}"
    return f"questions-{int(h, 16) % QUESTION_FOLDS}"


_PLAIN: dict[str, dict[str, Any]] = {
    "denoise": {"kind": "none"},
    "rerank": {"enabled": False},
    "passages": {"enabled": False},
}


def _plain(**groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A plain baseline's nested overrides: no reranker, no passages, no speakers in keys."""
    units = {"speaker_keys": False, **groups.pop("units", {})}
    return {**_PLAIN, "units": units, **groups}


@dataclass(frozen=True)
class System:
    """One configuration under test.

    Attributes:
        name: Row label.
        config: Nested `MemoryConfig` overrides (merged into the library defaults).
        mode: Retrieval mode passed to `retrieve` (`None`: the config's).
        window: Fixed-window segmenter of this many turns (plain window baselines).
        what: One line saying what the row is.
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None
    window: int | None = None
    what: str = ""

    @property
    def passages(self) -> bool:
        """Whether the system returns passages (packed by the engine)."""
        return bool(self.config.get("passages", {}).get("enabled", True))

    def build(
        self,
        embedder: Embedder,
        denoiser: Any | None = None,
        store: Any | None = None,
        *,
        words: bool = True,
    ) -> ReflectiveMemory:
        """A fresh `ReflectiveMemory` of this system (in memory, or on an empty `store`).

        With `words` a passage system counts its budgets in words (the bench's unit); without,
        in tokens, as shipped.
        """
        # the bench ends every session itself; nothing ends on idle time or turn count
        config = MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})
        if self.passages and words:
            config = config.replace(passages={"budget_unit": "words"})
        config = config.replace(**self.config)
        segmenter = FixedWindowSegmenter(self.window) if self.window is not None else None
        return ReflectiveMemory(
            None,
            embedder=embedder,
            config=config,
            segmenter=segmenter,
            denoiser=denoiser,
            store=store,
        )


DEFAULT = System("default", {}, what="ReflectiveMemory() as shipped")
BASELINES = (
    System(
        "turn dense",
        _plain(units={"granularities": ("turn",)}),
        mode="dense",
        what="one unit per turn, MiniLM top-k",
    ),
    System(
        "turn dense+BM25",
        _plain(units={"granularities": ("turn",)}),
        mode="hybrid",
        what="one unit per turn, MiniLM and BM25 fused by reciprocal rank",
    ),
    System(
        "5-turn window BM25",
        _plain(units={"granularities": ("segment",)}),
        mode="lexical",
        window=5,
        what="fixed windows of 5 turns, BM25",
    ),
)
ABLATIONS = (
    System("- segment keys", {"units": {"granularities": ("turn",)}}, what="turn keys only"),
    System(
        "- segment context votes",
        {"passages": {"context_weight": 0.0}},
        what="segments searched, no vote",
    ),
    System("- recency", {"passages": {"recency": False}}, what="no time-aware boost"),
    System("- time frame", {"passages": {"time_frame": False}}, what="no time-anchored boost"),
    System(
        "- length-aware packing",
        {"passages": {"length_exponent": 0.0}},
        what="passages packed in vote order",
    ),
    System(
        "- speaker in keys", {"units": {"speaker_keys": False}}, what="BM25 keys without speakers"
    ),
    System(
        "- speaker focus",
        {"passages": {"speaker_focus": False}},
        what="a named speaker is searched for like any word",
    ),
    System(
        "- date headers", {"units": {"date_prefix": False}}, what="passages without a date header"
    ),
    System("- reranker stage", {"rerank": {"enabled": False}}, what="untrained reranker removed"),
    System(
        "+ offline denoiser", {"denoise": {"kind": "offline"}}, what="denoised keys (re-embedded)"
    ),
    System(
        "+ RF-Mem gate",
        {"recall": {"mode": "rfmem"}},
        what="RF-Mem, gate fitted per embedder (bench fit-gate)",
    ),
    System(
        "- person focus",
        {"passages": {"person_focus": False}},
        what="I/my questions do not favour the user's turns, nor 'you said' the assistant's",
    ),
    System(
        "learned ranker, cross-validated",
        {"passages": {"ranker": FOLDS}},
        what="each conversation scored by the model fitted without its fold (--ranker-folds)",
    ),
    System(
        "- excerpts",
        {"passages": {"excerpt_length": 0}},
        what="whole turns only: a long turn is read whole or not at all",
    ),
)


def variant_system(spec: str, folds: bool = False) -> System:
    """The default with one setting changed: `GROUP.FIELD=VALUE` (VALUE read as JSON).

    The row is named by the spec itself, so `bench cv-settings` can read back which setting
    and value it ran. With `folds`, each conversation is scored by its fold's ranker model,
    unless the setting is the ranker itself (`passages.ranker=FILE` runs FILE, as its row
    says).
    """
    path, sep, raw = spec.partition("=")
    group, dot, name = path.strip().partition(".")
    if not sep or not dot or not group or not name:
        raise ConfigError(
            f"a variant is GROUP.FIELD=VALUE, e.g. passages.context_weight=0.5: {spec!r}"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw.strip()
    config: dict[str, dict[str, Any]] = {group: {name: value}}
    if folds and (group, name) != ("passages", "ranker"):
        config.setdefault("passages", {})["ranker"] = FOLDS
    MemoryConfig().replace(**{group: {name: value}})  # a bad setting fails before any work
    return System(
        f"{group}.{name}={json.dumps(value)}", config, what="the default, one setting changed"
    )


def system_by_name(name: str) -> System:
    """Look a system up by its row name (default, baselines, ablations)."""
    for s in (DEFAULT, *BASELINES, *ABLATIONS):
        if s.name == name:
            return s
    raise ConfigError(f"unknown bench system {name!r}")


@dataclass
class SystemsResult:
    """Numbers of one `run_systems` call."""

    coverage: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    by_type: dict[tuple[str, str, int], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    latency_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ingest: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))
    paths: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    over_budget: int = 0
    questions: int = 0
    topk: int = 0
    topk_coverage: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    topk_words: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    topk_latency_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    recall: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    #: (system, conversation id, budget or `k=5`) -> each question's coverage
    by_conversation: dict[tuple[str, str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    #: conversation id -> its cross-validation fold (`fold_of`)
    folds: dict[str, str] = field(default_factory=dict)

    def _by_conversation(self) -> dict[str, dict[str, dict[str, list[float]]]]:
        """`{system: {conversation: {cell: [sum of coverage, questions]}}}`."""
        out: dict[str, dict[str, dict[str, list[float]]]] = {}
        for (s, c, b), v in self.by_conversation.items():
            out.setdefault(s, {}).setdefault(c, {})[b] = [float(np.sum(v)), len(v)]
        return out

    def _by_question(self) -> dict[str, dict[str, dict[str, list[float]]]]:
        """`{system: {conversation: {cell: [each question's coverage, in order]}}}`."""
        out: dict[str, dict[str, dict[str, list[float]]]] = {}
        for (s, c, b), v in self.by_conversation.items():
            out.setdefault(s, {}).setdefault(c, {})[b] = [float(x) for x in v]
        return out

    def summary(self) -> dict[str, Any]:
        """Plain-dict means (JSON-friendly)."""
        return {
            "questions": self.questions,
            "over_budget": self.over_budget,
            "coverage": {f"{s}/{b}": float(np.mean(v)) for (s, b), v in self.coverage.items()},
            "coverage_by_type": {
                f"{s}/{t}/{b}": float(np.mean(v)) for (s, t, b), v in self.by_type.items()
            },
            "latency_ms": {
                s: {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95))}
                for s, v in self.latency_ms.items()
            },
            "ingest_turns_per_s": {
                s: float(v[1] / max(v[0], 1e-9)) for s, v in self.ingest.items()
            },
            "paths": {
                s: {p: v.count(p) / len(v) for p in sorted(set(v))} for s, v in self.paths.items()
            },
            "topk": {
                s: {
                    "k": self.topk,
                    "coverage": float(np.mean(v)),
                    "mean_words": float(np.mean(self.topk_words[s])),
                    "p50_ms": float(np.percentile(self.topk_latency_ms[s], 50)),
                }
                for s, v in self.topk_coverage.items()
            },
            "session_recall": {f"{s}/{n}": float(np.mean(v)) for (s, n), v in self.recall.items()},
            "coverage_by_conversation": self._by_conversation(),
            "coverage_by_question": self._by_question(),
            "folds": dict(self.folds),
        }


#: What `RepeatQuery.forget` embeds, untimed, before a timed call.
_PRIMER = "what did we talk about last time"


class RepeatQuery:
    """Embedder wrapper that reuses the vector of the query embedded just before.

    Each question is asked once for the latency (embedded for real) and then once per budget;
    the repeats reuse that vector so the bench does not pay the query embedding five more times.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self._last: tuple[str, np.ndarray] | None = None

    @property
    def dim(self) -> int:
        """The inner embedder's dimension."""
        return self.inner.dim

    def encode(self, texts: Any) -> np.ndarray:
        """Embed `texts`; a single text equal to the last one reuses its vector."""
        if isinstance(texts, str):
            if self._last is not None and self._last[0] == texts:
                return self._last[1]
            vec = self.inner.encode(texts)
            self._last = (texts, vec)
            return vec
        return self.inner.encode(texts)

    def forget(self) -> None:
        """Embed the next query for real (before a timed call).

        An untimed query is embedded first, so every timed call finds the model as warm as
        the others do: the work a system's untimed warm-up did before (building its caches)
        must not slow the timed call's embedding.
        """
        self.inner.encode(_PRIMER)
        self._last = None


def covered(retrieval: Retrieval, evidence: set[str], budget: int = 0) -> tuple[float, int]:
    """Fraction of `evidence` turns inside a passage answer, and the answer's words."""
    words = sum(len(h.memory.text.split()) for h in retrieval.hits)
    got: set[str] = set()
    for h in retrieval.hits:
        got.update(h.memory.turn_ids)
    return len(evidence & got) / len(evidence), words


def run_systems(
    conversations: Sequence[Conversation],
    systems: Sequence[System],
    *,
    embedder: Embedder,
    budgets: Sequence[int],
    coverage_fn: Callable[[Retrieval, set[str], int], tuple[float, int]],
    denoiser: Any | None = None,
    progress: bool = True,
    stores: Callable[[], tuple[Any, Callable[[], None]]] | None = None,
    topk: int = 5,
    recall_ks: Sequence[int] = (5, 10),
    session_recall_fn: Callable[[Retrieval, set[str], int], tuple[float, float]] | None = None,
    ranker_folds: str | None = None,
    copies: Copies | None = None,
    starts_folds: str | None = None,
) -> SystemsResult:
    """Ingest every conversation into every system and measure coverage, latency and ingest.

    Args:
        conversations: Conversations with questions.
        systems: Systems to compare.
        embedder: Shared embedder.
        budgets: Word budgets.
        coverage_fn: Packs a plain ranking into N words and returns `(coverage, words)`.
        denoiser: Denoiser override for every system (`None`: each config's).
        progress: Show a progress bar.
        stores: Makes an empty store and its clean-up for each (conversation, system), e.g.
            a fresh PostgreSQL schema (`None`: in-memory SQLite).
        topk: Measure what `retrieve(k=topk)` returns (0: not measured).
        recall_ks: Session recall cut-offs (needs `session_recall_fn`).
        session_recall_fn: `(ranking, evidence sessions, k) -> (recall_any, recall_all)`
            (`None`: no session recall).
        ranker_folds: Folder of `bench fit-ranker --folds` models, for the systems whose
            ranker is `FOLDS` (each conversation scored by its fold's model).
        copies: Turns that count as other turns (`--perturb repeated`): every answer is
            scored with its copies mapped to their originals (`Copies.originals`).
        starts_folds: Folder of `bench fit-starts --folds` models: every system that does not
            set `sessions.conversation_starts` itself reads each conversation with the start
            detector fitted without its fold.
    """
    scored = (Copies() if copies is None else copies).originals
    res = SystemsResult(topk=topk)
    default_call = f"{DEFAULT.name} · retrieve()"
    embedder.encode(["load the model before anything is timed"])
    repeat = RepeatQuery(embedder)
    for conv in conversations:  # every system then reads the turn vectors on equal terms
        repeat.encode([t["text"][:4000] for s in conv.sessions for t in s.turns])
    todo = [(c, s) for c in conversations for s in systems]
    res.folds = {conv.user_id: fold_of(conv) for conv in conversations}
    for conv, system in tqdm(todo, desc="bench retrieval", disable=not progress):
        store, cleanup = stores() if stores is not None else (None, None)
        built = system
        if system.config.get("passages", {}).get("ranker") == FOLDS:
            if ranker_folds is None:
                raise ConfigError(f"system {system.name!r} needs --ranker-folds")
            model = str(Path(ranker_folds) / f"{fold_of(conv)}.json")
            passages = {**system.config["passages"], "ranker": model}
            built = replace(system, config={**system.config, "passages": passages})
        if starts_folds is not None and "conversation_starts" not in system.config.get(
            "sessions", {}
        ):
            model = str(Path(starts_folds) / f"{fold_of(conv)}.json")
            sessions = {**built.config.get("sessions", {}), "conversation_starts": model}
            built = replace(built, config={**built.config, "sessions": sessions})
        mem = built.build(repeat, denoiser, store)
        shipped = None  # the default as shipped (token budgets), for the adapters' call
        if topk > 0 and system is DEFAULT and stores is None:
            shipped = system.build(repeat, denoiser, words=False)
            ingest_conversations(shipped, [conv], progress=False)
            shipped.retrieve(conv.user_id, "warm-up query", k=1)
        try:
            t0 = time.perf_counter()
            ingest_conversations(mem, [conv], progress=False)
            res.ingest[system.name][0] += time.perf_counter() - t0
            res.ingest[system.name][1] += conv.n_turns
            n_units = mem.stats(conv.user_id)["memories"]
            mem.retrieve(conv.user_id, "warm-up query", k=1, mode=system.mode)
            for q in conv.questions:
                evidence = set(q.evidence)
                if system is systems[0]:
                    res.questions += 1
                if not evidence:
                    continue
                repeat.forget()
                t1 = time.perf_counter()
                if system.passages:
                    top = mem.retrieve(conv.user_id, q.question, now=q.date, budget_tokens=1000)
                else:
                    top = mem.retrieve(conv.user_id, q.question, now=q.date, k=10, mode=system.mode)
                res.latency_ms[system.name].append((time.perf_counter() - t1) * 1000)
                res.paths[system.name].append(str(top.diagnostics.get("path")))
                ranking = None
                if not system.passages:
                    ranking = scored(
                        mem.retrieve(
                            conv.user_id, q.question, now=q.date, k=n_units, mode=system.mode
                        )
                    )
                for b in budgets:
                    if ranking is None:
                        r = scored(
                            mem.retrieve(conv.user_id, q.question, now=q.date, budget_tokens=b)
                        )
                        cov, words = covered(r, evidence, b)
                        res.over_budget += int(words > b)
                    else:
                        cov, _ = coverage_fn(ranking, evidence, b)
                    res.coverage[(system.name, b)].append(cov)
                    res.by_conversation[(system.name, conv.user_id, str(b))].append(cov)
                    res.by_type[(system.name, q.qtype or "-", b)].append(cov)
                if session_recall_fn is not None and q.evidence_sessions:
                    if ranking is None:  # passage systems: their whole ranking of turns
                        ranking = scored(
                            mem.retrieve(conv.user_id, q.question, now=q.date, k=n_units)
                        )
                    for kk in recall_ks:
                        ra, rall = session_recall_fn(ranking, set(q.evidence_sessions), kk)
                        res.recall[(system.name, f"any@{kk}")].append(ra)
                        res.recall[(system.name, f"all@{kk}")].append(rall)
                    ndcg = session_ndcg(ranking, set(q.evidence_sessions), 10)
                    res.recall[(system.name, "ndcg@10")].append(ndcg)
                if topk > 0:
                    repeat.forget()
                    t2 = time.perf_counter()
                    top = mem.retrieve(
                        conv.user_id, q.question, now=q.date, k=topk, mode=system.mode
                    )
                    res.topk_latency_ms[system.name].append((time.perf_counter() - t2) * 1000)
                    cov, words = covered(scored(top), evidence, topk)
                    res.topk_coverage[system.name].append(cov)
                    res.by_conversation[(system.name, conv.user_id, f"k={topk}")].append(cov)
                    res.topk_words[system.name].append(words)
                if shipped is not None:
                    repeat.forget()
                    t3 = time.perf_counter()
                    top = shipped.retrieve(conv.user_id, q.question, now=q.date)
                    res.topk_latency_ms[default_call].append((time.perf_counter() - t3) * 1000)
                    cov, words = covered(scored(top), evidence, 0)
                    res.topk_coverage[default_call].append(cov)
                    res.topk_words[default_call].append(words)
        finally:
            mem.close()
            if shipped is not None:
                shipped.close()
            if cleanup is not None:
                cleanup()
    return res


def format_systems(
    res: SystemsResult,
    main: Sequence[System],
    ablations: Sequence[System],
    budgets: Sequence[int],
    *,
    type_rows: Sequence[str] = ("knowledge-update", "temporal-reasoning", "2"),
) -> str:
    """The main table (default next to baselines), the ablation table and per-type rows."""
    s = res.summary()
    head = "| system | " + " | ".join(f"cov@{b}" for b in budgets)

    def row(name: str) -> str:
        covs = [
            f"{np.mean(res.coverage[(name, b)]):.3f}" if res.coverage[(name, b)] else "-"
            for b in budgets
        ]
        lat = s["latency_ms"].get(name, {"p50": float("nan"), "p95": float("nan")})
        ing = s["ingest_turns_per_s"].get(name, float("nan"))
        return (
            f"| {name} | "
            + " | ".join(covs)
            + (f" | {lat['p50']:.1f} | {lat['p95']:.1f} | {ing:.0f} |")
        )

    lines = [
        f"questions: {s['questions']} (passage answers over budget: {s['over_budget']})",
        "",
        head + " | p50 ms | p95 ms | ingest turns/s |",
        "|---|" + "---|" * (len(budgets) + 3),
    ]
    lines += [row(x.name) for x in main]
    if ablations:
        lines += ["", head + " | p50 ms | p95 ms | ingest turns/s |"]
        lines += ["|---|" + "---|" * (len(budgets) + 3)]
        lines += [row(x.name) for x in (main[0], *ablations)]
    types = sorted({t for (_, t, _) in res.by_type})
    for t in [t for t in type_rows if t in types]:
        label = "2 (REALTALK / LoCoMo dates)" if t == "2" else t
        lines += ["", f"question type {label}:", head + " |", "|---|" + "---|" * len(budgets)]
        for x in (*main, *ablations):
            vals = res.by_type.get((x.name, t, budgets[0]))
            if not vals:
                continue
            covs = [f"{np.mean(res.by_type[(x.name, t, b)]):.3f}" for b in budgets]
            lines.append(f"| {x.name} | " + " | ".join(covs) + " |")
    paths = {k: v for k, v in s["paths"].items() if any(p != "familiarity" for p in v)}
    if paths:
        lines += ["", "| system | dense path shares |", "|---|---|"]
        for name, shares in paths.items():
            lines.append(f"| {name} | " + ", ".join(f"{p} {v:.0%}" for p, v in shares.items()))
    rows = [x.name for x in (*main, *ablations) if x.name in res.topk_coverage]
    rows += [name for name in res.topk_coverage if " · " in name]
    if rows:
        k = res.topk
        lines += [
            "",
            f"what `retrieve(k={k})` returns, and the adapters' default call `retrieve()`:",
            f"| system | cov@k={k} | mean words | p50 ms |",
            "|---|---|---|---|",
        ]
        for name in rows:
            top = s["topk"][name]
            lines.append(
                f"| {name} | {top['coverage']:.3f} | {top['mean_words']:.0f} | "
                f"{top['p50_ms']:.1f} |"
            )
    names = sorted(
        {n for (_, n) in res.recall},
        key=lambda n: (n.startswith("ndcg"), int(n.split("@")[1]), n.startswith("all")),
    )
    rows = [x.name for x in (*main, *ablations) if names and (x.name, names[0]) in res.recall]
    if rows:
        lines += [
            "",
            "session recall (first k distinct sessions of the whole ranking):",
            "| system | "
            + " | ".join(n if n.startswith("ndcg") else f"recall_{n}" for n in names)
            + " |",
            "|---|" + "---|" * len(names),
        ]
        for name in rows:
            cells = [f"{np.mean(res.recall[(name, n)]):.3f}" for n in names]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
