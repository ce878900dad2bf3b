from __future__ import annotations

import random

from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

WORDS = (
    "garden piano violin marathon lisbon berlin tokyo allergy peanut dog cat parrot nurse "
    "teacher engineer wedding sister brother coffee tea cycling sailing chess novel poetry "
    "python cooking baking pasta sushi"
).split()


def test_users_never_receive_each_others_memories() -> None:
    rng = random.Random(1234)
    cfg = MemoryConfig(units={"granularities": ("turn",)})
    with ReflectiveMemory(embedder=HashingEmbedder(64), config=cfg) as mem:
        owner: dict[str, str] = {}
        users = [f"user-{i}" for i in range(6)]
        for n in range(120):
            user = rng.choice(users)
            session = f"s{rng.randint(0, 3)}"
            text = " ".join(rng.choices(WORDS, k=6)) + f" marker{n}"
            t = mem.add_turn(user, session, "user", text)
            owner[f"{user}/{t.session_id}/{t.turn_id}"] = user
        for user in users:
            for session in mem.open_sessions(user):
                mem.end_session(user, session)
        for _ in range(60):
            user = rng.choice(users)
            query = " ".join(rng.choices(WORDS, k=3))
            for mode in ("dense", "lexical", "hybrid"):
                r = mem.retrieve(user, query, k=50, mode=mode)
                assert all(h.memory.user_id == user for h in r)
                for h in r:
                    for tid in h.memory.turn_ids:
                        assert owner[f"{user}/{h.memory.session_id}/{tid}"] == user
        # a marker said by one user only is never found for another one
        r = mem.retrieve("user-0", "marker7", k=200, mode="lexical")
        assert all(h.memory.user_id == "user-0" for h in r)


def test_same_session_id_under_two_users_stays_apart(mem) -> None:
    mem.add_turn("alice", "s1", "user", "My password hint is the blue heron.")
    mem.add_turn("bob", "s1", "user", "I like green tea.")
    mem.end_session("alice", "s1")
    mem.end_session("bob", "s1")
    assert mem.retrieve("bob", "blue heron password", k=5).memories[0].user_id == "bob"
    mem.delete_session("bob", "s1")
    assert len(mem.retrieve("alice", "heron", k=5)) == 1
