import pytest
from reflective_memory.errors import InvalidInputError
from reflective_memory.segment import LabeledDialogue, LLMSegmenter, Rubric, learn_rubric
from reflective_memory.segment.rubric import build_reflection_prompt, parse_reflection
from reflective_memory.types import Usage

ONE_SEGMENT = (
    '<segmentation>{"segment_id": 0, "start_exchange_number": 0, "end_exchange_number": 99}'
    "</segmentation>"
)


def dialogues(k=5):
    out = []
    for j in range(k):
        utts = [f"d{j} topic a {i}" for i in range(4)] + [f"d{j} topic b {i}" for i in range(4)]
        out.append(LabeledDialogue.from_starts(utts, [4], dialogue_id=f"d{j}"))
    return out


class Scripted:
    """Segments everything as one topic; answers reflections from a list."""

    def __init__(self, reflections):
        self.reflections = list(reflections)
        self.seg_prompts = []
        self.reflect_prompts = []

    def __call__(self, prompt):
        if "improving the instructions" in prompt:
            self.reflect_prompts.append(prompt)
            return self.reflections.pop(0)
        self.seg_prompts.append(prompt)
        return ONE_SEGMENT


def test_learn_rubric_iterates_batches_and_persists(tmp_path):
    rules = "\n".join(f"- rule {i}" for i in range(14))
    llm = Scripted(
        [
            "<reflection>cut too rarely</reflection><rubric>\n- Cut when the subject changes.\n"
            "</rubric><example>ex one</example>",
            "no tags at all",  # unusable: keeps the rubric
            f"<rubric>\n{rules}\n</rubric><example>ex two</example>",
        ]
    )
    usage = Usage()
    rubric = learn_rubric(
        llm, dialogues(5), hard_examples=5, batch_size=2, max_examples=1, usage=usage
    )
    assert len(llm.reflect_prompts) == 3  # 5 hard dialogues in batches of 2
    assert "(empty)" in llm.reflect_prompts[0]
    assert "- Cut when the subject changes." in llm.reflect_prompts[1]
    assert "### Predicted" in llm.reflect_prompts[0] and "### Annotated" in llm.reflect_prompts[0]
    assert rubric.items == [f"rule {i}" for i in range(10)]  # capped at 10
    assert rubric.examples == ["ex two"]
    assert rubric.metadata["rounds"][0]["hard"] == 5
    assert usage.llm_calls == 5 + 3 and usage.failures == 1
    path = rubric.save(tmp_path / "r" / "rubric.json")
    again = Rubric.load(path)
    assert again.items == rubric.items and again.examples == rubric.examples
    seg = LLMSegmenter(llm, rubric=again, unit="turn", fallback=None)
    seg.segment(dialogues(1)[0].turns())
    assert llm.seg_prompts[-1].startswith("# Segmentation rubric")
    assert "- rule 9" in llm.seg_prompts[-1]


def test_learn_rubric_skips_perfect_dialogues_and_validates():
    perfect = LabeledDialogue.from_starts(["a", "b"], [])
    llm = Scripted([])
    rubric = learn_rubric(llm, [perfect])
    assert rubric.is_empty() and llm.reflect_prompts == []
    with pytest.raises(InvalidInputError):
        learn_rubric(llm, [])
    with pytest.raises(InvalidInputError):
        learn_rubric(llm, [perfect], batch_size=0)


def test_parse_reflection_and_prompt():
    items, example = parse_reflection("<rubric>1. First\n2) Second\n- First\n</rubric>")
    assert items == ["First", "Second"] and example is None
    assert parse_reflection("nothing") == (None, None)
    d = dialogues(1)[0]
    prompt = build_reflection_prompt(Rubric(items=["x"]), [(d, [(0, 8)])])
    assert "- x" in prompt and "Segment 1:" in prompt and "at most 10 rules" in prompt


def test_rubric_load_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(InvalidInputError):
        Rubric.load(bad)
    with pytest.raises(InvalidInputError):
        Rubric.load(tmp_path / "missing.json")
    with pytest.raises(InvalidInputError):
        LabeledDialogue(("a",), ((0, 2),))
