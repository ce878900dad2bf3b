"""`reflective-memory bench transfer`: how much could feedback teach about a user's next questions?

`bench feedback` measures what the citation-trained reranker gains on a user's unseen questions.
This bench bounds what *any* learner fed by that user's teaching questions could gain, by giving
it labels the library never has, on the same splits (`bench.feedback.make_splits`) and the same
coverage (`retrieve(budget_tokens=B)` passages, budgets in words):

* **free ceiling**: the teaching half's true evidence turns are added to every test answer at
  no cost in budget (nothing displaced) -- what perfect per-user memory could add at most;
* **oracle credit**: the same turns have their vote multiplied by `1 + strength` on every later
  question of their user (a per-user memory table with perfect labels; only they compete for
  the budget, so other evidence can be displaced);
* **oracle features**: a logistic model over generic turn features (question mark, length,
  digits, first person, vote rank, voting units, very short), fit on the teaching halves' true
  evidence labels of all users (a prior shared by users), scales every voted turn's vote by
  `exp(strength * z)`, z its centred decision value;
* **citation features**: the same model fit on what RMM-quality citations say (simulated as in
  `bench feedback`: the turns of a cited 1,000-word passage are positive, the other shown turns
  negative): what the library could learn from the signal it really gets.

The rules run inside the real pipeline: `ReflectiveMemory._adjust_votes` is the last step of
vote collection (after speaker focus and recency), and this bench overrides it in a subclass.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from reflective_memory.bench.datasets import Conversation, ingest_conversations, load_conversations
from reflective_memory.bench.feedback import (
    BUDGETS,
    TEACH_BUDGET,
    Split,
    _calibrate,
    coverage,
    make_splits,
    simulated_citations,
)
from reflective_memory.config import MemoryConfig
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.passages import TurnVotes
from reflective_memory.rmm.turn_prior import TURN_FEATURES, TurnPrior, turn_features
from reflective_memory.types import Turn

__all__ = ["FEATURE_NAMES", "StudyMemory", "run_transfer", "format_transfer", "register"]

#: Turn features of the study models (`reflective_memory.rmm.turn_prior.TURN_FEATURES`).
FEATURE_NAMES = TURN_FEATURES

Rule = Callable[[str, TurnVotes, Callable[[str], list[Turn]]], None]


class StudyMemory(ReflectiveMemory):
    """A `ReflectiveMemory` whose turn votes a study rule may change before packing.

    `rule(user_id, votes, session_turns)` runs as the last step of vote collection; `None`
    keeps the library's votes.
    """

    rule: Rule | None = None

    def _adjust_votes(
        self,
        user_id: str,
        query: str,
        votes: TurnVotes,
        session_turns: Callable[[str], list[Turn]],
    ) -> None:
        if self.rule is not None:
            self.rule(user_id, votes, session_turns)


def _credit_rule(table: dict[str, set[str]], strength: float) -> Rule:
    def rule(user_id: str, votes: TurnVotes, session_turns: Callable[[str], list[Turn]]) -> None:
        mine = table.get(user_id, set())
        for key in votes.turn:
            if session_turns(key[0])[key[1]].turn_id in mine:
                votes.turn[key] *= 1.0 + strength

    return rule


def _model_rule(model: Any, strength: float) -> Rule:
    def rule(user_id: str, votes: TurnVotes, session_turns: Callable[[str], list[Turn]]) -> None:
        keys, x = turn_features(votes, session_turns)
        if not keys:
            return
        z = model.decision_function(x)
        z = np.clip(z - z.mean(), -3.0, 3.0)
        for key, zz in zip(keys, z, strict=True):
            votes.turn[key] *= float(np.exp(strength * zz))

    return rule


def _prior_rule(prior: TurnPrior, strength: float) -> Rule:
    def rule(user_id: str, votes: TurnVotes, session_turns: Callable[[str], list[Turn]]) -> None:
        prior.scale_votes(votes, session_turns, strength)

    return rule


def _capture(store: dict[str, Any]) -> Rule:
    """A rule that changes nothing and keeps the last call's voted turns and features."""

    def rule(user_id: str, votes: TurnVotes, session_turns: Callable[[str], list[Turn]]) -> None:
        keys, x = turn_features(votes, session_turns)
        store["ids"] = [session_turns(k[0])[k[1]].turn_id for k in keys]
        store["x"] = x

    return rule


def _fit(rows: list[np.ndarray], labels: list[np.ndarray]) -> Any:
    from sklearn.linear_model import LogisticRegression

    x, y = np.concatenate(rows), np.concatenate(labels)
    if len(set(y.tolist())) < 2:
        return None
    return LogisticRegression(max_iter=1000, class_weight="balanced").fit(x, y)


def _coverages(mem: StudyMemory, split: Split, budgets: Sequence[int]) -> np.ndarray:
    """`(questions, budgets)` coverage of the split's test questions."""
    return np.array(
        [
            [
                coverage(mem.retrieve(it.user, it.question.question, budget_tokens=b), it.evidence)
                for b in budgets
            ]
            for it in split.test
        ]
    )


def _study_split(
    mem: StudyMemory,
    split: Split,
    strengths: Sequence[float],
    budgets: Sequence[int],
    online_params: dict[str, Any],
) -> dict[str, np.ndarray]:
    """Mean coverage change (points) per study row on one split."""
    mem.rule = None
    base = _coverages(mem, split, budgets)
    taught: dict[str, set[str]] = {}
    for it in split.train:
        taught.setdefault(it.user, set()).update(it.evidence)
    free = []
    for it in split.test:
        got: set[str] = set()
        for h in mem.retrieve(it.user, it.question.question, budget_tokens=TEACH_BUDGET).hits:
            got.update(h.memory.turn_ids)
        ev = it.evidence
        free.append(len((got | (taught.get(it.user, set()) & ev)) & ev) / len(ev))
    out: dict[str, np.ndarray] = {}
    col = list(budgets).index(TEACH_BUDGET) if TEACH_BUDGET in budgets else None
    if col is not None:
        row = np.full(len(budgets), np.nan)
        row[col] = 100.0 * (np.mean(free) - base[:, col].mean())
        out["free ceiling"] = row
    # teaching retrievals: features of every voted turn, true and citation labels
    seen: dict[str, Any] = {}
    mem.rule = _capture(seen)
    p_false, _ = _calibrate(mem, split.train)
    rng = np.random.default_rng([split.seed, 0])
    xs, y_true, xs_shown, y_cited = [], [], [], []
    for it in split.train:
        r = mem.retrieve(it.user, it.question.question, budget_tokens=TEACH_BUDGET)
        ids, x = seen["ids"], seen["x"]
        xs.append(x)
        y_true.append(np.array([t in it.evidence for t in ids]))
        cited = set(simulated_citations(r, it.evidence, rng, p_false=p_false))
        pos = {t for i, h in enumerate(r.hits) if i in cited for t in h.memory.turn_ids}
        shown = {t for h in r.hits for t in h.memory.turn_ids}
        keep = np.array([t in shown for t in ids], dtype=bool)
        xs_shown.append(x[keep] if len(ids) else x)
        y_cited.append(np.array([t in pos for t, k in zip(ids, keep, strict=True) if k]))
    models = {"oracle features": _fit(xs, y_true), "citation features": _fit(xs_shown, y_cited)}
    online = TurnPrior(**online_params)  # the library's learner, one answer at a time
    for x, y in zip(xs_shown, y_cited, strict=True):
        online.partial_fit(x, y)
    for s in strengths:
        rules: list[tuple[str, Rule | None]] = [
            (f"oracle credit x{1 + s:g}", _credit_rule(taught, s))
        ]
        rules += [
            (f"{name} {s:g}", None if m is None else _model_rule(m, s))
            for name, m in models.items()
        ]
        rules.append((f"citation features, online TurnPrior {s:g}", _prior_rule(online, s)))
        for name, rule in rules:
            if rule is None:
                continue
            mem.rule = rule
            out[name] = 100.0 * (_coverages(mem, split, budgets).mean(0) - base.mean(0))
    mem.rule = None
    return out


def run_transfer(
    conversations: Sequence[Conversation],
    *,
    seeds: Sequence[int],
    strengths: Sequence[float] = (0.25, 0.5),
    budgets: Sequence[int] = BUDGETS,
    embedder: Any = None,
    progress: bool = True,
    online: dict[str, Any] | None = None,
) -> dict[str, list[np.ndarray]]:
    """Run every study row on every split.

    Args:
        conversations: One per user, with questions (the per-user protocol of `bench feedback`).
        seeds: Split seeds (0: file order).
        strengths: Vote strengths of the credit and model rules.
        budgets: Word budgets.
        embedder: Embedder of the memory (`None`: the library's default).
        progress: Show progress bars.
        online: `TurnPrior` arguments of the online row (`None`: its defaults).

    Returns:
        Per study row, one `(len(budgets),)` array of coverage change in points per split.
    """
    protocol, splits = make_splits(conversations, seeds)
    cfg = MemoryConfig(budget_unit="words", rerank_explore=False)
    rows: dict[str, list[np.ndarray]] = {}
    with StudyMemory(None, config=cfg, embedder=embedder) as mem:
        ingest_conversations(mem, conversations, progress=progress)
        for sp in tqdm(splits, desc="bench transfer", unit="split", disable=not progress):
            for name, delta in _study_split(mem, sp, strengths, budgets, online or {}).items():
                rows.setdefault(name, []).append(delta)
    return rows


def format_transfer(rows: dict[str, list[np.ndarray]], budgets: Sequence[int]) -> str:
    """Markdown table: mean (and min..max over splits) coverage change per row and budget."""
    head = "| study (labels the library never has, except the last) | " + " | ".join(
        f"Δcov@{b}" for b in budgets
    )
    lines = [head + " |", "|---|" + "---|" * len(budgets)]
    for name, per_split in rows.items():
        arr = np.vstack(per_split)
        cells = []
        for j in range(len(budgets)):
            col = arr[:, j]
            if np.all(np.isnan(col)):
                cells.append("")
            else:
                cells.append(
                    f"{np.nanmean(col):+.2f} ({np.nanmin(col):+.1f}..{np.nanmax(col):+.1f})"
                )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from reflective_memory.bench.retrieval import make_embedder

    convs = load_conversations(args.data)
    if args.limit is not None:
        convs = convs[: args.limit]
    seeds = list(range(args.splits))
    rows = run_transfer(
        convs,
        seeds=seeds,
        strengths=args.strengths,
        embedder=make_embedder(args.embedder, args.cache),
        online=None if args.online_lr is None else {"learning_rate": args.online_lr},
    )
    print(  # noqa: T201 - the command's output
        f"data: {args.data}; splits: {seeds}; "
        "change of held-out coverage in points, mean (min..max) over splits"
    )
    print(format_transfer(rows, BUDGETS))  # noqa: T201 - the command's output
    return 0


def register(bench_subparsers: Any) -> None:
    """Add `transfer` to `reflective-memory bench`."""
    from reflective_memory.bench.retrieval import add_embedder_arguments

    p = bench_subparsers.add_parser("transfer", help=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="REALTALK/LoCoMo-style file (per-user questions)")
    p.add_argument("--splits", type=int, default=5, help="splits 0..N-1 (split 0: file order)")
    p.add_argument(
        "--strengths",
        type=lambda t: [float(x) for x in t.split(",") if x.strip()],
        default=[0.25, 0.5],
        help="vote strengths of the study rules, comma-separated",
    )
    p.add_argument(
        "--online-lr", type=float, default=None, help="learning rate of the online TurnPrior row"
    )
    p.add_argument("--limit", type=int, default=None, help="use the first N conversations")
    add_embedder_arguments(p)
    p.set_defaults(func=_run)
