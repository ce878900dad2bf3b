"""`reflective-memory bench segmentation`: load annotated dialogues and score a segmenter.

Three input formats are read (detected from the content):

* TIAGE annotation JSON: `{"<id>": [[utterance, label], ...], ...}` with label `"1"` on the
  utterance that opens a new topic (`"-1"` / `"0"` otherwise).
* SuperDialseg / TADAM text: a `call_id_<k>` line opens a dialogue, then one
  `<topic_index> <utterance>` line per utterance; a boundary is where the topic index changes.
* Our JSON list: `[{"utterances": [...], "segments": [lengths...], "roles": [...]?}, ...]`
  (segment lengths sum to the number of utterances; `roles` is optional).

Dialogues are evaluated per utterance: every utterance is one `Turn` and one unit. Every
utterance is embedded once, in large batches, before the segmenters run; the reported speed
(`seg/s`, segments produced per second) therefore excludes embedding time and measures the
segmentation itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from reflective_memory.embed import Embedder
from reflective_memory.errors import InvalidInputError
from reflective_memory.segment.base import Segmenter, check_spans
from reflective_memory.segment.dialogues import (
    load_dialogues,
    parse_segment_list,
    parse_superdialseg,
    parse_tiage,
)
from reflective_memory.segment.metrics import SegmentationScores, evaluate_segmentations
from reflective_memory.segment.rubric import LabeledDialogue
from tqdm import tqdm

__all__ = [
    "load_dialogues",
    "parse_tiage",
    "parse_superdialseg",
    "parse_segment_list",
    "evaluate_segmenter",
    "register",
    "run",
]

logger = logging.getLogger(__name__)


def evaluate_segmenter(
    segmenter: Segmenter,
    dialogues: Sequence[LabeledDialogue],
    *,
    progress: bool = False,
) -> tuple[SegmentationScores, dict[str, float]]:
    """Segment every dialogue per utterance and score against the annotation.

    Returns:
        The mean scores and timing facts (`seconds`, `dialogues_per_s`, `segments_per_s`,
        `utterances_per_s`, `mean_pred_segments`, `mean_ref_segments`).
    """
    if not dialogues:
        raise InvalidInputError("no dialogues to evaluate")
    pairs = []
    n_pred = 0
    n_utts = 0
    start = time.perf_counter()
    for dlg in tqdm(dialogues, disable=not progress, desc="segmenting"):
        turns = dlg.turns()
        hyp = check_spans(segmenter.segment(turns), len(turns))
        pairs.append((list(dlg.spans), hyp))
        n_pred += len(hyp)
        n_utts += len(turns)
    seconds = time.perf_counter() - start
    scores = evaluate_segmentations(pairs)
    facts = {
        "seconds": seconds,
        "dialogues_per_s": len(dialogues) / seconds if seconds > 0 else float("inf"),
        "segments_per_s": n_pred / seconds if seconds > 0 else float("inf"),
        "utterances_per_s": n_utts / seconds if seconds > 0 else float("inf"),
        "mean_pred_segments": n_pred / len(dialogues),
        "mean_ref_segments": sum(len(d.spans) for d in dialogues) / len(dialogues),
    }
    return scores, facts


class _MemoEmbedder:
    """Wraps an embedder and remembers vectors, so a benchmark embeds each utterance once.

    `prime` encodes many texts in large batches (much faster than one call per dialogue).
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self._memo: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        """Vector size."""
        return self.inner.dim

    def prime(self, texts: Sequence[str], batch: int = 2048, progress: bool = False) -> None:
        """Encode every not-yet-seen text in `texts`."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._memo))
        for i in tqdm(range(0, len(todo), batch), disable=not progress, desc="embedding"):
            chunk = todo[i : i + batch]
            vecs = np.asarray(self.inner.encode(chunk), dtype=np.float32)
            self._memo.update(zip(chunk, vecs, strict=True))

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """See `Embedder.encode`."""
        items = [texts] if isinstance(texts, str) else list(texts)
        self.prime(items)
        out = np.stack([self._memo[t] for t in items]) if items else np.zeros((0, self.dim))
        return out[0] if isinstance(texts, str) else out


def _make_embedder(name: str) -> _MemoEmbedder:
    from reflective_memory.embed import HashingEmbedder, default_embedder

    return _MemoEmbedder(HashingEmbedder(256) if name == "hashing" else default_embedder())


def _build_segmenter(name: str, embedder: Embedder, window: int, unit: str = "turn") -> Segmenter:
    from reflective_memory.segment.embedding import make_segmenter

    return make_segmenter(name, embedder=embedder, unit=unit, window=window)


def run(args: argparse.Namespace) -> int:
    """Entry point of `bench segmentation`; prints one row per data file."""
    rows = []
    embedder = _make_embedder(args.embedder)
    for path in args.data:
        dialogues = load_dialogues(path)
        if args.limit is not None:
            dialogues = dialogues[: args.limit]
        t0 = time.perf_counter()
        embedder.prime([u for d in dialogues for u in d.utterances], progress=args.progress)
        embed_seconds = time.perf_counter() - t0
        for name in args.segmenter:
            seg = _build_segmenter(name, embedder, args.window)
            scores, facts = evaluate_segmenter(seg, dialogues, progress=args.progress)
            rows.append(
                {
                    "data": str(path),
                    "segmenter": name,
                    **scores.as_dict(),
                    **facts,
                    "embed_seconds": embed_seconds,
                }
            )
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    header = f"{'data':<32} {'segmenter':<11} {'n':>5} {'Pk':>6} {'WD':>6} {'F1':>6} {'Score':>6} "
    header += f"{'seg/s':>8} {'embed s':>8} {'pred/ref segs':>14}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{Path(r['data']).name:<32} {r['segmenter']:<11} {r['n']:>5} {r['pk']:>6.3f} "
            f"{r['wd']:>6.3f} {r['f1']:>6.3f} {r['score']:>6.3f} {r['segments_per_s']:>8.1f} "
            f"{r['embed_seconds']:>8.1f} "
            f"{r['mean_pred_segments']:>6.2f}/{r['mean_ref_segments']:<6.2f}"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def register(bench_subparsers: Any) -> None:
    """Add the `segmentation` parser to `reflective-memory bench`."""
    from reflective_memory.segment.embedding import SEGMENTER_KINDS

    p = bench_subparsers.add_parser(
        "segmentation",
        help="score offline segmenters on annotated dialogues (Pk, WindowDiff, F1, Score)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", action="append", required=True, help="annotated file (repeatable)")
    p.add_argument(
        "--segmenter",
        action="append",
        choices=SEGMENTER_KINDS,
        help="segmenter(s) to score (repeatable; default: embedding)",
    )
    p.add_argument(
        "--embedder",
        choices=("minilm", "hashing"),
        default="minilm",
        help="minilm (default, the bundled all-MiniLM-L6-v2) or hashing (fast, for smoke tests)",
    )
    p.add_argument("--window", type=int, default=6, help="turns per segment for 'fixed'")
    p.add_argument("--limit", type=int, default=None, help="score only the first N dialogues")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.add_argument("--progress", action="store_true", help="show a progress bar")

    def _func(args: argparse.Namespace) -> int:
        if args.segmenter is None:
            args.segmenter = ["embedding"]
        return run(args)

    p.set_defaults(func=_func)
