"""Offline segmenters: embedding TextTiling and a small learned boundary scorer.

Both cut between *units* (turns or exchanges, see `reflective_memory.segment.base.unit_spans`) and
score every
gap between two neighbouring units.

* `TextTilingSegmenter` is TextTiling (Hearst, 1997) over sentence embeddings: the similarity of
  the mean embeddings of `window` units on each side of a gap, depth scores (how far the
  similarity dips below the nearest peaks on both sides) and a cut where the depth exceeds the
  dialogue's mean depth by `cutoff` standard deviations.
* `EmbeddingSegmenter` (the library's offline default) scores each gap with a logistic model over
  15 features: similarity and depth at three window sizes, decayed cross-gap similarity at two
  spans (all standardised within the dialogue), lexical novelty and overlap, whether the units on
  each side open with a question, and the length of the next unit. Its weights (a few hundred
  bytes of JSON in `reflective_memory/data/segmenter_weights.json`) were fitted on TIAGE train by
  `python -m reflective_memory.segment.train`. It cuts at local maxima of the standardised gap
  score that lie above `cutoff`.
"""

from __future__ import annotations

import logging
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.embed import Embedder, default_embedder
from reflective_memory.errors import ConfigError, InvalidFileError, InvalidInputError
from reflective_memory.jsonfile import MAX_MODEL_FILE_BYTES, loads_bounded, read_text_file
from reflective_memory.segment.base import (
    UNITS,
    FixedWindowSegmenter,
    Segmenter,
    boundaries_to_spans,
    check_spans,
    unit_spans,
    units_to_turn_spans,
)
from reflective_memory.types import Turn

__all__ = [
    "TextTilingSegmenter",
    "EmbeddingSegmenter",
    "FEATURE_NAMES",
    "gap_features",
    "depth_scores",
    "window_similarities",
    "pick_boundaries",
    "load_weights",
    "make_segmenter",
    "SEGMENTER_KINDS",
    "DEFAULT_WEIGHTS",
]

logger = logging.getLogger(__name__)

#: File name of the bundled weights inside `shared/data/`.
DEFAULT_WEIGHTS = "segmenter_weights.json"

#: Names of the per-gap features, in column order.
FEATURE_NAMES = (
    "dissim_w1",
    "depth_w1",
    "dissim_w2",
    "depth_w2",
    "dissim_w3",
    "depth_w3",
    "dissim_x2",
    "depth_x2",
    "dissim_x3",
    "depth_x3",
    "novelty",
    "overlap",
    "question_next",
    "question_prev",
    "log_len_next",
)

#: Segmenter kinds `make_segmenter` knows.
SEGMENTER_KINDS = ("embedding", "texttiling", "fixed")

_WORD = re.compile(r"[a-z0-9']+")
_STOP = frozenset(
    """a about after again all also am an and any are as at be been before being but by can
    could did do does doing don't for from get got had has have having he her here hers him his
    how i i'm if in into is it it's its just know like me more most my no not now of off oh ok
    okay on once only or other our out over really she should so some such than that that's the
    their them then there these they this those through to too up very was we well were what
    when where which while who why will with would yeah yes you your yours lol hi hello""".split()
)


def window_similarities(emb: np.ndarray, window: int) -> np.ndarray:
    """Cosine similarity of the mean embeddings of `window` units before and after each gap.

    Args:
        emb: `(n, d)` unit embeddings.
        window: Units on each side (fewer at the ends).

    Returns:
        `(n - 1,)` similarities; entry `g - 1` is the gap before unit `g`.
    """
    n = len(emb)
    if n < 2:
        return np.zeros(0, dtype=np.float64)
    cum = np.vstack([np.zeros((1, emb.shape[1])), np.cumsum(emb.astype(np.float64), axis=0)])
    g = np.arange(1, n)
    lo = np.maximum(0, g - window)
    hi = np.minimum(n, g + window)
    left = (cum[g] - cum[lo]) / (g - lo)[:, None]
    right = (cum[hi] - cum[g]) / (hi - g)[:, None]
    num = np.einsum("ij,ij->i", left, right)
    den = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
    den[den == 0] = 1.0
    return num / den


def _cross_similarities(emb: np.ndarray, span: int, decay: float) -> np.ndarray:
    """Decay-weighted mean similarity of unit pairs across each gap, up to `span` per side."""
    n = len(emb)
    if n < 2:
        return np.zeros(0, dtype=np.float64)
    e = emb.astype(np.float64)
    total = np.zeros(n - 1)
    weight = np.zeros(n - 1)
    g = np.arange(1, n)
    for a in range(1, span + 1):
        for b in range(1, span + 1):
            i, j = g - a, g + b - 1
            ok = (i >= 0) & (j < n)
            w = decay ** (a + b - 2)
            total[ok] += w * np.einsum("ij,ij->i", e[i[ok]], e[j[ok]])
            weight[ok] += w
    return total / weight


def depth_scores(sims: np.ndarray) -> np.ndarray:
    """TextTiling depth: climb to the highest similarity on each side, sum the two drops.

    Example:
        >>> depth_scores(np.array([0.9, 0.2, 0.8])).round(2).tolist()
        [0.0, 1.3, 0.0]
    """
    s = np.asarray(sims, dtype=np.float64)
    m = len(s)
    out = np.zeros(m)
    for i in range(m):
        left = s[i]
        j = i
        while j > 0 and s[j - 1] >= left:
            j -= 1
            left = s[j]
        right = s[i]
        j = i
        while j < m - 1 and s[j + 1] >= right:
            j += 1
            right = s[j]
        out[i] = left + right - 2 * s[i]
    return out


def _standardise(x: np.ndarray) -> np.ndarray:
    if len(x) < 2:
        return np.zeros_like(x)
    sd = x.std()
    return (x - x.mean()) / (sd if sd > 1e-9 else 1.0)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in _STOP}


def gap_features(emb: np.ndarray, texts: Sequence[str], lead_texts: Sequence[str]) -> np.ndarray:
    """The `FEATURE_NAMES` features of every gap between consecutive units.

    Args:
        emb: `(n, d)` L2-normalised unit embeddings.
        texts: The units' full texts.
        lead_texts: The text of each unit's first turn (used for the question features).

    Returns:
        `(n - 1, len(FEATURE_NAMES))` float64 matrix.
    """
    n = len(texts)
    if len(emb) != n or len(lead_texts) != n:
        raise InvalidInputError("emb, texts and lead_texts must have the same length")
    if n < 2:
        return np.zeros((0, len(FEATURE_NAMES)))
    cols: list[np.ndarray] = []
    for w in (1, 2, 3):
        s = window_similarities(emb, w)
        cols += [_standardise(-s), _standardise(depth_scores(s))]
    for span, decay in ((2, 0.5), (3, 0.7)):
        s = _cross_similarities(emb, span, decay)
        cols += [_standardise(-s), _standardise(depth_scores(s))]
    words = [_words(t) for t in texts]
    lex = np.zeros((n - 1, 5))
    for g in range(1, n):
        before = set().union(*words[max(0, g - 3) : g])
        after = set().union(*words[g : g + 2])
        lex[g - 1, 0] = len(words[g] - before) / (len(words[g]) + 1)
        lex[g - 1, 1] = len(before & after) / (len(before | after) + 1)
        lex[g - 1, 2] = float("?" in lead_texts[g])
        lex[g - 1, 3] = float("?" in lead_texts[g - 1])
        lex[g - 1, 4] = np.log1p(len(texts[g].split()))
    return np.column_stack([*cols, lex])


def pick_boundaries(scores: np.ndarray, cutoff: float, local_max: bool = True) -> list[int]:
    """Choose gaps whose standardised score exceeds `cutoff` (and, optionally, its neighbours).

    Args:
        scores: `(n - 1,)` gap scores (higher = more likely a topic change).
        cutoff: Threshold in standard deviations above the dialogue's mean score.
        local_max: Only cut at gaps scoring at least as high as both neighbours.

    Returns:
        Unit indices where a new segment starts (gap `g - 1` gives index `g`).
    """
    s = np.asarray(scores, dtype=np.float64)
    if len(s) < 2 or s.std() <= 1e-12:
        return []
    z = (s - s.mean()) / s.std()
    out = []
    for i in range(len(s)):
        if z[i] <= cutoff:
            continue
        if local_max and ((i > 0 and s[i] < s[i - 1]) or (i < len(s) - 1 and s[i] < s[i + 1])):
            continue
        out.append(i + 1)
    return out


class _UnitSegmenter(ABC):
    """Shared plumbing: turns -> units -> embeddings -> boundaries -> turn spans."""

    def __init__(self, embedder: Embedder | None, unit: str, max_chars: int) -> None:
        if unit not in UNITS:
            raise ConfigError(f"unit must be one of {UNITS}, got {unit!r}")
        if max_chars < 1:
            raise ConfigError("max_chars must be >= 1")
        self._embedder = embedder
        self.unit = unit
        self.max_chars = max_chars
        self._given = threading.local()

    @property
    def embedder(self) -> Embedder:
        """The embedder (the default MiniLM is created on first use if none was given)."""
        if self._embedder is None:
            self._embedder = default_embedder()
        return self._embedder

    def _units(self, turns: Sequence[Turn]) -> tuple[list[tuple[int, int]], list[str], list[str]]:
        units = unit_spans(turns, self.unit)
        texts = [" ".join(t.text for t in turns[a:b])[: self.max_chars] for a, b in units]
        leads = [turns[a].text for a, _ in units]
        return units, texts, leads

    @abstractmethod
    def boundaries_for_texts(self, texts: Sequence[str], lead_texts: Sequence[str]) -> list[int]:
        """Indices of the units (given as texts) where a new segment starts."""

    def segment_texts(self, texts: Sequence[str]) -> list[tuple[int, int]]:
        """Segment plain utterance texts (one unit each); returns spans over the texts."""
        texts = list(texts)
        return boundaries_to_spans(self.boundaries_for_texts(texts, texts), len(texts))

    def segment(
        self, turns: Sequence[Turn], turn_vectors: np.ndarray | None = None
    ) -> list[tuple[int, int]]:
        """See `Segmenter.segment`.

        Args:
            turns: The session's turns.
            turn_vectors: Optional embeddings of the turns (one row each); a unit's vector is
                then the normalised mean of its turns' vectors instead of a new embedding.
        """
        turns = list(turns)
        if not turns:
            return []
        units, texts, leads = self._units(turns)
        given = None
        if turn_vectors is not None and len(turn_vectors) == len(turns):
            vecs = np.asarray(turn_vectors, dtype=np.float32)
            rows = [vecs[a:b].mean(axis=0) for a, b in units]
            given = np.vstack(rows) if rows else np.zeros((0, vecs.shape[1]), np.float32)
            given /= np.maximum(np.linalg.norm(given, axis=1, keepdims=True), 1e-12)
        self._given.vectors = given
        try:
            starts = self.boundaries_for_texts(texts, leads) if len(units) > 2 else []
        finally:
            self._given.vectors = None
        unit_segs = boundaries_to_spans(starts, len(units))
        return check_spans(units_to_turn_spans(unit_segs, units), len(turns))

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        given = getattr(self._given, "vectors", None)
        if given is not None and len(given) == len(texts):
            return given
        return np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)


class TextTilingSegmenter(_UnitSegmenter):
    """Embedding TextTiling: depth scores of window similarities, cut above mean + cutoff·sd.

    Args:
        embedder: Sentence embedder; `None` uses the default MiniLM (loaded on first use).
        unit: `"exchange"` (default) or `"turn"`.
        window: Units averaged on each side of a gap.
        cutoff: Cut where depth > mean + cutoff · sd of the dialogue's depths (0.75 is best on
            TIAGE train with MiniLM).
        max_chars: Unit texts are cut to this length before embedding.

    Example:
        >>> from reflective_memory.embed import HashingEmbedder
        >>> seg = TextTilingSegmenter(HashingEmbedder(64), unit="turn")
        >>> seg.segment_texts(["cats purr", "cats nap", "cats eat", "tax forms", "tax dues",
        ...                    "tax rates"])
        [(0, 3), (3, 6)]
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        unit: str = "exchange",
        window: int = 2,
        cutoff: float = 0.75,
        max_chars: int = 2000,
    ) -> None:
        super().__init__(embedder, unit, max_chars)
        if window < 1:
            raise ConfigError("window must be >= 1")
        self.window = window
        self.cutoff = float(cutoff)

    def boundaries_for_texts(self, texts: Sequence[str], lead_texts: Sequence[str]) -> list[int]:
        """See `_UnitSegmenter.boundaries_for_texts`."""
        if len(texts) < 3:
            return []
        depth = depth_scores(window_similarities(self._embed(texts), self.window))
        return [g for g in pick_boundaries(depth, self.cutoff, local_max=False) if depth[g - 1] > 0]

    def __repr__(self) -> str:
        return (
            f"TextTilingSegmenter(unit={self.unit!r}, window={self.window}, cutoff={self.cutoff})"
        )


def load_weights(path: str | Path | None = None) -> dict[str, Any]:
    """Load boundary-scorer weights (the bundled file when `path` is None).

    Raises:
        ConfigError: The file is missing, not a bounded regular JSON file (`jsonfile`), or
            does not match `FEATURE_NAMES`; the message names the file.
    """
    where = Path(__file__).resolve().parents[1] / "data" / DEFAULT_WEIGHTS if path is None else path
    try:  # a bounded regular file, bounded JSON (`jsonfile`), whoever wrote it
        data = loads_bounded(read_text_file(where, max_bytes=MAX_MODEL_FILE_BYTES), where)
    except InvalidFileError as exc:
        raise ConfigError(f"cannot read segmenter weights {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"segmenter weights {where}: not a JSON object")
    if list(data.get("features", [])) != list(FEATURE_NAMES):
        raise ConfigError("segmenter weights were trained on other features; retrain them")
    if len(data.get("coef", [])) != len(FEATURE_NAMES):
        raise ConfigError("segmenter weights have the wrong number of coefficients")
    return data


class EmbeddingSegmenter(_UnitSegmenter):
    """The offline default: a learned gap scorer over embedding and dialogue features.

    Args:
        embedder: Sentence embedder; `None` uses the default MiniLM (loaded on first use).
        unit: `"exchange"` (default; never splits a question from its answer) or `"turn"`.
        weights: Path of a weights JSON written by
            `python -m reflective_memory.segment.train`; `None`
            uses the bundled weights.
        cutoff: Cut threshold in standard deviations; `None` uses the value stored with the
            weights (tuned by cross-validation on the training data).
        max_chars: Unit texts are cut to this length before embedding.

    Example:
        >>> from reflective_memory.embed import HashingEmbedder
        >>> seg = EmbeddingSegmenter(HashingEmbedder(64), unit="turn")
        >>> spans = seg.segment_texts(["do you like cats?", "yes cats are great", "cats purr",
        ...     "what job do you have?", "i teach math", "math is hard", "i like teaching"])
        >>> spans[0][0], spans[-1][1]
        (0, 7)
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        unit: str = "exchange",
        weights: str | Path | None = None,
        cutoff: float | None = None,
        max_chars: int = 2000,
    ) -> None:
        super().__init__(embedder, unit, max_chars)
        self.weights = weights
        data = load_weights(weights)
        self.coef_ = np.asarray(data["coef"], dtype=np.float64)
        self.intercept_ = float(data.get("intercept", 0.0))
        self.cutoff = float(data.get("cutoff", 0.75)) if cutoff is None else float(cutoff)
        self.local_max = bool(data.get("local_max", True))

    def gap_scores(self, texts: Sequence[str], lead_texts: Sequence[str]) -> np.ndarray:
        """Log-odds that a new topic starts at each gap (`len(texts) - 1` values)."""
        feats = gap_features(self._embed(texts), texts, lead_texts)
        return feats @ self.coef_ + self.intercept_

    def boundaries_for_texts(self, texts: Sequence[str], lead_texts: Sequence[str]) -> list[int]:
        """See `_UnitSegmenter.boundaries_for_texts`."""
        if len(texts) < 3:
            return []
        return pick_boundaries(self.gap_scores(texts, lead_texts), self.cutoff, self.local_max)

    def __repr__(self) -> str:
        return f"EmbeddingSegmenter(unit={self.unit!r}, cutoff={self.cutoff})"


def make_segmenter(
    kind: str,
    *,
    embedder: Embedder | None = None,
    unit: str = "exchange",
    window: int = 6,
) -> Segmenter:
    """Build an offline segmenter by name.

    Args:
        kind: `embedding` (learned, the default), `texttiling` or `fixed`.
        embedder: Embedder for the embedding-based kinds.
        unit: `exchange` or `turn` (embedding-based kinds).
        window: Turns per segment for `fixed`.

    Raises:
        ConfigError: Unknown kind.
    """
    if kind == "embedding":
        return EmbeddingSegmenter(embedder, unit=unit)
    if kind == "texttiling":
        return TextTilingSegmenter(embedder, unit=unit)
    if kind == "fixed":
        return FixedWindowSegmenter(window)
    raise ConfigError(f"unknown segmenter {kind!r}; choose from {SEGMENTER_KINDS}")
