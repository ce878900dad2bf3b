"""`reflective-memory bench fit-starts`: fit where a conversation starts in a log without times.

Every conversation of each `--data FILE[:ROLES]` is laid out as a log without session ids or
times would be stored (`--perturb bare`: its sessions' turns one after another under one id),
its turns embedded as the library embeds them (what was said, without a `Name: ` label), and
each gap between two turns becomes a row of `reflective_memory.sessions.starts.FEATURES`,
labelled 1 where a session of the file starts. A standardised L2 logistic regression is fitted
on every row (written to `--out`, by default the model the package ships) and, with `--folds
DIR`, one model per fold without that fold's conversations (`bench retrieval --starts-folds
DIR` then reads each conversation with a detector that never saw it). The folds are
`bench fit-ranker`'s: a chat of many questions is its own fold, a LongMemEval question falls in
one of five.

The command prints, cross-validated (each conversation scored by its fold's model), how many
session starts are found and how many found starts are false at each threshold, in a log of at
least `--min-turns` turns; the shipped threshold (`--threshold`) is chosen from that table for
precision: a false start splits a conversation, a missed one leaves it as it was.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.config import MemoryConfig
from reflective_memory.embed import Embedder
from reflective_memory.io import Conversation
from reflective_memory.retrieval.speakers import utterance
from reflective_memory.sessions.starts import ConversationStarts, gap_rows
from reflective_memory.types import Turn
from tqdm import tqdm

from reflective_bench.perturb import add_data_arguments, load_data_spec
from reflective_bench.retrieval import add_embedder_arguments, make_embedder
from reflective_bench.systems import fold_of

__all__ = ["log_rows", "log_turns", "fit_starts", "scores", "register"]

logger = logging.getLogger(__name__)

_PACKAGE_MODEL = (
    Path(__file__).resolve().parent.parent / "reflective_memory/data/conversation_starts.json"
)
#: Thresholds the cross-validated table reports.
THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)

#: One conversation's rows: `(fold, gap rows, 1 where a session starts)`.
LogRows = tuple[str, np.ndarray, np.ndarray]


def log_turns(conv: Conversation) -> tuple[list[Turn], list[int]]:
    """A conversation as one log without times, and the positions where its sessions start."""
    turns: list[Turn] = []
    starts: list[int] = []
    for s in conv.sessions:
        if turns and s.turns:
            starts.append(len(turns))
        for t in s.turns:
            p = len(turns)
            turns.append(Turn(conv.user_id, "log", str(t["role"]), str(t["text"]), f"log:{p}", p))
    return turns, starts


def log_rows(
    conversations: Sequence[Conversation], embedder: Embedder, *, progress: bool = True
) -> list[LogRows]:
    """Per conversation: its fold, the gap rows of its log and where its sessions start."""
    cut = MemoryConfig().units.embed_max_chars
    out: list[LogRows] = []
    for conv in tqdm(conversations, desc="gap rows", disable=not progress):
        turns, starts = log_turns(conv)
        if len(turns) < 2:
            continue
        vectors = np.asarray(embedder.encode([utterance(t)[:cut] for t in turns]))
        y = np.zeros(len(turns) - 1)
        y[[p - 1 for p in starts]] = 1.0
        out.append((fold_of(conv), gap_rows(vectors, turns), y))
    return out


def fit_starts(
    rows: Sequence[LogRows], *, c: float, threshold: float, min_turns: int, fitted: dict[str, Any]
) -> dict[str, Any]:
    """A model document (`ConversationStarts.document`) fitted on `rows`."""
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([r[1] for r in rows])
    y = np.concatenate([r[2] for r in rows])
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    lr = LogisticRegression(C=c, max_iter=2000).fit((x - mean) / scale, y)
    return ConversationStarts.document(
        {
            "mean": [round(float(v), 6) for v in mean],
            "scale": [round(float(v), 6) for v in scale],
            "coef": [round(float(v), 6) for v in lr.coef_[0]],
            "intercept": round(float(lr.intercept_[0]), 6),
            "threshold": threshold,
            "min_turns": min_turns,
            "fitted": {**fitted, "C": c, "gaps": int(len(y)), "starts": int(y.sum())},
        }
    )


def scores(
    rows: Sequence[LogRows], scored: Sequence[np.ndarray], min_turns: int
) -> dict[str, dict[str, float]]:
    """Per threshold: precision, recall and false starts per 100 turns, in logs of `min_turns`+."""
    keep = [i for i, r in enumerate(rows) if len(r[2]) + 1 >= min_turns]
    y = np.concatenate([rows[i][2] for i in keep]) if keep else np.zeros(0)
    p = np.concatenate([scored[i] for i in keep]) if keep else np.zeros(0)
    turns = len(y) + len(keep)
    out = {}
    for t in THRESHOLDS:
        hit = p >= t
        tp, fp = int((hit & (y == 1)).sum()), int((hit & (y == 0)).sum())
        out[str(t)] = {
            "precision": round(tp / (tp + fp), 3) if tp + fp else 0.0,
            "recall": round(tp / y.sum(), 3) if y.sum() else 0.0,
            "false_per_100_turns": round(100 * fp / turns, 3) if turns else 0.0,
        }
    return out


def _table(table: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        "| threshold | precision | recall | false starts / 100 turns |",
        "|---|---|---|---|",
    ]
    for t, s in table.items():
        lines.append(
            f"| p >= {t} | {s['precision']:.2f} | {s['recall']:.2f} "
            f"| {s['false_per_100_turns']:.2f} |"
        )
    return lines


def _run(args: argparse.Namespace) -> int:
    embedder = make_embedder(args.embedder, args.cache)
    rows: list[LogRows] = []
    names: list[str] = []
    for spec in args.data:
        label, data = load_data_spec(spec, args.limit, "none")
        rows += log_rows(data.conversations, embedder)
        names.append(label)
    if not rows:
        raise SystemExit("give --data: conversation files to fit on")
    fit = {"c": args.C, "threshold": args.threshold, "min_turns": args.min_turns}
    folds = sorted({r[0] for r in rows})
    scored: list[np.ndarray] = [np.zeros(0)] * len(rows)
    out = Path(args.folds) if args.folds else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for fold in tqdm(folds, desc="fold models"):
        doc = fit_starts(
            [r for r in rows if r[0] != fold], **fit, fitted={"data": names, "without_fold": fold}
        )
        model = ConversationStarts(doc)
        for i, r in enumerate(rows):
            if r[0] == fold:
                scored[i] = model.of_rows(r[1])
        if out is not None:
            ConversationStarts.write(doc, out / f"{fold}.json")
    table = scores(rows, scored, args.min_turns)
    doc = fit_starts(rows, **fit, fitted={"data": names, "cross_validated": table})
    ConversationStarts.write(doc, args.out)
    print(f"fitted on {len(rows)} logs of {', '.join(names)} -> {args.out}")  # noqa: T201
    print("| feature | weight (per standard deviation) |\n|---|---|")  # noqa: T201
    for name, w in zip(doc["features"], doc["coef"], strict=True):
        print(f"| {name} | {w:+.3f} |")  # noqa: T201
    print(f"\ncross-validated ({len(folds)} folds), logs of {args.min_turns}+ turns:")  # noqa: T201
    print("\n".join(_table(table)))  # noqa: T201
    if out is not None:
        print(f"{len(folds)} fold models -> {out}")  # noqa: T201
    return 0


def register(bench: Any) -> None:
    """Add `bench fit-starts` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "fit-starts",
        help="fit where a conversation starts in a log without times (and one model per fold)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    p.add_argument("--out", default=str(_PACKAGE_MODEL), help="model file to write")
    p.add_argument("--folds", default=None, help="folder for one model per fold")
    p.add_argument("--C", type=float, default=0.3, help="inverse L2 strength (default 0.3)")
    p.add_argument(
        "--threshold", type=float, default=0.9, help="start probability kept (default 0.9)"
    )
    p.add_argument(
        "--min-turns",
        type=int,
        default=40,
        help="shortest one-time session the detector reads (default 40)",
    )
    add_embedder_arguments(p)
    p.set_defaults(func=_run)
