"""`reflective-memory bench fit-ranker`: fit the learned turn ranker on the dev sets, with folds.

Collect: every conversation of each `--data FILE[:ROLES]` (ROLES `names` or `ua`, see
`bench retrieval --roles`) is ingested into the default memory; each question with evidence is
asked once (a budget of 1,000 words, its date as `now`), and the feature rows of its voted
turns (`reflective_memory.retrieval.features`) are kept with whether each turn is evidence. The
rows are cached in `--table` (npz), so refitting needs no new run (`--table` alone, as many as
there are row files). `--perturb NAME` collects them from a messy history of the data, as
`bench retrieval --perturb` stores it (a copy of an evidence turn is labelled evidence).

Fit: the model on every question (written to `--out`, by default the file the package ships);
with `--folds DIR`, one model per fold fitted without that fold's questions. A conversation of
many questions (a REALTALK chat, under either roles) is a fold of its own (leave one chat out);
a conversation of one question (LongMemEval) falls in one of 5 folds by a hash of its id.
`bench retrieval --ranker-folds DIR` then scores each conversation with its fold's model: the
cross-validated numbers.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.embed import Embedder
from reflective_memory.io import Conversation, ingest_conversations
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.ranker import fit_ranker
from tqdm import tqdm

from reflective_bench.perturb import (
    Copies,
    add_data_arguments,
    add_perturb_argument,
    load_data_spec,
)
from reflective_bench.retrieval import add_embedder_arguments, make_embedder
from reflective_bench.systems import DEFAULT, fold_of

__all__ = ["collect_rows", "register"]

logger = logging.getLogger(__name__)

#: The budget (words) each question is asked with while its rows are collected.
COLLECT_BUDGET = 1000
_PACKAGE_MODEL = Path(__file__).resolve().parent.parent / "reflective_memory/data/turn_ranker.json"


#: One question's rows: `(fold, feature rows, evidence labels, newness)`; `newness` is each
#: row's turn time (epoch seconds, its position within a session added as a fraction) when the
#: question asks about the present, else None (`fit_ranker`'s order pairs).
Rows = tuple[str, np.ndarray, np.ndarray, "np.ndarray | None"]


def collect_rows(
    conversations: Sequence[Conversation],
    embedder: Embedder,
    *,
    progress: bool = True,
    copies: Copies | None = None,
) -> list[Rows]:
    """Per question with evidence: `(fold, feature rows, evidence labels, newness)`.

    With `copies` (`--perturb repeated`), a copy of an evidence turn is labelled evidence.
    """
    originals = Copies() if copies is None else copies
    system = replace(
        DEFAULT, config={"passages": {"ranker": "learned"}}
    )  # rows, whatever the default
    out: list[Rows] = []
    for conv in tqdm(conversations, desc="collect ranker rows", disable=not progress):
        with system.build(embedder) as mem:
            ingest_conversations(mem, [conv], progress=False)
            turn_ids: dict[str, list[str]] = {}
            times: dict[str, list[float]] = {}
            for t in sorted(mem.store.turns(conv.user_id), key=lambda t: t.position):
                turn_ids.setdefault(t.session_id, []).append(t.turn_id)
                when = t.timestamp.timestamp() if t.timestamp is not None else 0.0
                times.setdefault(t.session_id, []).append(when + t.position / 1e6)
            fold = fold_of(conv)
            for q in conv.questions:
                evidence = set(q.evidence)
                if not evidence:
                    continue
                r = mem.retriever
                req = r.request(
                    conv.user_id, q.question, None, COLLECT_BUDGET, None, None, None, None,
                    None, q.date,
                )  # fmt: skip
                state = r.state(req)
                feats = state.features
                if feats is None or not feats.keys:
                    continue
                labels = np.array(
                    [
                        originals.original(conv.user_id, turn_ids[s][p]) in evidence
                        for s, p in feats.keys
                    ]
                )
                newness = np.array([times[s][p] for s, p in feats.keys]) if state.recency else None
                out.append((fold, feats.matrix, labels, newness))
    return out


def _save_table(path: str, rows: list[tuple[str, Rows]]) -> None:
    np.savez_compressed(
        path,
        features=np.array(FEATURES),
        data=np.array([d for d, _ in rows]),
        folds=np.array([r[0] for _, r in rows]),
        sizes=np.array([len(r[1]) for _, r in rows]),
        matrix=np.vstack([r[1] for _, r in rows]),
        labels=np.concatenate([r[2] for _, r in rows]),
        present=np.array([r[3] is not None for _, r in rows]),
        newness=np.concatenate(
            [r[3] if r[3] is not None else np.zeros(len(r[1])) for _, r in rows]
        ),
    )


def _load_table(path: str) -> list[tuple[str, Rows]]:
    z = np.load(path)
    if tuple(z["features"].tolist()) != FEATURES or "newness" not in z:
        raise SystemExit(f"{path}: rows of other features; collect them again")
    # each `z[name]` reads the array again: read each once (a slice of one per question kept
    # every question's copy of the whole matrix alive, 24 GB for three REALTALK tables)
    matrix, labels, newness = z["matrix"], z["labels"], z["newness"]
    out: list[tuple[str, Rows]] = []
    at = 0
    for d, f, n, present in zip(z["data"], z["folds"], z["sizes"], z["present"], strict=True):
        part = slice(at, at + int(n))
        new = newness[part] if present else None
        out.append((str(d), (str(f), matrix[part], labels[part], new)))
        at += int(n)
    return out


def _run(args: argparse.Namespace) -> int:
    rows: list[tuple[str, Rows]] = []
    if args.data:
        embedder = make_embedder(args.embedder, args.cache)
        for spec in args.data:
            label, data = load_data_spec(spec, args.limit, args.perturb)
            if data.name != "none":
                print(f"{label}: {data.line()}")  # noqa: T201
            got = collect_rows(data.conversations, embedder, copies=data.copies)
            rows += [(label, r) for r in got]
        if len(args.table) > 1:
            raise SystemExit("with --data, give one --table to write the rows to")
        if args.table:
            _save_table(args.table[0], rows)
    elif args.table:
        rows = [row for path in args.table for row in _load_table(path)]
    else:
        raise SystemExit("give --data (to collect rows) or --table (rows collected before)")
    data = sorted({d for d, _ in rows})
    model = fit_ranker(
        [r[1:] for _, r in rows],
        fitted={"data": data, "collect_budget_words": COLLECT_BUDGET},
    )
    model.save(args.out)
    print(f"fitted on {model.fitted['questions']} questions of {', '.join(data)} -> {args.out}")  # noqa: T201
    print("| feature | weight |\n|---|---|")  # noqa: T201
    for name, w in model.weights.items():
        print(f"| {name} | {w:+.3f} |")  # noqa: T201
    if args.folds:
        out = Path(args.folds)
        out.mkdir(parents=True, exist_ok=True)
        folds = sorted({r[0] for _, r in rows})
        for fold in folds:
            m = fit_ranker(
                [r[1:] for _, r in rows if r[0] != fold],
                fitted={"data": data, "without_fold": fold},
            )
            m.save(out / f"{fold}.json")
        print(f"{len(folds)} fold models -> {out}")  # noqa: T201
    return 0


def register(bench: Any) -> None:
    """Add `bench fit-ranker` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "fit-ranker",
        help="fit the learned turn ranker on dev sets (and one model per fold)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    add_perturb_argument(p)
    p.add_argument(
        "--table",
        action="append",
        default=[],
        help="npz of collected rows: written (with --data), or read (repeatable, without --data)",
    )
    p.add_argument("--out", default=str(_PACKAGE_MODEL), help="model file to write")
    p.add_argument("--folds", default=None, help="folder for one model per fold")
    add_embedder_arguments(p)
    p.set_defaults(func=_run)
