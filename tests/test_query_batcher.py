"""`embed.QueryBatcher`: concurrent async queries embedded together in the model thread (issue 41).

The PostgreSQL side (the batcher under `aretrieve`) is tested in tests/test_postgres_async.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
from typing import Any

import numpy as np
import pytest
from reflective_memory import HashingEmbedder
from reflective_memory.embed import QueryBatcher, encode_query
from reflective_memory.errors import ConfigError

TEXTS = [f"query number {i} about topic {i % 5}" for i in range(20)]


class Gated(HashingEmbedder):
    """Query embeddings that wait for `gate` on the first call, so later queries queue up.

    Records the texts of each `encode_query` call; a text containing "boom" raises `Boom`.
    """

    def __init__(self) -> None:
        super().__init__(32)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[list[str]] = []

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        items = [texts] if isinstance(texts, str) else list(texts)
        self.calls.append(items)
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        if any("boom" in t for t in items):
            raise Boom(f"cannot embed {items}")
        return self.encode(texts)


class Boom(RuntimeError):
    """The error `Gated` raises for a "boom" query."""


async def _queued(batcher: QueryBatcher, texts: list[str]) -> list[asyncio.Task[np.ndarray]]:
    """Start an `encode` for the first text and, once it holds the model thread, the others."""
    emb = batcher.embedder
    assert isinstance(emb, Gated)
    tasks = [asyncio.create_task(batcher.encode(texts[0]))]
    while not emb.entered.is_set():
        await asyncio.sleep(0.001)
    tasks += [asyncio.create_task(batcher.encode(t)) for t in texts[1:]]
    await asyncio.sleep(0.01)  # let them queue behind the first call
    return tasks


def test_concurrent_queries_share_model_calls_and_each_gets_its_own_row() -> None:
    emb = Gated()
    batcher = QueryBatcher(emb)

    async def main() -> list[np.ndarray]:
        tasks = await _queued(batcher, TEXTS)
        emb.gate.set()
        return await asyncio.gather(*tasks)

    got = asyncio.run(main())
    for text, vec in zip(TEXTS, got, strict=True):
        assert vec.shape == (32,)
        np.testing.assert_allclose(vec, encode_query(HashingEmbedder(32), text), rtol=1e-6)
    assert [len(c) for c in emb.calls] == [1, 8, 8, 3]  # the first alone; then FIFO batches
    assert [t for c in emb.calls for t in c] == TEXTS
    assert batcher.counts == {"calls": 4, "queries": 20}


def test_batches_are_cut_by_max_batch_and_calls_by_call_size() -> None:
    emb = Gated()
    batcher = QueryBatcher(emb, max_batch=5, call_size=2)

    async def main() -> list[np.ndarray]:
        tasks = await _queued(batcher, TEXTS[:14])
        emb.gate.set()
        return await asyncio.gather(*tasks)

    got = asyncio.run(main())
    assert [len(c) for c in emb.calls] == [1, 2, 2, 1, 2, 2, 1, 2, 1]
    assert [t for c in emb.calls for t in c] == TEXTS[:14]
    for text, vec in zip(TEXTS[:14], got, strict=True):
        np.testing.assert_allclose(vec, HashingEmbedder(32).encode(text), rtol=1e-6)


def test_an_error_reaches_only_the_caller_whose_query_failed() -> None:
    emb = Gated()
    texts = [*TEXTS[:5], "boom here", *TEXTS[5:9]]

    async def main() -> list[Any]:
        tasks = await _queued(QueryBatcher(emb), texts)
        emb.gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    got = asyncio.run(main())
    assert isinstance(got[5], Boom) and "boom here" in str(got[5])
    for text, vec in zip(texts, got, strict=True):
        if text != "boom here":
            np.testing.assert_allclose(vec, HashingEmbedder(32).encode(text), rtol=1e-6)
    # texts[1:9] failed as a batch, then each was embedded alone; the last came next, alone
    assert emb.calls == [texts[:1], texts[1:9], *([t] for t in texts[1:9]), texts[9:]]


class WrongShape(HashingEmbedder):
    """Returns one row for a whole list (a broken embedder); single queries are right."""

    def encode_query(self, texts: str | list[str]) -> np.ndarray:
        return self.encode(texts if isinstance(texts, str) else texts[0])


def test_a_batch_of_the_wrong_shape_is_embedded_query_by_query(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emb = WrongShape(16)
    batcher = QueryBatcher(emb)

    async def main() -> list[np.ndarray]:
        return await asyncio.gather(*(batcher.encode(t) for t in TEXTS[:4]))

    with caplog.at_level(logging.WARNING, logger="reflective_memory.embed"):
        got = asyncio.run(main())
    for text, vec in zip(TEXTS[:4], got, strict=True):
        np.testing.assert_allclose(vec, emb.encode(text), rtol=1e-6)
    assert "one by one" in caplog.text


def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    emb = Gated()
    batcher = QueryBatcher(emb, max_batch=4)

    async def main() -> list[Any]:
        tasks = await _queued(batcher, TEXTS[:10])
        tasks[0].cancel()  # in the model call now
        tasks[3].cancel()  # waiting in the queue
        await asyncio.sleep(0)
        emb.gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    got = asyncio.run(main())
    assert isinstance(got[0], asyncio.CancelledError)
    assert isinstance(got[3], asyncio.CancelledError)
    for i, (text, vec) in enumerate(zip(TEXTS[:10], got, strict=True)):
        if i not in (0, 3):
            np.testing.assert_allclose(vec, HashingEmbedder(32).encode(text), rtol=1e-6)
    assert TEXTS[3] not in [t for c in emb.calls for t in c]  # dropped before its batch
    assert [len(c) for c in emb.calls] == [1, 4, 4]


def test_aclose_lets_queued_queries_finish_and_forgets_the_loop() -> None:
    emb = Gated()
    batcher = QueryBatcher(emb)

    async def main() -> list[np.ndarray]:
        tasks = await _queued(batcher, TEXTS[:6])
        threading.Timer(0.05, emb.gate.set).start()
        await batcher.aclose()
        assert all(t.done() for t in tasks)  # aclose returned after the last batch
        assert not batcher._lanes
        return [t.result() for t in tasks]

    assert len(asyncio.run(main())) == 6
    assert batcher.counts == {"calls": 2, "queries": 6}


def test_a_loop_ending_mid_batch_cancels_its_callers_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emb = Gated()
    batcher = QueryBatcher(emb)
    seen: list[Any] = []

    async def main() -> None:
        tasks = await _queued(batcher, TEXTS[:5])
        for t in tasks:
            t.add_done_callback(lambda t: seen.append(t.cancelled()))
        threading.Timer(0.05, emb.gate.set).start()  # the model call ends after the loop

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())  # returns with the five callers and the batch still pending
    assert seen == [True] * 5
    assert not caplog.records  # no "Task was destroyed" / "exception never retrieved"


def test_several_loops_and_batchers_use_one_model_thread_and_leave_no_loop_behind() -> None:
    def model_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("reflective-model")]

    batchers = [QueryBatcher(HashingEmbedder(16)) for _ in range(3)]

    async def main() -> None:
        for b in batchers:
            await asyncio.gather(*(b.encode(t) for t in TEXTS))

    for _ in range(4):
        asyncio.run(main())
    assert len(model_threads()) == 1
    before = threading.active_count()
    for _ in range(4):
        asyncio.run(main())
        assert threading.active_count() == before
    gc.collect()
    assert all(not b._lanes for b in batchers)  # each loop's queue went with its loop


class RemoteQueries(HashingEmbedder):
    """An embedder with its own async query method (such as a remote model)."""

    def __init__(self) -> None:
        super().__init__(16)
        self.awaited: list[str | list[str]] = []

    async def aencode_query(self, texts: str | list[str]) -> np.ndarray:
        self.awaited.append(texts)
        await asyncio.sleep(0)
        return self.encode(texts)


def test_an_embedder_with_its_own_async_method_is_awaited_directly() -> None:
    emb = RemoteQueries()
    batcher = QueryBatcher(emb)

    async def main() -> list[np.ndarray]:
        return await asyncio.gather(*(batcher.encode(t) for t in TEXTS[:3]))

    got = asyncio.run(main())
    assert emb.awaited == TEXTS[:3] and batcher.counts == {"calls": 0, "queries": 0}
    np.testing.assert_allclose(got[2], emb.encode(TEXTS[2]), rtol=1e-6)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
@pytest.mark.parametrize("name", ["max_batch", "call_size"])
def test_batch_sizes_must_be_positive_ints(name: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        QueryBatcher(HashingEmbedder(16), **{name: bad})


def test_docstring_examples_run() -> None:
    import doctest

    import reflective_memory.embed

    assert doctest.testmod(reflective_memory.embed).failed == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_model_thread_yields_the_cores_to_the_event_loop() -> None:
    from reflective_memory.embed import MODEL_THREAD_NICE, in_model_thread

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    mine = nice()
    assert asyncio.run(in_model_thread(nice)) == min(19, mine + MODEL_THREAD_NICE)
    assert nice() == mine  # the loop's thread (and the process) keep their priority
