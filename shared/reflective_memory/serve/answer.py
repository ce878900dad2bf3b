"""Answers for the chat: an LLM that cites its memories, or an offline extractive answerer.

Both return an `Answer` whose `cited` positions refer to the hits of the retrieval they were
given, numbered as `reflective_memory.rmm.citations.build_answer_prompt` numbers them.

* `OfflineAnswerer` needs no model: it quotes the sentences of the top memories that share the
  most content words with the message, and cites exactly the memories it quotes. When no memory
  shares a content word it says so and cites nothing (`[NO_CITE]`). It does not reason, infer
  or paraphrase; the UI labels its replies as extractive.
* `LLMAnswerer` sends the answer-and-cite prompt to any LLM our `LLMClient` accepts, bounded by
  a timeout, and falls back to the offline answer (recording why) when the LLM raises, hangs or
  returns nothing usable.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from reflective_memory.embed import Embedder, encode_query
from reflective_memory.errors import InvalidInputError, LLMError
from reflective_memory.llm import LLMClient, as_llm
from reflective_memory.rmm.citations import (
    build_answer_prompt,
    parse_citations,
    split_sentences,
    strip_citations,
)
from reflective_memory.text import format_date, lexical_tokens
from reflective_memory.types import Hit, Usage

__all__ = ["Answer", "OfflineAnswerer", "LLMAnswerer", "make_answerer"]

logger = logging.getLogger(__name__)

# Words that ask rather than inform; matching them says nothing about a memory.
_ASKING = frozenset(lexical_tokens("tell remember know recall think please again anything name"))
_DATE_LINE = re.compile(r"^\[[^\]]*\]$")
_ROLE = re.compile(r"^([A-Za-z][\w .-]{0,30}):\s+(.*)$")


@dataclass
class Answer:
    """A chat reply and what it cites.

    Attributes:
        text: The reply as shown and stored (citation markers removed).
        raw: The reply as produced, citation markers included.
        cited: Cited hit positions (0-based, valid, unique).
        no_cite: The reply said no memory helped.
        source: `llm` or `offline`.
        usage: LLM usage of the reply (zero for offline replies).
        fallback_reason: Why the LLM's reply was replaced by the offline one, if it was.
        ms: Time taken in milliseconds.
    """

    text: str
    raw: str
    cited: tuple[int, ...]
    no_cite: bool
    source: str
    usage: Usage = field(default_factory=Usage)
    fallback_reason: str | None = None
    ms: float = 0.0


def _speaker_lines(text: str) -> list[tuple[str, str]]:
    """`(role, utterance)` pairs of a memory's text; a date header line is skipped."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or _DATE_LINE.match(line):
            continue
        m = _ROLE.match(line)
        if m:
            out.append((m.group(1).strip().lower(), m.group(2).strip()))
        elif out:
            role, prev = out[-1]
            out[-1] = (role, f"{prev} {line}")
        else:
            out.append(("", line))
    return out


class OfflineAnswerer:
    """Quote the best-matching sentences of the top memories, citing each quoted memory.

    Each sentence of the top hits' turns is scored by its cosine with the message (when an
    embedder is given) plus the content words it shares with the message; a sentence counts
    only if it shares a content word or reaches `min_similarity`. What the user said weighs
    more than the assistant's words, statements more than questions. The best sentence of each
    memory competes; the winners are quoted verbatim with the memory's date and cited.

    Args:
        embedder: Scores sentences by meaning too (e.g. the store's embedder); `None` matches
            content words only.
        max_quotes: Most sentences quoted (each from a different memory).
        top_n: Only the first `top_n` hits are read.
        keep_ratio: A further quote must score at least this fraction of the best one.
        min_similarity: Cosine at which a sentence counts without a shared word (0.4 suits
            all-MiniLM-L6-v2 sentence pairs: a paraphrase scores about 0.45-0.7, an unrelated
            sentence of the same chat about 0.1-0.35).
        max_sentences: Most sentences scored per answer (those sharing a content word with the
            message first, then the rest in rank order); bounds the embedding cost.
    """

    source = "offline"

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        max_quotes: int = 2,
        top_n: int = 5,
        keep_ratio: float = 0.75,
        min_similarity: float = 0.4,
        max_sentences: int = 64,
    ) -> None:
        if max_quotes < 1 or top_n < 1 or max_sentences < 1 or not 0.0 < keep_ratio <= 1.0:
            raise InvalidInputError(
                "max_quotes, top_n, max_sentences >= 1 and 0 < keep_ratio <= 1 are required"
            )
        self.embedder = embedder
        self.max_quotes = max_quotes
        self.top_n = top_n
        self.keep_ratio = keep_ratio
        self.min_similarity = min_similarity
        self.max_sentences = max_sentences

    def describe(self) -> str:
        """A short name for the UI."""
        return "offline extractive answerer"

    def _candidates(
        self, hits: Sequence[Hit], query_words: set[str]
    ) -> list[tuple[int, str, str, set[str]]]:
        sharing, rest = [], []
        for pos, hit in enumerate(hits[: self.top_n]):
            for role, utterance in _speaker_lines(hit.memory.text):
                for sentence in split_sentences(utterance) or [utterance]:
                    words = set(lexical_tokens(sentence))
                    if words:
                        (sharing if words & query_words else rest).append(
                            (pos, role, sentence, words)
                        )
        return (sharing + rest)[: self.max_sentences]

    def answer(self, query: str, hits: Sequence[Hit], context: str | None = None) -> Answer:
        """Answer `query` from `hits` (the retrieval's hits, in rank order)."""
        del context  # an extractive answer only quotes memories
        t0 = time.perf_counter()
        query_words = set(lexical_tokens(query)) - _ASKING
        cands = self._candidates(hits, query_words)
        sims = np.zeros(len(cands), dtype=np.float32)
        if self.embedder is not None and cands:
            qvec = np.asarray(encode_query(self.embedder, query), dtype=np.float32).reshape(-1)
            sims = np.asarray(self.embedder.encode([c[2] for c in cands])) @ qvec
        best: dict[int, tuple[float, str, str]] = {}
        for (pos, role, sentence, words), sim in zip(cands, sims, strict=True):
            shared = words & query_words
            if not shared and sim < self.min_similarity:
                continue
            lexical = len(shared) / (1.0 + 0.05 * len(words))
            score = (float(sim) + 0.25 * lexical) * (1.0 if role == "user" else 0.8)
            if sentence.rstrip().endswith("?"):
                score *= 0.5  # a question rarely answers one
            if score > 0 and score > best.get(pos, (0.0, "", ""))[0]:
                best[pos] = (score, role, sentence)
        found = sorted(
            ((sc, pos, role, sent) for pos, (sc, role, sent) in best.items()),
            key=lambda f: (-f[0], f[1]),
        )
        if found:
            floor = found[0][0] * self.keep_ratio
            found = [f for f in found if f[0] >= floor][: self.max_quotes]
        if not found:
            text = "I have no earlier memory that matches this."
            raw = f"{text} [NO_CITE]"
            return Answer(
                text=text,
                raw=raw,
                cited=(),
                no_cite=True,
                source=self.source,
                ms=(time.perf_counter() - t0) * 1000,
            )
        parts = []
        for _, pos, role, sentence in found:
            mem = hits[pos].memory
            when = format_date(mem.start_time).split(" ")[0] if mem.start_time else ""
            who = "You said" if role == "user" else "I said" if role == "assistant" else "Noted"
            on = f" on {when}" if when else ""
            parts.append(f"{who}{on}: \u201c{sentence}\u201d [{pos}]")
        raw = "From our earlier conversations: " + " ".join(parts)
        cited = tuple(pos for _, pos, _, _ in found)
        return Answer(
            text=strip_citations(raw),
            raw=raw,
            cited=cited,
            no_cite=False,
            source=self.source,
            ms=(time.perf_counter() - t0) * 1000,
        )


class LLMAnswerer:
    """Answer with an LLM through the citation prompt, bounded, with an offline fallback.

    Args:
        llm: Anything `reflective_memory.llm.as_llm` accepts (a callable, an object with
            `complete`, one of the framework adapters).
        timeout_s: Longest wait for the LLM; after it the offline answer is used.
        max_reply_chars: Longer replies are cut to this length.
        fallback: The answerer used when the LLM fails (default: `OfflineAnswerer()`).
    """

    source = "llm"

    def __init__(
        self,
        llm: object,
        *,
        timeout_s: float = 60.0,
        max_reply_chars: int = 4000,
        fallback: OfflineAnswerer | None = None,
    ) -> None:
        if timeout_s <= 0 or max_reply_chars < 1:
            raise InvalidInputError("timeout_s must be > 0 and max_reply_chars >= 1")
        client = as_llm(llm)
        if client is None:
            raise InvalidInputError("LLMAnswerer needs an LLM; use OfflineAnswerer without one")
        self.client: LLMClient = client
        self.timeout_s = timeout_s
        self.max_reply_chars = max_reply_chars
        self.fallback = fallback if fallback is not None else OfflineAnswerer()

    def describe(self) -> str:
        """A short name of the model for the UI."""
        inner = getattr(self.client.llm, "model", None) or self.client.llm
        return type(inner).__name__

    def _fall_back(
        self, query: str, hits: Sequence[Hit], reason: str, usage: Usage, t0: float
    ) -> Answer:
        logger.warning("LLM answer replaced by the offline answer: %s", reason)
        out = self.fallback.answer(query, hits)
        out.fallback_reason = reason
        out.usage = usage
        out.ms = (time.perf_counter() - t0) * 1000
        return out

    def answer(self, query: str, hits: Sequence[Hit], context: str | None = None) -> Answer:
        """Ask the LLM to answer `query` from `hits` and cite them; fall back offline."""
        t0 = time.perf_counter()
        usage = Usage()
        prompt = build_answer_prompt(query, list(hits), context=context)
        box: dict[str, object] = {}

        def call() -> None:
            try:
                box["reply"] = self.client.complete(prompt, usage)
            except LLMError as exc:
                box["error"] = exc

        # A daemon thread: a hung LLM call is abandoned and never blocks the process exit. It
        # runs in this request's context, so its trace span is the request's child.
        context = contextvars.copy_context()
        worker = threading.Thread(
            target=context.run, args=(call,), name="rm-serve-llm", daemon=True
        )
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            return self._fall_back(
                query, hits, f"the LLM did not answer within {self.timeout_s:g} s", usage, t0
            )
        if "error" in box:
            return self._fall_back(query, hits, str(box["error"]), usage, t0)
        reply = box.get("reply")
        if not isinstance(reply, str) or not reply.strip():
            return self._fall_back(query, hits, "the LLM returned an empty reply", usage, t0)
        reply = reply.strip()[: self.max_reply_chars]
        parsed = parse_citations(reply, len(hits))
        text = strip_citations(reply)
        if not text:
            return self._fall_back(query, hits, "the LLM reply held only citations", usage, t0)
        return Answer(
            text=text,
            raw=reply,
            cited=parsed.indices,
            no_cite=parsed.no_cite,
            source=self.source,
            usage=usage,
            ms=(time.perf_counter() - t0) * 1000,
        )


def make_answerer(
    llm: object | None, *, embedder: Embedder | None = None, timeout_s: float = 60.0
) -> OfflineAnswerer | LLMAnswerer:
    """`LLMAnswerer` for an LLM (falling back offline), `OfflineAnswerer` for `None`."""
    offline = OfflineAnswerer(embedder)
    if llm is None:
        return offline
    return LLMAnswerer(llm, timeout_s=timeout_s, fallback=offline)
