"""Vectors made again are the vectors writing makes.

An index build embeds the memories it finds without a vector of the current embedder (one
failed when the turn was added, or the embedder changed), and `redenoise` embeds the keys it
rebuilds. Either way a turn's vector is made from what was said (a chat-role turn's `Name: `
label goes to the keyword key only) and a raw segment key's from the mean of its turns, as on
the write path: a store reopened with another embedder ranks as a fresh one would.
"""

from __future__ import annotations

import numpy as np
from pg_cluster import pg_schema
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

CHAT = [
    ("s1", "user", "Mia: I adopted a beagle called Pixel last week."),
    ("s1", "assistant", "Pixel is a lovely name for a beagle."),
    ("s1", "user", "Mia: He already chewed my red sneakers."),
    ("s1", "assistant", "Beagles chew when they are bored; try a puzzle toy."),
    ("s2", "user", "Mia: My sister Lea moved to Porto in May."),
    ("s2", "assistant", "Porto is beautiful in spring."),
]


class Renamed(HashingEmbedder):
    """The same vectors under another model name: every stored vector is another model's."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim)
        self.name = f"renamed:{dim}"


def _cfg() -> MemoryConfig:
    return MemoryConfig(sessions={"idle_seconds": None, "max_turns": None})


def _fill(mem: ReflectiveMemory) -> None:
    for i, (sid, role, text) in enumerate(CHAT):
        mem.add_turn("mia", sid, role, text, timestamp=f"2026-03-0{1 + i // 4}T10:0{i}:00")
    mem.end_session("mia", "s1")  # s2 stays open


def _vectors(mem: ReflectiveMemory) -> dict[str, np.ndarray]:
    ids, _, blobs, models = mem.store.embeddings("mia")
    assert len(set(models)) == 1
    return {i: np.frombuffer(b, dtype=np.float32) for i, b in zip(ids, blobs, strict=True)}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b) and len(a) >= len(CHAT) + 1  # turns and a segment at least
    for mid, vec in a.items():
        assert np.allclose(vec, b[mid], atol=1e-6), mid


def test_another_embedder_makes_the_vectors_writing_makes(tmp_path) -> None:
    with ReflectiveMemory(tmp_path, embedder=HashingEmbedder(64), config=_cfg()) as mem:
        _fill(mem)
        written = _vectors(mem)
    with ReflectiveMemory(tmp_path, embedder=Renamed(64), config=_cfg()) as mem:
        hits = mem.retrieve("mia", "what did the dog chew", k=2).hits
        assert any("sneakers" in h.memory.text for h in hits)
        _same(_vectors(mem), written)
        assert set(mem.store.embeddings("mia")[3]) == {"renamed:64"}


_SAID = "Mia: Pixel chewed my red sneakers."


def test_a_turn_embedded_late_gets_the_vector_of_what_was_said() -> None:
    """A turn a stopped process left unindexed, indexed while the embedder was down (a
    `pending` unit), gets the vector of what was said when the index build embeds it.

    (`add_turn` itself embeds before it commits: with the embedder down it stores nothing.)
    """
    emb = HashingEmbedder(64)
    with ReflectiveMemory(embedder=emb, config=_cfg()) as mem:
        broken = mem.embedder.encode
        mem.store.add_turns(
            [{"user_id": "mia", "session_id": "s", "role": "user", "text": _SAID, "turn_id": "t"}]
        )
        mem.embedder.encode = lambda texts: (_ for _ in ()).throw(RuntimeError("down"))
        assert mem.sessions.lost_turns.run("mia") == 1
        mem.embedder.encode = broken
        assert mem.retrieve("mia", "what did Pixel chew", k=1, mode="dense").hits
        got = _vectors(mem)
        (vec,) = got.values()
        assert np.allclose(vec, emb.encode("Pixel chewed my red sneakers."), atol=1e-6)
        assert not np.allclose(vec, emb.encode("user: Mia: Pixel chewed my red sneakers."))


def test_redenoise_to_raw_keys_makes_the_vectors_writing_makes() -> None:
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=_cfg()) as mem:
        _fill(mem)
        written = _vectors(mem)
        assert mem.redenoise("mia") == len(written)
        _same(_vectors(mem), written)


def test_another_embedder_on_postgres_makes_the_vectors_writing_makes(pg_dsn) -> None:
    from reflective_memory.storage.postgres import PostgresStore

    schema = pg_schema()
    with ReflectiveMemory(
        store=PostgresStore(pg_dsn, schema=schema), embedder=HashingEmbedder(64), config=_cfg()
    ) as mem:
        _fill(mem)
        written = _vectors(mem)
    with ReflectiveMemory(
        store=PostgresStore(pg_dsn, schema=schema), embedder=Renamed(64), config=_cfg()
    ) as mem:
        assert mem.retrieve("mia", "what did the dog chew", k=2).hits
        _same(_vectors(mem), written)
