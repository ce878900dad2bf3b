"""Train the `EmbeddingSegmenter` gap scorer.

Run as `python -m reflective_memory.segment.train --data FILE`.

Reads annotated dialogues (any format `bench segmentation` reads; the bundled weights come from
TIAGE train), embeds every utterance with the default MiniLM (or `--embedder hashing`), computes
the gap features of `reflective_memory.segment.embedding.gap_features`, fits an L2-regularised
logistic
regression, picks the cut threshold by k-fold cross-validation on the same data (maximising the
mean Score), refits on all of it and writes the weights JSON (a few hundred bytes).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.embed import Embedder, HashingEmbedder, default_embedder
from reflective_memory.errors import InvalidInputError
from reflective_memory.segment.base import boundaries_to_spans
from reflective_memory.segment.dialogues import load_dialogues
from reflective_memory.segment.embedding import FEATURE_NAMES, gap_features, pick_boundaries
from reflective_memory.segment.metrics import evaluate_segmentations
from reflective_memory.segment.rubric import LabeledDialogue

__all__ = ["dialogue_features", "fit_weights", "main"]

logger = logging.getLogger(__name__)

CUTOFFS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25)


def dialogue_features(
    dialogues: Sequence[LabeledDialogue], embedder: Embedder
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per dialogue: the gap feature matrix and the 0/1 "new segment starts here" targets."""
    texts = [u for d in dialogues for u in d.utterances]
    emb = np.asarray(embedder.encode(texts), dtype=np.float32)
    out = []
    pos = 0
    for d in dialogues:
        n = len(d.utterances)
        e = emb[pos : pos + n]
        pos += n
        y = np.zeros(max(n - 1, 0))
        for a, _ in d.spans[1:]:
            y[a - 1] = 1.0
        out.append((gap_features(e, d.utterances, d.utterances), y))
    return out


def _fit(rows: Sequence[tuple[np.ndarray, np.ndarray]], c_reg: float) -> tuple[np.ndarray, float]:
    from sklearn.linear_model import LogisticRegression

    x = np.concatenate([f for f, _ in rows if len(f)])
    y = np.concatenate([t for _, t in rows if len(t)])
    clf = LogisticRegression(C=c_reg, max_iter=5000).fit(x, y)
    return clf.coef_[0].astype(np.float64), float(clf.intercept_[0])


def _score(
    rows: Sequence[tuple[np.ndarray, np.ndarray]], coef: np.ndarray, b: float, cutoff: float
) -> float:
    pairs = []
    for f, y in rows:
        n = len(y) + 1
        ref = boundaries_to_spans([i + 1 for i in np.flatnonzero(y)], n)
        starts = pick_boundaries(f @ coef + b, cutoff) if n > 2 else []
        pairs.append((ref, boundaries_to_spans(starts, n)))
    return evaluate_segmentations(pairs).score


def fit_weights(
    rows: Sequence[tuple[np.ndarray, np.ndarray]], folds: int = 5, c_reg: float = 1.0, seed: int = 0
) -> dict[str, Any]:
    """Fit coefficients and choose the cutoff by cross-validation.

    Returns:
        The weights document (features, coef, intercept, cutoff, local_max, cv scores).
    """
    if len(rows) < folds:
        raise InvalidInputError(f"need at least {folds} dialogues to train")
    order = np.random.default_rng(seed).permutation(len(rows))
    cv = {c: 0.0 for c in CUTOFFS}
    for k in range(folds):
        test = [rows[i] for i in order[k::folds]]
        train = [rows[i] for i in order if i not in set(order[k::folds])]
        coef, b = _fit(train, c_reg)
        for c in CUTOFFS:
            cv[c] += _score(test, coef, b, c) / folds
    best = max(CUTOFFS, key=lambda c: cv[c])
    coef, b = _fit(rows, c_reg)
    return {
        "features": list(FEATURE_NAMES),
        "coef": [round(float(x), 6) for x in coef],
        "intercept": round(b, 6),
        "cutoff": best,
        "local_max": True,
        "cv_score": {str(c): round(v, 4) for c, v in cv.items()},
        "regularisation_C": c_reg,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(
        prog="python -m reflective_memory.segment.train", description=__doc__
    )
    p.add_argument("--data", required=True, help="annotated training dialogues (e.g. TIAGE train)")
    p.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parents[1] / "data" / "segmenter_weights.json"),
    )
    p.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--C", type=float, default=1.0, help="inverse L2 regularisation strength")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dialogues = load_dialogues(args.data)
    embedder = HashingEmbedder(256) if args.embedder == "hashing" else default_embedder()
    rows = dialogue_features(dialogues, embedder)
    doc = fit_weights(rows, folds=args.folds, c_reg=args.C)
    doc["trained_on"] = {
        "file": Path(args.data).name,
        "dialogues": len(dialogues),
        "embedder": embedder.name,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    logger.info("cv Score by cutoff: %s; chose %s; wrote %s", doc["cv_score"], doc["cutoff"], out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
