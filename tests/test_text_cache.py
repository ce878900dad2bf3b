"""The text cache a version's first question finds filled (`UserTurns.text_cache`, `prepare_turns`).

Every turn's line cost, its `short_words` (small talk) and, for a long line, its excerpt pieces
are counted when an index version is made, for the sessions it is the first to hold; later
versions carry them. Retrieval must not change: a prepared cache gives the hits a cache filled
as questions ask gives.
"""

from __future__ import annotations

import re
from importlib import resources

from hypothesis import given
from hypothesis import strategies as st
from reflective_memory import HashingEmbedder, ReflectiveMemory
from reflective_memory.io import ingest_conversations, load_conversations
from reflective_memory.text import short_words


def _demo() -> object:
    src = resources.files("reflective_memory") / "data" / "demo_conversation.json"
    with resources.as_file(src) as path:
        return load_conversations(path)[0]


def _turns(mem: ReflectiveMemory, user: str) -> dict[str, list]:
    cache = mem.retriever.votes.turns.sessions(user, mem.indexes.get(user))
    return dict(cache)


def _cache(mem: ReflectiveMemory, user: str) -> dict:
    return mem.retriever.votes.turns.text_cache(user, mem.indexes.get(user))


_WORDS = st.lists(
    st.sampled_from(["ok", "Thanks", "ß", "über", "_", "—", "🙂", "a" * 300, "x1", "\n", "!!"]),
    max_size=40,
)


@given(_WORDS, st.sampled_from([" ", "", ", ", "\n"]))
def test_short_words_are_every_word_of_a_short_text(parts: list[str], sep: str) -> None:
    text = sep.join(parts)
    every = re.findall(r"[^\W_]+", text.casefold())
    assert short_words(text) == (tuple(every) if len(every) <= 12 else None)


def test_a_new_index_has_every_turn_counted_before_any_question_reads_it() -> None:
    conv = _demo()
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        ingest_conversations(mem, [conv], progress=False)
        user = conv.user_id
        mem.retrieve(user, "hello", k=1)  # makes the index version
        cache, turns = _cache(mem, user), _turns(mem, user)
        cut = mem.config.passages.excerpt_length
        for sid, ts in turns.items():
            for p, t in enumerate(ts):
                assert cache[(sid, p)] > 0
                assert cache[("words", sid, p)] == short_words(t.text)
                assert (("pieces", sid, p) in cache) == (cache[(sid, p)] > cut)


def test_a_version_that_appends_a_session_prepares_only_that_session() -> None:
    conv = _demo()
    first, last = conv.sessions[:-1], conv.sessions[-1]
    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        user = conv.user_id
        for s in first:
            mem.add_turns([{**t, "user_id": user, "session_id": s.session_id} for t in s.turns])
            mem.end_session(user, s.session_id)
        mem.retrieve(user, "hello", k=1)
        before = dict(_cache(mem, user))
        turns = [{**t, "user_id": user, "session_id": last.session_id} for t in last.turns]
        mem.add_turns(turns)
        mem.end_session(user, last.session_id)
        mem.retrieve(user, "hello", k=1)
        after = _cache(mem, user)
        assert all(after[k] is v for k, v in before.items())  # carried, not counted again
        new = {k for k in after if k not in before}
        assert {k[-2] for k in new} == {last.session_id}
        assert {k for k in new if len(k) == 2} == {
            (last.session_id, p) for p in range(len(last.turns))
        }


def test_a_prepared_cache_gives_the_hits_a_cache_filled_by_questions_gives() -> None:
    conv = _demo()
    got = []
    for prepared in (True, False):
        with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
            if not prepared:
                mem.retriever.votes.turns.prepare = None
            ingest_conversations(mem, [conv], progress=False)
            for q in conv.questions:
                for kw in ({"budget_tokens": 60}, {"budget_tokens": 400}, {"k": 5}):
                    hits = mem.retrieve(conv.user_id, q.question, **kw).hits
                    got.append([(h.memory.id, h.memory.text, h.score) for h in hits])
    half = len(got) // 2
    assert got[:half] == got[half:] and half >= 3 * 5


def test_a_when_question_keeps_which_turns_name_a_time_in_the_text_cache() -> None:
    from reflective_memory.retrieval.features import names_a_time

    with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        mem.add_turns(
            [
                {"user_id": "u", "session_id": "s", "role": "user", "text": text}
                for text in (
                    "My sister's wedding is on 14 June 2025 in Porto.",
                    "I booked the flights to Porto for the wedding yesterday.",
                    "The wedding dinner will be at a small place by the river.",
                )
            ]
        )
        mem.retrieve("u", "When is my sister's wedding?", budget_tokens=200)
        cache, turns = _cache(mem, "u"), _turns(mem, "u")["s"]
        dated = {k[2]: v for k, v in cache.items() if k[0] == "dated"}
        assert dated and all(
            (v != 0) == names_a_time(turns[p])
            and (v == 2) == names_a_time(turns[p], beyond_its_day=True)
            for p, v in dated.items()
        )
        assert dated.get(0) == 2  # "on 14 June 2025": a day other than its own
