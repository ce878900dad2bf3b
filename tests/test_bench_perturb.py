"""`bench retrieval --perturb`: messy histories built from clean conversations (issue 49)."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from reflective_bench.perturb import (
    FILLER_LAST,
    FILLER_MIDDLE,
    PERTURBATIONS,
    SESSIONLESS_ID,
    Copies,
    filler_exchange,
    load_perturbed,
    perturb,
    small_talk_exchange,
)
from reflective_bench.ranker import collect_rows
from reflective_bench.retrieval import coverage_at_budget, run_retrieval_bench, session_recall
from reflective_bench.roles import user_roles
from reflective_bench.systems import covered
from reflective_memory import HashingEmbedder
from reflective_memory.errors import ConfigError
from reflective_memory.io import (
    Conversation,
    Question,
    SessionData,
    ingest_conversations,
    load_conversations,
)
from reflective_memory.text import parse_timestamp
from reflective_memory.types import Hit, Memory, Retrieval

DATES = ["10:00 AM on 1 March, 2024", "9:30 PM on 8 March, 2024", "8:15 AM on 20 March, 2024"]


def _chat(sample: str, user: str, other: str, facts: list[str]) -> dict[str, Any]:
    """A LoCoMo-shaped chat of three sessions: `other` opens, `user` (speaker_a) states a fact.

    Questions: the user's fact of each session (D<n>:2) and, for session 2, the other
    speaker's reply (D2:3), which is evidence said by the other side.
    """
    conv: dict[str, Any] = {"speaker_a": user, "speaker_b": other}
    qa = []
    for n, fact in enumerate(facts, 1):
        conv[f"session_{n}_date_time"] = DATES[n - 1]
        conv[f"session_{n}"] = [
            {"speaker": other, "dia_id": f"D{n}:1", "text": f"Hey {user}, what's new?"},
            {"speaker": user, "dia_id": f"D{n}:2", "text": fact},
            {"speaker": other, "dia_id": f"D{n}:3", "text": "Good to hear, tell me more later."},
            {"speaker": user, "dia_id": f"D{n}:4", "text": "Will do, talk soon."},
        ]
        qa.append({"question": f"What did {user} say? {fact}", "evidence": [f"D{n}:2"]})
    qa.append({"question": "What did the friend reply?", "evidence": ["D2:3"]})
    return {"sample_id": sample, "conversation": conv, "qa": qa}


CHATS = [
    _chat(
        "chat-1",
        "Ana",
        "Ben",
        [
            "I hiked the Lofoten ridge in the rain.",
            "My dog is called Pretzel.",
            "I cook a mushroom risotto on Sundays.",
        ],
    ),
    _chat(
        "chat-2",
        "Cleo",
        "Dan",
        [
            "I visited Porto with my aunt.",
            "I play the cello in a quartet.",
            "I am reading a novel about whales.",
        ],
    ),
]


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    f = tmp_path / "chats.json"
    f.write_text(json.dumps(CHATS))
    return f


@pytest.fixture
def convs(chats: Path) -> list[Conversation]:
    return load_conversations(chats)


def _sides(convs: list[Conversation], chats: Path) -> dict[str, str]:
    return user_roles(convs, chats)


def _ids(conv: Conversation) -> list[str]:
    return [t["turn_id"] for s in conv.sessions for t in s.turns]


def test_user_roles_are_speaker_a_or_the_user_role(chats: Path, convs) -> None:
    assert user_roles(convs, chats) == {"chat-1": "Ana", "chat-2": "Cleo"}
    data, _ = load_perturbed(chats, "ua", None, "none")
    assert user_roles(data.conversations, chats) == {"chat-1": "user", "chat-2": "user"}


def test_filler_adds_30_and_60_exchanges_in_the_middle_of_the_middle_and_last_session(
    chats: Path, convs
) -> None:
    out = perturb(convs, "filler", _sides(convs, chats))
    assert out.turns == (24, 24 + 2 * 2 * (FILLER_MIDDLE + FILLER_LAST))
    assert out.sessions == (6, 6)
    for before, after in zip(convs, out.conversations, strict=True):
        first, middle, last = after.sessions
        assert first == before.sessions[0]  # untouched
        assert len(middle.turns) == 4 + 2 * FILLER_MIDDLE
        assert len(last.turns) == 4 + 2 * FILLER_LAST
        # inserted after the second of four turns, the originals kept in order around them
        for session, old in ((middle, before.sessions[1]), (last, before.sessions[2])):
            assert session.turns[:2] == old.turns[:2] and session.turns[-2:] == old.turns[2:]
            added = session.turns[2:-2]
            assert {t["timestamp"] for t in added} == {old.turns[1]["timestamp"]}
            user = before.sessions[0].turns[1]["role"]
            assert [t["role"] for t in added[:2]] == [user, before.sessions[0].turns[0]["role"]]
        assert after.questions == before.questions
        assert len(set(_ids(after))) == len(_ids(after))
    # the same strings in every conversation, numbered 1-30 then 31-90
    texts = [[t["text"] for t in c.sessions[2].turns[2:-2]] for c in out.conversations]
    assert texts[0] == texts[1]
    assert texts[0][:2] == list(filler_exchange(FILLER_MIDDLE + 1))
    assert "dinner idea number 31" in texts[0][0] and texts[0][1].startswith("Dinner idea 31:")
    middle_texts = [t["text"] for t in out.conversations[0].sessions[1].turns[2:-2]]
    assert middle_texts[0] == filler_exchange(1)[0] and len(set(middle_texts)) == len(middle_texts)


def test_filler_of_a_one_session_chat_puts_both_floods_in_it() -> None:
    conv = Conversation(
        "u",
        [SessionData("s", [{"role": "user", "text": "hi", "turn_id": "t", "timestamp": None}])],
    )
    (after,) = perturb([conv], "filler", {"u": "user"}).conversations
    roles = [t["role"] for t in after.sessions[0].turns]
    assert len(roles) == 1 + 2 * (FILLER_MIDDLE + FILLER_LAST)
    added = roles[:-1]  # in the middle of one turn: before it
    assert set(added[0::2]) == {"user"} and set(added[1::2]) == {"assistant"}  # nobody else


def test_smalltalk_opens_every_session_with_an_exchange_in_five_languages_in_turn(
    chats: Path, convs
) -> None:
    out = perturb(convs, "smalltalk", _sides(convs, chats))
    assert out.turns == (24, 24 + 2 * 6) and out.sessions == (6, 6)
    for before, after in zip(convs, out.conversations, strict=True):
        user = before.sessions[0].turns[1]["role"]
        other = before.sessions[0].turns[0]["role"]
        for i, (old, new) in enumerate(zip(before.sessions, after.sessions, strict=True)):
            assert new.turns[2:] == old.turns  # the session as it was, after the opening
            q, a = new.turns[:2]
            assert (q["text"], a["text"]) == small_talk_exchange(i)
            assert (q["role"], a["role"]) == (user, other)
            assert q["timestamp"] == a["timestamp"] == old.turns[0]["timestamp"]
            assert all(len(t["text"].split()) > 2 for t in (q, a))  # not a short rider
        assert after.questions == before.questions
        assert len(set(_ids(after))) == len(_ids(after))
    assert len({small_talk_exchange(i) for i in range(6)}) == 6  # then they come back
    assert small_talk_exchange(6) == small_talk_exchange(0)


def test_sessionless_puts_every_turn_under_one_session_with_per_turn_times(convs) -> None:
    convs[0].sessions[0].turns[2]["timestamp"] = "2024-03-01T10:02:30"  # a time of its own
    out = perturb(convs, "sessionless", {})
    assert out.turns == (24, 24) and out.sessions == (6, 2)
    conv = out.conversations[0]
    (session,) = conv.sessions
    assert session.session_id == SESSIONLESS_ID
    assert _ids(conv) == _ids(convs[0])  # ids and order kept
    times = [parse_timestamp(t["timestamp"]) for t in session.turns]
    assert times[:4] == [
        datetime(2024, 3, 1, 10, 0, tzinfo=timezone.utc),
        datetime(2024, 3, 1, 10, 1, tzinfo=timezone.utc),
        datetime(2024, 3, 1, 10, 2, 30, tzinfo=timezone.utc),  # its own
        datetime(2024, 3, 1, 10, 3, tzinfo=timezone.utc),
    ]
    assert times[4:6] == [
        datetime(2024, 3, 8, 21, 30, tzinfo=timezone.utc),
        datetime(2024, 3, 8, 21, 31, tzinfo=timezone.utc),
    ]
    assert times == sorted(times)
    assert {s for q in conv.questions for s in q.evidence_sessions} == {SESSIONLESS_ID}
    assert [q.evidence for q in conv.questions] == [q.evidence for q in convs[0].questions]


def test_bare_is_one_session_with_no_time_anywhere(convs) -> None:
    out = perturb(convs, "bare", {})
    assert out.turns == (24, 24) and out.sessions == (6, 2)
    conv = out.conversations[0]
    (session,) = conv.sessions
    assert session.session_id == SESSIONLESS_ID and session.date is None
    assert [t.get("timestamp") for t in session.turns] == [None] * 12
    texts = [t["text"] for s in convs[0].sessions for t in s.turns]
    assert [t["text"] for t in session.turns] == texts
    assert {s for q in conv.questions for s in q.evidence_sessions} == {SESSIONLESS_ID}


def test_untimed_keeps_sessions_and_no_time_anywhere(convs) -> None:
    out = perturb(convs, "untimed", {})
    assert out.turns == (24, 24) and out.sessions == (6, 6)
    for before, after in zip(convs, out.conversations, strict=True):
        assert [s.session_id for s in after.sessions] == [s.session_id for s in before.sessions]
        assert all(s.date is None for s in after.sessions)
        assert all(t.get("timestamp") is None for s in after.sessions for t in s.turns)
        assert _ids(after) == _ids(before) and after.questions == before.questions


class _Recorder:
    """What `ingest_conversations` hands `add_turns` (as a memory would receive it)."""

    def __init__(self) -> None:
        self.added: list[dict[str, Any]] = []
        self.sessions = self  # `ingest_conversations` checks every turn first

    def check_turns(self, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(turns)

    def turns(self, user_id: str, session_id: str) -> list[Any]:
        return []

    def add_turns(self, turns: list[dict[str, Any]]) -> None:
        self.added += turns

    def end_session(self, user_id: str, session_id: str) -> None:
        pass


@pytest.mark.parametrize("roles", ["names", "ua"])
def test_unstamped_leaves_only_the_user_side_timed(chats: Path, roles: str) -> None:
    data, _ = load_perturbed(chats, roles, None, "unstamped")
    assert data.turns == (24, 24) and data.sessions == (6, 6)
    user = "Ana" if roles == "names" else "user"
    conv = data.conversations[0]
    assert {s.date for s in conv.sessions} == {None}  # no session date to fall back on
    seen = _Recorder()
    ingest_conversations(seen, [conv], progress=False)  # type: ignore[arg-type]
    assert len(seen.added) == 12
    for t in seen.added:
        if t["role"] == user:
            date = DATES[int(t["turn_id"][1]) - 1]
            assert parse_timestamp(t["timestamp"]) == parse_timestamp(date)
        else:
            assert t["timestamp"] is None
    assert {t["role"] for t in seen.added if t["timestamp"] is None} == {
        "Ben" if roles == "names" else "assistant"
    }


def test_repeated_says_each_user_evidence_turn_again_in_the_next_two_sessions(
    chats: Path, convs
) -> None:
    out = perturb(convs, "repeated", _sides(convs, chats))
    # three user evidence turns per chat, two copies each; Ben's reply D2:3 is not copied
    assert out.turns == (24, 24 + 2 * 3 * 2) and len(out.copies) == 12
    conv = out.conversations[0]
    table = out.copies.by_user["chat-1"]
    assert table == {
        "D1:2~again1": ("D1:2", "session_1"),
        "D1:2~again2": ("D1:2", "session_1"),
        "D2:2~again1": ("D2:2", "session_2"),
        "D2:2~again2": ("D2:2", "session_2"),
        "D3:2~again1": ("D3:2", "session_3"),
        "D3:2~again2": ("D3:2", "session_3"),
    }
    where = {t["turn_id"]: s.session_id for s in conv.sessions for t in s.turns}
    # the next two sessions after it; the last session's turn goes to the two before it
    assert where["D1:2~again1"] == "session_2" and where["D1:2~again2"] == "session_3"
    assert where["D2:2~again1"] == "session_3" and where["D2:2~again2"] == "session_1"
    assert where["D3:2~again1"] == "session_2" and where["D3:2~again2"] == "session_1"
    by_id = {t["turn_id"]: t for s in conv.sessions for t in s.turns}
    second = conv.sessions[1]
    assert [t["turn_id"] for t in second.turns] == [
        "D2:1", "D2:2", "D1:2~again1", "D3:2~again1", "D2:3", "D2:4",
    ]  # fmt: skip
    for cid, (orig, _) in table.items():
        assert (by_id[cid]["role"], by_id[cid]["text"]) == (
            by_id[orig]["role"],
            by_id[orig]["text"],
        )
        assert by_id[cid]["timestamp"] == DATES[int(where[cid][-1]) - 1]  # that session's time
        assert out.copies.original("chat-1", cid) == orig
    assert out.copies.original("chat-1", "D2:3") == "D2:3"
    assert out.copies.original("chat-2", "D1:2~again1") == "D1:2"  # per conversation
    one = Conversation("u", [SessionData("s", [{"role": "user", "text": "x", "turn_id": "t"}])])
    one.questions = convs[0].questions[:0]
    assert len(perturb([one], "repeated", {"u": "user"}).copies) == 0


@pytest.mark.parametrize("name", PERTURBATIONS)
def test_every_perturbation_is_deterministic_and_leaves_its_input_alone(
    chats: Path, convs, name: str
) -> None:
    before = copy.deepcopy(convs)
    first = perturb(convs, name, _sides(convs, chats))
    again = perturb(convs, name, _sides(convs, chats))
    assert first == again
    assert convs == before
    assert load_perturbed(chats, "names", 1, name)[0].conversations == first.conversations[:1]


def test_bad_input_is_refused_before_any_work(chats: Path, convs) -> None:
    with pytest.raises(ConfigError, match="--perturb must be one of"):
        load_perturbed(chats.parent / "missing.json", "names", None, "shuffled")
    with pytest.raises(ConfigError, match="no user side"):
        perturb(convs, "filler", {})
    convs[0].sessions[0].turns[0]["turn_id"] = "filler:1:q"
    with pytest.raises(ConfigError, match="already has turn ids"):
        perturb(convs, "filler", _sides(convs, chats))


def _hit(i: int, session: str, turn_ids: tuple[str, ...], text: str = "two words") -> Hit:
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    return Hit(Memory(f"m{i}", "chat-1", session, "turn", text, "key", turn_ids, now, now), 1.0, i)


def test_a_retrieved_copy_counts_as_its_original() -> None:
    copies = Copies({"chat-1": {"D1:2~again1": ("D1:2", "session_1")}})
    ranking = Retrieval("chat-1", "q", [_hit(0, "session_2", ("D2:1", "D1:2~again1", "D1:2"))])
    mapped = copies.originals(ranking)
    assert mapped.hits[0].memory.turn_ids == ("D2:1", "D1:2")
    assert mapped.hits[0].memory.session_id == "session_1"
    assert ranking.hits[0].memory.turn_ids == ("D2:1", "D1:2~again1", "D1:2")  # not changed
    only_copy = Retrieval("chat-1", "q", [_hit(0, "session_2", ("D1:2~again1",))])
    assert coverage_at_budget(only_copy, {"D1:2"}, 10) == (0.0, 2)
    assert coverage_at_budget(copies.originals(only_copy), {"D1:2"}, 10) == (1.0, 2)
    assert covered(copies.originals(only_copy), {"D1:2"})[0] == 1.0
    assert session_recall(copies.originals(only_copy), {"session_1"}, 1) == (1.0, 1.0)
    other_user = Retrieval("chat-2", "q", only_copy.hits)
    assert copies.originals(other_user) is other_user


def _question_on_copies(data: Any) -> None:
    """Leave each chat one question, whose only evidence is a user turn said three times."""
    for conv in data.conversations:
        conv.questions = [q for q in conv.questions if q.evidence == ["D1:2"]]


def test_run_retrieval_bench_counts_copies_on_a_perturbed_pair_of_chats(chats: Path) -> None:
    data, _ = load_perturbed(chats, "names", None, "repeated")
    _question_on_copies(data)
    res = run_retrieval_bench(
        data.conversations,
        embedder=HashingEmbedder(64),
        units=("turn",),
        modes=("hybrid",),
        budgets=(12, 1000),
        progress=False,
        copies=data.copies,
    )
    s = res.summary()
    assert s["questions"] == 2
    # at a budget of one turn, whichever of the three equal turns ranks first covers the fact
    assert s["coverage"]["turn/hybrid/12"] == 1.0
    assert s["coverage"]["turn/hybrid/1000"] == 1.0
    assert s["session_recall"]["turn/hybrid/any@5"] == 1.0


def _cli(*argv: str) -> int:
    from reflective_memory.cli import main

    return main([*argv, "--embedder", "hashing", "--cache", "none"])


@pytest.mark.parametrize("name", ["filler", "repeated"])
def test_bench_retrieval_records_the_perturbation(
    chats: Path, tmp_path: Path, capsys, name: str
) -> None:
    summary = tmp_path / "summary.json"
    argv = ["bench", "retrieval", "--data", str(chats), "--ablations", "none", "--budgets", "50"]
    assert _cli(*argv, "--perturb", name, "--topk", "0", "--json", str(summary)) == 0
    printed = capsys.readouterr().out
    got = json.loads(summary.read_text())
    if name == "filler":
        assert "perturb: filler; turns 24 -> 384, sessions 6 -> 6" in printed
        assert got["perturb"] == {"name": "filler", "turns": [24, 384], "sessions": [6, 6]} | {
            "copies": 0
        }
    else:
        assert got["perturb"]["copies"] == 12 and got["perturb"]["turns"] == [24, 36]
    assert 0.0 <= got["coverage"]["default/50"] <= 1.0 and got["questions"] == 8


TOPICS = [
    "the garden needs new tulip bulbs",
    "my train to work was late again",
    "the bakery on the corner closed",
    "our neighbour bought a red kayak",
    "I finished the puzzle with a lighthouse",
    "the printer ran out of cyan ink",
    "we watched a documentary about octopuses",
    "my cousin moved to Tromso",
    "the heating broke on Tuesday",
    "I started learning the ukulele",
    "the library fines doubled",
    "a heron sat on the fence",
]


def _varied_chat() -> Conversation:
    """Four sessions of varied user / assistant chatter; the allergy is said in the first."""
    sessions = []
    for n in range(4):
        when = f"2024-03-0{n + 1}T10:00:00"
        turns = []
        for j in range(3):
            topic = TOPICS[(n * 3 + j) % len(TOPICS)]
            reply = TOPICS[(n * 3 + j + 5) % len(TOPICS)].split()[-1]
            turns.append({"role": "user", "text": f"Also, {topic}.", "turn_id": f"s{n}:{2 * j}"})
            turns.append(
                {
                    "role": "assistant",
                    "text": f"Noted, and {reply}?",
                    "turn_id": f"s{n}:{2 * j + 1}",
                }
            )
        sessions.append(SessionData(f"s{n}", [{**t, "timestamp": when} for t in turns], when))
    fact = {"role": "user", "text": "I am allergic to peanuts.", "turn_id": "fact"}
    sessions[0].turns.insert(1, {**fact, "timestamp": sessions[0].date})
    question = Question("What am I allergic to?", evidence=["fact"], evidence_sessions=["s0"])
    return Conversation("u", sessions, [question])


def test_fit_ranker_rows_label_a_copy_as_evidence() -> None:
    data = perturb([_varied_chat()], "repeated", {"u": "user"})
    assert len(data.copies) == 2
    embedder = HashingEmbedder(64)
    ((_, _, labels, _),) = collect_rows(
        data.conversations, embedder, progress=False, copies=data.copies
    )
    ((_, _, plain, _),) = collect_rows(data.conversations, embedder, progress=False)
    assert plain.sum() == 1  # the original only
    assert labels.sum() == 3  # the original and its two copies
