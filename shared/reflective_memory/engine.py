"""`ReflectiveMemory`: the façade every adapter calls.

Write path (`SessionWriter`): `add_turn` commits a turn at once and indexes it; `end_session`
turns a session into memory units (turns, whole sessions or topical segments). Read path
(`Retriever`): `retrieve` runs the retrieval pipeline (RF-Mem dense + BM25 candidates, fusion,
small-to-big passages weighed by the turn ranker). Learning (`RerankStage`): `feedback` teaches
the turn ranker from an answer's citations (RMM's retrospective reflection). With a tracer
provider set, each of these is an OpenTelemetry span (`reflective_memory.tracing`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from reflective_memory import tracing
from reflective_memory.config import MemoryConfig
from reflective_memory.denoise import Denoiser, make_denoiser
from reflective_memory.embed import Embedder, default_embedder
from reflective_memory.errors import ConfigError, InvalidInputError, UnknownMemoryError
from reflective_memory.kept_retrievals import erased
from reflective_memory.llm import LLMClient, as_llm, count_tokens
from reflective_memory.recall import RecallConfig
from reflective_memory.records import Records
from reflective_memory.retrieval.ranker import load_ranker
from reflective_memory.retrieval.retriever import Retriever
from reflective_memory.rmm.episodes import RankedTexts
from reflective_memory.rmm.feedback import CallerReranker, FeedbackResult, RerankStage
from reflective_memory.rmm.topics import ProspectiveReflector
from reflective_memory.rmm.turn_learning import TurnLearning
from reflective_memory.segment.base import Segmenter
from reflective_memory.segment.factory import segmenter_from_config
from reflective_memory.sessions.starts import load_starts
from reflective_memory.sessions.writer import SessionWriter
from reflective_memory.storage.base import MemoryStore, NativeAsync, StateHolder, require_open
from reflective_memory.storage.driver_errors import typed_errors
from reflective_memory.storage.factory import open_store
from reflective_memory.storage.index import IndexCache
from reflective_memory.storage.sqlite import SQLiteStore
from reflective_memory.storage.state import FileStateStore
from reflective_memory.types import Memory, RerankRecord, Retrieval, Turn
from reflective_memory.validation import (
    check_flag,
    check_id,
    check_numbering,
    check_numbers,
    check_optional_ids,
    check_positive,
    check_query,
    check_str,
    check_texts,
)

__all__ = ["ReflectiveMemory"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _has_derived_files(directory: Path) -> bool:
    """Whether index or reranker files exist, i.e. a database was stored here before."""
    return any(
        any((directory / d).iterdir()) for d in ("index", "rerankers") if (directory / d).is_dir()
    )


def _count_words(text: str) -> int:
    return len(text.split())


class ReflectiveMemory:
    """Long-term memory for many users, in one durable store: a façade over its collaborators.

    Writes go to a `SessionWriter` (turns in, sessions out as memories), reads to a
    `Retriever` (the retrieval pipeline), record edits to `Records`, learning to RMM's
    `RerankStage`; this class wires them to one store and one set of settings.

    Every method checks its arguments (`reflective_memory.validation`) before any store call
    and fails with a `ReflectiveMemoryError`; a driver or decoding error from either backend
    is raised as one too, the driver's error chained as its cause
    (`reflective_memory.storage.driver_errors`).

    Args:
        path: `None` keeps everything in memory; a directory holds the SQLite database
            (`memory.sqlite3`) and the index cache files (`index/`). Reopening the directory
            restores everything.
        embedder: Any `Embedder`; defaults to the bundled offline all-MiniLM-L6-v2.
        llm: Optional LLM (a callable `prompt -> str` or an object with `complete`). Every
            LLM-backed step falls back to its offline counterpart without it.
        config: Settings; see `MemoryConfig`.
        segmenter: Cuts sessions into segments for the `segment` granularity (default: chosen by
            `config.segment.kind`; `auto` is the LLM segmenter when `llm` is given, else the offline
            embedding segmenter).
        denoiser: Denoises memory keys before indexing (SeCom compression): `"none"`,
            `"offline"`, `"llmlingua"` or any object with `denoise(texts)` (see
            `reflective_memory.denoise.Denoiser`). `None` uses `config.denoise.kind`. Only keys
            are denoised; the LLM always gets the raw text. After changing it,
            `redenoise(user_id)` re-keys a user's existing memories.
        store: Keep everything in a database server instead of `path`: a
            `postgresql://...` URI (a `reflective_memory.storage.postgres.PostgresStore` with its
            own pool) or a store object (closed with this memory). Many processes may share one
            database; see the README's "Scaling out".
        read_dsn: With a `store` URI: the URI of a hot standby of that database, or a list of
            them. Reads go to a replica, writes to the primary, and a read sees every write
            this process made for its user (it waits up to `read_wait` for the replica, else
            reads from the primary); see docs/storage.md, "Read replicas".

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        ...     _ = mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        ...     _ = mem.end_session("ana", "s1")
        ...     mem.retrieve("ana", "What is my dog called?").hits[0].memory.turn_ids
        ('s1:0',)
    """

    @typed_errors
    def __init__(
        self,
        path: str | Path | None = None,
        *,
        embedder: Embedder | None = None,
        llm: Any | None = None,
        config: MemoryConfig | None = None,
        segmenter: Segmenter | None = None,
        denoiser: Denoiser | str | None = None,
        store: Any | None = None,
        read_dsn: str | Sequence[str] | None = None,
    ) -> None:
        cfg = self.config = config if config is not None else MemoryConfig()
        if not isinstance(cfg, MemoryConfig):
            raise ConfigError(f"config must be a MemoryConfig, got {type(cfg).__name__}")
        # the model files the settings name are read (and cached) before any file is made
        load_ranker(None if cfg.passages.ranker == "learned" else cfg.passages.ranker)
        load_starts(cfg.sessions.conversation_starts)
        self.path = self._directory(path, store)
        if read_dsn is not None and store is None:
            raise InvalidInputError(
                "read_dsn needs a PostgreSQL store: pass store='postgresql://...'"
            )
        self.store: MemoryStore = self._open_store(store, read_dsn)
        self.embedder: Embedder = embedder if embedder is not None else default_embedder()
        self.llm: LLMClient | None = as_llm(
            llm, timeout_s=cfg.llm.timeout_s, max_chars=cfg.llm.max_chars
        )
        if segmenter is None:
            segmenter = segmenter_from_config(cfg.segment, self.embedder, self.llm)
        made = make_denoiser(
            cfg.denoise.kind if denoiser is None else denoiser,
            rate=cfg.denoise.rate,
            model=cfg.denoise.model,
            device=cfg.denoise.device,
        )
        self.indexes = IndexCache(
            self.store,
            self.embedder,
            None if self.path is None else self.path / "index",
            batch_size=cfg.units.embed_batch_size,
            ann=cfg.index.ann(),
            max_bytes=cfg.index.cache_bytes,
            # bound late: the writer, made below, makes vectors as it writes them
            vectors=lambda user_id, ids, keys: self.sessions.stored_vectors(user_id, ids, keys),
        )
        reflector = None  # RMM prospective reflection needs an LLM and the option
        if self.llm is not None and cfg.topics.enabled:
            reflector = ProspectiveReflector(
                self.llm,
                merge_k=cfg.topics.merge_k,
                speakers=cfg.topics.speakers,
                date_prefix=cfg.units.date_prefix,
            )
        self.rerank_stage = self._rerankers()
        self.sessions = SessionWriter(
            cfg, self.store, self.indexes, self.embedder, self.llm, segmenter, made, reflector
        )
        self.records = Records(
            self.store, self.indexes, self.rerank_stage, self.embedder, self.sessions.embed_keys
        )
        count = count_tokens if cfg.passages.budget_unit == "tokens" else _count_words
        self.retriever = Retriever(
            cfg, self.store, self.indexes, self.embedder, self.rerank_stage, self.llm, count
        )
        self.sessions.end_stale_sessions()  # embedded and server stores alike
        self.sessions.lost_turns.at_open()  # turns a killed process stored but never indexed
        self._async_io = self.store.async_io() if isinstance(self.store, NativeAsync) else None

    @staticmethod
    def _directory(path: str | Path | None, store: Any | None) -> Path | None:
        """The embedded store's directory (created), checked before anything is opened."""
        if store is not None and path is not None:
            raise InvalidInputError("give either path (embedded store) or store, not both")
        if path is None:
            return None
        directory = Path(path)
        if directory.exists() and not directory.is_dir():
            raise InvalidInputError(f"path {str(directory)!r} exists and is not a directory")
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _open_store(self, store: Any | None, read_dsn: Any = None) -> MemoryStore:
        if store is not None:
            return open_store(store, read_dsn=read_dsn)
        return SQLiteStore(
            None if self.path is None else self.path / "memory.sqlite3",
            must_exist=self.path is not None and _has_derived_files(self.path),
        )

    def _rerankers(self) -> RerankStage:
        """RMM's rerankers, their learned state where the store keeps it (else in files)."""
        files = None if self.path is None else self.path / "rerankers"
        state = self.store.state if isinstance(self.store, StateHolder) else FileStateStore(files)
        ranker = self.config.passages.ranker
        prior = load_ranker(None if ranker == "learned" else ranker)
        learning = TurnLearning(self.config.rerank, prior, state)
        return RerankStage(self.config.rerank, self.embedder, state, learning=learning)

    @property
    def segmenter(self) -> Segmenter:
        """The segmenter that cuts finished sessions."""
        return self.sessions.segmenter

    @property
    def denoiser(self) -> Denoiser | None:
        """The key denoiser (`None`: raw keys); assign to change it, then `redenoise`."""
        return self.sessions.denoiser

    @denoiser.setter
    def denoiser(self, value: Denoiser | None) -> None:
        self.sessions.denoiser = value

    @property
    def reflector(self) -> ProspectiveReflector | None:
        """RMM prospective reflection, when on."""
        return self.sessions.reflector

    # -- lifecycle ------------------------------------------------------------------------
    @typed_errors
    def close(self) -> None:
        """Close the store; later calls raise `StoreClosedError`. Idempotent.

        What feedback taught the turn ranker and is not yet stored (`rerank.save_every`,
        `rerank.save_seconds`) is stored first.
        """
        if not self.store.closed:
            self.rerank_stage.learning.flush()
        self.store.close()

    def __enter__(self) -> ReflectiveMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        require_open(self.store)

    # -- write path -----------------------------------------------------------------------
    @typed_errors
    def add_turn(
        self,
        user_id: str,
        session_id: str,
        role: str,
        text: str,
        *,
        timestamp: datetime | str | float | None = None,
        turn_id: str | None = None,
    ) -> Turn:
        """Store one utterance durably (committed before this returns).

        Args:
            user_id: Owner of the conversation.
            session_id: The session; a new id opens a new session.
            role: `user`, `assistant`, `system` or any speaker label; `user`, `assistant` and
                their aliases in any case (`Human`, `AI`, `bot`, `model`, ...:
                `validation.ROLE_ALIASES`) are stored as `user` / `assistant`.
            text: The utterance (stored whole, however long).
            timestamp: When it was said (datetime, Unix seconds, or a date string; without a
                time zone it is UTC). Without one, the turn takes its conversation's time
                (`turn_time`): the previous turn's in a replayed log, the wall clock in a live
                chat.
            turn_id: Your own id for the turn, kept in every memory's provenance. Sending a
                stored turn again (same ids, role and text; e.g. a retry after a crash or a
                timeout) stores nothing and returns the stored turn, indexing it if it was not.

        Returns:
            The stored `Turn`.

        Raises:
            InvalidInputError: An argument is empty, of the wrong type, or a turn id already
                used for another role or text.
        """
        return self.add_turns(
            [
                {
                    "user_id": user_id,
                    "session_id": session_id,
                    "role": role,
                    "text": text,
                    "timestamp": timestamp,
                    "turn_id": turn_id,
                }
            ]
        )[0]

    @typed_errors
    def add_turns(self, turns: Iterable[dict[str, Any]]) -> list[Turn]:
        """Store many turns in one transaction (all or none).

        Args:
            turns: Dicts with the keyword arguments of `add_turn` (`user_id`, `session_id`,
                `role`, `text`, optional `timestamp`, `turn_id`).

        Returns:
            The stored turns, in order.
        """
        return self.sessions.add_turns(turns)

    @typed_errors
    def turn_time(
        self,
        user_id: str,
        session_id: str,
        timestamp: datetime | str | float | None = None,
    ) -> datetime:
        """The time a turn of this session added now is stored at (timezone-aware).

        Its own `timestamp` when given (a naive time is read as UTC); without one, its
        conversation's time: the previous turn's when the session is a replayed log, the
        user's newest turn's for a session that begins while a replay is going on (its
        newest session replayed, open and begun within `sessions.idle_seconds`), else the
        wall clock (a live chat; `reflective_memory.sessions.clock`). Adapters compare it with
        the session's last turn to end an idle session.

        Raises:
            InvalidInputError: A bad id, or a timestamp in no known format.
        """
        return self.sessions.turn_time(user_id, session_id, timestamp)

    @typed_errors
    def end_session(self, user_id: str, session_id: str) -> list[Memory]:
        """Turn a session's turns into memories and index them (see `SessionWriter`).

        Ending a session again (for instance after more turns arrived) rebuilds its units.

        Raises:
            UnknownSessionError: The user has no such session.
        """
        return self.sessions.end_session(user_id, session_id)

    @typed_errors
    def redenoise(self, user_id: str, *, only_stale: bool = False) -> int:
        """Re-key a user's turn, session and segment units with the current denoiser."""
        return self.sessions.redenoise(user_id, only_stale=only_stale)

    @typed_errors
    def reflection_report(self, user_id: str, session_id: str) -> dict[str, Any] | None:
        """The last prospective-reflection report of a session (counts and LLM usage)."""
        return self.sessions.reflection_report(user_id, session_id)

    # -- read path ------------------------------------------------------------------------
    @typed_errors
    def retrieve(
        self,
        user_id: str,
        query: str,
        *,
        k: int | None = None,
        budget_tokens: int | None = None,
        mode: str | None = None,
        recall: RecallConfig | dict[str, Any] | None = None,
        views: Sequence[str] | None = None,
        reflect: bool | None = None,
        explore: bool | None = None,
        exclude_turns: Collection[str] | None = None,
        now: datetime | str | None = None,
    ) -> Retrieval:
        """Rank a user's memories for a query and return what the reader should see.

        Small-to-big by default: every indexed key (turns, segments, topics, notes) is ranked
        and the ranking resolved to turns. With `budget_tokens` the best turns are packed into
        `passage` memories, one per session (date header once, `…` between runs, headers and
        role labels counted, no turn twice); with only `k` the hits are the top `k` turns.
        With `config.passages.enabled=False` or `views`, the ranked units are returned.

        Args:
            user_id: Whose memories to search (an unknown user gets an empty result).
            query: The query text.
            k: Number of hits. Without `k` and `budget_tokens`, the passages fill
                `config.search.default_budget_tokens` (or `config.search.default_k` turns, when
                set).
            budget_tokens: Fill this many tokens (`reflective_memory.llm.count_tokens`); a hit
                that does not fit is skipped and smaller later ones may still fit.
            mode: Override `config.search.mode` (`hybrid`, `dense` or `lexical`).
            recall: RF-Mem settings for this call: a `RecallConfig` or a dict of fields that
                override `config.recall`.
            views: Memory kinds to rank as units (override `config.search.views`).
            reflect: Override `config.conditional.self_reflection`.
            explore: Retrieve for learning (`config.rerank.explore`): once citations taught
                the user's turn ranker something, show the interleaving of the learned and the
                served ranking, whose citations judge it (`rmm.turn_learning`); before, sample
                what is shown with Gumbel noise.
            exclude_turns: Ids of turns never returned, e.g. the current exchange the reader
                sees anyway (the adapters pass it); other turns take their place.
            now: When the question is asked (a datetime or any timestamp `add_turn` takes;
                naive = UTC): "two weeks ago" or "last summer" resolve against it. Default:
                the time of the user's newest turn.

        Returns:
            The ranked `Retrieval`; its diagnostics hold the path taken, candidate counts, the
            reranker's record and the time of every pipeline stage in ms (and `reads`, the
            servers that answered, on PostgreSQL with read replicas).
        """
        self._open()
        name, attrs = tracing.RETRIEVAL_SPAN, tracing.RETRIEVAL_ATTRIBUTES
        with tracing.span(name, attrs, user_id=user_id) as span:
            out = self.retriever.retrieve(
                user_id,
                query,
                k=k,
                budget_tokens=budget_tokens,
                mode=mode,
                recall=recall,
                views=views,
                reflect=reflect,
                explore=explore,
                exclude_turns=exclude_turns,
                now=now,
            )
            tracing.describe(span, tracing.retrieval_attributes, out)
        return out

    # -- feedback (RMM) --------------------------------------------------------------------
    # Forwarding façade of `self.rerank_stage` (`reflective_memory.rmm.feedback.RerankStage`).
    @typed_errors
    def ranker_weights(self, user_id: str | None = None) -> dict[str, Any]:
        """The turn ranker's weights next to the prior's: what citations taught so far.

        Returns:
            `TurnLearning.inspect`: by feature name the fitted `prior`, the memory's `shared`
            offsets (learned from every user's feedback), with `user_id` that user's own
            offsets (`user`), and the `weights` that rank (the user's, when given); the
            episodes each learned from, and each gate (`shared_gate`, `user_gate`: episodes
            judged, mean gain, `t` the mean gain in standard errors, whether it ranks).
        """
        self._open()
        if user_id is not None:
            check_id("user_id", user_id)
        return self.rerank_stage.learning.inspect(user_id)

    @typed_errors
    def rerank_texts(
        self,
        user_id: str,
        query: str,
        texts: Sequence[str],
        *,
        ids: Sequence[str | None] | None = None,
        top_n: int | None = None,
        explore: bool = False,
        keep_order: bool = False,
        reranker: CallerReranker | None = None,
        times: Sequence[datetime | str | float | None] | None = None,
        now: datetime | str | float | None = None,
    ) -> RankedTexts:
        """Rank texts from any retriever with the user's citation-taught turn ranker.

        The weights that rank the user's turns in `retrieve` order the texts (over the
        features a text has: its place in the order given, query cosine, BM25); give the
        result to `feedback` with the answer that cited them (`[i]` names
        `result.order[i]`) and the same weights learn. With `times` (when each text was
        said), a query naming a period ("two weeks ago", resolved against `now`) puts the
        texts said in it first. See `RerankStage.rerank_texts` for the arguments.

        Example:
            >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
            >>> mem = ReflectiveMemory(embedder=HashingEmbedder())
            >>> ranked = mem.rerank_texts("ana", "why do dogs bark", ["cats purr", "dogs bark"])
            >>> ranked.order
            (1, 0)
            >>> mem.feedback(ranked, "Dogs bark to warn. [0]").rewards
            {'1': 1.0, '0': -1.0}
        """
        self._open()
        check_id("user_id", user_id)
        check_query(query, self.config.search.max_query_chars)
        check_texts("texts", texts)
        if ids is not None:
            check_optional_ids("ids", ids)
        check_positive("top_n", top_n)
        check_flag("explore", explore)
        check_flag("keep_order", keep_order)
        return self.rerank_stage.rerank_texts(
            user_id,
            query,
            texts,
            ids=ids,
            top_n=top_n,
            explore=explore,
            keep_order=keep_order,
            reranker=reranker,
            times=times,
            now=now,
        )

    @typed_errors
    def feedback(
        self,
        shown: Retrieval | RankedTexts | RerankRecord,
        answer: str | None = None,
        *,
        cited: Sequence[int] | None = None,
        numbering: Mapping[int, int | None] | None = None,
    ) -> FeedbackResult:
        """Learn from which shown memories (or texts) an answer used.

        Citations (`[0]`, `[0, 2]`, `[NO_CITE]`, ...) refer to positions in `retrieval.hits`, as
        numbered by `reflective_memory.rmm.citations.build_answer_prompt(query, retrieval.hits)`,
        or to the texts `rerank_texts` showed, best first. Each shown passage (or text) cited
        gets reward +1, each other shown one -1; the episode teaches the turn ranker's weights
        (the memory's shared offsets and the user's own, `config.rerank.turn_*`), stored
        every `config.rerank.save_every` episodes or `save_seconds` (and at `close`).

        Args:
            shown: The `Retrieval` the answer was generated from, or the `RankedTexts` (or its
                `RerankRecord`) of `rerank_texts`.
            answer: The LLM's answer text; if it has no citation marker and
                `config.rerank.attribution_fallback` is on, used items are inferred by
                embedding similarity (`config.rerank.attribution_threshold`) and the result is
                marked `inferred`.
            cited: The cited positions, given directly instead of an answer.
            numbering: What each citation number names, when the answer numbered something
                else than the shown list: number -> shown position (None: not shown). E.g.
                sources numbered from 1, several of them pieces of one shown text.

        Returns:
            A `FeedbackResult` saying what was learned, or why nothing was (`reason`: e.g.
            learning is off, the answer cites nothing readable, all or none cited). Only
            the answer is read: an answer that echoes the prompt's instructions or its memory
            blocks back (`reflective_memory.rmm.citations.echoes_instructions`) teaches
            nothing.

        Raises:
            InvalidInputError: Neither `answer` nor `cited` given, a cited position names
                nothing, or `shown` is none of the types above.
            UnknownMemoryError: The `Retrieval` shows turns (or memories) erased since it was
                made, by this process or another on the store (`delete_user`,
                `delete_session`, ...: `kept_retrievals.erased` reads the store); nothing is
                learned from what was erased.
        """
        self._open()
        if answer is not None:
            check_str("answer", answer)
        if cited is not None:
            check_numbers("cited", cited)
        check_numbering("numbering", numbering)
        if isinstance(shown, Retrieval) and (gone := erased(self.store, shown)):
            more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
            raise UnknownMemoryError(
                f"retrieval {shown.retrieval_id!r} shows what was erased since it was made "
                f"({gone[0]!r}{more}): no feedback is taken on it, nothing was learned"
            )
        with tracing.span("feedback") as span:
            out = self.rerank_stage.feedback(shown, answer, cited, numbering=numbering)
            tracing.describe(span, tracing.feedback_attributes, out)
        return out

    # -- records ------------------------------------------------------------------------
    @typed_errors
    def turns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Stored turns of a user, or of one session, in order (unknown ids give `[]`)."""
        return self.records.turns(user_id, session_id)

    @typed_errors
    def memories(self, user_id: str, ids: Sequence[str] | None = None) -> list[Memory]:
        """A user's memories (all of them, or the given ids in that order)."""
        return self.records.memories(user_id, ids)

    @typed_errors
    def open_sessions(self, user_id: str) -> list[str]:
        """Ids of the user's sessions that have turns not yet turned into memories."""
        return self.records.open_sessions(user_id)

    @typed_errors
    def put_memory(self, user_id: str, text: str, **kw: Any) -> Memory:
        """Store (or replace, by id) one memory written directly (see `Records.put_memory`)."""
        return self.records.put_memory(user_id, text, **kw)

    @typed_errors
    def get_memory(self, user_id: str, memory_id: str) -> Memory:
        """One memory of a user by id (`UnknownMemoryError` when it has none)."""
        return self.records.get_memory(user_id, memory_id)

    @typed_errors
    def delete_memory(self, user_id: str, memory_id: str) -> bool:
        """Delete one memory of a user; return whether it existed."""
        return self.records.delete_memory(user_id, memory_id)

    @typed_errors
    def delete_memories(self, user_id: str, memory_ids: Sequence[str]) -> int:
        """Delete memories of a user by id, from every file; return how many existed."""
        return self.records.delete_memories(user_id, memory_ids)

    @typed_errors
    def delete_expired(self, user_id: str, now: float) -> int:
        """Delete a user's memories whose metadata `expires_at` is at or before `now`."""
        return self.records.delete_expired(user_id, now)

    @typed_errors
    def update_memory_metadata(self, user_id: str, updates: Mapping[str, Mapping[str, Any]]) -> int:
        """Merge fields into memories' metadata without re-embedding; return how many."""
        return self.records.update_memory_metadata(user_id, updates)

    @typed_errors
    def delete_turns(
        self, user_id: str, session_id: str, turn_ids: Sequence[str] | None = None
    ) -> list[Turn]:
        """Delete some turns of a session (all when None) and what was built from them.

        Returns:
            The deleted turns, in order.
        """
        return self.records.delete_turns(user_id, session_id, turn_ids)

    @typed_errors
    def delete_session(self, user_id: str, session_id: str) -> int:
        """Erase a session's turns and every memory derived from it; return the turns deleted."""
        return self.records.delete_session(user_id, session_id)

    @typed_errors
    def delete_user(self, user_id: str) -> int:
        """Erase a user: turns, memories, caches, reranker data and the id itself."""
        return self.records.delete_user(user_id)

    @typed_errors
    def users(self) -> list[str]:
        """Every user with stored turns or memories."""
        return self.records.users()

    @typed_errors
    def stats(self, user_id: str) -> dict[str, Any]:
        """Counts of a user's turns, sessions (open ones too) and memories by granularity."""
        return self.records.stats(user_id)

    # -- async twins ------------------------------------------------------------------------
    # On PostgreSQL (a `NativeAsync` store) the queries are awaited on the running loop through
    # psycopg's async pool, with no thread; the embedding model runs in the model thread
    # (`embed.in_model_thread`; concurrent queries batched by `embed.QueryBatcher`) and the
    # rest of the pipeline on the loop between them.
    # Elsewhere (SQLite) each twin runs its sync method in a worker thread.
    async def arun(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run synchronous code that calls this memory (e.g. an adapter's method) as a coroutine.

        Natively async on a store with async I/O (`NativeAsync`, PostgreSQL given a URI), in a
        worker thread otherwise (SQLite).
        """
        if self._async_io is None:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await self._async_io.run(fn, *args, **kwargs)

    def _awrite(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        """`arun` for a write, started at the call: it runs to its end, whatever the caller does.

        Called on a running event loop, the write is scheduled at once, so a caller cancelled
        even before its first step still has its write done (as long as the loop runs); a
        caller cancelled while it waits gets `CancelledError` after the write has finished.
        So a cancelled `aadd_turn` is always stored, never sometimes: a retry with the same
        `turn_id` stores nothing twice. Called outside a loop (`asyncio.run(mem.aadd_turn(...))`)
        it starts when awaited.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._write_to_end(None, functools.partial(fn, *args, **kwargs))
        write = loop.create_task(self.arun(fn, *args, **kwargs))
        return self._write_to_end(write, None)

    async def _write_to_end(self, write: asyncio.Task[T] | None, call: Callable[[], T] | None) -> T:
        """Await `write` (or start `call`), shielded: a cancel is raised once it has finished."""
        if write is None:
            assert call is not None
            write = asyncio.ensure_future(self.arun(call))
        cancelled = False
        while True:
            try:
                result = await asyncio.shield(write)
            except asyncio.CancelledError:
                if write.done():  # the write itself was cancelled (the loop is closing)
                    raise
                cancelled = True  # wait for the write, then tell the caller
                continue
            if cancelled:
                raise asyncio.CancelledError
            return result

    def aadd_turn(
        self, user_id: str, session_id: str, role: str, text: str, **kw: Any
    ) -> Awaitable[Turn]:
        """Async twin of `add_turn` (see `arun`); a cancelled call still stores the turn."""
        return self._awrite(self.add_turn, user_id, session_id, role, text, **kw)

    def aadd_turns(self, turns: Iterable[dict[str, Any]]) -> Awaitable[list[Turn]]:
        """Async twin of `add_turns` (see `arun`); a cancelled call still stores the turns."""
        return self._awrite(self.add_turns, turns)

    def aend_session(self, user_id: str, session_id: str) -> Awaitable[list[Memory]]:
        """Async twin of `end_session` (see `arun`); a cancelled call still ends the session."""
        return self._awrite(self.end_session, user_id, session_id)

    async def aretrieve(self, user_id: str, query: str, **kw: Any) -> Retrieval:
        """Async twin of `retrieve` (see `arun`)."""
        return await self.arun(self.retrieve, user_id, query, **kw)

    async def aturns(self, user_id: str, session_id: str | None = None) -> list[Turn]:
        """Async twin of `turns` (see `arun`)."""
        return await self.arun(self.turns, user_id, session_id)

    async def afeedback(
        self, shown: Retrieval | RankedTexts | RerankRecord, answer: str | None = None, **kw: Any
    ) -> FeedbackResult:
        """Async twin of `feedback` (see `arun`)."""
        return await self.arun(self.feedback, shown, answer, **kw)

    async def aclose(self) -> None:
        """Finish the running loop's query embeddings, close its async pool, then the store."""
        await self.retriever.aclose()
        if self._async_io is not None:
            await self._async_io.aclose()
        self.close()

    async def __aenter__(self) -> ReflectiveMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
