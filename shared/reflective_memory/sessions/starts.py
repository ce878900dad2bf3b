"""Where a new conversation starts inside a session whose log gave no times.

A log imported without session ids and without times arrives as one long session whose turns
share one time (or none), so nothing tells where one conversation ended and the next began;
the ranker's `position` feature then reads the whole log as one conversation, and recency
cannot order its parts. `ConversationStarts` finds the starts from the turns themselves: a
logistic model over a few scalar features of each gap between consecutive turns (how similar
the turn is to the ones before it and after it at three spans, how deep that similarity dips
below its neighbourhood, which side speaks, how long the turns are; no words of any
language), fitted on the dev sets' true session starts by `bench fit-starts`, its weights in
`reflective_memory/data/conversation_starts.json`.

It runs when a session is built (`sessions.writer`), only on a session of at least
`min_turns` turns whose log gave them no time (`untimed`: one time for all, the clock's when
the session was stored; a dated session is one day's talk), and only turns whose start
probability reaches `threshold` are kept: a false start costs more than a missed one. The
positions are stored with the session's memories and read back as
`types.SessionTurns.conversation_starts`, which `retrieval.turn_votes.conversation_spans` cuts
at.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.errors import ConfigError, InvalidFileError
from reflective_memory.jsonfile import MAX_MODEL_FILE_BYTES, loads_bounded, read_text_file
from reflective_memory.retrieval.ranker import model_checksum
from reflective_memory.segment.embedding import depth_scores, window_similarities
from reflective_memory.text import as_utc
from reflective_memory.types import Turn

__all__ = [
    "FEATURES",
    "FORMAT",
    "ConversationStarts",
    "gap_rows",
    "load_starts",
    "one_time",
    "untimed",
]

logger = logging.getLogger(__name__)

#: The model file's format tag.
FORMAT = "reflective-memory/conversation-starts/1"

#: One column per feature of the gap before turn `g` (`gap_rows`).
FEATURES = (
    "cos_prev",  # cosine to the turn before
    "cos_prev3",  # cosine to the mean of the 3 turns before
    "cos_next",  # cosine to the turn after (a new conversation's turns hang together)
    "cos_next3",  # cosine to the mean of the 3 turns after
    "cross2",  # mean of 2 / 3 turns before against the same after
    "cross3",
    "depth1",  # how far the similarity across a gap of 1 / 2 / 3 turns dips below its
    "depth2",  # neighbours (TextTiling depth)
    "depth3",
    "dip3",  # cross3 below the log's mean, in its standard deviations
    "lowest3",  # cross3 is the lowest of the gaps within 5 on either side
    "below3",  # how far cross3 is below the lowest of those other gaps
    "same_role",  # the turn's speaker spoke the turn before too
    "opener_role",  # the turn's speaker opened the log
    "log_words",  # log(1 + words) of the turn
    "log_words_prev",  # of the turn before
)


#: A session whose one time lies within this many seconds of when the session was stored got
#: it from the clock (its log gave none), not from the log's date.
CLOCK_SLACK_SECONDS = 300.0


def one_time(turns: Sequence[Turn]) -> bool:
    """Whether no two turns' times differ (all the same, or none given)."""
    return len({t.timestamp for t in turns}) <= 1


def untimed(turns: Sequence[Turn], stored_at: datetime | None) -> bool:
    """Whether a session's log gave its turns no time: one time, the clock's when stored.

    A dated session (a log that gives the day, every turn of it sharing that time) is not
    untimed: its date says it is one day's conversation.
    """
    if not one_time(turns):
        return False
    ts = turns[0].timestamp if turns else None
    if ts is None or stored_at is None:
        return True
    return abs((as_utc(ts) - as_utc(stored_at)).total_seconds()) <= CLOCK_SLACK_SECONDS


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    n[n == 0] = 1.0
    return x / n


#: Gaps on either side a gap is compared with (`lowest3`, `below3`).
NEIGHBOURS = 5


def _neighbourhood(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per gap: whether it is the lowest within `k` gaps each side, and its margin below them."""
    m = len(sims)
    lowest, below = np.zeros(m), np.zeros(m)
    for i in range(m):
        others = np.concatenate([sims[max(0, i - k) : i], sims[i + 1 : i + 1 + k]])
        if len(others):
            margin = float(others.min() - sims[i])
            lowest[i], below[i] = float(margin > 0), margin
    return lowest, below


def gap_rows(vectors: np.ndarray, turns: Sequence[Turn]) -> np.ndarray:
    """The `FEATURES` of every gap: row `g - 1` is the gap before turn `g`.

    Args:
        vectors: `(n, d)` turn vectors (normalised here).
        turns: The `n` turns, for speakers and lengths.

    Returns:
        `(n - 1, len(FEATURES))` float64 matrix (empty for fewer than two turns).
    """
    n = len(turns)
    if n < 2:
        return np.zeros((0, len(FEATURES)))
    emb = _unit(np.asarray(vectors, dtype=np.float64))
    g = np.arange(1, n)
    cum = np.vstack([np.zeros((1, emb.shape[1])), np.cumsum(emb, axis=0)])
    prev3 = _unit(cum[g] - cum[np.maximum(0, g - 3)])
    cos_prev = np.einsum("ij,ij->i", emb[g], emb[g - 1])
    cos_prev3 = np.einsum("ij,ij->i", emb[g], prev3)
    cos_next = np.append(np.einsum("ij,ij->i", emb[g[:-1]], emb[g[:-1] + 1]), 1.0)
    next3 = _unit(cum[np.minimum(n, g + 4)] - cum[g + 1])
    cos_next3 = np.einsum("ij,ij->i", emb[g], next3)
    cross = [window_similarities(emb, w) for w in (1, 2, 3)]
    depth = [depth_scores(s) for s in cross]
    spread = cross[2].std()
    dip = (cross[2].mean() - cross[2]) / spread if spread > 1e-12 else np.zeros(n - 1)
    lowest, below = _neighbourhood(cross[2], NEIGHBOURS)
    roles = [t.role for t in turns]
    same = np.array([float(roles[i] == roles[i - 1]) for i in g])
    opener = np.array([float(roles[i] == roles[0]) for i in g])
    words = np.log1p([len(t.text.split()) for t in turns])
    return np.column_stack(
        [
            cos_prev,
            cos_prev3,
            cos_next,
            cos_next3,
            cross[1],
            cross[2],
            *depth,
            dip,
            lowest,
            below,
            same,
            opener,
            words[g],
            words[g - 1],
        ]
    )


class ConversationStarts:
    """A fitted start detector: logistic model, threshold and the sessions it reads.

    Args:
        model: The model document (`FORMAT`): `mean`, `scale`, `coef` (one per `FEATURES`),
            `intercept`, `threshold`, `min_turns` and what it was `fitted` on.

    Raises:
        ConfigError: The document is not a model of this version's features.
    """

    def __init__(self, model: dict[str, Any], where: str = "in memory") -> None:
        try:
            if model.get("format") != FORMAT or tuple(model["features"]) != FEATURES:
                raise ValueError(f"not a {FORMAT} document of this version's features")
            self.mean = np.asarray(model["mean"], dtype=np.float64)
            self.scale = np.asarray(model["scale"], dtype=np.float64)
            self.coef = np.asarray(model["coef"], dtype=np.float64)
            self.intercept = float(model["intercept"])
            self.threshold = float(model["threshold"])
            self.min_turns = int(model["min_turns"])
            shapes = {self.mean.shape, self.scale.shape, self.coef.shape}
            if shapes != {(len(FEATURES),)}:
                raise ValueError("weights do not match the features")
            if not 0.0 < self.threshold < 1.0 or self.min_turns < 2 or np.any(self.scale <= 0):
                raise ValueError("threshold, min_turns or scale out of range")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"conversation-start model {where}: {e}") from None
        self.model = model

    @staticmethod
    def document(model: dict[str, Any]) -> dict[str, Any]:
        """A fitted model as the file `load` reads (format, features and checksum added)."""
        body = {"format": FORMAT, "features": list(FEATURES), **model}
        return {**body, "sha256": model_checksum(body)}

    @staticmethod
    def write(document: dict[str, Any], path: str | Path) -> None:
        """Write a model document as `load_starts` reads it."""
        Path(path).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")

    def applies(self, turns: Sequence[Turn], stored_at: datetime | None = None) -> bool:
        """Whether a session is one this detector reads: long, and its log gave no times.

        Args:
            turns: The session's turns.
            stored_at: When the session was stored (`untimed`); None: not known.
        """
        return len(turns) >= self.min_turns and untimed(turns, stored_at)

    def probabilities(self, vectors: np.ndarray, turns: Sequence[Turn]) -> np.ndarray:
        """Each gap's probability that a conversation starts after it (`gap_rows` order)."""
        return self.of_rows(gap_rows(vectors, turns))

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The start probability of each row of `gap_rows` features."""
        z = ((rows - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))

    def find(
        self,
        turns: Sequence[Turn],
        vectors: np.ndarray | None,
        stored_at: datetime | None = None,
    ) -> list[int]:
        """Positions where a conversation starts (empty when the session is not one to read)."""
        if vectors is None or len(vectors) != len(turns) or not self.applies(turns, stored_at):
            return []
        p = self.probabilities(vectors, turns)
        found = [int(i) + 1 for i in np.flatnonzero(p >= self.threshold)]
        if found:
            logger.debug("%d conversation starts in a session of %d turns", len(found), len(turns))
        return found

    def __repr__(self) -> str:
        return f"ConversationStarts(threshold={self.threshold}, min_turns={self.min_turns})"


#: Where the bundled model lives in the package.
BUNDLED = "data/conversation_starts.json"


@lru_cache(maxsize=8)
def load_starts(spec: str) -> ConversationStarts | None:
    """The detector a `sessions.conversation_starts` setting names.

    Args:
        spec: `"learned"` (the bundled model), `"off"` (None), or the path of a model file.

    Raises:
        ConfigError: The file is missing, too large, not JSON, fails its checksum or is not a
            model of this version's features; the message names the file.
    """
    if spec == "off":
        return None
    try:
        if spec == "learned":
            where = f"reflective_memory/{BUNDLED}"
            text = resources.files("reflective_memory").joinpath(BUNDLED).read_text("utf-8")
        else:
            where = spec
            text = read_text_file(Path(spec), max_bytes=MAX_MODEL_FILE_BYTES)
        doc = loads_bounded(text, where)
    except InvalidFileError as exc:
        raise ConfigError(f"cannot read conversation-start model {exc}") from None
    if not isinstance(doc, dict) or doc.get("sha256") != model_checksum(doc):
        raise ConfigError(f"conversation-start model {where} does not match its sha256 checksum")
    return ConversationStarts(doc, where)
