"""`reflective-memory bench latency`: query latency and memory of dense retrieval at scale.

Builds synthetic corpora of the requested sizes from *real* embeddings: a few thousand real chat
turns (from a LongMemEval file) are embedded with the configured embedder, and every synthetic
memory is a normalised mix `norm(w·e_i + (1 − w)·e_j + σ·ε)` of two of them plus noise, so the
corpus keeps the embedder's geometry (clusters, score scale) at any size. Real questions from the
same file are the queries. For each size the dense index is built as the engine would build it
(exact at or below the ANN threshold, IVF / HNSW above) and four retrievals are timed per query:

* `topk` — the bare index search for `k` hits,
* `familiarity` — RF-Mem forced onto the familiarity path (probe + gate statistics),
* `recollection` — RF-Mem forced onto the recollection path (Algorithm 3),
* `rfmem` — the gate decides.

Latency is reported with and without embedding the query text (p50 / p95 wall-clock milliseconds,
and the process CPU time of the whole call summed over its threads, which a busy shared machine
inflates less than wall time), together
with the process's resident memory after building, the index build time, the share of queries the
gate sent to recollection and, for approximate indexes, recall@k of `topk` against exact search.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.embed import Embedder, HashingEmbedder, SentenceTransformerEmbedder
from reflective_memory.errors import InvalidInputError
from reflective_memory.recall import RecallConfig, recall
from reflective_memory.storage.index import ANN_KINDS, AnnSettings, DenseIndex, build_dense_index
from tqdm import tqdm

__all__ = [
    "METHODS",
    "load_texts",
    "embed_base",
    "synthetic_corpus",
    "exact_topk",
    "run_latency_bench",
    "format_latency_table",
    "register",
    "set_threads",
]

logger = logging.getLogger(__name__)

#: Retrievals timed for every size.
METHODS = ("topk", "familiarity", "recollection", "rfmem")


def _rss_mb() -> float:
    """Current resident set size in MiB (Linux `/proc`; peak RSS elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - non-Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # pragma: no cover


def load_texts(path: str | Path, n_texts: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Chat turns and questions from a LongMemEval-style file.

    Args:
        path: `.json` or `.json.gz` list of items with `question` and `haystack_sessions`.
        n_texts: Distinct turn texts to sample (each cut to 1,000 characters).
        seed: Sampling seed.

    Returns:
        `(texts, questions)`.

    Raises:
        InvalidInputError: Unreadable file or no usable turns.
    """
    p = Path(path)
    try:
        opener: Any = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as fh:
            items = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"cannot read {p}: {exc}") from exc
    if not isinstance(items, list):
        raise InvalidInputError(f"{p} is not a LongMemEval-style list of questions")
    seen: set[str] = set()
    texts: list[str] = []
    questions: list[str] = []
    for item in items:
        if isinstance(item.get("question"), str):
            questions.append(item["question"])
        for session in item.get("haystack_sessions", []):
            for turn in session:
                t = str(turn.get("content", "")).strip()[:1000]
                if len(t) > 20 and t not in seen:
                    seen.add(t)
                    texts.append(t)
    if not texts or not questions:
        raise InvalidInputError(f"{p} holds no turns or no questions")
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(texts), size=min(n_texts, len(texts)), replace=False)
    return [texts[i] for i in sorted(pick)], questions


def embed_base(
    texts: list[str], embedder: Embedder, cache_dir: str | Path | None = None
) -> np.ndarray:
    """Embed the base texts, reusing a cached `.npy` keyed by the texts and the model name."""
    key = hashlib.sha1(("\x00".join(texts) + "\x01" + embedder.name).encode()).hexdigest()[:16]
    cache = None if cache_dir is None else Path(cache_dir) / f"base-{key}.npy"
    if cache is not None and cache.exists():
        return np.load(cache)
    parts = []
    for s in tqdm(range(0, len(texts), 256), desc="embedding base texts"):
        parts.append(embedder.encode(texts[s : s + 256]))
    base = np.vstack(parts).astype(np.float32)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, base)
    return base


def synthetic_corpus(base: np.ndarray, n: int, *, noise: float = 0.1, seed: int = 0) -> np.ndarray:
    """`n` normalised rows, each `norm(w·e_i + (1 − w)·e_j + noise·ε)` over base rows.

    `w` is uniform in [0.5, 1] (each synthetic memory stays closest to one real text), `ε` is
    Gaussian with unit expected norm.
    """
    if n < 1:
        raise InvalidInputError(f"corpus size must be positive, got {n}")
    rng = np.random.default_rng(seed)
    d = base.shape[1]
    out = np.empty((n, d), np.float32)
    for s in range(0, n, 100_000):
        m = min(100_000, n - s)
        i = rng.integers(0, len(base), m)
        j = rng.integers(0, len(base), m)
        w = rng.uniform(0.5, 1.0, (m, 1)).astype(np.float32)
        eps = rng.standard_normal((m, d), dtype=np.float32) / np.float32(np.sqrt(d))
        rows = w * base[i] + (1 - w) * base[j] + np.float32(noise) * eps
        out[s : s + m] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def exact_topk(corpus: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact top-`k` positions by blockwise matrix products (ground truth for ANN recall)."""
    best_s = np.full((len(queries), 0), -np.inf, np.float32)
    best_p = np.zeros((len(queries), 0), np.int64)
    for s in range(0, len(corpus), 200_000):
        sims = queries @ corpus[s : s + 200_000].T
        top = np.argpartition(-sims, min(k, sims.shape[1] - 1), axis=1)[:, :k]
        best_s = np.hstack([best_s, np.take_along_axis(sims, top, axis=1)])
        best_p = np.hstack([best_p, top + s])
    order = np.argsort(-best_s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(best_p, order, axis=1)


def _run_method(method: str, index: DenseIndex, qvec: np.ndarray, k: int, cfg: RecallConfig) -> str:
    if method == "topk":
        index.search(qvec[None, :], k)
        return "topk"
    mode = "rfmem" if method == "rfmem" else method
    return recall(index, qvec, k, cfg.replace(mode=mode)).path


def run_latency_bench(
    base: np.ndarray,
    questions: Sequence[str],
    embedder: Embedder,
    *,
    sizes: Sequence[int],
    n_queries: int = 200,
    k: int = 10,
    ann: AnnSettings | None = None,
    config: RecallConfig | None = None,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Time the retrievals of `methods` on synthetic corpora of each size.

    Args:
        base: Real embeddings the corpora are mixed from.
        questions: Query texts (cycled up to `n_queries`).
        embedder: Embeds the queries (timed in the "with embedding" numbers).
        sizes: Corpus sizes.
        n_queries: Timed queries per method and size (after 5 warm-up queries).
        k: Hits per query.
        ann: Exact/approximate switch (`None`: the engine's default `AnnSettings()`).
        config: RF-Mem parameters (`None`: paper defaults).
        methods: Subset of `METHODS`.
        seed: Corpus seed.
        progress: Show progress bars.

    Returns:
        One dict per size with build time, memory, ANN recall and per-method latencies.
    """
    bad = set(methods) - set(METHODS)
    if bad:
        raise InvalidInputError(f"unknown methods {sorted(bad)}; choose from {METHODS}")
    settings = AnnSettings() if ann is None else ann
    cfg = RecallConfig() if config is None else config
    qtexts = [questions[i % len(questions)] for i in range(n_queries)]
    qvecs = np.asarray(embedder.encode(list(qtexts)), dtype=np.float32)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        rss0 = _rss_mb()
        corpus = synthetic_corpus(base, n, seed=seed)
        t0 = time.perf_counter()
        index = build_dense_index(corpus, settings)
        build_s = time.perf_counter() - t0
        rss1 = _rss_mb()
        row: dict[str, Any] = {
            "size": n,
            "index": index.kind,
            "build_s": build_s,
            "vectors_mb": corpus.nbytes / 2**20,
            "rss_mb": rss1,
            "rss_delta_mb": rss1 - rss0,
            "load_avg_1m": os.getloadavg()[0],
            "methods": {},
        }
        if index.kind != "exact":
            truth = exact_topk(corpus, qvecs[: min(100, n_queries)], k)
            _, got = index.search(qvecs[: len(truth)], k)
            row["ann_recall_at_k"] = float(
                np.mean([len(set(a) & set(b)) / k for a, b in zip(got, truth, strict=True)])
            )
        for method in methods:
            for q in qtexts[:5]:  # warm-up
                _run_method(method, index, embedder.encode(q), k, cfg)
            with_embed, without_embed, cpu, paths = [], [], [], []
            for q in tqdm(qtexts, desc=f"{n} {method}", disable=not progress):
                c0 = time.process_time()
                t0 = time.perf_counter()
                qv = embedder.encode(q)
                t1 = time.perf_counter()
                paths.append(_run_method(method, index, qv, k, cfg))
                t2 = time.perf_counter()
                cpu.append((time.process_time() - c0) * 1000)
                with_embed.append((t2 - t0) * 1000)
                without_embed.append((t2 - t1) * 1000)
            row["methods"][method] = {
                "p50_ms": float(np.percentile(with_embed, 50)),
                "p95_ms": float(np.percentile(with_embed, 95)),
                "p50_ms_no_embed": float(np.percentile(without_embed, 50)),
                "p95_ms_no_embed": float(np.percentile(without_embed, 95)),
                "p50_cpu_ms": float(np.percentile(cpu, 50)),
                "recollection_share": paths.count("recollection") / len(paths),
            }
        rows.append(row)
        logger.info("size %d done: %s", n, json.dumps(row))
        del index, corpus
    return rows


def format_latency_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown tables of `run_latency_bench` output."""
    lines = [
        "| memories | index | method | p50 ms | p95 ms | p50 ms (no embed) | p95 ms (no embed) "
        "| CPU ms p50 (all threads) | → recollection |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for m, v in r["methods"].items():
            lines.append(
                f"| {r['size']:,} | {r['index']} | {m} | {v['p50_ms']:.1f} | {v['p95_ms']:.1f} "
                f"| {v['p50_ms_no_embed']:.2f} | {v['p95_ms_no_embed']:.2f} "
                f"| {v['p50_cpu_ms']:.1f} | {v['recollection_share']:.0%} |"
            )
    lines += [
        "",
        "| memories | index | build s | vectors MiB | RSS after build MiB | RSS growth MiB "
        "| ANN recall@k vs exact | load avg (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rec = r.get("ann_recall_at_k")
        lines.append(
            f"| {r['size']:,} | {r['index']} | {r['build_s']:.1f} | {r['vectors_mb']:.0f} "
            f"| {r['rss_mb']:.0f} | {r['rss_delta_mb']:.0f} | "
            + ("-" if rec is None else f"{rec:.3f}")
            + f" | {r['load_avg_1m']:.1f} |"
        )
    return "\n".join(lines)


def _ints(value: str) -> list[int]:
    try:
        return [int(v.replace("_", "")) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise InvalidInputError(f"expected comma-separated integers, got {value!r}") from exc


def set_threads(n: int) -> None:
    """Use `n` threads in torch (query embedding) and faiss (search).

    On a busy shared machine, multi-threaded single-query work oversubscribes the cores: on this
    2-core box under load ~17, embedding one query took ~1.2 s with 2 torch threads and ~33 ms
    with 1.
    """
    import faiss

    faiss.omp_set_num_threads(n)
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:  # pragma: no cover - torch is a base dependency
        pass


def _run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        set_threads(args.threads)
    if args.embedder == "hashing":
        embedder: Embedder = HashingEmbedder()
    else:
        embedder = SentenceTransformerEmbedder(
            None if args.embedder == "default" else args.embedder
        )
    texts, questions = load_texts(args.data, args.base_texts, seed=args.seed)
    base = embed_base(texts, embedder, args.cache_dir)
    ann = AnnSettings(
        threshold=None if args.ann_threshold < 0 else args.ann_threshold,
        kind=args.ann,
        nprobe=args.probe,
        ef_search=args.probe,
    )
    cfg = RecallConfig().replace(**json.loads(args.recall)) if args.recall else RecallConfig()
    rows = run_latency_bench(
        base,
        questions,
        embedder,
        sizes=_ints(args.sizes),
        n_queries=args.queries,
        k=args.k,
        ann=ann,
        config=cfg,
        methods=[m.strip() for m in args.methods.split(",") if m.strip()],
        seed=args.seed,
    )
    print(  # noqa: T201
        f"data: {args.data}; {len(base)} real base texts ({embedder.name}); k={args.k}; "
        f"{args.queries} queries; threads: {args.threads}; ANN: {ann}"
    )
    print(format_latency_table(rows))  # noqa: T201
    if args.json is not None:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def register(bench: Any) -> None:
    """Add `bench latency` to the CLI's bench sub-parsers."""
    p = bench.add_parser(
        "latency",
        help="p50/p95 query latency and memory of top-K / familiarity / recollection / RF-Mem",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma list of corpus sizes")
    p.add_argument(
        "--data",
        default="../shared/data/longmemeval_s_dev100.json.gz",
        help="LongMemEval-style file giving the real texts and questions",
    )
    p.add_argument("--base-texts", type=int, default=4000, help="real texts to embed")
    p.add_argument("--queries", type=int, default=200, help="timed queries per method and size")
    p.add_argument("--k", type=int, default=10, help="hits per query")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {METHODS}")
    p.add_argument("--ann", default="ivf", choices=ANN_KINDS, help="approximate index kind")
    p.add_argument(
        "--ann-threshold",
        type=int,
        default=AnnSettings().threshold,
        help="sizes above this use the approximate index (-1: always exact)",
    )
    p.add_argument("--probe", type=int, default=AnnSettings().nprobe, help="nprobe / efSearch")
    p.add_argument(
        "--recall", default=None, help='RecallConfig overrides as JSON, e.g. {"tau":0.3}'
    )
    p.add_argument("--embedder", default="default", help="'default', 'hashing' or a model path")
    p.add_argument("--cache-dir", default=None, help="cache the base embeddings here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch/faiss threads (1 suits single queries)"
    )
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `bench latency` on its own (`python -m reflective_bench.latency ...`)."""
    parser = argparse.ArgumentParser(prog="bench")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["latency", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
