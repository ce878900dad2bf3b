"""Random sequences of add / end / retrieve / delete keep the store consistent with a model."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory
from reflective_memory.retrieval.redundancy import Distinct, is_short
from reflective_memory.types import Turn

USERS = st.sampled_from(["ann", "bo", "cy"])
SESSIONS = st.sampled_from(["s1", "s2", "s3"])
TEXTS = st.text(
    alphabet=st.characters(categories=("L", "N", "Zs", "P")), min_size=1, max_size=60
).filter(lambda t: t.strip())


class MemoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mem = ReflectiveMemory(
            embedder=HashingEmbedder(32), config=MemoryConfig(units={"granularities": ("turn",)})
        )
        self.turns: dict[tuple[str, str], list[str]] = {}
        self.ended: dict[tuple[str, str], int] = {}

    @rule(user=USERS, session=SESSIONS, text=TEXTS)
    def add(self, user: str, session: str, text: str) -> None:
        t = self.mem.add_turn(user, session, "user", text)
        self.turns.setdefault((user, session), []).append(t.text)
        assert t.text == text

    @rule(user=USERS, session=SESSIONS)
    def end(self, user: str, session: str) -> None:
        if (user, session) not in self.turns:
            return
        built = self.mem.end_session(user, session)
        assert len(built) == len(self.turns[(user, session)])
        self.ended[(user, session)] = len(built)

    @rule(user=USERS, query=TEXTS, k=st.integers(1, 20))
    def retrieve(self, user: str, query: str, k: int) -> None:
        r = self.mem.retrieve(user, query, k=k)
        # every acknowledged turn is searchable at once, ended or not; a turn of a few words
        # is never one of k bare turns, and near-duplicates count once (retrieval.redundancy)
        said = {sid: ts for (u, sid), ts in self.turns.items() if u == user}

        def turns(sid: str) -> list[Turn]:
            return [Turn(user, sid, "user", t, f"{sid}:{i}", i) for i, t in enumerate(said[sid])]

        seen = Distinct({}, turns)
        keys = [(sid, i) for sid, ts in said.items() for i in range(len(ts))]
        short = {key for key in keys if is_short({}, turns, key)}
        alone = {sid for sid, ts in said.items() if all((sid, i) in short for i in range(len(ts)))}
        expected = sum(key[0] in alone or (key not in short and seen.fresh(key)) for key in keys)
        # a short turn may bring back the near-duplicate it answers (its anchor)
        riders = sum(key in short and key[0] not in alone for key in keys)
        assert min(k, expected) <= len(r) <= min(k, expected + riders)
        assert all(h.memory.user_id == user for h in r)
        assert len({h.memory.id for h in r}) == len(r)

    @rule(user=USERS, session=SESSIONS)
    def delete_session(self, user: str, session: str) -> None:
        if (user, session) not in self.turns:
            return
        self.mem.delete_session(user, session)
        del self.turns[(user, session)]
        self.ended.pop((user, session), None)

    @rule(user=USERS)
    def delete_user(self, user: str) -> None:
        self.mem.delete_user(user)
        for key in [k for k in self.turns if k[0] == user]:
            del self.turns[key]
            self.ended.pop(key, None)

    @invariant()
    def store_matches_model(self) -> None:
        for user in ("ann", "bo", "cy"):
            stored = [t.text for t in self.mem.turns(user)]
            model = sorted(t for (u, _), ts in self.turns.items() if u == user for t in ts)
            assert sorted(stored) == model
            assert self.mem.stats(user)["memories"] == sum(
                len(ts) for (u, _), ts in self.turns.items() if u == user
            )

    def teardown(self) -> None:
        self.mem.close()


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
