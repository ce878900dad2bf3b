"""`reflective-memory bench feedback`: does the citation-trained reranker learn?

Protocol (issue 6): every LongMemEval question is one user whose whole haystack (~490 turns) is
ingested as turn units (the default; `--granularity` changes it) with raw keys (`--denoiser none`
by default, so the embedding cache shared with `bench retrieval` hits). Questions are split in
two halves. On the training half, the engine
retrieves the top-M with exploration on, a simulated generator "cites" the shown memories that
contain an evidence turn, with label noise at RMM's measured citation quality (precision ~87%,
recall ~86%, paper Table 3), and `ReflectiveMemory.feedback` trains one shared reranker. The test
half is measured before, during and after training: evidence coverage under a word budget (rank
memories, pack them in rank order into N words, count the evidence turns that made it in).

A control run trains a fresh reranker on pure-noise citations (random memories cited at the same
rate): coverage should not drop beyond noise.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from reflective_memory.config import MemoryConfig
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import InvalidInputError
from reflective_memory.types import Retrieval

__all__ = ["register", "run", "coverage", "simulated_citations", "plot_curves", "main"]

logger = logging.getLogger(__name__)

BUDGETS = (250, 500, 1000, 2000, 4000)
PRECISION = 0.87
RECALL = 0.86


def _load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, list) or not data or "haystack_sessions" not in data[0]:
        raise InvalidInputError(f"{path} is not LongMemEval-style data")
    return data


def _sessions(
    q: dict[str, Any], distractors: int | None = None, seed: int = 0
) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """`(unique session id, date, turns)` of a haystack (repeated ids get a `#n` suffix).

    With `distractors`, keep the evidence sessions plus that many other sessions, drawn with a
    seeded generator, in haystack order.
    """
    seen: dict[str, int] = {}
    out = []
    for sid, date, sess in zip(
        q["haystack_session_ids"], q["haystack_dates"], q["haystack_sessions"], strict=True
    ):
        n = seen.get(sid, 0)
        seen[sid] = n + 1
        out.append((sid if n == 0 else f"{sid}#{n}", date, sess))
    if distractors is None:
        return out
    ev = [i for i, (_, _, sess) in enumerate(out) if any(t.get("has_answer") for t in sess)]
    ev += [i for i, (sid, _, _) in enumerate(out) if sid in q["answer_session_ids"]]
    rest = [i for i in range(len(out)) if i not in set(ev)]
    rng = np.random.default_rng([seed, int(q["question_id"][:8], 16) % (2**31)])
    pick = rng.choice(rest, size=min(distractors, len(rest)), replace=False).tolist()
    return [out[i] for i in sorted(set(ev) | set(pick))]


def _evidence(q: dict[str, Any]) -> set[str]:
    out = set()
    for sid, _, sess in _sessions(q):
        for i, t in enumerate(sess):
            if t.get("has_answer"):
                out.add(f"{sid}:{i}")
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


def _ingest(
    mem: ReflectiveMemory, data: list[dict[str, Any]], distractors: int | None, seed: int
) -> None:
    for q in tqdm(data, desc="ingest", unit="question"):
        user = q["question_id"]
        for sid, date, sess in _sessions(q, distractors, seed):
            if mem.store.session(user, sid) is not None:  # resumed run
                if sid in mem.open_sessions(user):
                    mem.end_session(user, sid)
                continue
            turns = [
                {
                    "user_id": user,
                    "session_id": sid,
                    "role": t["role"],
                    "text": t["content"] if t["content"].strip() else "(empty)",
                    "timestamp": date,
                    "turn_id": f"{sid}:{i}",
                }
                for i, t in enumerate(sess)
            ]
            if turns:
                mem.add_turns(turns)
                mem.end_session(user, sid)


def coverage(retrieval: Retrieval, evidence: set[str], budgets: Sequence[int]) -> dict[int, float]:
    """Fraction of evidence turns inside the hits packed in rank order into each word budget.

    A hit that does not fit the remaining budget is skipped (smaller later hits may still fit).
    """
    out = {}
    for b in budgets:
        used, got = 0, set()
        for h in retrieval.hits:
            cost = len(h.memory.text.split())
            if used + cost > b:
                continue
            used += cost
            got.update(set(h.memory.turn_ids) & evidence)
        out[b] = len(got) / len(evidence) if evidence else 0.0
    return out


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


@dataclass
class _Split:
    train: list[dict[str, Any]]
    test: list[dict[str, Any]]


def _evaluate(
    mem: ReflectiveMemory, qs: list[dict[str, Any]], budgets: Sequence[int], k: int
) -> dict[int, float]:
    tot = dict.fromkeys(budgets, 0.0)
    for q in qs:
        r = mem.retrieve(q["question_id"], q["question"], k=k, explore=False)
        for b, v in coverage(r, _evidence(q), budgets).items():
            tot[b] += v
    return {b: 100.0 * v / len(qs) for b, v in tot.items()}


def _ceiling(
    mem: ReflectiveMemory, qs: list[dict[str, Any]], budgets: Sequence[int], k: int
) -> dict[int, float]:
    """Reference coverage: the retriever's top K put evidence-first (untrained reranker).

    Evidence-holding candidates first (shortest first), then the others in retriever order;
    hits past K keep their place. Not a strict bound under a word budget: an order that also
    puts short non-evidence before long can leave room for evidence past rank K.
    """
    top_k = mem.config.rerank_top_k
    tot = dict.fromkeys(budgets, 0.0)
    for q in qs:
        ev = _evidence(q)
        r = mem.retrieve(q["question_id"], q["question"], k=k, explore=False)
        head, tail = r.hits[:top_k], r.hits[top_k:]
        good = sorted(
            (h for h in head if set(h.memory.turn_ids) & ev), key=lambda h: len(h.memory.text)
        )
        picked = {h.memory.id for h in good}
        best = good + [h for h in head if h.memory.id not in picked] + tail
        perfect = Retrieval(r.user_id, r.query, best, r.diagnostics)
        for b, v in coverage(perfect, ev, budgets).items():
            tot[b] += v
    return {b: 100.0 * v / len(qs) for b, v in tot.items()}


def _train(
    mem: ReflectiveMemory,
    split: _Split,
    *,
    epochs: int,
    eval_every: int,
    p_false: float,
    noise_only: bool,
    cite_rate: float,
    seed: int,
    budgets: Sequence[int],
    k_eval: int,
    label: str,
) -> list[tuple[int, dict[int, float], dict[int, float]]]:
    rng = np.random.default_rng(seed)
    curve = [
        (
            0,
            _evaluate(mem, split.test, budgets, k_eval),
            _evaluate(mem, split.train, budgets, k_eval),
        )
    ]
    episodes = 0
    order = list(range(len(split.train)))
    for epoch in tqdm(range(epochs), desc=f"train ({label})", unit="epoch"):
        rng.shuffle(order)
        for i in order:
            q = split.train[i]
            r = mem.retrieve(q["question_id"], q["question"], k=mem.config.rerank_top_m)
            cited = simulated_citations(
                r,
                _evidence(q),
                rng,
                p_false=p_false,
                noise_only=noise_only,
                cite_rate=cite_rate,
            )
            mem.feedback(r, cited=cited)
            episodes += 1
        if (epoch + 1) % eval_every == 0 or epoch + 1 == epochs:
            train_cov = _evaluate(mem, split.train, budgets, k_eval)
            curve.append((episodes, _evaluate(mem, split.test, budgets, k_eval), train_cov))
            logger.info("%s: %d episodes, test %s", label, episodes, curve[-1][1])
    return curve


def _calibrate(mem: ReflectiveMemory, train: list[dict[str, Any]]) -> tuple[float, float]:
    """Evidence base rate among shown memories -> false-citation chance and citation rate."""
    shown = ev = 0
    for q in train:
        r = mem.retrieve(q["question_id"], q["question"], k=mem.config.rerank_top_m, explore=False)
        evid = _evidence(q)
        shown += len(r.hits)
        ev += sum(1 for h in r.hits if set(h.memory.turn_ids) & evid)
    e = ev / max(shown, 1)
    # precision = R e / (R e + p (1 - e))  =>  p = R e (1 - P) / (P (1 - e))
    p_false = min(1.0, RECALL * e * (1 - PRECISION) / (PRECISION * max(1 - e, 1e-9)))
    cite_rate = RECALL * e + p_false * (1 - e)
    return p_false, cite_rate


def plot_curves(
    curves: dict[str, list[tuple[int, float]]], path: Path, title: str, ylabel: str
) -> Path:
    """Draw learning curves as a PNG with Pillow (no plotting library needed)."""
    from PIL import Image, ImageDraw

    w, h, ml, mr, mt, mb = 760, 440, 70, 170, 40, 55
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    xs = [x for c in curves.values() for x, _ in c]
    ys = [y for c in curves.values() for _, y in c]
    x0, x1 = 0, max(xs) or 1
    lo, hi = min(ys), max(ys)
    pad = max(1.0, (hi - lo) * 0.15)
    y0, y1 = lo - pad, hi + pad

    def px(x: float, y: float) -> tuple[float, float]:
        return (
            ml + (x - x0) / (x1 - x0) * (w - ml - mr),
            h - mb - (y - y0) / (y1 - y0) * (h - mt - mb),
        )

    d.rectangle([ml, mt, w - mr, h - mb], outline="black")
    for i in range(6):
        yv = y0 + (y1 - y0) * i / 5
        _, yy = px(0, yv)
        d.line([ml - 4, yy, ml, yy], fill="black")
        d.text((8, yy - 6), f"{yv:.1f}", fill="black")
        xv = x0 + (x1 - x0) * i / 5
        xx, _ = px(xv, y0)
        d.line([xx, h - mb, xx, h - mb + 4], fill="black")
        d.text((xx - 10, h - mb + 8), f"{xv:.0f}", fill="black")
    d.text((ml, 12), title, fill="black")
    d.text((w // 2 - 80, h - 22), "feedback episodes (training half)", fill="black")
    d.text((8, mt - 20), ylabel, fill="black")
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for n, (name, pts) in enumerate(curves.items()):
        col = colors[n % len(colors)]
        pp = [px(x, y) for x, y in pts]
        if len(pp) > 1:
            d.line(pp, fill=col, width=2)
        for x, y in pp:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=col)
        d.line([w - mr + 12, mt + 20 * n + 8, w - mr + 32, mt + 20 * n + 8], fill=col, width=3)
        d.text((w - mr + 38, mt + 20 * n + 2), name, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a Markdown report."""
    data = _load(Path(args.data))
    if args.limit is not None:
        data = data[: args.limit]
    store = Path(args.store)
    cfg = MemoryConfig(
        granularities=(args.granularity,),
        rerank_scope="shared",
        rerank_explore=True,
        rerank_seed=args.seed,
        rerank_optimizer=args.optimizer,
        rerank_learning_rate=args.lr,
        rerank_top_k=args.top_k,
        rerank_weight_decay=args.weight_decay,
        rerank_memory_bias=args.memory_bias,
        rerank_baseline=args.baseline,
        rerank_features=args.features,
    )
    t0 = time.time()
    from reflective_memory.bench.retrieval import make_embedder, parse_denoiser

    embedder = _QueryCache(make_embedder(args.embedder, args.cache))
    denoiser = parse_denoiser(args.denoiser)

    def open_mem() -> ReflectiveMemory:
        return ReflectiveMemory(store, config=cfg, embedder=embedder, denoiser=denoiser)

    with open_mem() as mem:
        _ingest(mem, data, args.distractors, args.seed)
    ingest_s = time.time() - t0
    rng = np.random.default_rng(args.seed)
    idx = rng.permutation(len(data))
    half = len(data) // 2
    split = _Split([data[i] for i in idx[:half]], [data[i] for i in idx[half:]])
    budgets = BUDGETS
    results: dict[str, list[tuple[int, dict[int, float], dict[int, float]]]] = {}
    shutil.rmtree(store / "rerankers", ignore_errors=True)
    with open_mem() as mem:
        ceiling = _ceiling(mem, split.test, budgets, args.k_eval)
    for label, noise in (("citations", False), ("pure noise", True)):
        shutil.rmtree(store / "rerankers", ignore_errors=True)
        with open_mem() as mem:
            p_false, cite_rate = _calibrate(mem, split.train)
            results[label] = _train(
                mem,
                split,
                epochs=args.epochs,
                eval_every=args.eval_every,
                p_false=p_false,
                noise_only=noise,
                cite_rate=cite_rate,
                seed=args.seed,
                budgets=budgets,
                k_eval=args.k_eval,
                label=label,
            )
    shutil.rmtree(store / "rerankers", ignore_errors=True)
    png = Path(args.plot)
    plot_curves(
        {f"test, {lab}": [(e, c[1000]) for e, c, _ in curve] for lab, curve in results.items()}
        | {f"train, {lab}": [(e, t[1000]) for e, _, t in curve] for lab, curve in results.items()},
        png,
        "RMM reranker: evidence coverage at 1000 words (LongMemEval-S dev)",
        "coverage %",
    )
    hay = (
        "all sessions"
        if args.distractors is None
        else f"evidence + {args.distractors} distractor sessions"
    )
    lines = [
        f"data: {args.data} ({len(data)} questions, {len(split.train)} train / "
        f"{len(split.test)} test), haystack: "
        f"{hay}, "
        f"unit={args.granularity}, keys: denoiser={args.denoiser}, embedder={embedder.name}, "
        f"retrieval=hybrid, "
        f"K={cfg.rerank_top_k}, M={cfg.rerank_top_m}, tau={cfg.rerank_tau}, "
        f"lr={cfg.rerank_learning_rate} ({cfg.rerank_optimizer}), batch={cfg.rerank_batch_size}, "
        f"weight decay={cfg.rerank_weight_decay}, memory bias={cfg.rerank_memory_bias}, "
        f"features={list(cfg.rerank_features)}, "
        f"b={cfg.rerank_baseline}, epochs={args.epochs}, seed={args.seed}; "
        f"simulated citations: precision {PRECISION}, recall {RECALL}; ingest {ingest_s:.0f} s",
        "",
        "| run (held-out half) | episodes | "
        + " | ".join(f"cov@{b}" for b in budgets)
        + " | training half cov@1000 |",
        "|---|---|" + "---|" * (len(budgets) + 1),
    ]
    for lab, curve in results.items():
        for when, (ep, cov, tr) in (("before", curve[0]), ("after", curve[-1])):
            cells = " | ".join(f"{cov[b]:.1f}" for b in budgets)
            lines.append(f"| {lab}, {when} | {ep} | {cells} | {tr[1000]:.1f} |")
        delta = " | ".join(f"{curve[-1][1][b] - curve[0][1][b]:+.1f}" for b in budgets)
        tr_delta = curve[-1][2][1000] - curve[0][2][1000]
        lines.append(f"| {lab}, change | | {delta} | {tr_delta:+.1f} |")
    cells = " | ".join(f"{ceiling[b]:.1f}" for b in budgets)
    lines.append(f"| reference: top {cfg.rerank_top_k} evidence-first | | {cells} | |")
    lines += ["", f"plot: {png}"]
    report = "\n".join(lines)
    print(report)  # noqa: T201 - the command's output
    if args.json is not None:
        Path(args.json).write_text(
            json.dumps(
                {
                    lab: [{"episodes": e, "test": c, "train": t} for e, c, t in curve]
                    for lab, curve in results.items()
                },
                indent=1,
            )
        )
    return 0


def register(bench_subparsers: Any) -> None:
    """Add the `feedback` benchmark to `reflective-memory bench`."""
    p = bench_subparsers.add_parser("feedback", help=__doc__.splitlines()[0])
    _arguments(p)
    p.set_defaults(func=run)


def _arguments(p: argparse.ArgumentParser) -> None:
    from reflective_memory.bench.retrieval import add_embedder_arguments

    p.add_argument("--data", required=True, help="LongMemEval-style .json or .json.gz")
    p.add_argument("--store", default="rmm-bench-store", help="store directory (reused)")
    p.add_argument(
        "--granularity",
        default="turn",
        choices=("turn", "segment", "session"),
        help="memory unit (default turn: its raw-key vectors are in the shared cache)",
    )
    add_embedder_arguments(p)
    p.add_argument(
        "--denoiser",
        default="none",
        help="key denoiser (default none: raw keys, as cached by bench retrieval --denoiser none)",
    )
    p.add_argument("--epochs", type=int, default=20, help="passes over the training half")
    p.add_argument("--eval-every", type=int, default=2, help="epochs between test evaluations")
    p.add_argument("--k-eval", type=int, default=100, help="hits ranked for coverage")
    defaults = MemoryConfig()
    p.add_argument("--optimizer", default=defaults.rerank_optimizer, choices=("adam", "sgd"))
    p.add_argument("--lr", type=float, default=defaults.rerank_learning_rate)
    p.add_argument(
        "--baseline",
        type=_baseline,
        default=defaults.rerank_baseline,
        help="REINFORCE baseline: a number (paper: 0.5) or 'episode' (default: the library's)",
    )
    p.add_argument(
        "--features",
        type=_features,
        default=defaults.rerank_features,
        help="reranker side features, comma-separated, or 'none' (paper form); "
        "default: the library's",
    )
    p.add_argument("--top-k", type=int, default=20, help="candidates the reranker reorders (K)")
    p.add_argument(
        "--weight-decay",
        type=float,
        default=defaults.rerank_weight_decay,
        help="decoupled L2 decay toward the identity (default: the library's; 0 = paper's form)",
    )
    p.add_argument(
        "--memory-bias",
        action="store_true",
        help="extension: learn a query-independent b.m score term (not in the paper)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="use the first N questions")
    p.add_argument(
        "--distractors",
        type=int,
        default=None,
        help="keep the evidence sessions plus N seeded random others per question (default: all)",
    )
    p.add_argument("--plot", default="docs/rmm_feedback_curve.png")
    p.add_argument("--json", default=None, help="write the curves as JSON here")


def _baseline(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # validated by MemoryConfig


def _features(text: str) -> tuple[str, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(f.strip() for f in text.split(",") if f.strip())


def main(argv: Sequence[str] | None = None, _run: Callable[..., int] = run) -> int:
    """Standalone entry: `python -m reflective_memory.bench.feedback --data ...`."""
    p = argparse.ArgumentParser(prog="bench feedback", description=__doc__)
    _arguments(p)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
