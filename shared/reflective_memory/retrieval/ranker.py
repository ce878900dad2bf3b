"""`TurnRanker`: one log-linear model that weighs every cue of a candidate turn.

A turn's score is `exp(w · x)` over its feature row (`reflective_memory.retrieval.features`):
`log_vote` carries the small-to-big vote, the other columns raise or lower it (a named
speaker's other side, the newest of the best turns for a present-tense question, the period
the question names, ...). The weights are fitted offline by pairwise logistic regression
(scikit-learn) on the dev sets: within each question, every evidence turn against the
other candidate turns, each question weighing the same. They ship as JSON
inside the package with a SHA-256 checksum (`data/turn_ranker.json`), are read once, and are
refitted with `reflective-memory bench fit-ranker`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from reflective_memory.errors import ConfigError, InvalidFileError
from reflective_memory.jsonfile import MAX_MODEL_FILE_BYTES, loads_bounded, read_text_file
from reflective_memory.retrieval.features import FEATURES

__all__ = ["FORMAT", "TurnRanker", "load_ranker", "fit_ranker", "model_checksum"]

logger = logging.getLogger(__name__)

FORMAT = "reflective-memory/turn-ranker/1"
#: Inverse L2 strength of the pairwise logistic regression. The features are not standardised:
#: each is of order one, and a cue that seldom fires (present tense on REALTALK: 2 questions
#: of 714) keeps a small weight instead of one blown up by its tiny spread.
C = 1.0
#: How much a question's order pairs weigh against its coverage pairs (`fit_ranker`).
ORDER_WEIGHT = 1.0


@dataclass(frozen=True)
class TurnRanker:
    """Weights of the log-linear turn score, one per feature.

    Attributes:
        weights: Feature name -> weight (in the feature's own units).
        fitted: What it was fitted on (data, questions, pairs), for the reader.
    """

    weights: Mapping[str, float]
    fitted: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # read-only copies: `load_ranker` shares one object per file across the process, and
        # a document edited from `to_json()` changed the shipped prior for every later caller
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "fitted", copy.deepcopy(self.fitted))
        if tuple(self.weights) != FEATURES:
            raise ConfigError(
                f"turn ranker weights must name the features {list(FEATURES)} in order, "
                f"got {list(self.weights)}"
            )
        bad = [n for n, w in self.weights.items() if not math.isfinite(w)]
        if bad:
            raise ConfigError(f"turn ranker weights are not finite numbers: {bad}")

    @property
    def vector(self) -> np.ndarray:
        """The weights in `FEATURES` order."""
        return np.array([self.weights[n] for n in FEATURES])

    def score(self, matrix: np.ndarray) -> np.ndarray:
        """Log-scores `w · x` of feature rows."""
        if matrix.size == 0:
            return np.zeros(len(matrix))
        return matrix @ self.vector

    def to_json(self) -> dict[str, Any]:
        """The model as the JSON document `load_ranker` reads (checksum included)."""
        body = {
            "format": FORMAT,
            "weights": dict(self.weights),
            "fitted": copy.deepcopy(self.fitted),
        }
        return {**body, "sha256": model_checksum(body)}

    def save(self, path: str | Path) -> None:
        """Write `to_json()` to `path`."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")


def model_checksum(body: dict[str, Any]) -> str:
    """SHA-256 of a model document without its `sha256` (canonical JSON)."""
    rest = {k: v for k, v in body.items() if k != "sha256"}
    canon = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("ascii")).hexdigest()


#: Largest turn ranker file read (the shipped one is under 1 KiB).
MAX_MODEL_BYTES = MAX_MODEL_FILE_BYTES
#: Largest weight a turn ranker file may hold (fitted ones are of order one; a score is
#: `exp(w · x)`, which a weight past this would overflow).
MAX_WEIGHT = 100.0


def _parse(doc: Any, where: str) -> TurnRanker:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"turn ranker {where} is not a {FORMAT} document")
    if doc.get("sha256") != model_checksum(doc):
        raise ConfigError(f"turn ranker {where} does not match its sha256 checksum")
    weights = doc.get("weights")
    if not isinstance(weights, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in weights.values()
    ):
        raise ConfigError(f"turn ranker {where} has no weights map of numbers")
    big = sorted(str(k) for k, v in weights.items() if not abs(v) <= MAX_WEIGHT)
    if big:
        raise ConfigError(
            f"turn ranker {where} has weights beyond +-{MAX_WEIGHT:g}: {', '.join(big[:5])}"
        )
    fitted = doc.get("fitted") or {}
    if not isinstance(fitted, dict):
        raise ConfigError(f"turn ranker {where}: 'fitted' is not an object")
    return TurnRanker({str(k): float(v) for k, v in weights.items()}, fitted)


@lru_cache(maxsize=8)
def load_ranker(path: str | None = None) -> TurnRanker:
    """Read a turn ranker: the one shipped with the package, or the JSON file at `path`.

    A file is read only if it is a regular file of at most `MAX_MODEL_BYTES` (a FIFO or a
    device is refused without blocking), UTF-8, and JSON within `jsonfile.loads_bounded`'s
    limits (nesting, integer digits, finite numbers), with weights within `MAX_WEIGHT`.

    Raises:
        ConfigError: The file is missing, not a regular file, too large, not a turn ranker,
            fails its checksum, or names other features; the message names the file.
    """
    try:
        if path is None:
            where = "reflective_memory/data/turn_ranker.json"
            text = resources.files("reflective_memory").joinpath("data/turn_ranker.json")
            doc = loads_bounded(text.read_text(encoding="utf-8"), where)
        else:
            where = str(path)
            doc = loads_bounded(read_text_file(path, max_bytes=MAX_MODEL_BYTES), where)
    except InvalidFileError as exc:
        raise ConfigError(f"cannot read turn ranker {exc}") from None
    return _parse(doc, where)


def _pairs(matrix: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """One question's (evidence row - other row) differences and their weights."""
    pos = np.flatnonzero(labels)
    neg = np.flatnonzero(~labels)
    if len(pos) == 0 or len(neg) == 0:
        return None
    return _diffs(matrix, pos, neg)


def _order_pairs(
    matrix: np.ndarray, labels: np.ndarray, newness: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """A present-tense question's (newest evidence row - older evidence row) differences."""
    pos = np.flatnonzero(labels)
    if len(pos) < 2:
        return None
    newest = newness[pos].max()
    new, old = pos[newness[pos] == newest], pos[newness[pos] < newest]
    if len(old) == 0:
        return None
    return _diffs(matrix, new, old)


def _diffs(
    matrix: np.ndarray, first: np.ndarray, second: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows `first` minus rows `second`, every pair, weighing one in total."""
    diffs = (matrix[first][:, None, :] - matrix[second][None, :, :]).reshape(-1, matrix.shape[1])
    return diffs, np.full(len(diffs), 1.0 / len(diffs))


def fit_ranker(
    questions: Iterable[
        tuple[np.ndarray, Sequence[bool]] | tuple[np.ndarray, Sequence[bool], np.ndarray | None]
    ],
    *,
    c: float = C,
    order_weight: float = ORDER_WEIGHT,
    fitted: dict[str, Any] | None = None,
) -> TurnRanker:
    """Fit the weights on questions' feature rows and evidence labels.

    Two kinds of pairs, each question's pairs of a kind weighing as much as another's:

    - *coverage*: every evidence turn of a question against every other candidate turn
      (pairing only with the best-voted ones taught the model what tells evidence from near
      misses, and it then ranked the rest of the candidates badly);
    - *order*: for a question about the present (a `newness` given), its newest evidence
      turns against its older evidence turns. Coverage cannot see which of two evidence turns
      comes first; "Where do I live now?" needs the move before the old address.

    A logistic regression without intercept on the differences (each pair also mirrored)
    learns which row is the better one.

    Args:
        questions: Per question, its feature rows (`FEATURES` columns), whether each row's
            turn is evidence, and optionally each row's time (any increasing number) when the
            question asks about the present (None otherwise).
        c: Inverse L2 strength.
        order_weight: What a question's order pairs weigh against its coverage pairs.
        fitted: Notes stored with the model (data, counts).

    Returns:
        The fitted ranker.

    Raises:
        ConfigError: No question has both an evidence turn and another turn among its rows.
    """
    from sklearn.linear_model import LogisticRegression

    diffs, weights, used, ordered = [], [], 0, 0
    for question in questions:
        matrix = np.asarray(question[0], dtype=float)
        labels = np.asarray(question[1], dtype=bool)
        newness = question[2] if len(question) > 2 else None  # type: ignore[misc]
        got = _pairs(matrix, labels)
        if got is not None:
            diffs.append(got[0])
            weights.append(got[1])
            used += 1
        if newness is not None:
            order = _order_pairs(matrix, labels, np.asarray(newness, dtype=float))
            if order is not None:
                diffs.append(order[0])
                weights.append(order[1] * order_weight)
                ordered += 1
    if not used:
        raise ConfigError("no question has both an evidence turn and another candidate turn")
    d = np.vstack(diffs)
    w = np.concatenate(weights)
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=2000)
    model.fit(np.vstack([d, -d]), np.r_[np.ones(len(d)), np.zeros(len(d))], np.r_[w, w])
    coef = model.coef_[0]
    notes = {
        **(fitted or {}),
        "questions": used,
        "ordered_questions": ordered,
        "pairs": int(len(d)),
        "C": c,
        "order_weight": order_weight,
    }
    return TurnRanker({n: round(float(v), 6) for n, v in zip(FEATURES, coef, strict=True)}, notes)
