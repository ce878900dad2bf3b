"""Hypothesis state machine: add / end / retrieve / delete / reopen on disk against a model.

The model is a dict of each user's sessions (turn id -> text, and whether the session is built).
After every step the store must agree with it: the same turns, the same open sessions, every
ended session's turn memories exactly its turns, retrieval only ever returning the user's own
built memories, and nothing of a deleted user in any file.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory

pytestmark = pytest.mark.reliability

USERS = st.sampled_from(["ann", "bo", "cy"])
SESSIONS = st.sampled_from(["s1", "s2"])
WORDS = st.lists(
    st.sampled_from("apple river stone cloud ember violin tulip".split()), min_size=1, max_size=5
)


def _unit(text: str) -> str:
    """A turn unit's text without its date line (every turn has a time)."""
    return text.split("\n", 1)[1] if text.startswith("[") else text


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rm-model-"))
        self.cfg = MemoryConfig(  # the store, not the session rules (test_session_rules)
            units={"granularities": ("turn",)},
            denoise={"kind": "none"},
            sessions={"end_on_new_session": False, "idle_seconds": None},
        )
        self.mem = self._open()
        # (user, session) -> {turn_id: text}; built: (user, session) -> texts at the last end
        self.turns: dict[tuple[str, str], dict[str, str]] = {}
        self.built: dict[tuple[str, str], dict[str, str]] = {}
        self.open: set[tuple[str, str]] = set()
        self.counter = 0
        self.deleted: set[str] = set()

    def _open(self) -> ReflectiveMemory:
        return ReflectiveMemory(self.dir, embedder=HashingEmbedder(32), config=self.cfg)

    def teardown(self) -> None:
        self.mem.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(user=USERS, session=SESSIONS, words=WORDS)
    def add(self, user: str, session: str, words: list[str]) -> None:
        self.counter += 1
        text = f"{user} token{self.counter} " + " ".join(words)
        t = self.mem.add_turn(user, session, "user", text)
        self.turns.setdefault((user, session), {})[t.turn_id] = f"user: {text}"  # unit text
        self.open.add((user, session))
        self.deleted.discard(user)

    @rule(user=USERS, session=SESSIONS)
    def end(self, user: str, session: str) -> None:
        key = (user, session)
        if key not in self.turns:
            return
        built = self.mem.end_session(user, session)
        assert sorted(_unit(m.text) for m in built) == sorted(self.turns[key].values())
        self.built[key] = dict(self.turns[key])
        self.open.discard(key)

    @rule(user=USERS, words=WORDS, k=st.integers(1, 8))
    def retrieve(self, user: str, words: list[str], k: int) -> None:
        hits = self.mem.retrieve(user, " ".join(words), k=k).hits
        # every stored turn is searchable at once, built into memories or not
        mine = {t for (u, _), texts in self.turns.items() if u == user for t in texts.values()}
        assert len(hits) <= k
        for h in hits:
            assert h.memory.user_id == user and _unit(h.memory.text) in mine

    @rule(user=USERS)
    def delete_user(self, user: str) -> None:
        n = self.mem.delete_user(user)
        assert n == sum(len(v) for (u, _), v in self.turns.items() if u == user)
        for key in [k for k in self.turns if k[0] == user]:
            self.turns.pop(key)
            self.built.pop(key, None)
            self.open.discard(key)
        self.deleted.add(user)

    @rule(user=USERS, session=SESSIONS)
    def delete_session(self, user: str, session: str) -> None:
        key = (user, session)
        if key not in self.turns:
            return
        self.mem.delete_session(user, session)
        self.turns.pop(key)
        self.built.pop(key, None)
        self.open.discard(key)

    @rule(user=USERS, session=SESSIONS, pick=st.integers(0, 10))
    def delete_turn(self, user: str, session: str, pick: int) -> None:
        key = (user, session)
        if key not in self.turns or not self.turns[key]:
            return
        tid = sorted(self.turns[key])[pick % len(self.turns[key])]
        gone = self.mem.delete_turns(user, session, [tid])
        assert [t.turn_id for t in gone] == [tid]
        del self.turns[key][tid]
        if key in self.built:  # memories holding the turn are gone with it
            self.built[key].pop(tid, None)
        if self.turns[key]:
            self.open.add(key)

    @rule()
    def reopen(self) -> None:
        self.mem.close()
        self.mem = self._open()

    @precondition(lambda self: bool(self.deleted))
    @rule()
    def deleted_users_leave_no_trace(self) -> None:
        blob = b"".join(f.read_bytes() for f in self.dir.rglob("*") if f.is_file())
        for user in self.deleted:
            assert f"{user} token".encode() not in blob

    @invariant()
    def store_matches_model(self) -> None:
        for user in ("ann", "bo", "cy"):
            stored = {(t.session_id, t.turn_id): f"user: {t.text}" for t in self.mem.turns(user)}
            want = {
                (s, tid): text
                for (u, s), v in self.turns.items()
                if u == user
                for tid, text in v.items()
            }
            assert stored == want
            assert set(self.mem.open_sessions(user)) == {s for (u, s) in self.open if u == user}
            texts = sorted(_unit(m.text) for m in self.mem.memories(user))
            assert texts == sorted(
                t for (u, _), v in self.turns.items() if u == user for t in v.values()
            )


StoreModel.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreModel.TestCase
