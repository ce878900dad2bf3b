r"""`reflective-memory bench fit-gate`: fit RF-Mem's gate to where recollection helps.

The RF-Mem gate (`reflective_memory.recall.choose_path`) sends a question down the recollection
path when its probe's mean score s̄ is low, or middling with a flat score distribution (entropy
H). Whether that pays depends on the embedder's score scale and on the data, so the thresholds
are fitted on the dev sets, per embedder:

1. **collect** (once per data file; cached as a JSON table): every question with evidence is
   asked of the library's default configuration (`reflective_bench.systems.DEFAULT`, passages
   counted in words) twice, `recall={"mode": "familiarity"}` and `{"mode": "recollection"}`, at a
   budget of 500 words; a row keeps the question's gate signals (s̄, H), its evidence coverage
   under each path and each call's latency;
2. **fit** θ_high, θ_low and τ (`reflective_memory.recall.fit_gate`) to the most coverage gained
   over familiarity, routing at most 30% of the questions; **cross-validate** the fit: leave one
   conversation out where a data file has several questions per conversation (REALTALK), five
   folds by question otherwise (LongMemEval, one question per haystack);
3. **write** the fit for the embedder into the library's `data/gate_calibration.json` (with
   `--write`), which `recall={"mode": "rfmem"}` reads when the memory's embedder has that name.

One command re-fits (collecting what is not cached):

    reflective-memory bench fit-gate --data ../shared/data/realtalk_dev.json.gz \\
        --data ../shared/data/longmemeval_s_dev100.json.gz --write
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.embed import Embedder
from reflective_memory.io import Conversation, ingest_conversations, load_conversations
from reflective_memory.recall import fit_gate, gate_routes, write_gate_calibration
from tqdm import tqdm

from reflective_bench.retrieval import add_embedder_arguments, make_embedder
from reflective_bench.systems import DEFAULT, RepeatQuery, covered

__all__ = [
    "GateRow",
    "collect_rows",
    "load_table",
    "cross_validate",
    "folds_of",
    "summarize",
    "register",
]

logger = logging.getLogger(__name__)

#: The budget (words) the gate is fitted at: the adapters' default is 500 tokens.
BUDGET = 500
#: Most questions the gate may send to recollection.
MAX_SHARE = 0.3
_PATHS = ("familiarity", "recollection")


@dataclass(frozen=True)
class GateRow:
    """One dev question, asked down both RF-Mem paths.

    Attributes:
        data: Data file name (without folders).
        group: Conversation (user) the question is asked of.
        question: The question.
        qtype: Its category.
        mean_score: s̄ of its probe.
        entropy: H of its probe.
        familiarity: Evidence coverage at `BUDGET` words on the familiarity path.
        recollection: The same on the recollection path.
        ms_familiarity: Latency of the familiarity call (query embedded for real).
        ms_recollection: Latency of the recollection call.
    """

    data: str
    group: str
    question: str
    qtype: str
    mean_score: float
    entropy: float
    familiarity: float
    recollection: float
    ms_familiarity: float
    ms_recollection: float


def collect_rows(
    conversations: Sequence[Conversation],
    embedder: Embedder,
    data: str,
    *,
    budget: int = BUDGET,
    progress: bool = True,
) -> list[GateRow]:
    """Ask every question with evidence down both paths of the default configuration.

    Args:
        conversations: Conversations with questions (each ingested into a fresh memory).
        embedder: The embedder (its `name` keys the calibration).
        data: Label of the data file, kept on each row.
        budget: Word budget coverage is measured at.
        progress: Show a progress bar.

    Returns:
        One row per question with evidence, in file order.
    """
    repeat = RepeatQuery(embedder)
    repeat.encode(["load the model before anything is timed"])
    rows: list[GateRow] = []
    for conv in tqdm(conversations, desc=f"fit-gate {data}", disable=not progress):
        repeat.encode([t["text"][:4000] for s in conv.sessions for t in s.turns])
        with DEFAULT.build(repeat) as mem:
            ingest_conversations(mem, [conv], progress=False)
            mem.retrieve(conv.user_id, "warm-up query", k=1)
            for q in conv.questions:
                evidence = set(q.evidence)
                if not evidence:
                    continue
                cov: dict[str, float] = {}
                ms: dict[str, float] = {}
                signals: tuple[float, float] = (float("nan"), float("nan"))
                for path in _PATHS:
                    repeat.forget()
                    t0 = time.perf_counter()
                    r = mem.retrieve(
                        conv.user_id, q.question, now=q.date, budget_tokens=budget,
                        recall={"mode": path},
                    )  # fmt: skip
                    ms[path] = (time.perf_counter() - t0) * 1000
                    cov[path] = covered(r, evidence)[0]
                    d = r.diagnostics
                    if d.get("mean_score") is not None:
                        signals = (float(d["mean_score"]), float(d["entropy"]))
                rows.append(
                    GateRow(
                        data,
                        conv.user_id,
                        q.question,
                        q.qtype or "-",
                        *signals,
                        cov["familiarity"],
                        cov["recollection"],
                        ms["familiarity"],
                        ms["recollection"],
                    )
                )
    return rows


def load_table(
    path: Path,
    data: str,
    embedder: Embedder,
    *,
    limit: int | None,
    fresh: bool = False,
) -> list[GateRow]:
    """The rows of one data file: from the cached table at `path`, else collected and cached.

    A cached table is used only when it was made from the same file, embedder, `--limit` and
    budget; otherwise (or with `fresh`) the rows are collected again.
    """
    key = {
        "data": os.path.basename(data),
        "embedder": embedder.name,
        "limit": limit,
        "budget": BUDGET,
    }
    if path.exists() and not fresh:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            table = json.load(fh)
        if table.get("key") == key:
            logger.info("gate table %s: %d cached rows", path, len(table["rows"]))
            return [GateRow(**r) for r in table["rows"]]
        logger.info("gate table %s was made for %s; collecting again", path, table.get("key"))
    convs = load_conversations(data)
    if limit is not None:
        convs = convs[:limit]
    rows = collect_rows(convs, embedder, key["data"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump({"key": key, "rows": [asdict(r) for r in rows]}, fh)
    os.replace(tmp, path)
    return rows


def folds_of(rows: Sequence[GateRow], k: int = 5) -> np.ndarray:
    """A cross-validation fold per row.

    One fold per conversation where conversations hold several questions (leave one
    conversation out), else `k` folds by question (row order, striped).

    Fold numbers of different data files never collide.
    """
    out = np.zeros(len(rows), dtype=np.int64)
    start = 0
    for data in dict.fromkeys(r.data for r in rows):
        idx = [i for i, r in enumerate(rows) if r.data == data]
        groups = list(dict.fromkeys(rows[i].group for i in idx))
        if len(groups) < len(idx):  # several questions per conversation
            for i in idx:
                out[i] = start + groups.index(rows[i].group)
            start += len(groups)
        else:
            for j, i in enumerate(idx):
                out[i] = start + j % k
            start += k
    return out


def _arrays(rows: Sequence[GateRow]) -> dict[str, np.ndarray]:
    return {
        name: np.array([getattr(r, name) for r in rows], dtype=np.float64)
        for name in ("mean_score", "entropy", "familiarity", "recollection")
    }


def cross_validate(rows: Sequence[GateRow], max_share: float = MAX_SHARE) -> np.ndarray:
    """Held-out routing: each row routed by a gate fitted on the other folds' rows."""
    a = _arrays(rows)
    folds = folds_of(rows)
    routed = np.zeros(len(rows), dtype=bool)
    for f in np.unique(folds):
        train = folds != f
        if not train.any():  # one fold only: nothing to fit on, nothing routed
            continue
        gate = fit_gate(
            a["mean_score"][train],
            a["entropy"][train],
            a["recollection"][train] - a["familiarity"][train],
            max_share=max_share,
        )
        test = ~train
        routed[test] = gate_routes(a["mean_score"][test], a["entropy"][test], gate)
    return routed


def summarize(rows: Sequence[GateRow], routed: np.ndarray) -> dict[str, Any]:
    """Share routed, coverage of the routed questions both ways, and overall coverage.

    Latency: p50 of familiarity calls, of recollection calls, and of the routed mix (each
    question at the latency of the path its gate chose), measured pairwise in one run.
    """
    a = _arrays(rows)
    fam, rec = a["familiarity"], a["recollection"]
    ms_f = np.array([r.ms_familiarity for r in rows])
    ms_r = np.array([r.ms_recollection for r in rows])
    n = int(routed.sum())
    mixed = np.where(routed, rec, fam)
    return {
        "questions": len(rows),
        "routed": n,
        "share_routed": n / max(len(rows), 1),
        "routed_familiarity": float(fam[routed].mean()) if n else None,
        "routed_recollection": float(rec[routed].mean()) if n else None,
        "routed_gain": float((rec - fam)[routed].mean()) if n else None,
        "coverage_familiarity": float(fam.mean()),
        "coverage_gated": float(mixed.mean()),
        "coverage_recollection": float(rec.mean()),
        "p50_ms_familiarity": float(np.median(ms_f)),
        "p50_ms_recollection": float(np.median(ms_r)),
        "p50_ms_gated": float(np.median(np.where(routed, ms_r, ms_f))),
    }


def _table_path(folder: str, data: str, limit: int | None) -> Path:
    stem = os.path.basename(data).split(".")[0]
    return (
        Path(os.path.expanduser(folder))
        / f"gate-{stem}{'' if limit is None else f'-{limit}'}.json.gz"
    )


def format_report(report: dict[str, dict[str, Any]]) -> str:
    """Markdown table of `summarize` results, keyed by row label."""
    lines = [
        f"| rows | questions | routed | routed cov@{BUDGET} familiarity | recollection | gain | "
        f"cov@{BUDGET} familiarity | gated | p50 ms familiarity | gated | ratio |",
        "|---|" + "---|" * 11,
    ]
    for label, s in report.items():
        routed = (
            f"{s['routed_familiarity']:.3f} | {s['routed_recollection']:.3f} | "
            f"{s['routed_gain']:+.3f}"
            if s["routed"]
            else "- | - | -"
        )
        lines.append(
            f"| {label} | {s['questions']} | {s['share_routed']:.1%} | {routed} | "
            f"{s['coverage_familiarity']:.3f} | {s['coverage_gated']:.3f} | "
            f"{s['p50_ms_familiarity']:.1f} | {s['p50_ms_gated']:.1f} | "
            f"{s['p50_ms_gated'] / s['p50_ms_familiarity']:.2f} |"
        )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from reflective_memory.recall import RecallConfig

    embedder = make_embedder(args.embedder, args.cache)
    rows: list[GateRow] = []
    for data in args.data:
        path = _table_path(args.tables, data, args.limit)
        rows += load_table(path, data, embedder, limit=args.limit, fresh=args.fresh)
    a = _arrays(rows)
    gate = fit_gate(
        a["mean_score"], a["entropy"], a["recollection"] - a["familiarity"], max_share=MAX_SHARE
    )
    in_sample = gate_routes(a["mean_score"], a["entropy"], gate)
    held_out = cross_validate(rows)
    report: dict[str, dict[str, Any]] = {}
    labels = dict.fromkeys(r.data for r in rows)
    for how, routed in (("in-sample", in_sample), ("cross-validated", held_out)):
        for data in [*labels, "all"]:
            keep = np.array([data in ("all", r.data) for r in rows])
            sub = [r for r, k in zip(rows, keep, strict=True) if k]
            report[f"{data} {how}"] = summarize(sub, routed[keep])
    print(  # noqa: T201
        f"gate for {embedder.name}: theta_high={gate.theta_high:.4f} "
        f"theta_low={gate.theta_low:.4f} tau={gate.tau:.4f} (fitted on {gate.n} questions)"
    )
    print(format_report(report))  # noqa: T201
    if args.json is not None:
        with open(args.json, "w") as fh:
            json.dump({"gate": asdict(gate), "report": report}, fh, indent=2)
    if args.write:
        base = RecallConfig()
        where = write_gate_calibration(
            embedder.name,
            gate,
            probe_k=base.probe_k,
            lam=base.lam,
            measured={
                "data": list(labels),
                "limit": args.limit,
                "budget_words": BUDGET,
                "max_share": MAX_SHARE,
                "in_sample": report["all in-sample"],
                "cross_validated": report["all cross-validated"],
            },
        )
        logger.info("wrote the gate for %s to %s", embedder.name, where)
    return 0


def register(bench: Any) -> None:
    """Add `bench fit-gate` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "fit-gate",
        help="fit RF-Mem's gate thresholds on the dev sets (per embedder), cross-validated",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", action="append", required=True, help="a dev file (repeat for several)")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    p.add_argument(
        "--tables",
        default="~/.cache/reflective-memory",
        help="folder of the per-question tables (collected once per data file and embedder)",
    )
    p.add_argument("--fresh", action="store_true", help="collect the tables again")
    p.add_argument(
        "--write",
        action="store_true",
        help="store the fit in reflective_memory/data/gate_calibration.json",
    )
    p.add_argument("--json", default=None, help="also write the fit and the report as JSON here")
    add_embedder_arguments(p)
    p.set_defaults(func=_run)
