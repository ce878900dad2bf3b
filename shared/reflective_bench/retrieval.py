"""`reflective-memory bench retrieval`: evidence coverage under a word budget.

For every conversation of a data file (LongMemEval, LoCoMo or our own schema) and every unit kind,
the conversation is ingested into a fresh in-memory `ReflectiveMemory`; each question ranks the
user's memories, the ranking is packed in rank order into a budget of N words (a unit that does not
fit is skipped), and coverage is the fraction of the question's evidence turns inside the packed
units. Session-level recall_any@k / recall_all@k are reported too.

Without `--units` the library's default config runs next to plain baselines and ablations (see
`reflective_bench.systems`); a table of what `retrieve(k=5)` returns (`--topk`) and one of
session recall follow the budget tables.

`--roles names` (the default) stores each turn under the speaker name the data gives; `--roles
ua` stores the conversation as a chat app would: the user side as `user`, the other side as
`assistant`, each text as `Name: text` (the user side is the file's `speaker_a`, else the first
turn's speaker; conversations already in `user` / `assistant` are stored as they are; see
`reflective_bench.roles`). Every system of a run is stored the same way.

`--perturb NAME` turns the data into a messy history after `--roles`, before anything is stored,
the same for every system of the run and on every run (`reflective_bench.perturb`): `filler` (30
and 60 near-duplicate request / answer exchanges in the middle and last session), `sessionless`
(every turn under one session id, each with its own time), `unstamped` (only the user side's
turns carry a time) or `repeated` (each evidence turn of the user side said again in the two
sessions after it; a retrieved copy is scored as its original). The turn and session counts
before and after are printed and written to `--json` (`perturb`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from reflective_memory.config import MemoryConfig
from reflective_memory.denoise import make_denoiser
from reflective_memory.embed import (
    CachedEmbedder,
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
)
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ConfigError
from reflective_memory.io import Conversation, ingest_conversations
from reflective_memory.segment.base import FixedWindowSegmenter
from reflective_memory.types import Retrieval
from tqdm import tqdm

from reflective_bench.perturb import Copies, Perturbed, add_perturb_argument, load_perturbed
from reflective_bench.roles import ROLES

__all__ = [
    "BenchResult",
    "coverage_at_budget",
    "session_recall",
    "session_ndcg",
    "run_retrieval_bench",
    "format_table",
    "register",
    "make_embedder",
    "add_embedder_arguments",
]

logger = logging.getLogger(__name__)

DEFAULT_BUDGETS = (250, 500, 1000, 2000, 4000)
UNITS = ("turn", "session", "window", "segment")
MemoryFactory = Callable[[str, Embedder], ReflectiveMemory]


def coverage_at_budget(
    retrieval: Retrieval, evidence: set[str], budget_words: int
) -> tuple[float, int]:
    """Fraction of evidence turns inside the units packed into `budget_words` words.

    Args:
        retrieval: A ranking (every hit's memory carries `turn_ids`).
        evidence: Evidence turn ids.
        budget_words: Budget in whitespace-separated words of the memories' texts.

    Returns:
        `(coverage, words_used)`.
    """
    used = 0
    covered: set[str] = set()
    for hit in retrieval.hits:
        cost = len(hit.memory.text.split())
        if used + cost > budget_words:
            continue
        used += cost
        covered.update(hit.memory.turn_ids)
    return (len(evidence & covered) / len(evidence) if evidence else 0.0), used


def _ranked_sessions(retrieval: Retrieval, k: int) -> list[str]:
    """The first `k` distinct sessions of a ranking, in the order they first appear."""
    ranked: list[str] = []
    for hit in retrieval.hits:
        if hit.memory.session_id not in ranked:
            ranked.append(hit.memory.session_id)
        if len(ranked) >= k:
            break
    return ranked


def session_recall(retrieval: Retrieval, sessions: set[str], k: int) -> tuple[float, float]:
    """`(recall_any@k, recall_all@k)` over the first `k` distinct sessions of the ranking."""
    top = set(_ranked_sessions(retrieval, k))
    return float(bool(top & sessions)), float(sessions <= top)


def session_ndcg(retrieval: Retrieval, sessions: set[str], k: int = 10) -> float:
    """NDCG@k of the distinct sessions of a ranking, evidence sessions relevant (binary)."""
    if not sessions:
        return 0.0
    dcg = sum(
        1.0 / np.log2(i + 2) for i, s in enumerate(_ranked_sessions(retrieval, k)) if s in sessions
    )
    ideal = sum(1.0 / np.log2(i + 2) for i in range(min(k, len(sessions))))
    return float(dcg / ideal)


@dataclass
class BenchResult:
    """Aggregated numbers of one retrieval benchmark run."""

    coverage: dict[tuple[str, str, int], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    recall: dict[tuple[str, str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    latency_ms: dict[tuple[str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    paths: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    signals: dict[tuple[str, str], list[tuple[float, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    ingest: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    units: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    questions: int = 0
    skipped: int = 0

    def summary(self) -> dict[str, Any]:
        """Plain-dict means (JSON-friendly)."""
        out: dict[str, Any] = {"questions": self.questions, "skipped_no_evidence": self.skipped}
        out["coverage"] = {
            f"{u}/{m}/{b}": float(np.mean(v)) for (u, m, b), v in sorted(self.coverage.items())
        }
        out["session_recall"] = {
            f"{u}/{m}/{name}": float(np.mean(v)) for (u, m, name), v in sorted(self.recall.items())
        }
        out["latency_ms"] = {
            f"{u}/{m}": {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95))}
            for (u, m), v in sorted(self.latency_ms.items())
        }
        out["recollection_share"] = {
            f"{u}/{m}": v.count("recollection") / len(v) for (u, m), v in sorted(self.paths.items())
        }
        out["gate_signals"] = {
            f"{u}/{m}": {"mean_score": [a for a, _ in v], "entropy": [b for _, b in v]}
            for (u, m), v in sorted(self.signals.items())
        }
        out["ingest_turns_per_s"] = {
            u: float(sum(v[1::2]) / max(sum(v[0::2]), 1e-9)) for u, v in self.ingest.items()
        }
        out["units_indexed"] = dict(self.units)
        return out


def _default_factory(
    unit: str, embedder: Embedder, denoiser: Any | None = None
) -> ReflectiveMemory:
    plain: dict[str, Any] = {"passages": {"enabled": False}}  # units ranked as they are (issue 2)
    if unit == "window":
        cfg = MemoryConfig(units={"granularities": ("segment",), "speaker_keys": False}, **plain)
        return ReflectiveMemory(
            None,
            embedder=embedder,
            config=cfg,
            segmenter=FixedWindowSegmenter(cfg.segment.window),
            denoiser=denoiser,
        )
    return ReflectiveMemory(
        None,
        embedder=embedder,
        config=MemoryConfig(units={"granularities": (unit,), "speaker_keys": False}, **plain),
        denoiser=denoiser,
    )


def parse_denoiser(spec: str, model: str | None = None) -> Any:
    """`default`, `none`, `offline[:rate]` or `llmlingua[:rate]` -> `ReflectiveMemory(denoiser=)`.

    Args:
        spec: Denoiser name, optionally with `:rate` (fraction kept, default 0.75).
        model: LLMLingua-2 model name or folder for `llmlingua`.

    Returns:
        `None` (the config's default denoiser), `"none"` or a denoiser object.

    Raises:
        ConfigError: Unknown name or bad rate.
    """
    name, _, rate = spec.partition(":")
    if name.strip() == "default":
        return None
    if name.strip() == "none":
        return "none"
    try:
        value = float(rate) if rate else 0.75
    except ValueError as exc:
        raise ConfigError(f"bad denoiser rate in {spec!r}") from exc
    return make_denoiser(name.strip(), rate=value, model=model)


def _mode_kwargs(mode: str, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split `dense:recollection` into the engine mode and `retrieve` kwargs with the RF-Mem path.

    The part after the colon (`familiarity`, `recollection` or `rfmem`) is merged into the
    `recall` overrides of `extra`; a plain mode uses the memory's configured RF-Mem mode.
    """
    base, _, path = mode.partition(":")
    if not path:
        return base, extra
    recall = dict(extra.get("recall") or {})
    recall["mode"] = path
    return base, {**extra, "recall": recall}


def run_retrieval_bench(
    conversations: Sequence[Conversation],
    *,
    embedder: Embedder,
    units: Sequence[str] = ("turn", "session", "window"),
    modes: Sequence[str] = ("dense", "hybrid"),
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    recall_ks: Sequence[int] = (5, 10),
    memory_factory: MemoryFactory | None = None,
    retrieve_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
    copies: Copies | None = None,
) -> BenchResult:
    """Run the retrieval benchmark.

    Args:
        conversations: Loaded conversations with questions.
        embedder: Embedder shared by every memory built.
        units: Unit kinds: `turn`, `session`, `window` (fixed windows) and `segment` (the
            engine's default segmenter).
        modes: Retrieval modes (`dense`, `hybrid`, `lexical`), optionally with a forced RF-Mem
            path after a colon: `dense:familiarity`, `hybrid:recollection`, `dense:rfmem`.
        budgets: Word budgets.
        recall_ks: Session-level recall cut-offs.
        memory_factory: Builds the `ReflectiveMemory` for a unit kind (to test other settings).
        retrieve_kwargs: Extra keyword arguments for every `retrieve` call.
        progress: Show a progress bar.
        copies: Turns that count as other turns (`--perturb repeated`): each ranking is
            scored with its copies mapped to their originals (`Copies.originals`).

    Returns:
        The collected numbers.
    """
    scored = Copies() if copies is None else copies
    factory = memory_factory if memory_factory is not None else _default_factory
    extra = retrieve_kwargs if retrieve_kwargs is not None else {}
    res = BenchResult()
    todo = [(c, u) for c in conversations for u in units]
    for conv, unit in tqdm(todo, desc="bench retrieval", disable=not progress):
        with factory(unit, embedder) as mem:
            t0 = time.perf_counter()
            ingest_conversations(mem, [conv], progress=False)
            res.ingest[unit] += [time.perf_counter() - t0, conv.n_turns]
            n_units = mem.stats(conv.user_id)["memories"]
            res.units[unit] += n_units
            # warm the per-user caches (dense and BM25 indexes) so latency is steady-state
            mem.retrieve(conv.user_id, "warm-up query", k=1, mode="hybrid", **extra)
            for q in conv.questions:
                evidence = set(q.evidence)
                if unit == units[0]:
                    res.questions += 1
                    res.skipped += int(not evidence)
                for mode in modes:
                    base_mode, kw = _mode_kwargs(mode, extra)
                    t1 = time.perf_counter()
                    top = mem.retrieve(conv.user_id, q.question, k=10, mode=base_mode, **kw)
                    res.latency_ms[(unit, mode)].append((time.perf_counter() - t1) * 1000)
                    res.paths[(unit, mode)].append(str(top.diagnostics.get("path")))
                    if top.diagnostics.get("mean_score") is not None:
                        res.signals[(unit, mode)].append(
                            (top.diagnostics["mean_score"], top.diagnostics["entropy"])
                        )
                    ranking = scored.originals(
                        mem.retrieve(conv.user_id, q.question, k=n_units, mode=base_mode, **kw)
                    )
                    if evidence:
                        for b in budgets:
                            cov, _ = coverage_at_budget(ranking, evidence, b)
                            res.coverage[(unit, mode, b)].append(cov)
                    if q.evidence_sessions:
                        for kk in recall_ks:
                            ra, rall = session_recall(ranking, set(q.evidence_sessions), kk)
                            res.recall[(unit, mode, f"any@{kk}")].append(ra)
                            res.recall[(unit, mode, f"all@{kk}")].append(rall)
    return res


def format_table(res: BenchResult, budgets: Sequence[int] = DEFAULT_BUDGETS) -> str:
    """Markdown tables of a `BenchResult`."""
    s = res.summary()
    lines = [
        f"questions: {s['questions']} (without turn evidence, left out of coverage: "
        f"{s['skipped_no_evidence']})",
        "",
        "| unit | mode | " + " | ".join(f"cov@{b}" for b in budgets) + " | p50 ms | p95 ms |",
        "|---|---|" + "---|" * (len(budgets) + 2),
    ]
    for unit, mode in sorted(res.latency_ms):
        covs = [
            f"{np.mean(res.coverage[(unit, mode, b)]):.3f}"
            if res.coverage[(unit, mode, b)]
            else "-"
            for b in budgets
        ]
        lat = s["latency_ms"][f"{unit}/{mode}"]
        lines.append(
            f"| {unit} | {mode} | " + " | ".join(covs) + f" | {lat['p50']:.1f} | {lat['p95']:.1f} |"
        )
    if res.recall:
        names = sorted({n for (_, _, n) in res.recall})
        lines += [
            "",
            "| unit | mode | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names),
        ]
        for unit, mode in sorted(res.latency_ms):
            vals = [f"{np.mean(res.recall[(unit, mode, n)]):.3f}" for n in names]
            lines.append(f"| {unit} | {mode} | " + " | ".join(vals) + " |")
    if any(p in ("familiarity", "recollection") for v in res.paths.values() for p in v):
        lines += ["", "| unit | mode | RF-Mem path → recollection |", "|---|---|---|"]
        for key, share in s["recollection_share"].items():
            unit, mode = key.split("/", 1)
            lines.append(f"| {unit} | {mode} | {share:.0%} |")
    lines += [
        "",
        "| unit | memories indexed | ingest turns/s (embedding included) |",
        "|---|---|---|",
    ]
    for unit, n in res.units.items():
        lines.append(f"| {unit} | {n} | {s['ingest_turns_per_s'][unit]:.0f} |")
    return "\n".join(lines)


def make_embedder(name: str, cache: str | None = None) -> Embedder:
    """Build the benchmark's embedder.

    Args:
        name: `default` or a model name/path (sentence-transformers), or `hashing`.
        cache: Optional SQLite file caching vectors across runs (`none` disables it).
    """
    inner: Embedder
    if name == "hashing":
        inner = HashingEmbedder()
    else:
        inner = SentenceTransformerEmbedder(None if name == "default" else name, batch_size=32)
    if cache is None or cache == "none":
        return inner
    return CachedEmbedder(inner, os.path.expanduser(cache))


def add_embedder_arguments(parser: Any) -> None:
    """Add the `--embedder` and `--cache` options every benchmark command shares."""
    parser.add_argument(
        "--embedder", default="default", help="'default', 'hashing' or a model path"
    )
    parser.add_argument(
        "--cache",
        default="~/.cache/reflective-memory/bench-embeddings.sqlite",
        help="SQLite file caching embeddings across runs ('none' to disable)",
    )


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def pg_stores(dsn: str) -> Callable[[], tuple[Any, Callable[[], None]]]:
    """Each call: a `PostgresStore` on a new, empty schema, and a clean-up that drops it."""
    import uuid

    import psycopg
    from reflective_memory.storage.postgres import PostgresStore

    def make() -> tuple[Any, Callable[[], None]]:
        schema = f"bench_retrieval_{uuid.uuid4().hex[:12]}"
        store = PostgresStore(dsn, schema=schema)

        def drop() -> None:
            store.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        return store, drop

    return make


def _run_systems(
    args: argparse.Namespace,
    data: Perturbed,
    budgets: list[int],
    roles_line: str | None = None,
) -> int:
    from reflective_bench.systems import (
        ABLATIONS,
        BASELINES,
        DEFAULT,
        FOLDS,
        format_systems,
        run_systems,
        system_by_name,
        variant_system,
    )

    main = [DEFAULT] if args.no_baselines else [DEFAULT, *BASELINES]
    if args.ablations == "all":
        ablations = [a for a in ABLATIONS if a.config.get("passages", {}).get("ranker") != FOLDS]
    elif args.ablations in ("", "none"):
        ablations = []
    else:
        ablations = [system_by_name(n) for n in args.ablations.split(";") if n.strip()]
    ablations += [variant_system(v, args.ranker_folds is not None) for v in args.variant]
    if args.ranker_folds is not None:
        ablations.append(system_by_name("learned ranker, cross-validated"))
    denoiser = None if args.denoiser == "default" else parse_denoiser(args.denoiser)
    convs = data.conversations
    res = run_systems(
        convs,
        [*main, *ablations],
        embedder=make_embedder(args.embedder, args.cache),
        budgets=budgets,
        coverage_fn=coverage_at_budget,
        denoiser=denoiser,
        stores=None if args.dsn is None else pg_stores(args.dsn),
        topk=args.topk,
        session_recall_fn=session_recall,
        ranker_folds=args.ranker_folds,
        copies=data.copies,
        starts_folds=args.starts_folds,
    )
    where = "in-memory SQLite" if args.dsn is None else "PostgreSQL + pgvector"
    print(f"data: {args.data} ({len(convs)} conversations); store: {where}")  # noqa: T201
    if roles_line is not None:
        print(roles_line)  # noqa: T201
    print(format_systems(res, main, ablations, budgets))  # noqa: T201
    if args.json is not None:
        with open(args.json, "w") as fh:
            json.dump(
                {**res.summary(), "roles": args.roles, "perturb": data.summary()}, fh, indent=2
            )
    return 0


def _roles_line(roles: str, n: int, sides: dict[str, str]) -> str | None:
    """What `--roles ua` did, printed under the data line (`None` for `names`)."""
    if roles == "names":
        return None
    if not sides:
        return f"roles: ua; {n} conversations already user/assistant, stored as they are"
    who = ", ".join(f"{uid}: {name}" for uid, name in sides.items())
    return f"roles: ua (user side, the rest as assistant; texts as `Name: text`): {who}"


def _run(args: argparse.Namespace) -> int:
    if args.dsn is not None and args.units is not None:
        raise ConfigError("--dsn runs the default and the baselines; it does not go with --units")
    if args.topk < 0:
        raise ConfigError(f"--topk must be 0 (off) or more, not {args.topk}")
    data, sides = load_perturbed(args.data, args.roles, args.limit, args.perturb)
    convs = data.conversations
    roles_line = _roles_line(args.roles, len(convs), sides)
    if data.name != "none":
        roles_line = data.line() if roles_line is None else f"{roles_line}\n{data.line()}"
    budgets = [int(b) for b in _split(args.budgets)]
    if args.units is None:
        return _run_systems(args, data, budgets, roles_line)
    denoiser = parse_denoiser(args.denoiser, args.denoiser_model)
    res = run_retrieval_bench(
        convs,
        embedder=make_embedder(args.embedder, args.cache),
        units=_split(args.units),
        modes=_split(args.modes),
        budgets=budgets,
        memory_factory=lambda unit, emb: _default_factory(unit, emb, denoiser),
        retrieve_kwargs=None if args.recall is None else {"recall": json.loads(args.recall)},
        copies=data.copies,
    )
    logger.info("bench retrieval done")
    print(f"data: {args.data} ({len(convs)} conversations), denoiser: {args.denoiser}")  # noqa: T201
    if roles_line is not None:
        print(roles_line)  # noqa: T201
    print(format_table(res, budgets))  # noqa: T201
    if args.json is not None:
        with open(args.json, "w") as fh:
            json.dump(
                {**res.summary(), "roles": args.roles, "perturb": data.summary()}, fh, indent=2
            )
    return 0


def register(bench: Any) -> None:
    """Add `bench retrieval` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "retrieval",
        help="evidence coverage under word budgets (LongMemEval / LoCoMo / our JSON)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help="conversation file (.json or .json.gz)")
    p.add_argument(
        "--units",
        default=None,
        help=f"comma list of {UNITS}: the per-unit table of issue 2 instead of the default "
        "config next to plain baselines",
    )
    p.add_argument(
        "--ablations",
        default="all",
        help="ablation rows beside the default: 'all', 'none' or ';'-separated row names",
    )
    p.add_argument(
        "--modes",
        default="dense,hybrid",
        help="comma list of dense,hybrid,lexical; add ':familiarity', ':recollection' or "
        "':rfmem' to force the RF-Mem path (e.g. dense:recollection)",
    )
    p.add_argument(
        "--recall", default=None, help='RF-Mem overrides as JSON, e.g. {"theta_low": 0.0}'
    )
    p.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="word budgets")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    add_perturb_argument(p)
    p.add_argument(
        "--roles",
        choices=ROLES,
        default="names",
        help="names: turns stored under the data's speaker names; ua: as a chat app stores "
        "them, the user side as 'user', the other as 'assistant', texts as 'Name: text'",
    )
    p.add_argument(
        "--topk",
        type=int,
        default=5,
        help="also measure what retrieve(k=TOPK) returns, the adapters' default call "
        "(0: off; not with --units)",
    )
    add_embedder_arguments(p)
    p.add_argument(
        "--denoiser",
        default="default",
        help="key denoiser: default (MemoryConfig's), none, offline[:rate] or llmlingua[:rate] "
        "(rate = fraction of each key kept)",
    )
    p.add_argument("--denoiser-model", default=None, help="LLMLingua-2 model name or folder")
    p.add_argument("--json", default=None, help="also write the summary as JSON here")
    p.add_argument(
        "--ranker-folds",
        default=None,
        help="folder of `bench fit-ranker --folds` models: adds the row 'learned ranker, "
        "cross-validated' (each conversation scored by the model fitted without its fold)",
    )
    p.add_argument(
        "--starts-folds",
        default=None,
        help="folder of `bench fit-starts --folds` models: every row reads each conversation "
        "with the conversation-start detector fitted without its fold (cross-validated)",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="run every system on PostgreSQL + pgvector (a fresh schema each, dropped after)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="GROUP.FIELD=VALUE",
        help="add a row: the default with one setting changed, e.g. passages.context_weight=0.5 "
        "(repeatable; with --ranker-folds each conversation is scored by its fold's model). "
        "`bench cv-settings` then picks each setting's value by cross-validation",
    )
    p.add_argument(
        "--no-baselines",
        action="store_true",
        help="leave out the plain baselines (their numbers do not depend on the library's "
        "retrieval settings): the default and the requested rows only",
    )
    p.set_defaults(func=_run)
