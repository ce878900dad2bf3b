import json

import pytest
from reflective_memory import MemoryConfig, ReflectiveMemory
from reflective_memory.embed import HashingEmbedder
from reflective_memory.errors import ConfigError
from reflective_memory.segment import (
    EmbeddingSegmenter,
    FixedWindowSegmenter,
    LLMSegmenter,
    Rubric,
    TextTilingSegmenter,
    segmenter_from_config,
)

CONVERSATION = [
    ("user", "Do you like cats?"),
    ("assistant", "Yes, cats are wonderful pets that purr."),
    ("user", "My cat sleeps on the sofa all day."),
    ("assistant", "Cats sleep up to sixteen hours a day."),
    ("user", "What should I cook for dinner tonight?"),
    ("assistant", "A pasta with tomato sauce is quick to cook."),
    ("user", "Which pasta shape works best with tomato sauce?"),
    ("assistant", "Spaghetti or penne pasta both hold tomato sauce well."),
    ("user", "Can you recommend a science fiction novel?"),
    ("assistant", "Try Dune, a classic science fiction novel."),
]


def fill(mem, user="ana", session="s1"):
    for role, text in CONVERSATION:
        mem.add_turn(user, session, role, text)
    return mem.end_session(user, session)


def covered_turns(memories):
    return sorted(t for m in memories for t in m.turn_ids)


def test_default_segmenter_is_offline_embedding_on_exchanges():
    with ReflectiveMemory(embedder=HashingEmbedder(128)) as mem:
        assert isinstance(mem.segmenter, EmbeddingSegmenter)
        assert mem.segmenter.unit == "exchange"
        memories = fill(mem)
        segs = [m for m in memories if m.granularity == "segment"]
        assert covered_turns(segs) == sorted(f"s1:{i}" for i in range(len(CONVERSATION)))
        for m in segs:  # every segment starts at a user turn and keeps whole exchanges
            first = int(m.turn_ids[0].split(":")[1])
            assert CONVERSATION[first][0] == "user"
            assert len(m.turn_ids) % 2 == 0


def answer_for(spans):
    lines = [
        json.dumps(
            {
                "segment_id": i,
                "start_exchange_number": a,
                "end_exchange_number": b,
                "num_exchanges": b - a + 1,
            }
        )
        for i, (a, b) in enumerate(spans)
    ]
    return "<segmentation>\n" + "\n".join(lines) + "\n</segmentation>"


def test_llm_configured_uses_llm_segmenter_and_counts_usage():
    prompts = []

    def llm(prompt):
        prompts.append(prompt)
        return answer_for([(0, 1), (2, 3), (4, 4)])

    with ReflectiveMemory(embedder=HashingEmbedder(64), llm=llm) as mem:
        assert isinstance(mem.segmenter, LLMSegmenter)
        memories = fill(mem)
        segs = [m.turn_ids for m in memories if m.granularity == "segment"]
        assert segs == [
            ("s1:0", "s1:1", "s1:2", "s1:3"),
            ("s1:4", "s1:5", "s1:6", "s1:7"),
            ("s1:8", "s1:9"),
        ]
        assert len(prompts) == 1 and "[Exchange 4]" in prompts[0]
        assert mem.llm is not None and mem.llm.usage.llm_calls == 1


@pytest.mark.parametrize("answer", ["", "sorry, no", "<segmentation>{bad json</segmentation>"])
def test_llm_garbage_falls_back_offline_without_losing_turns(answer):
    with ReflectiveMemory(embedder=HashingEmbedder(64), llm=lambda p: answer) as mem:
        memories = fill(mem)
        segs = [m for m in memories if m.granularity == "segment"]
        assert covered_turns(segs) == sorted(f"s1:{i}" for i in range(len(CONVERSATION)))


def test_llm_that_raises_falls_back_offline():
    def broken(prompt):
        raise TimeoutError("LLM timed out")

    with ReflectiveMemory(embedder=HashingEmbedder(64), llm=broken) as mem:
        memories = fill(mem)
        segs = [m for m in memories if m.granularity == "segment"]
        assert len(covered_turns(segs)) == len(CONVERSATION)
        assert mem.llm.usage.failures == 1


def test_config_choices(tmp_path):
    emb = HashingEmbedder(64)
    assert isinstance(
        segmenter_from_config(MemoryConfig(segment={"kind": "fixed"}).segment, emb),
        FixedWindowSegmenter,
    )
    assert isinstance(
        segmenter_from_config(MemoryConfig(segment={"kind": "texttiling"}).segment, emb),
        TextTilingSegmenter,
    )
    seg = segmenter_from_config(
        MemoryConfig(segment={"kind": "embedding", "unit": "turn"}).segment, emb
    )
    assert isinstance(seg, EmbeddingSegmenter) and seg.unit == "turn"
    with pytest.raises(ConfigError):
        segmenter_from_config(MemoryConfig(segment={"kind": "llm"}).segment, emb, None)
    with pytest.raises(ConfigError):
        MemoryConfig(segment={"kind": "magic"})
    with pytest.raises(ConfigError):
        MemoryConfig(segment={"unit": "sentence"})
    with pytest.raises(ConfigError):
        MemoryConfig(segment={"llm_window": 10, "llm_overlap": 5})
    path = Rubric(items=["Cut at new subjects."]).save(tmp_path / "rubric.json")
    cfg = MemoryConfig(segment={"kind": "llm", "rubric": str(path), "llm_window": 14})
    seg = segmenter_from_config(cfg.segment, emb, lambda p: "")
    assert isinstance(seg, LLMSegmenter)
    assert seg.rubric is not None and seg.rubric.items == ["Cut at new subjects."]
    assert seg.window == 14
    with pytest.raises(ConfigError):
        segmenter_from_config(
            MemoryConfig(segment={"kind": "llm", "rubric": str(tmp_path / "none.json")}).segment,
            emb,
            len,
        )


def test_explicit_segmenter_wins():
    with ReflectiveMemory(embedder=HashingEmbedder(64), segmenter=FixedWindowSegmenter(3)) as mem:
        memories = [m for m in fill(mem) if m.granularity == "segment"]
        assert [len(m.turn_ids) for m in memories] == [3, 3, 3, 1]


@pytest.mark.integration
def test_minilm_segmenter_splits_clear_topic_changes():
    from reflective_memory.embed import default_embedder

    seg = EmbeddingSegmenter(default_embedder(), unit="turn")
    texts = [
        "I adopted a puppy last week.",
        "What breed is it?",
        "A beagle, she loves chewing shoes.",
        "Beagles are very energetic dogs.",
        "Do you know a good recipe for lasagna?",
        "Layer pasta sheets with ragu and bechamel.",
        "Should I use fresh or dried pasta?",
        "Fresh pasta sheets cook faster in the oven.",
    ]
    spans = seg.segment_texts(texts)
    assert (0, 4) in spans or 4 in {a for a, _ in spans}
