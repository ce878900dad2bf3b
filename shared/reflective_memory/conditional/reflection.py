"""Self-reflection retrieval: the LLM judges the retrieved memories and asks for more if needed.

From the conditional-memory paper (§3.2, Appendix C.3). After a retrieval, the LLM reads the
query and the retrieved memories and answers either

* **enough** — followed by the memory lines relevant to the query (each citing its memory
  number), kept in the diagnostics; or
* **missing** — followed by keywords for the information it misses.

Keywords are cleaned (junk, duplicates, words already in the query removed), appended to the
query, and retrieval runs again. Rounds are bounded (`rounds`, default 1 extra). The rankings of
all rounds are merged by reciprocal-rank fusion with duplicates removed (a tie goes to the later
round, whose query knows what was missing), then cut to `k` hits or the token budget.

Cost: one LLM call per reflection round, so at most `rounds` calls per query (the retrieval after
the last judgement is not judged again). When the LLM fails or answers in a form that cannot be
read, reflection stops and the hits retrieved so far are returned.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reflective_memory.errors import InvalidInputError, LLMError, LLMOutputError
from reflective_memory.framing import frame_lines
from reflective_memory.llm import LLMClient, count_tokens
from reflective_memory.text import lexical_tokens
from reflective_memory.types import Hit, Retrieval, Usage

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = [
    "Reflection",
    "reflection_prompt",
    "parse_reflection",
    "clean_keywords",
    "reflective_retrieve",
    "SearchFn",
]

logger = logging.getLogger(__name__)

#: What `reflective_retrieve` calls to retrieve: query -> a `Retrieval` (or ranked hits).
SearchFn = Callable[[str], "Retrieval | Sequence[Hit]"]

_PROMPT = """You are about to answer a user's message with the help of memories recalled from \
earlier conversations with this user. Before answering, judge whether the recalled memories \
hold enough information to answer well.

Message: {query}

Recalled memories:
{memories}

If the memories are enough, write ENOUGH on the first line. Then copy the sentences that matter \
for the message, one per line, each starting with the number of its memory, for example:
[2] The user adopted a beagle called Max in March.

If the memories are not enough, write MISSING on the first line. Then write one line that starts \
with "Keywords:" and lists, separated by commas, a few short keywords or phrases naming the \
information that is missing, for example:
Keywords: dog's name, adoption date
"""

#: Characters of one memory shown to the judging LLM.
SHOW_CHARS = 1500
#: Most keywords taken from one answer.
MAX_KEYWORDS = 8
_MAX_KEYWORD_CHARS = 60
_MAX_KEYWORD_WORDS = 6


@dataclass
class Reflection:
    """The LLM's judgement of one round's memories.

    Attributes:
        enough: Whether the memories suffice.
        relevant: Memory lines the LLM copied as relevant (when enough).
        cited: Numbers of the shown memories the relevant lines cite.
        keywords: Cleaned keywords for the missing information (when not enough).
        raw_keywords: The keyword strings before cleaning.
    """

    enough: bool
    relevant: list[str] = field(default_factory=list)
    cited: list[int] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)
    raw_keywords: list[str] = field(default_factory=list)


def reflection_prompt(query: str, memories: Sequence[str], show_chars: int = SHOW_CHARS) -> str:
    """The judging prompt for a query and the memory texts retrieved for it (numbered from 0)."""
    if memories:
        shown = "\n".join(
            f"[{i}] {' '.join(m.split())[:show_chars]}" for i, m in enumerate(memories)
        )
    else:
        shown = "(no memories were found)"
    # The query's further lines are indented, so it cannot add a numbered memory line.
    return _PROMPT.format(query=frame_lines(query.strip()), memories=shown)


_MARKDOWN = re.compile(r"[*_#`>]+")
_NEG = re.compile(
    r"^(verdict|answer|decision)?\W*(missing|not enough|insufficient|not sufficient|no)\b"
)
_POS = re.compile(r"^(verdict|answer|decision)?\W*(enough|sufficient|yes)\b")
_NEG_ANY = re.compile(r"\b(missing|not enough|insufficient|not sufficient|lacking)\b")
_POS_ANY = re.compile(r"\b(enough|sufficient)\b")
_KW_PREFIX = re.compile(r"^\W*(keywords?|key phrases?|query|search terms?)\s*[:\-]\s*", re.I)
_PAPER_MEMORY = re.compile(r"<\s*memory\s*>\s*:?", re.I)
_PAPER_QUERY = re.compile(r"<\s*query\s*>\s*:?", re.I)
_CITE = re.compile(r"\[(\d+)\]")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)]|\(\d+\))\s*")
_JUNK = frozenset({"none", "n/a", "na", "nan", "null", "keywords", "keyword", "etc", "...", "-"})


def clean_keywords(
    raw: str | Sequence[str], query: str = "", max_keywords: int = MAX_KEYWORDS
) -> list[str]:
    r"""Turn the LLM's keyword text into a short, clean list.

    Splits on commas, semicolons, slashes between spaces and new lines; strips bullets,
    numbering, quotes, brackets and trailing punctuation; drops empty and overlong items,
    placeholders (`none`, `...`), single characters, items made only of stopwords, items
    whose every word is already in the query, and duplicates (case-insensitive). Keeps at most
    `max_keywords`.

    Example:
        >>> clean_keywords('1. "dog\'s name", , none, ..., Dog\'s Name; adoption date', "my dog")
        ["dog's name", 'adoption date']
    """
    parts: list[str] = []
    for item in [raw] if isinstance(raw, str) else list(raw):
        if not isinstance(item, str):
            continue
        parts.extend(re.split(r"[,;\n|]|\s/\s", item))
    query_tokens = set(lexical_tokens(query))
    out: list[str] = []
    seen: set[str] = set()
    for part in parts:
        text = _KW_PREFIX.sub("", part)
        text = _BULLET.sub("", _MARKDOWN.sub(" ", text))
        text = " ".join(text.strip().strip("\"'`[](){}<>").strip(" .:!?").split())
        text = text.strip("\"'`")
        low = text.lower()
        if low in _JUNK or len(re.sub(r"\W", "", text)) < 2:
            continue
        if len(text) > _MAX_KEYWORD_CHARS or len(text.split()) > _MAX_KEYWORD_WORDS:
            continue
        tokens = lexical_tokens(text)
        if not tokens or set(tokens) <= query_tokens:
            continue
        if low in seen:
            continue
        seen.add(low)
        out.append(text)
        if len(out) >= max_keywords:
            break
    return out


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def parse_reflection(output: str, n_shown: int, query: str = "") -> Reflection:
    """Read the judging LLM's answer.

    Accepts the requested form (`ENOUGH` / `MISSING` + `Keywords:`), yes/no variants
    (`Yes.`, `**Not enough**`, `Verdict: insufficient`), the paper's `<Memory>:` / `<Query>:`
    form, and a bare `Keywords:` line (read as missing).

    Args:
        output: The LLM's text.
        n_shown: How many memories were shown (citations outside `0..n_shown-1` are dropped).
        query: The query (keywords already in it are dropped).

    Returns:
        The judgement. A "missing" judgement may have no keywords left after cleaning.

    Raises:
        LLMOutputError: The answer is empty or states no verdict.
    """
    lines = _lines(output or "")
    if not lines:
        raise LLMOutputError("empty self-reflection answer")
    text = "\n".join(lines)
    q = _PAPER_QUERY.search(text)
    m = _PAPER_MEMORY.search(text)
    if q is not None and (m is None or q.start() < m.start()):
        body = text[q.end() :]
        return Reflection(False, keywords=clean_keywords(body, query), raw_keywords=[body])
    if m is not None:
        return _enough(_lines(text[m.end() :]), n_shown)
    head = _MARKDOWN.sub("", lines[0]).strip().lower()
    rest = lines[1:]
    tail = re.split(r"[:\-\u2013]", lines[0], maxsplit=1)
    after = tail[1].strip() if len(tail) > 1 else ""
    negative = bool(_NEG.match(head))
    positive = not negative and bool(_POS.match(head))
    if not negative and not positive:  # a verdict phrased as a sentence on the first line
        negative = bool(_NEG_ANY.search(head))
        positive = not negative and bool(_POS_ANY.search(head))
    if negative:
        kw_lines = [ln for ln in rest if _KW_PREFIX.match(ln)]
        if kw_lines:
            raw = [_KW_PREFIX.sub("", ln) for ln in kw_lines]
        else:  # no "Keywords:" line: take what follows the verdict
            raw = [after, *rest] if after else rest
        raw = [r for r in raw if r]
        return Reflection(False, keywords=clean_keywords(raw, query), raw_keywords=raw)
    if positive:
        return _enough(([after] if after else []) + rest, n_shown)
    if _KW_PREFIX.match(lines[0]):
        raw = [_KW_PREFIX.sub("", ln) for ln in lines if _KW_PREFIX.match(ln)]
        return Reflection(False, keywords=clean_keywords(raw, query), raw_keywords=raw)
    raise LLMOutputError(f"no verdict in self-reflection answer: {lines[0][:80]!r}")


def _enough(lines: list[str], n_shown: int) -> Reflection:
    relevant: list[str] = []
    cited: list[int] = []
    for ln in lines:
        ln = _BULLET.sub("", _MARKDOWN.sub("", ln)).strip()
        if not ln:
            continue
        relevant.append(ln)
        for c in _CITE.findall(ln):
            i = int(c)
            if 0 <= i < n_shown and i not in cited:
                cited.append(i)
    return Reflection(True, relevant=relevant, cited=cited)


def _hits_of(result: Retrieval | Sequence[Hit]) -> tuple[list[Hit], Usage | None, dict[str, Any]]:
    if isinstance(result, Retrieval):
        return list(result.hits), result.usage, result.diagnostics
    return list(result), None, {}


def _fuse(rankings: list[list[Hit]], rrf_k: int) -> list[Hit]:
    """Merge rankings by reciprocal-rank fusion; one hit per memory id."""
    score: dict[str, float] = {}
    best: dict[str, tuple[int, Hit]] = {}
    latest: dict[str, int] = {}
    for r, hits in enumerate(rankings):
        for rank, h in enumerate(hits):
            mid = h.memory.id
            score[mid] = score.get(mid, 0.0) + 1.0 / (rrf_k + rank + 1)
            latest[mid] = r
            if mid not in best:
                best[mid] = (r, h)
    order = sorted(score, key=lambda mid: (-score[mid], -latest[mid]))
    out: list[Hit] = []
    for mid in order:
        first_round, h = best[mid]
        scores = dict(h.scores)
        scores["reflect_rrf"] = score[mid]
        scores["round"] = float(first_round)
        out.append(Hit(h.memory, score[mid], 0, scores))
    return out


def _cut(hits: list[Hit], k: int | None, budget: int | None) -> list[Hit]:
    """Keep hits in order up to `k` and the token budget (same packing rule as the engine)."""
    out: list[Hit] = []
    used = 0
    for h in hits:
        if budget is not None:
            cost = count_tokens(h.memory.text)
            if used + cost > budget:
                if budget - used < 10:
                    break
                continue
            used += cost
        out.append(Hit(h.memory, h.score, len(out), h.scores))
        if k is not None and len(out) >= k:
            break
    return out


def reflective_retrieve(
    search: SearchFn,
    query: str,
    llm: LLMClient | Any | None,
    *,
    rounds: int = 1,
    k: int | None = None,
    budget_tokens: int | None = None,
    user_id: str = "",
    rrf_k: int = 60,
    show_chars: int = SHOW_CHARS,
) -> Retrieval:
    """Retrieve, let the LLM judge the memories, and retrieve again with its keywords.

    Args:
        search: Runs one retrieval for a query text (e.g. a `ReflectiveMemory.retrieve` bound to
            a user, `k` and budget); returns a `Retrieval` or a ranked list of `Hit`s.
        query: The user's query.
        llm: The judging LLM (anything `LLMClient` accepts); `None` returns the first retrieval
            with `stopped="no_llm"`.
        rounds: Most reflection rounds (LLM calls); 0 disables reflection.
        k: Most hits returned (`None`: no count limit).
        budget_tokens: Token budget for the returned hits' texts (`None`: no budget). With
            neither `k` nor a budget, all merged hits are returned.
        user_id: Owner, copied into the result.
        rrf_k: Fusion constant for merging the rounds' rankings.
        show_chars: Characters of each memory shown to the LLM.

    Returns:
        A `Retrieval` whose `usage` counts the judging calls (and any usage of `search`) and
        whose `diagnostics["reflection"]` holds `rounds` (per round: `query`, `hit_ids`,
        `new_hits`, `verdict`, `keywords`, `relevant`, `cited_ids`), `llm_calls` and `stopped`
        (`enough`, `no_keywords`, `max_rounds`, `llm_error`, `unparsed`, `no_llm`, `disabled`,
        `no_hits`).

    Raises:
        InvalidInputError: `rounds` is negative or the query is empty.
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise InvalidInputError(f"rounds must be a non-negative integer, got {rounds!r}")
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty str")
    client = None if llm is None else (llm if isinstance(llm, LLMClient) else LLMClient(llm))
    usage = Usage()
    first = search(query)
    hits0, u0, base_diag = _hits_of(first)
    if u0 is not None:
        usage.add(u0)
    rankings = [hits0]
    log: list[dict[str, Any]] = [{"round": 0, "query": query, "hit_ids": _ids(hits0)}]
    keywords_all: list[str] = []
    current = _cut(hits0, k, budget_tokens)
    stopped = "max_rounds"
    if client is None:
        stopped = "no_llm"
    elif rounds == 0:
        stopped = "disabled"
    elif not hits0:
        stopped = "no_hits"
    calls = 0
    for r in range(rounds if stopped == "max_rounds" else 0):
        prompt = reflection_prompt(query, [h.memory.text for h in current], show_chars)
        entry = log[-1]
        calls += 1
        try:
            out = client.complete(prompt, usage=usage)  # type: ignore[union-attr]
            verdict = parse_reflection(out, len(current), " ".join([query, *keywords_all]))
        except LLMOutputError as exc:
            usage.failures += 1
            entry["verdict"] = "unparsed"
            logger.warning("self-reflection answer unusable in round %d: %s", r, exc)
            stopped = "unparsed"
            break
        except LLMError as exc:
            entry["verdict"] = "llm_error"
            logger.warning("self-reflection call failed in round %d: %s", r, exc)
            stopped = "llm_error"
            break
        if verdict.enough:
            entry["verdict"] = "enough"
            entry["relevant"] = verdict.relevant
            entry["cited_ids"] = [current[i].memory.id for i in verdict.cited]
            stopped = "enough"
            break
        entry["verdict"] = "missing"
        entry["keywords"] = verdict.keywords
        if not verdict.keywords:
            stopped = "no_keywords"
            break
        keywords_all.extend(verdict.keywords)
        extended = f"{query} {' '.join(keywords_all)}"
        seen = {h.memory.id for ranking in rankings for h in ranking}
        result = search(extended)
        hits, u, _ = _hits_of(result)
        if u is not None:
            usage.add(u)
        rankings.append(hits)
        log.append(
            {
                "round": r + 1,
                "query": extended,
                "hit_ids": _ids(hits),
                "new_hits": sum(1 for h in hits if h.memory.id not in seen),
            }
        )
        current = _cut(_fuse(rankings, rrf_k), k, budget_tokens)
    final = current if len(rankings) > 1 else _cut(hits0, k, budget_tokens)
    diagnostics = dict(base_diag)
    diagnostics["reflection"] = {"rounds": log, "llm_calls": calls, "stopped": stopped}
    rid = first.retrieval_id if isinstance(first, Retrieval) else ""
    uid = first.user_id if isinstance(first, Retrieval) and not user_id else user_id
    rerank = first.rerank if isinstance(first, Retrieval) else None
    return Retrieval(uid, query, final, diagnostics, usage, rid, rerank=rerank)


def _ids(hits: Sequence[Hit]) -> list[str]:
    return [h.memory.id for h in hits]
