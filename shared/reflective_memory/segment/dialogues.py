"""Readers of annotated dialogues (TIAGE, SuperDialseg and our own segment lists).

Used by rubric learning, the offline segmenter's training and the segmentation benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reflective_memory.errors import InvalidInputError
from reflective_memory.segment.rubric import LabeledDialogue

__all__ = ["parse_tiage", "parse_superdialseg", "parse_segment_list", "load_dialogues"]


def parse_tiage(data: dict[str, Any]) -> list[LabeledDialogue]:
    """Dialogues from TIAGE annotation JSON (already decoded)."""
    out = []
    for key, rows in data.items():
        if not isinstance(rows, list) or not rows:
            raise InvalidInputError(f"TIAGE dialogue {key!r} is not a non-empty list")
        utts: list[str] = []
        starts: list[int] = []
        for i, row in enumerate(rows):
            if not isinstance(row, (list, tuple)) or len(row) < 2:
                raise InvalidInputError(f"TIAGE dialogue {key!r} row {i} is not [text, label]")
            utts.append(str(row[0]))
            if str(row[1]).strip() == "1" and i > 0:
                starts.append(i)
        out.append(LabeledDialogue.from_starts(utts, starts, dialogue_id=str(key)))
    return out


def parse_superdialseg(text: str) -> list[LabeledDialogue]:
    """Dialogues from SuperDialseg/TADAM text (`call_id_<k>` then `<topic> <utterance>` lines)."""
    out: list[LabeledDialogue] = []
    name: str | None = None
    utts: list[str] = []
    starts: list[int] = []
    prev: str | None = None

    def flush() -> None:
        if name is not None and utts:
            out.append(LabeledDialogue.from_starts(list(utts), list(starts), dialogue_id=name))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("call_id"):
            flush()
            name, utts, starts, prev = line, [], [], None
            continue
        if name is None:
            raise InvalidInputError(f"line {lineno}: utterance before the first call_id line")
        topic, _, utt = line.partition(" ")
        if prev is not None and topic != prev:
            starts.append(len(utts))
        utts.append(utt)
        prev = topic
    flush()
    return out


def parse_segment_list(data: list[Any]) -> list[LabeledDialogue]:
    """Dialogues from our JSON list format (`utterances`, `segments` lengths, optional `roles`)."""
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "utterances" not in item or "segments" not in item:
            raise InvalidInputError(f"item {i} needs 'utterances' and 'segments'")
        utts = [str(u) for u in item["utterances"]]
        lengths = [int(x) for x in item["segments"]]
        if any(x < 1 for x in lengths) or sum(lengths) != len(utts):
            raise InvalidInputError(
                f"item {i}: segment lengths {lengths} must be >= 1 and sum to {len(utts)}"
            )
        spans, pos = [], 0
        for length in lengths:
            spans.append((pos, pos + length))
            pos += length
        roles = item.get("roles")
        out.append(
            LabeledDialogue(
                utterances=tuple(utts),
                spans=tuple(spans),
                roles=None if roles is None else tuple(str(r) for r in roles),
                dialogue_id=str(item.get("id", i)),
            )
        )
    return out


def load_dialogues(path: str | Path) -> list[LabeledDialogue]:
    """Read annotated dialogues in any of the three formats (see the module doc).

    Raises:
        InvalidInputError: The file is missing or in none of the formats.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot read {p}: {exc}") from exc
    stripped = text.lstrip()
    if stripped.startswith("call_id"):
        return parse_superdialseg(text)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(
            f"{p}: neither JSON nor SuperDialseg text (expected a call_id line first)"
        ) from exc
    if isinstance(data, dict):
        return parse_tiage(data)
    if isinstance(data, list):
        return parse_segment_list(data)
    raise InvalidInputError(f"{p}: unsupported JSON top-level type {type(data).__name__}")
