"""The engine's turn prior: applied to a retrieval's votes, trained by answers, persisted.

`TurnPriorStage` owns the one `TurnPrior` of a memory (`reflective_memory.rmm.turn_prior`):

- `scale(votes, session_turns)` changes a retrieval's turn votes once the prior is trained and
  returns the turns' features;
- `shown_features(...)` picks the features of the turns a retrieval returned, kept in its
  diagnostics so that feedback on that retrieval (in this process or another) can learn;
- `learn(retrieval, cited)` takes one answer's citations.

Persistence follows the reranker's: a file `turn_prior.json` in the store directory's
`rerankers/` folder (written after every answer, atomically), or, in a store with versioned blobs
(PostgreSQL), the blob `rmm.turn_prior` of the shared owner, updated inside the store's
cross-process read-modify-write so concurrent answers are never lost; a process reloads the
prior when another one saved a newer version. The prior holds no text and no user's data.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reflective_memory.errors import ModelLoadError
from reflective_memory.passages import TurnVotes
from reflective_memory.rmm.reranker import _atomic
from reflective_memory.rmm.turn_prior import TURN_FEATURES, TurnPrior, turn_features
from reflective_memory.types import Hit, Retrieval, Turn

__all__ = ["TurnPriorStage", "TURN_PRIOR_BLOB", "TURN_PRIOR_FILE", "DIAGNOSTICS_KEY"]

logger = logging.getLogger(__name__)

#: Blob name of the prior in stores with versioned blobs (owner: the shared owner).
TURN_PRIOR_BLOB = "rmm.turn_prior"
#: File name of the prior inside the `rerankers/` folder of a store directory.
TURN_PRIOR_FILE = "turn_prior.json"
#: Where a retrieval's diagnostics keep its shown turns' features.
DIAGNOSTICS_KEY = "turn_features"
_OWNER = "__shared__"
#: Largest magnitude of a feature value taken from a retrieval's diagnostics.
_FEATURE_LIMIT = 100.0


class TurnPriorStage:
    """Apply, record, learn and persist a memory's `TurnPrior`.

    Args:
        strength: Vote scaling strength (`exp(strength * z)`); 0 turns the stage off.
        learning_rate: `TurnPrior` step per answer.
        directory: Folder of the prior's file (`None`: not on disk).
        store: A store with versioned blobs (`get_blob`, `update_blob`, `blob_version`);
            takes precedence over `directory`.
    """

    def __init__(
        self,
        *,
        strength: float,
        learning_rate: float,
        directory: Path | None = None,
        store: Any = None,
    ) -> None:
        self.strength = float(strength)
        self.learning_rate = float(learning_rate)
        self.directory = directory
        self.store = store if store is not None and hasattr(store, "update_blob") else None
        self._prior: TurnPrior | None = None
        self._version = -1
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether the stage changes or records anything."""
        return self.strength > 0

    # ------------------------------------------------------------ state
    def _decode(self, data: bytes | None) -> TurnPrior:
        if data is not None:
            try:
                return TurnPrior.from_bytes(data, learning_rate=self.learning_rate)
            except ModelLoadError as exc:
                logger.warning("starting a fresh turn prior: %s", exc)
        return TurnPrior(learning_rate=self.learning_rate)

    def _file(self) -> Path | None:
        return None if self.directory is None else self.directory / TURN_PRIOR_FILE

    def prior(self) -> TurnPrior:
        """The current prior (reloaded from the store when another process saved a newer one)."""
        with self._lock:
            if self.store is not None:
                version = self.store.blob_version(_OWNER, TURN_PRIOR_BLOB)
                if self._prior is None or version != self._version:
                    got = self.store.get_blob(_OWNER, TURN_PRIOR_BLOB)
                    self._version, data = (0, None) if got is None else got
                    self._prior = self._decode(data)
            elif self._prior is None:
                path = self._file()
                data = path.read_bytes() if path is not None and path.exists() else None
                self._prior = self._decode(data)
            return self._prior

    # ------------------------------------------------------------ retrieval
    def scale(
        self,
        votes: TurnVotes,
        session_turns: Callable[[str], Sequence[Turn]],
        cache: dict[Any, Any] | None = None,
    ) -> tuple[list[tuple[str, int]], np.ndarray] | None:
        """Scale a retrieval's votes by the prior, once it is trained.

        Args:
            votes: The retrieval's votes (changed in place).
            session_turns: The turns of a session, in order.
            cache: Text features kept across retrievals (see `turn_features`).

        Returns:
            Every voted turn's key and features as they were *before* scaling (what
            `shown_features` records for learning), or None when nothing was scaled.
        """
        if not self.enabled:
            return None
        prior = self.prior()
        if not prior.trained:
            return None
        features = turn_features(votes, session_turns, cache=cache)
        prior.scale_votes(votes, session_turns, self.strength, features)
        return features

    def shown_features(
        self,
        features: tuple[list[tuple[str, int]], np.ndarray] | None,
        votes: TurnVotes,
        session_turns: Callable[[str], Sequence[Turn]],
        hits: Sequence[Hit],
        cache: dict[Any, Any] | None = None,
    ) -> list[list[list[float]]] | None:
        """Per hit, the feature rows of its turns, for `learn`; None when the stage is off.

        `features` is `scale`'s result; without it (the prior did not scale) the returned
        turns' features are computed from the unchanged `votes`.
        """
        if not self.enabled:
            return None
        if features is None:
            shown = [
                (h.memory.session_id, p)
                for h in hits
                for p in h.memory.metadata.get("positions") or ()
            ]
            features = turn_features(votes, session_turns, shown, cache)
        keys, x = features
        row = {key: i for i, key in enumerate(keys)}
        out = []
        for h in hits:
            sid = h.memory.session_id
            pos = h.memory.metadata.get("positions") or ()
            out.append([np.round(x[row[(sid, p)]], 4).tolist() for p in pos if (sid, p) in row])
        return out

    # ------------------------------------------------------------ learning
    def learn(self, retrieval: Retrieval, cited: Sequence[int]) -> bool:
        """Learn from one answer: turns of cited hits are positive, other shown turns negative.

        Returns:
            Whether the prior took a step (False when off, when the retrieval recorded no
            features, or when the answer cited none or all of the hits).
        """
        rows = retrieval.diagnostics.get(DIAGNOSTICS_KEY) if self.enabled else None
        if not isinstance(rows, list) or len(rows) != len(retrieval.hits):
            return False
        chosen = {c for c in cited if isinstance(c, int)}
        if not chosen or all(i in chosen for i, r in enumerate(rows) if r):
            return False
        x, y = [], []
        for i, hit_rows in enumerate(rows):
            if not isinstance(hit_rows, list):
                return False
            for r in hit_rows:
                x.append(r)
                y.append(i in chosen)
        if not x or all(y) or not any(y):
            return False
        try:  # the diagnostics travel with the Retrieval object: trust nothing in them
            xa = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            xa = np.zeros((0, 0))
        if xa.shape != (len(y), len(TURN_FEATURES)) or not np.isfinite(xa).all():
            logger.debug("turn features of retrieval %s are unreadable", retrieval.retrieval_id)
            return False
        xa, ya = np.clip(xa, -_FEATURE_LIMIT, _FEATURE_LIMIT), np.asarray(y)
        if self.store is not None:

            def update(_version: int, data: bytes | None) -> bytes:
                tp = self._decode(data).partial_fit(xa, ya)
                box.append(tp)
                return tp.to_bytes()

            box: list[TurnPrior] = []
            with self._lock:
                self._version = self.store.update_blob(_OWNER, TURN_PRIOR_BLOB, update)
                self._prior = box[-1]
            return True
        tp = self.prior()
        with self._lock:
            tp.partial_fit(xa, ya)
            path = self._file()
            if path is not None:
                data = tp.to_bytes()
                path.parent.mkdir(parents=True, exist_ok=True)
                _atomic(path, lambda tmp: Path(tmp).write_bytes(data))
        return True
