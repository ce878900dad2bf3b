"""`reflective-memory bench feedback`: does citation feedback pay off on questions not trained on?

Every conversation of the file is one user; all are ingested into one store with the library's
default config (or `--granularity` / `--denoiser`). Two protocols, picked from the data:

* **per user** (conversations with several questions, e.g. REALTALK / LoCoMo): each user's
  questions are split in two halves (split 0: file order, the first half teaches; splits 1..:
  a seeded shuffle). Feedback on every user's teaching half arrives interleaved, user by user,
  as in a live app; coverage is measured on every user's other half.
* **across users** (one question per conversation, e.g. LongMemEval): the users are split in
  two halves; feedback on one half's questions, coverage on the other's.

Feedback: a teaching question is retrieved as a live app would, `retrieve(budget_tokens=1000,
explore=True)` (small-to-big passages; once something is learned, an interleaving of the learned
and the served ranking, `retrieval.interleave`); a simulated generator cites the returned
passages that hold an evidence turn with RMM's measured recall (0.86) and any other with a
chance set for its precision (0.87, RMM Table 3) -- condition `citations`; or cites passages at
random at the same rate -- `noise`; or cites nothing -- `none`.
Coverage is what a user gets: `retrieve(budget_tokens=B)` on a memory that counts its budget in
words (`budget_unit="words"`, as `bench systems`), the fraction of the question's evidence turns
among the returned passages' turns, at every budget B.
Each condition starts from fresh reranker state; every split reports before / after coverage at
every budget, a learning curve, the feedback cost per episode and retrieval latency (at 1,000
words) before and after learning.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.config import MemoryConfig
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError
from reflective_memory.io import Conversation, Question, load_conversations
from reflective_memory.retrieval.ranker import TurnRanker, load_ranker
from reflective_memory.types import Retrieval
from tqdm import tqdm

from reflective_bench.feedback_report import as_json, plot_curves, report

__all__ = [
    "register",
    "run",
    "coverage",
    "simulated_citations",
    "plot_curves",
    "make_splits",
    "main",
    "CONDITIONS",
]

logger = logging.getLogger(__name__)

BUDGETS = (250, 500, 1000, 2000, 4000)
#: Word budget of a teaching retrieval (what the simulated generator reads and cites).
TEACH_BUDGET = 1000
PRECISION = 0.87
RECALL = 0.86
CONDITIONS = ("citations", "noise", "none")


@dataclass
class _Item:
    user: str
    question: Question

    @property
    def evidence(self) -> set[str]:
        return set(self.question.evidence)


@dataclass
class Split:
    """One split: teaching questions (interleaved across users) and test questions."""

    seed: int
    train: list[_Item] = field(default_factory=list)
    test: list[_Item] = field(default_factory=list)


def make_splits(convs: Sequence[Conversation], seeds: Sequence[int]) -> tuple[str, list[Split]]:
    """Protocol name and one `Split` per seed (see the module docs).

    Questions without evidence are left out. Per user, the teaching questions of all users are
    interleaved round-robin (user 1's first, user 2's first, ..., user 1's second, ...).
    """
    per_user = [(c.user_id, [q for q in c.questions if q.evidence]) for c in convs]
    per_user = [(u, qs) for u, qs in per_user if qs]
    if not per_user:
        raise InvalidInputError("no question with evidence in the data")
    multi = sum(len(qs) >= 2 for _, qs in per_user) >= max(1, len(per_user) // 2)
    out = []
    for seed in seeds:
        sp = Split(seed)
        if multi:
            teach: list[list[_Item]] = []
            for n, (user, qs) in enumerate(per_user):
                order = list(range(len(qs)))
                if seed != 0:
                    rng = np.random.default_rng([seed, n])
                    order = rng.permutation(len(qs)).tolist()
                half = len(qs) // 2
                teach.append([_Item(user, qs[i]) for i in order[:half]])
                sp.test += [_Item(user, qs[i]) for i in order[half:]]
            for j in range(max(len(t) for t in teach)):
                sp.train += [t[j] for t in teach if j < len(t)]
        else:
            rng = np.random.default_rng(seed)
            idx = rng.permutation(len(per_user)).tolist()
            half = len(per_user) // 2
            sp.train = [_Item(per_user[i][0], q) for i in idx[:half] for q in per_user[i][1]]
            sp.test = [_Item(per_user[i][0], q) for i in idx[half:] for q in per_user[i][1]]
        out.append(sp)
    return ("per user" if multi else "across users"), out


def coverage(retrieval: Retrieval, evidence: set[str]) -> float:
    """Fraction of evidence turns among the turns of the returned hits (passages)."""
    if not evidence:
        return 0.0
    got: set[str] = set()
    for h in retrieval.hits:
        got.update(h.memory.turn_ids)
    return len(got & evidence) / len(evidence)


def simulated_citations(
    retrieval: Retrieval,
    evidence: set[str],
    rng: np.random.Generator,
    *,
    p_false: float,
    noise_only: bool = False,
    cite_rate: float = 0.0,
) -> list[int]:
    """Cited hit positions of a simulated generator.

    Args:
        retrieval: The shown hits.
        evidence: Evidence turn ids of the question.
        rng: Random generator.
        p_false: Chance to cite a non-evidence memory (set for ~87% precision).
        noise_only: Cite at random, ignoring evidence.
        cite_rate: The chance to cite any memory when `noise_only`.
    """
    out = []
    for i, h in enumerate(retrieval.hits):
        if noise_only:
            if rng.random() < cite_rate:
                out.append(i)
            continue
        is_ev = bool(set(h.memory.turn_ids) & evidence)
        if rng.random() < (RECALL if is_ev else p_false):
            out.append(i)
    return out


class _QueryCache:
    """Wraps an embedder and memoises single-string encodes (the benchmark's repeated queries)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self._memo: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    def encode(self, texts: str | list[str]) -> np.ndarray:
        if not isinstance(texts, str):
            return self.inner.encode(texts)
        if texts not in self._memo:
            self._memo[texts] = self.inner.encode(texts)
        return self._memo[texts]


def _ingest(mem: ReflectiveMemory, convs: Sequence[Conversation]) -> None:
    for conv in tqdm(convs, desc="ingest", unit="user"):
        for s in conv.sessions:
            if not s.turns:
                continue
            if mem.store.session(conv.user_id, s.session_id) is not None:  # resumed run
                if s.session_id in mem.open_sessions(conv.user_id):
                    mem.end_session(conv.user_id, s.session_id)
                continue
            mem.add_turns(
                [{**t, "user_id": conv.user_id, "session_id": s.session_id} for t in s.turns]
            )
            mem.end_session(conv.user_id, s.session_id)


def _evaluate(
    mem: ReflectiveMemory,
    items: Sequence[_Item],
    budgets: Sequence[int],
    times: list[float] | None = None,
    memo: dict[tuple[str, str, int], float] | None = None,
    by_user: dict[str, dict[int, float]] | None = None,
) -> dict[int, float]:
    """Mean coverage (%) of `retrieve(budget_tokens=B)` per budget.

    `memo` caches per (user, question, budget) results of an untrained engine (its rankings do
    not depend on the split); `times` collects the latency of the 1,000-word retrievals;
    `by_user` receives the same means per user.
    """
    per: dict[str, list[dict[int, float]]] = {}
    for it in items:
        got = per.setdefault(it.user, [])
        got.append({})
        for b in budgets:
            key = (it.user, it.question.question, b)
            if memo is not None and key in memo and times is None:
                got[-1][b] = memo[key]
                continue
            t0 = time.perf_counter()
            r = mem.retrieve(it.user, it.question.question, budget_tokens=b, explore=False)
            if times is not None and b == TEACH_BUDGET:
                times.append((time.perf_counter() - t0) * 1000)
            got[-1][b] = coverage(r, it.evidence)
            if memo is not None:
                memo[key] = got[-1][b]
    if by_user is not None:
        by_user.update({u: _percent(rows, budgets) for u, rows in per.items()})
    return _percent([row for rows in per.values() for row in rows], budgets)


def _percent(rows: Sequence[dict[int, float]], budgets: Sequence[int]) -> dict[int, float]:
    return {b: 100.0 * sum(r[b] for r in rows) / max(len(rows), 1) for b in budgets}


def _calibrate(mem: ReflectiveMemory, train: Sequence[_Item]) -> tuple[float, float]:
    """Evidence base rate among shown memories -> false-citation chance and citation rate."""
    shown = ev = 0
    for it in train:
        r = mem.retrieve(it.user, it.question.question, budget_tokens=TEACH_BUDGET, explore=False)
        shown += len(r.hits)
        ev += sum(1 for h in r.hits if set(h.memory.turn_ids) & it.evidence)
    e = ev / max(shown, 1)
    # precision = R e / (R e + p (1 - e))  =>  p = R e (1 - P) / (P (1 - e))
    p_false = min(1.0, RECALL * e * (1 - PRECISION) / (PRECISION * max(1 - e, 1e-9)))
    cite_rate = RECALL * e + p_false * (1 - e)
    return p_false, cite_rate


@dataclass
class _Run:
    curve: list[tuple[float, dict[int, float]]]
    train_before: dict[int, float]
    train_after: dict[int, float]
    feedback_ms: list[float]
    retrieve_ms_after: list[float]
    test_by_user: dict[str, dict[int, float]] = field(default_factory=dict)
    gates: dict[str, Any] = field(default_factory=dict)


def _train(
    mem: ReflectiveMemory,
    split: Split,
    condition: str,
    *,
    epochs: int,
    checkpoints: int,
    budgets: Sequence[int],
    before: dict[int, float],
    train_before: dict[int, float],
    per_user_marks: Sequence[int] = (),
) -> _Run:
    rng = np.random.default_rng([split.seed, CONDITIONS.index(condition)])
    curve_budgets = tuple(b for b in budgets if b <= TEACH_BUDGET)
    p_false, cite_rate = _calibrate(mem, split.train)
    # the curve's unit: episodes per user, or episodes in all when each user asks once (across
    # users: the stream of users teaches the shared weights)
    users = max(len({it.user for it in split.train}), 1)
    if users == len(split.train):
        users = 1
    total = epochs * len(split.train)
    if per_user_marks:
        marks = {round(m * users) for m in per_user_marks}
    else:
        marks = {round(total * (c + 1) / checkpoints) for c in range(checkpoints)}
    curve = [(0.0, before)]
    fb_ms: list[float] = []
    done = 0
    for epoch in range(epochs):
        order = list(range(len(split.train)))
        if epoch > 0:
            rng.shuffle(order)
        for i in order:
            it = split.train[i]
            r = mem.retrieve(
                it.user, it.question.question, budget_tokens=TEACH_BUDGET, explore=True
            )
            if condition == "none":
                cited: list[int] = []
            else:
                cited = simulated_citations(
                    r,
                    it.evidence,
                    rng,
                    p_false=p_false,
                    noise_only=condition == "noise",
                    cite_rate=cite_rate,
                )
            t0 = time.perf_counter()
            mem.feedback(r, cited=cited)
            fb_ms.append((time.perf_counter() - t0) * 1000)
            done += 1
            if done in marks and done < total:
                curve.append((done / users, _evaluate(mem, split.test, curve_budgets)))
    after_ms: list[float] = []
    by_user: dict[str, dict[int, float]] = {}
    curve.append((done / users, _evaluate(mem, split.test, budgets, after_ms, by_user=by_user)))
    train_after = _evaluate(mem, split.train, (TEACH_BUDGET,))
    return _Run(curve, train_before, train_after, fb_ms, after_ms, by_user, _gates(mem, split))


def _gates(mem: ReflectiveMemory, split: Split) -> dict[str, Any]:
    """The gates after teaching: the shared one, and how many users' own offsets rank."""
    users = sorted({it.user for it in split.train})
    own = [mem.ranker_weights(u)["user_gate"] for u in users]
    return {
        "shared": mem.ranker_weights()["shared_gate"],
        "users_serving": sum(g["serves"] for g in own),
        "users": len(users),
    }


def start_ranker(start: str, store: Path) -> str:
    """`passages.ranker` for `--start`.

    `prior`: the shipped ranker; `cosine`: a ranker that weighs only the turn's query cosine
    (at its shipped weight), an uninformed start; anything else: a ranker file.
    """
    if start == "prior":
        return "learned"
    if start != "cosine":
        return start
    prior = load_ranker()
    weights = {n: (w if n == "cosine" else 0.0) for n, w in prior.weights.items()}
    path = store.with_name(store.name + "-cosine-ranker.json")
    TurnRanker(weights, {"data": ["cosine only: an uninformed start"]}).save(path)
    return str(path)


def _config(args: argparse.Namespace) -> MemoryConfig:
    rerank: dict[str, Any] = {"explore": False, "top_k": args.top_k}
    given = {
        "turn_update": args.turn_update,
        "turn_learning_rate": args.turn_lr,
        "turn_user_learning_rate": args.turn_user_lr,
        "turn_pull": args.turn_pull,
        "turn_prior_pull": args.turn_prior_pull,
        "scope": args.scope,
    }
    rerank.update({name: val for name, val in given.items() if val is not None})
    kw: dict[str, Any] = {
        "rerank": rerank,
        # budgets in whitespace words, as `bench systems`
        "passages": {"budget_unit": "words", "ranker": start_ranker(args.start, Path(args.store))},
    }
    if args.granularity != "default":
        kw["units"] = {"granularities": (args.granularity,)}
    return MemoryConfig(**kw)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown report."""
    convs = load_conversations(args.data)
    if args.limit is not None:
        convs = convs[: args.limit]
    seeds = list(range(args.splits)) if args.seeds is None else list(args.seeds)
    protocol, splits = make_splits(convs, seeds)
    store = Path(args.store)
    cfg = _config(args)
    from reflective_bench.retrieval import make_embedder, parse_denoiser

    embedder = _QueryCache(make_embedder(args.embedder, args.cache))
    denoiser = parse_denoiser(args.denoiser)
    conditions = list(args.conditions)

    def fresh(seed: int) -> ReflectiveMemory:
        shutil.rmtree(store / "rerankers", ignore_errors=True)
        c = cfg.replace(rerank={"seed": seed})
        return ReflectiveMemory(store, config=c, embedder=embedder, denoiser=denoiser)

    t0 = time.time()
    with fresh(0) as mem:
        _ingest(mem, convs)
    ingest_s = time.time() - t0
    budgets = BUDGETS
    per_split: list[dict[str, Any]] = []
    untrained: dict[tuple[str, str, int], float] = {}  # the same for every split
    for sp in splits:
        with fresh(sp.seed) as mem:
            ms_before: list[float] = []
            _evaluate(mem, sp.test[:20], (TEACH_BUDGET,))  # warm caches
            _evaluate(mem, sp.test, (TEACH_BUDGET,), ms_before)
            before_by_user: dict[str, dict[int, float]] = {}
            before = _evaluate(mem, sp.test, budgets, memo=untrained, by_user=before_by_user)
            train_before = _evaluate(mem, sp.train, (TEACH_BUDGET,), memo=untrained)
        runs: dict[str, _Run] = {}
        for cond in tqdm(conditions, desc=f"split {sp.seed}", unit="condition"):
            with fresh(sp.seed) as mem:
                runs[cond] = _train(
                    mem,
                    sp,
                    cond,
                    epochs=args.epochs,
                    checkpoints=args.checkpoints,
                    budgets=budgets,
                    before=before,
                    train_before=train_before,
                    per_user_marks=args.marks,
                )
        per_split.append(
            {
                "split": sp,
                "before": before,
                "before_by_user": before_by_user,
                "runs": runs,
                "ms": ms_before,
            }
        )
    shutil.rmtree(store / "rerankers", ignore_errors=True)
    text = report(
        args,
        cfg,
        protocol,
        convs,
        per_split,
        conditions,
        ingest_s,
        embedder.name,
        budgets=budgets,
        precision=PRECISION,
        recall=RECALL,
    )
    print(text)  # noqa: T201 - the command's output
    if args.json is not None:
        Path(args.json).write_text(json.dumps(as_json(per_split), indent=1))
    return 0


def register(bench_subparsers: Any) -> None:
    """Add the `feedback` benchmark to `reflective-memory bench`."""
    p = bench_subparsers.add_parser("feedback", help=__doc__.splitlines()[0])
    _arguments(p)
    p.set_defaults(func=run)


def _arguments(p: argparse.ArgumentParser) -> None:
    from reflective_bench.retrieval import add_embedder_arguments

    p.add_argument("--data", required=True, help="REALTALK/LoCoMo, LongMemEval or our own JSON")
    p.add_argument("--store", default="rmm-bench-store", help="store directory (reused)")
    p.add_argument(
        "--granularity",
        default="default",
        choices=("default", "turn", "segment", "session"),
        help="memory unit (default: the library's)",
    )
    add_embedder_arguments(p)
    p.add_argument("--denoiser", default="default", help="key denoiser (default: the library's)")
    p.add_argument("--splits", type=int, default=5, help="splits 0..N-1 (split 0: file order)")
    p.add_argument("--seeds", type=_ints, default=None, help="explicit split seeds, e.g. 0,3")
    p.add_argument(
        "--conditions",
        type=_names,
        default=CONDITIONS,
        help=f"comma-separated among {','.join(CONDITIONS)}",
    )
    p.add_argument("--epochs", type=int, default=1, help="passes over the teaching half")
    p.add_argument("--checkpoints", type=int, default=3, help="learning-curve points per run")
    p.add_argument(
        "--top-k", type=int, default=20, help="candidates each ranker contributes at least"
    )
    # The turn ranker's learning: not given = the library's defaults.
    p.add_argument("--scope", default=None, choices=("user", "shared", "isolated"))
    p.add_argument(
        "--start",
        default="prior",
        help="the ranker learning starts from: prior (shipped), cosine (query cosine only), "
        "or a ranker file (e.g. fitted on another corpus)",
    )
    p.add_argument("--turn-update", default=None, choices=("pairwise", "reinforce", "expected"))
    p.add_argument("--turn-lr", type=float, default=None, help="shared offsets' step")
    p.add_argument("--turn-user-lr", type=float, default=None, help="per-user offsets' step")
    p.add_argument("--turn-pull", type=float, default=None, help="per-user pull to shared")
    p.add_argument("--turn-prior-pull", type=float, default=None, help="shared pull to prior")
    p.add_argument(
        "--marks", type=_ints, default=(), help="curve points, episodes per user (10,20,40)"
    )
    p.add_argument("--limit", type=int, default=None, help="use the first N conversations")
    p.add_argument("--plot", default="docs/rmm_feedback_curve.png", help="'' for none")
    p.add_argument("--json", default=None, help="write the results as JSON here")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> tuple[str, ...]:
    out = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in out if x not in CONDITIONS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"conditions must be among {CONDITIONS}, got {text!r}")
    return out


def _arguments_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench feedback", description=__doc__)
    _arguments(p)
    return p


def main(argv: Sequence[str] | None = None, _run: Callable[..., int] = run) -> int:
    """Standalone entry: `python -m reflective_bench.feedback --data ...`."""
    p = _arguments_parser()
    logging.basicConfig(level=logging.WARNING)
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
