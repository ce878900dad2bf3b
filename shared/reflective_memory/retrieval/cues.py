"""What a question asks beyond its words: the present, a named speaker, the user or the assistant.

Read from the question's text by patterns, no model: a present-tense question ("where do I live
now?") wants the newest evidence (`present_tense`); a question naming a speaker ("What does Kate
do on weekends?") is answered by what that person said (`named_speaker`); in a two-role chat,
"I / my" asks for the user's words and "you said / you recommended" for the assistant's
(`addressed_role`). The retrieval pipeline (`reflective_memory.retrieval.votes`) turns these cues
into vote adjustments (`reflective_memory.retrieval.turn_votes`).

The patterns read English. The present cue also reads the other languages of a call's
`languages` (`PassageConfig.languages`): their word for "now" in dateparser's locale data
("jetzt", "maintenant", "ahora", "nå"; `retrieval.time_words.now_spans`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from reflective_memory.retrieval.time_words import ENGLISH, now_spans
from reflective_memory.text import lexical_tokens

__all__ = [
    "asks_when",
    "present_tense",
    "without_present_cue",
    "named_speaker",
    "without_name",
    "addressed_role",
]

_PRESENT = re.compile(
    r"\b(now|currently|current|these days|nowadays|still|at the moment|at present|presently|"
    r"anymore|any more|latest|most recent|most recently|right now)\b",
    re.IGNORECASE,
)


_STATE_NOW = re.compile(  # the user's state, in the simple present: "where do I live?"
    r"\b(?:do I|am I|is my|are my|what's my|who's my|where's my)\b",
    re.IGNORECASE,
)


_WHEN = re.compile(
    r"^\W*(?:when|what (?:date|day|time|year|month)|which (?:date|day|year|month))\b",
    re.IGNORECASE,
)


_PAST = re.compile(
    r"\b(?:initially|originally|at first|first|used to|before|previously|earlier|ago|last|"
    r"back then|once)\b",
    re.IGNORECASE,
)


def present_tense(query: str, languages: Sequence[str] = (ENGLISH,)) -> bool:
    """Whether a question asks about the present state of things.

    Args:
        query: The question.
        languages: The languages it is read in: English by the patterns here (when `en` is
            listed), the others by their word for "now" (`time_words.now_spans`).

    Returns:
        True when it holds a cue such as "now", "currently", "these days", "still", "latest",
        or asks about the user's state in the simple present ("where do I live?", "what is
        my job?" read as "is my") without a cue of the past ("initially", "before", "ago");
        or says "now" in another of `languages`.

    Example:
        >>> present_tense("Where do I live now?"), present_tense("Where did I live in 2020?")
        (True, False)
        >>> present_tense("Where do I live?"), present_tense("Where do I initially keep it?")
        (True, False)
        >>> present_tense("Wo wohne ich jetzt?", ("en", "de"))
        True
    """
    if ENGLISH in languages:
        if _PRESENT.search(query):
            return True
        if _STATE_NOW.search(query) and not _PAST.search(query):
            return True
    return bool(now_spans(query, languages))


def asks_when(query: str) -> bool:
    """Whether a question asks for a time ("When is ...?", "What date ...?").

    Example:
        >>> asks_when("When is my sister's wedding?"), asks_when("Where do I live?")
        (True, False)
    """
    return bool(_WHEN.match(query))


def without_present_cue(query: str, languages: Sequence[str] = (ENGLISH,)) -> str:
    """The question without its present-tense cues, which say *when*, not *what*.

    Searched as words, "these days" matches every turn about days; the cue is used by the
    recency boost instead. A question made only of cues is returned as it is. `languages` as
    for `present_tense`.

    Example:
        >>> without_present_cue("Remind me, where am I living these days?")
        'Remind me, where am I living?'
        >>> without_present_cue("Où est-ce que j'habite maintenant ?", ("en", "fr"))
        "Où est-ce que j'habite?"
    """
    out = _PRESENT.sub(" ", query) if ENGLISH in languages else query
    for start, end in reversed(now_spans(out, languages)):
        out = f"{out[:start]} {out[end:]}"
    out = " ".join(out.split())
    out = re.sub(r"\s+([?.!,;:])", r"\1", out)
    out = re.sub(r"([¿¡])\s+", r"\1", out)
    out = re.sub(r"[,;:]+(?=[?.!]|$)", "", out)
    return out if re.search(r"\w", out) else query


def named_speaker(query: str, speakers: Iterable[str]) -> str | None:
    """The one speaker a question names, if it names exactly one.

    Args:
        query: The question.
        speakers: The roles of the user's turns (speaker names in a chat between people).

    Returns:
        The speaker named as a whole word (any case, possessives too), or None when the
        question names none or several.

    Example:
        >>> named_speaker("What hobbies does Nebraas have?", ["Nicolas", "Nebraas"])
        'Nebraas'
        >>> named_speaker("Did Nicolas meet Nebraas's roommate?", ["Nicolas", "Nebraas"]) is None
        True
    """
    found = [
        s
        for s in speakers
        if s.strip() and re.search(rf"(?<!\w){re.escape(s.strip())}(?!\w)", query, re.IGNORECASE)
    ]
    return found[0] if len(found) == 1 else None


def without_name(query: str, name: str) -> str:
    """The question with a name (and its possessive) taken out, for the rankers.

    Falls back to the question as it is when nothing with content would be left.

    Example:
        >>> without_name("What are Nebraas's hobbies?", "Nebraas")
        'What are hobbies?'
        >>> without_name("Nebraas?", "Nebraas")
        'Nebraas?'
    """
    pattern = rf"(?<!\w){re.escape(name.strip())}(?:['\u2019]s?)?(?!\w)"
    text = " ".join(re.sub(pattern, " ", query, flags=re.IGNORECASE).split())
    text = re.sub(r"\s+([?.!,;:])", r"\1", text)
    return text if lexical_tokens(text) else query


_TO_ASSISTANT = re.compile(  # what the assistant said before, not a request ("can you suggest")
    r"\b(?:you|you've|you have|you had) (?:said|told|gave|given|wrote|written|mentioned|"
    r"recommended|suggested|provided|listed|named|shared|explained|described|made|created|"
    r"proposed|came up with)\b"
    r"|\bdid you (?:say|tell|give|write|mention|recommend|suggest|provide|list|name|share|"
    r"explain|describe)\b"
    r"|\byour (?:suggestion|recommendation|advice|answer|list)",
    re.IGNORECASE,
)
_BACK_TO_CHAT = re.compile(  # both sides spoke: "remind me", "our last chat", "we decided"
    r"\bremind me\b|\bour (?:previous|last|earlier|other) (?:chat|conversation|discussion|talk)"
    r"|\bwe (?:talked|discussed|decided|agreed|chatted)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(r"\b(?:I|my|me|mine|myself|I'm|I've|I'd)\b")


def addressed_role(query: str) -> str | None:
    """Whose words a question about a two-role chat asks for, from its person.

    "What did you recommend for ...?" asks for the assistant's turns; "Where do I work?" for
    the user's. A request ("Can you suggest a show for me?") is answered from what the user
    said they like, so it is the user's. A question back to an earlier chat ("remind me",
    "our previous conversation", "we decided") may be answered by either side: None, as
    for a question with neither cue.

    Example:
        >>> addressed_role("Which hotel did you recommend?"), addressed_role("Where do I work?")
        ('assistant', 'user')
        >>> addressed_role("Can you suggest something I could cook tonight?")
        'user'
        >>> addressed_role("When is the concert?") is None
        True
    """
    if _TO_ASSISTANT.search(query):
        return "assistant"
    if _BACK_TO_CHAT.search(query):
        return None
    if _FIRST_PERSON.search(query):
        return "user"
    return None
