"""Memory units of a session: raw text for the reader, a (denoised) key for the index.

`build_units` cuts a finished session into the configured granularities (turns, segments from a
SeCom segmenter, whole sessions); `denoise_drafts` replaces each unit's key by its denoised form
(SeCom compression) while the text the LLM reads stays raw.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from reflective_memory.denoise import Denoiser, denoiser_name, fitted_on
from reflective_memory.errors import ConfigError, ModelLoadError, ReflectiveMemoryError
from reflective_memory.segment.base import Segmenter, check_spans
from reflective_memory.settings import check_bool, check_choice, check_int, check_names, set_field
from reflective_memory.storage.base import MemoryDraft
from reflective_memory.text import format_date
from reflective_memory.types import Memory, Turn

__all__ = [
    "BASE_UNITS",
    "CONVERSATION_STARTS",
    "UnitConfig",
    "build_units",
    "turn_unit_id",
    "unit_draft",
    "raw_key",
    "source_turns",
    "denoise_drafts",
    "denoised_keys",
]

logger = logging.getLogger(__name__)

#: Unit kinds built from a session's turns (rebuilt by `end_session` and `redenoise`).
BASE_UNITS = ("turn", "session", "segment")
#: Metadata key of the memories built from a session's first turn that lists where further
#: conversations start inside it (`sessions.starts`: a long log without times).
CONVERSATION_STARTS = "conversation_starts"


@dataclass(frozen=True)
class UnitConfig:
    """Which memory units are built from a session's turns and how their keys are made.

    Attributes:
        granularities: Any of `turn` (one unit per utterance, indexed by `add_turn` at once),
            `session` (the whole session) and `segment` (topical segments, built by
            `end_session`). All are searched. Turns are the keys that find things; segments
            add topical context.
        speaker_keys: Keys of units built from turns start each line with the speaker
            (`Kate: ...`), so keyword search finds what a named person said; dense vectors are
            made from the utterances alone, without the `Name: ` label a chat-role turn opens
            with (`speakers.utterance`). Off: keys and vectors are of the texts as given.
        date_prefix: Start each memory's text with its session date when known.
        segment_vectors: Vector of a multi-turn unit with a raw key: `mean` (the normalised
            mean of its turns' vectors, nothing embedded again) or `embed` (embed the key).
        embed_max_chars: Texts are cut to this many characters before embedding; the stored
            text stays whole.
        embed_batch_size: Texts per embedding call when indexing.
    """

    granularities: tuple[str, ...] = ("turn", "segment")
    speaker_keys: bool = True
    date_prefix: bool = True
    segment_vectors: str = "mean"
    embed_max_chars: int = 4000
    embed_batch_size: int = 64

    def __post_init__(self) -> None:
        names = check_names("units.granularities", self.granularities, BASE_UNITS)
        if not names:
            raise ConfigError("units.granularities must name at least one unit kind")
        set_field(self, "granularities", names)
        check_bool("units.speaker_keys", self.speaker_keys)
        check_bool("units.date_prefix", self.date_prefix)
        check_choice("units.segment_vectors", self.segment_vectors, ("mean", "embed"))
        check_int("units.embed_max_chars", self.embed_max_chars)
        check_int("units.embed_batch_size", self.embed_batch_size)


def turn_unit_id(user_id: str, session_id: str, turn_id: str) -> str:
    """The stable memory id of a turn's `turn` unit (the same at `add_turn` and `end_session`)."""
    h = hashlib.sha1("\x1f".join([user_id, session_id, turn_id]).encode()).hexdigest()
    return f"turn-{h[:20]}"


def _segment(
    segmenter: Segmenter, turns: Sequence[Turn], turn_vectors: np.ndarray | None
) -> list[tuple[int, int]]:
    """Cut a session, handing the turns' vectors to segmenters that accept them."""
    if turn_vectors is not None:
        try:
            accepts = "turn_vectors" in inspect.signature(segmenter.segment).parameters
        except (TypeError, ValueError):
            accepts = False
        if accepts:
            return segmenter.segment(turns, turn_vectors=turn_vectors)  # type: ignore[call-arg]
    return segmenter.segment(turns)


def raw_key(turns: Sequence[Turn], speakers: bool = False) -> str:
    """The undenoised key of a unit: its turns' texts, one per line.

    Args:
        turns: The unit's turns.
        speakers: Start each line with the speaker (`Kate: ...`), so keyword search finds
            what a named person said. Dense vectors are still made from the utterances alone.
    """
    if speakers:
        return "\n".join(f"{t.role}: {t.text}" for t in turns)
    return "\n".join(t.text for t in turns)


def source_turns(mem: Memory, turns: Sequence[Turn]) -> list[Turn] | None:
    """The session turns a memory was built from (by stored positions, else by turn ids)."""
    pos = mem.metadata.get("positions")
    if (
        isinstance(pos, (list, tuple))
        and len(pos) == 2
        and all(isinstance(p, int) for p in pos)
        and 0 <= pos[0] < pos[1] <= len(turns)
    ):
        span = list(turns[pos[0] : pos[1]])
        if tuple(t.turn_id for t in span) == tuple(mem.turn_ids):
            return span
    by_id = {t.turn_id: t for t in turns}
    if mem.turn_ids and all(tid in by_id for tid in mem.turn_ids):
        return [by_id[tid] for tid in mem.turn_ids]
    return None


def unit_draft(
    granularity: str,
    turns: Sequence[Turn],
    session_time: datetime | None,
    *,
    date_prefix: bool = True,
    speaker_keys: bool = False,
) -> MemoryDraft:
    """One memory unit over consecutive turns of a session.

    Args:
        granularity: Unit kind.
        turns: The unit's turns, in order.
        session_time: The session's time (its date heads the text when `date_prefix`).
        date_prefix: Start the text with the session date.
        speaker_keys: Put the speaker in front of each line of the key (see `raw_key`).
    """
    body = "\n".join(f"{t.role}: {t.text}" for t in turns)
    date = format_date(session_time) if date_prefix else ""
    text = f"[{date}]\n{body}" if date else body
    times = [t.timestamp for t in turns if t.timestamp is not None]
    return MemoryDraft(
        session_id=turns[0].session_id,
        granularity=granularity,
        text=text,
        key=raw_key(turns, speaker_keys),
        turn_ids=tuple(t.turn_id for t in turns),
        start_time=times[0] if times else None,
        end_time=times[-1] if times else None,
        metadata={"positions": [turns[0].position, turns[-1].position + 1]},
    )


def build_units(
    turns: Sequence[Turn],
    granularities: Sequence[str],
    segmenter: Segmenter,
    *,
    date_prefix: bool = True,
    turn_vectors: np.ndarray | None = None,
    speaker_keys: bool = False,
) -> list[MemoryDraft]:
    """Memory units of one session for every granularity in `granularities` (not yet stored).

    Args:
        turns: The session's turns, in order.
        granularities: Unit kinds among `BASE_UNITS`.
        segmenter: Cuts the session for the `segment` kind.
        date_prefix: Start each unit's text with the session date.
        turn_vectors: Embeddings of the raw turns (one row per turn), handed to segmenters
            that can use them instead of embedding the session again.
        speaker_keys: Put the speaker in front of each line of the keys (see `raw_key`).

    Returns:
        Drafts whose `text` is the raw turns (with the session date first when known) and
        whose `key` is the text that gets indexed.
    """
    if not turns:
        return []
    drafts: list[MemoryDraft] = []
    for granularity in granularities:
        if granularity == "turn":
            spans = [(i, i + 1) for i in range(len(turns))]
        elif granularity == "session":
            spans = [(0, len(turns))]
        else:
            spans = check_spans(_segment(segmenter, turns, turn_vectors), len(turns))
        for start, end in spans:
            drafts.append(
                unit_draft(
                    granularity,
                    turns[start:end],
                    turns[0].timestamp,
                    date_prefix=date_prefix,
                    speaker_keys=speaker_keys,
                )
            )
    return drafts


def denoised_keys(
    denoiser: Denoiser | None,
    sources: list[str],
    corpus: Callable[[], Sequence[str]],
    user_id: str,
    *,
    strict: bool = False,
) -> list[str] | None:
    """Denoised keys, or `None` when no denoiser is set or it failed (raw keys are kept).

    Args:
        denoiser: The key denoiser, if any.
        sources: Raw keys.
        corpus: The user's turn texts, for denoisers fitted to corpus statistics.
        user_id: Owner (for the log).
        strict: A failing denoiser raises instead of falling back to raw keys.

    Raises:
        ReflectiveMemoryError: With `strict`, the denoiser failed (a `ModelLoadError` when its
            model could not load).
    """
    if denoiser is None:
        return None
    try:
        fitted = denoiser
        if callable(getattr(fitted, "fit", None)):
            fitted = fitted_on(fitted, corpus())
        keys = fitted.denoise(list(sources))
        if not isinstance(keys, list) or len(keys) != len(sources):
            raise TypeError(f"denoise returned {type(keys).__name__} for {len(sources)} texts")
        if not all(isinstance(k, str) for k in keys):
            raise TypeError("denoise returned a non-str key")
    except Exception as exc:  # keys fall back to raw text; nothing is lost
        if strict:
            if isinstance(exc, ReflectiveMemoryError):
                raise
            raise ReflectiveMemoryError(
                f"denoiser {denoiser_name(denoiser)} failed: {type(exc).__name__}: {exc}"
            ) from exc
        logger.log(
            logging.ERROR if isinstance(exc, ModelLoadError) else logging.WARNING,
            "denoiser %s failed for user %s; indexing raw keys (redenoise later): %s",
            denoiser_name(denoiser),
            user_id,
            exc,
            exc_info=True,
        )
        return None
    return keys


def denoise_drafts(
    denoiser: Denoiser | None,
    drafts: Sequence[MemoryDraft],
    corpus: Callable[[], Sequence[str]],
    user_id: str,
    *,
    strict: bool = False,
) -> None:
    """Replace each draft's key by its denoised form, in place (texts stay raw).

    Each draft's metadata records the denoiser under `key_denoiser`. If the denoiser fails, the
    raw keys are kept (and recorded as `none`); a blank denoised key is replaced by the raw one.

    Args:
        denoiser: The key denoiser, if any.
        drafts: Memory drafts of one user.
        corpus: The user's turn texts (called only for denoisers with corpus statistics).
        user_id: Owner of the drafts.
        strict: A failing denoiser raises (see `denoised_keys`) instead of keeping raw keys.
    """
    if not drafts:
        return
    keys = denoised_keys(denoiser, [d.key for d in drafts], corpus, user_id, strict=strict)
    name = denoiser_name(denoiser) if keys is not None else "none"
    for i, draft in enumerate(drafts):
        meta = dict(draft.metadata) if draft.metadata is not None else {}
        meta["key_denoiser"] = name
        draft.metadata = meta
        if keys is not None and keys[i].strip():
            draft.key = keys[i]
