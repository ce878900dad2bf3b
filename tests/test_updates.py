"""What is true now (issue 28): when a later turn updates a fact, a present-tense question gets
the newest statement first, and a question about the past still finds the old one.

Five kinds of update (a move, a new job, a new date, a new name, a negation), each in a small
chat of three sessions written for this test, with other topics around them. Real MiniLM.
"""

from __future__ import annotations

import pytest
from reflective_memory import ReflectiveMemory

FILLER = [
    ("user", "Can you suggest a good podcast about history?"),
    ("assistant", "Try 'The Rest Is History'; the episodes are short and lively."),
    ("user", "I also need a birthday present idea for my brother, he likes board games."),
    ("assistant", "Wingspan or Cascadia are lovely and easy to learn."),
]

UPDATES = {
    "move": (
        "I live in Lisbon, in a small flat in Alfama with a view of the river.",
        "We finally moved: I live in Porto now, in a flat near the Bolhão market.",
        "Where do I live now?",
        "Where did I live in January 2025?",
    ),
    "job": (
        "I work as a nurse at Santa Maria hospital, mostly night shifts.",
        "I quit the hospital; I started as a paramedic with the city ambulance service.",
        "What is my job these days?",
        "What was my job in January 2025?",
    ),
    "date": (
        "Our wedding is planned for June 14 at the old monastery.",
        "We moved the wedding to September 20, the monastery was double-booked in June.",
        "When is my wedding now?",
        "What wedding date did we plan in January 2025?",
    ),
    "name": (
        "My cat is called Biscuit, she is a tiny grey tabby.",
        "We renamed the cat Mochi, Biscuit never suited our grey tabby.",
        "What is my cat called now?",
        "What was my cat called in January 2025?",
    ),
    "negation": (
        "I play tennis every Saturday morning at the club.",
        "I no longer play tennis since my knee surgery; I swim on Saturdays instead.",
        "Do I still play tennis?",
        "Did I play tennis in January 2025?",
    ),
}


def _chat(mem: ReflectiveMemory, old: str, new: str) -> None:
    sessions = [
        ("2025-01-12", [("user", old), ("assistant", "Good to know, thanks for sharing.")]),
        ("2025-03-02", FILLER),
        ("2025-06-15", [("user", new), ("assistant", "Thanks for the update!")]),
    ]
    for sid, turns in sessions:
        for i, (role, text) in enumerate(turns):
            mem.add_turn("ana", sid, role, text, timestamp=f"{sid}T10:{i:02d}:00")
        mem.end_session("ana", sid)


def _rank(hits, text: str) -> int:
    return next((i for i, h in enumerate(hits) if text in h.memory.text), 99)


@pytest.mark.integration
@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_the_newest_statement_comes_first_and_the_old_one_stays_reachable(kind):
    old, new, now_q, past_q = UPDATES[kind]
    with ReflectiveMemory() as mem:
        _chat(mem, old, new)
        hits = mem.retrieve("ana", now_q, k=5).hits
        assert _rank(hits, new) < _rank(hits, old), [h.memory.text for h in hits]
        assert _rank(hits, new) == 0
        packed = "\n".join(h.memory.text for h in mem.retrieve("ana", now_q, budget_tokens=300))
        assert new in packed
        past = mem.retrieve("ana", past_q, k=5).hits
        assert _rank(past, old) < _rank(past, new), [h.memory.text for h in past]


def _demo() -> ReflectiveMemory:
    from importlib import resources

    from reflective_memory.io import ingest_conversations, load_conversations

    src = resources.files("reflective_memory") / "data" / "demo_conversation.json"
    with resources.as_file(src) as path:
        conv = load_conversations(path)[0]
    mem = ReflectiveMemory()
    ingest_conversations(mem, [conv], progress=False)
    return mem


@pytest.mark.integration
def test_the_demo_knows_where_maya_lives_now_within_300_tokens():
    with _demo() as mem:
        packed = mem.retrieve("maya", "Where do I live now?", budget_tokens=300)
        assert "Neukölln" in "\n".join(h.memory.text for h in packed)


@pytest.mark.integration
def test_the_demo_knows_where_maya_lives_now_in_five_turns():
    with _demo() as mem:
        for question in ("Where do I live now?", "Where do I live?"):
            top5 = [h.memory.turn_ids[0] for h in mem.retrieve("maya", question, k=5)]
            assert "s5-t7" in top5, question  # "I'm moving to Neukölln on August 1"
