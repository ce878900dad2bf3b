"""`--perturb`: messy histories built from clean dev conversations (issue 49).

Real histories are not the clean chats of the dev sets: people repeat themselves, flood a chat
with near-identical requests, keep logs without session ids, and apps store the assistant's
replies without a time. Each perturbation rewrites loaded conversations (after `--roles`, before
ingestion, the same for every system of a run) deterministically: no randomness, the same output
on every run, the same inserted texts in every conversation (so an embedding cache embeds them
once). Questions and their evidence are kept; turn ids are kept.

* `none`: the conversations as they are.
* `filler`: `FILLER_MIDDLE` (30) near-duplicate request / answer exchanges ("Can you give me
  weekday dinner idea number N for this week?" / "Dinner idea N: ...", a few templates, N
  counting up) inserted in the middle of the middle session (`sessions[(n - 1) // 2]`) and
  `FILLER_LAST` (60) in the middle of the last one (numbered on, 31-90). The user side asks, the
  conversation's first other speaker answers (`assistant` when there is none). Each inserted
  turn takes the time of the turn before it (else the one after it, else the session's date).
* `sessionless`: every turn under one session id (`SESSIONLESS_ID`), sessions in file order, as a
  log without session ids. Each turn keeps its own time when it has one (a timestamp other than
  its session's date); a turn timed only by its session's date (the readers copy the date into
  every turn) gets that date plus one minute per turn before it in its session, so the log's
  times are distinct and in order. Questions' evidence sessions become that one id (session
  recall is then trivially 1; read coverage).
* `bare`: a log of roles and texts only: every turn under one session id (`SESSIONLESS_ID`),
  sessions in file order, no turn and no session with a time (ingestion times them as a
  replayed log). Questions' evidence sessions become that one id, as `sessionless`'s.
* `untimed`: sessions kept, no turn and no session with a time (a log of sessions whose messages
  carry no times).
* `unstamped`: the user side's turns carry a time (their own timestamp, else their session's
  date, written into the turn), every other turn `timestamp=None`, and every session's date is
  cleared: `add_turns` sees timed user turns and untimed assistant turns, with no session date
  to fall back on (ingestion reads only the turns' timestamps).
* `repeated`: every evidence turn the user side said is said again, an exact copy (role and text)
  with a new turn id (`<id>~again1`, `<id>~again2`), in the two sessions after its own (when
  fewer follow it, the nearest before it make up the two; a conversation of one session gets
  none), inserted in the middle of the session with the time of the turn before it. A copy
  counts as the original: `Copies.originals` maps a retrieval's copies back to the original
  turn and session before coverage and session recall are counted, and `bench fit-ranker`
  labels a copy as evidence when its original is.

* `smalltalk`: every session opens with a small-talk exchange of more than two words (short
  turns ride with their anchor, `retrieval.redundancy`; these do not), the user side greeting
  and the conversation's first other speaker answering, in English, German, French, Spanish and
  Norwegian in turn (`small_talk_exchange`: session `i` takes exchange `i`), timed like the
  session's first turn. The same exchanges come back every few sessions, as a person's
  greetings do: near-duplicates said on many days.

Which side is the user: the role `user` in a user / assistant conversation (LongMemEval, or any
chat under `--roles ua`), else the speaker `reflective_bench.roles.user_roles` names (the file's
`speaker_a`, else the first speaker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from reflective_memory.errors import ConfigError
from reflective_memory.io import Conversation, Question, SessionData, load_conversations
from reflective_memory.text import parse_timestamp
from reflective_memory.types import Retrieval

from reflective_bench.roles import ROLES, store_roles, user_roles

__all__ = [
    "PERTURBATIONS",
    "FILLER_MIDDLE",
    "FILLER_LAST",
    "SESSIONLESS_ID",
    "COPIES_PER_TURN",
    "Copies",
    "Perturbed",
    "filler_exchange",
    "small_talk_exchange",
    "perturb",
    "load_perturbed",
    "add_perturb_argument",
]

#: Values of `--perturb`.
PERTURBATIONS = (
    "none",
    "filler",
    "sessionless",
    "bare",
    "untimed",
    "unstamped",
    "repeated",
    "smalltalk",
)
#: Filler exchanges inserted in the middle session and in the last one.
FILLER_MIDDLE = 30
FILLER_LAST = 60
#: The one session id of a `sessionless` conversation.
SESSIONLESS_ID = "log"
#: Copies of each user evidence turn (`repeated`).
COPIES_PER_TURN = 2
_COPY_MARK = "~again"

_REQUESTS = (
    "Can you give me weekday dinner idea number {n} for this week?",
    "Could you suggest dinner idea number {n} for a weeknight this week?",
    "Give me weeknight dinner idea number {n} for this week, please.",
)
_DISHES = (
    "a tray of roasted vegetables with chickpeas and a yogurt sauce",
    "a quick tomato pasta with spinach and parmesan",
    "a rice bowl with fried egg, greens and soy dressing",
    "a lentil soup with crusty bread",
    "tacos with black beans, corn and lime",
)
_ANSWER = "Dinner idea {n}: {dish}, ready in about 30 minutes."
_SMALL_TALK = (
    ("Hey, how is your day going so far?", "Pretty good so far, thanks for asking!"),
    ("Hallo, wie geht es dir heute?", "Mir geht es gut, danke der Nachfrage!"),
    ("Salut, comment ça va aujourd'hui ?", "Ça va bien, merci de demander !"),
    ("Hola, ¿qué tal tu día hoy?", "Muy bien por ahora, ¡gracias por preguntar!"),
    ("Hei, hvordan går det med deg i dag?", "Det går fint, takk som spør!"),
    ("Good morning, I hope you slept well!", "I did, thank you, and you?"),
)

Turn = dict[str, Any]


def filler_exchange(n: int) -> tuple[str, str]:
    """The `n`-th filler exchange (1-based): `(request, answer)`, the same in every run."""
    return (
        _REQUESTS[(n - 1) % len(_REQUESTS)].format(n=n),
        _ANSWER.format(n=n, dish=_DISHES[(n - 1) % len(_DISHES)]),
    )


def small_talk_exchange(i: int) -> tuple[str, str]:
    """The small talk opening session `i` (0-based): `(greeting, answer)`, in turn."""
    return _SMALL_TALK[i % len(_SMALL_TALK)]


@dataclass(frozen=True)
class Copies:
    """Which turns of a `repeated` run are copies, and of what.

    Attributes:
        by_user: `{user id: {copy turn id: (original turn id, original session id)}}`.
    """

    by_user: Mapping[str, Mapping[str, tuple[str, str]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_user.values())

    def original(self, user_id: str, turn_id: str) -> str:
        """The turn `turn_id` stands for: its original when it is a copy, else itself."""
        found = self.by_user.get(user_id, {}).get(turn_id)
        return turn_id if found is None else found[0]

    def originals(self, retrieval: Retrieval) -> Retrieval:
        """`retrieval` with every copy counted as its original, for scoring.

        Each hit holding a copy gets its turn ids mapped to the originals (each once, in
        order) and the original's session as its session (the first copy's, when it holds
        copies of several sessions), so coverage and session recall count a retrieved copy
        as the original turn. Hits without copies are returned as they are.
        """
        table = self.by_user.get(retrieval.user_id)
        if not table:
            return retrieval
        hits = []
        for hit in retrieval.hits:
            ids = hit.memory.turn_ids
            copied = [table[t] for t in ids if t in table]
            if not copied:
                hits.append(hit)
                continue
            mapped = tuple(dict.fromkeys(self.original(retrieval.user_id, t) for t in ids))
            memory = replace(hit.memory, turn_ids=mapped, session_id=copied[0][1])
            hits.append(replace(hit, memory=memory))
        return replace(retrieval, hits=hits)


@dataclass(frozen=True)
class Perturbed:
    """Conversations after a perturbation.

    Attributes:
        name: The perturbation (`PERTURBATIONS`).
        conversations: The conversations to ingest.
        copies: The copies `repeated` made (empty otherwise).
        turns: Turns before and after.
        sessions: Sessions before and after.
    """

    name: str
    conversations: list[Conversation]
    copies: Copies
    turns: tuple[int, int]
    sessions: tuple[int, int]

    def summary(self) -> dict[str, Any]:
        """What the perturbation did, JSON-friendly (`--json`'s `perturb`)."""
        return {
            "name": self.name,
            "turns": list(self.turns),
            "sessions": list(self.sessions),
            "copies": len(self.copies),
        }

    def line(self) -> str:
        """One printed line: the name and the turn and session counts before and after."""
        out = (
            f"perturb: {self.name}; turns {self.turns[0]} -> {self.turns[1]}, "
            f"sessions {self.sessions[0]} -> {self.sessions[1]}"
        )
        return out + (f", {len(self.copies)} copies" if self.name == "repeated" else "")


def _when(turn: Turn, session: SessionData) -> Any:
    """A turn's time as add_turns would read it: its timestamp, else its session's date."""
    stamp = turn.get("timestamp")
    return session.date if stamp is None else stamp


def _insert(session: SessionData, new: list[Turn]) -> SessionData:
    """`session` with `new` (turns without times) in its middle, timed like their neighbour."""
    at = len(session.turns) // 2
    near = session.turns[at - 1] if at > 0 else (session.turns[0] if session.turns else None)
    stamp = session.date if near is None else _when(near, session)
    timed = [{**t, "timestamp": stamp} for t in new]
    return replace(session, turns=[*session.turns[:at], *timed, *session.turns[at:]])


def _ids(conv: Conversation) -> set[str]:
    return {str(t["turn_id"]) for s in conv.sessions for t in s.turns if t.get("turn_id")}


def _check_new(conv: Conversation, new: Iterable[str]) -> None:
    """Refuse a made-up turn id the conversation already uses (before anything is stored)."""
    clash = sorted(_ids(conv) & set(new))
    if clash:
        raise ConfigError(
            f"conversation {conv.user_id!r} already has turn ids {clash[:3]} that the "
            "perturbation would add"
        )


def _filler_turns(conv: Conversation, user: str, first: int, count: int) -> list[Turn]:
    other = _other(conv, user)
    out: list[Turn] = []
    for n in range(first, first + count):
        request, answer = filler_exchange(n)
        out.append({"role": user, "text": request, "turn_id": f"filler:{n}:q"})
        out.append({"role": other, "text": answer, "turn_id": f"filler:{n}:a"})
    return out


def _filler(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    if not conv.sessions:
        return conv, {}
    middle = (len(conv.sessions) - 1) // 2
    last = len(conv.sessions) - 1
    added: dict[int, list[Turn]] = {middle: _filler_turns(conv, user, 1, FILLER_MIDDLE)}
    more = _filler_turns(conv, user, FILLER_MIDDLE + 1, FILLER_LAST)
    added[last] = [*added.get(last, []), *more]
    _check_new(conv, (str(t["turn_id"]) for ts in added.values() for t in ts))
    sessions = [_insert(s, added[i]) if i in added else s for i, s in enumerate(conv.sessions)]
    return replace(conv, sessions=sessions), {}


def _other(conv: Conversation, user: str) -> str:
    """The conversation's first speaker who is not `user` (`assistant` when there is none)."""
    return next(
        (str(t["role"]) for s in conv.sessions for t in s.turns if t["role"] != user),
        "assistant",
    )


def _smalltalk(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    other = _other(conv, user)
    new = {f"smalltalk:{i}:{side}" for i in range(len(conv.sessions)) for side in "qa"}
    _check_new(conv, new)
    sessions = []
    for i, s in enumerate(conv.sessions):
        stamp = _when(s.turns[0], s) if s.turns else s.date
        greeting, answer = small_talk_exchange(i)
        opening = [
            {"role": user, "text": greeting, "turn_id": f"smalltalk:{i}:q", "timestamp": stamp},
            {"role": other, "text": answer, "turn_id": f"smalltalk:{i}:a", "timestamp": stamp},
        ]
        sessions.append(replace(s, turns=[*opening, *s.turns]))
    return replace(conv, sessions=sessions), {}


def _sessionless(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    del user  # every side alike
    turns: list[Turn] = []
    for s in conv.sessions:
        date = parse_timestamp(s.date)
        for k, t in enumerate(s.turns):
            own = parse_timestamp(t.get("timestamp"))
            if date is not None and (own is None or own == date):
                turns.append({**t, "timestamp": (date + timedelta(minutes=k)).isoformat()})
            else:
                turns.append(dict(t))
    first = next((s.date for s in conv.sessions if s.date is not None), None)
    questions = [
        replace(q, evidence_sessions=[SESSIONLESS_ID]) if q.evidence_sessions else q
        for q in conv.questions
    ]
    sessions = [SessionData(SESSIONLESS_ID, turns, first)] if turns else []
    return replace(conv, sessions=sessions, questions=questions), {}


def _untimed(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    del user  # every side alike
    sessions = [
        SessionData(s.session_id, [{**t, "timestamp": None} for t in s.turns], None)
        for s in conv.sessions
    ]
    return replace(conv, sessions=sessions), {}


def _bare(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    return _untimed(_sessionless(conv, user)[0], user)


def _unstamped(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    sessions = [
        SessionData(
            s.session_id,
            [{**t, "timestamp": _when(t, s) if t["role"] == user else None} for t in s.turns],
            None,
        )
        for s in conv.sessions
    ]
    return replace(conv, sessions=sessions), {}


def _targets(index: int, n_sessions: int) -> list[int]:
    """The sessions a turn of session `index` is said again in: the next two, else nearest."""
    after = list(range(index + 1, n_sessions))
    before = list(range(index - 1, -1, -1))
    return (after + before)[:COPIES_PER_TURN]


def _evidence(questions: list[Question]) -> set[str]:
    return {e for q in questions for e in q.evidence}


def _repeated(conv: Conversation, user: str) -> tuple[Conversation, dict[str, tuple[str, str]]]:
    evidence = _evidence(conv.questions)
    added: dict[int, list[Turn]] = {}
    copies: dict[str, tuple[str, str]] = {}
    for i, s in enumerate(conv.sessions):
        for t in s.turns:
            tid = t.get("turn_id")
            if tid not in evidence or t["role"] != user:
                continue
            for k, target in enumerate(_targets(i, len(conv.sessions)), 1):
                copy = f"{tid}{_COPY_MARK}{k}"
                copies[copy] = (str(tid), s.session_id)
                added.setdefault(target, []).append(
                    {"role": t["role"], "text": t["text"], "turn_id": copy}
                )
    _check_new(conv, copies)
    sessions = [_insert(s, added[i]) if i in added else s for i, s in enumerate(conv.sessions)]
    return replace(conv, sessions=sessions), copies


_RULES: dict[str, Callable[[Conversation, str], tuple[Conversation, dict[str, tuple[str, str]]]]]
_RULES = {
    "filler": _filler,
    "sessionless": _sessionless,
    "bare": _bare,
    "untimed": _untimed,
    "unstamped": _unstamped,
    "repeated": _repeated,
    "smalltalk": _smalltalk,
}


#: The perturbations that tell the user side from the other.
_SIDED = ("filler", "unstamped", "repeated", "smalltalk")


def _check_name(name: str) -> None:
    if name not in PERTURBATIONS:
        raise ConfigError(f"--perturb must be one of {PERTURBATIONS}, not {name!r}")


def perturb(
    conversations: list[Conversation], name: str, user_roles: Mapping[str, str]
) -> Perturbed:
    """Apply one perturbation to every conversation (a new list; the input is not changed).

    Args:
        conversations: Loaded conversations, roles already mapped (`--roles`).
        name: One of `PERTURBATIONS`.
        user_roles: The role of each conversation's user side, by user id
            (`reflective_bench.roles.user_roles`); `none`, `sessionless`, `bare` and `untimed`
            do not read it.

    Returns:
        The perturbed conversations, the copies made and the counts before and after.

    Raises:
        ConfigError: Unknown name, a conversation without its user side, or a made-up turn
            id the data already uses.
    """
    _check_name(name)
    if name in _SIDED:
        missing = [c.user_id for c in conversations if c.user_id not in user_roles]
        if missing:
            raise ConfigError(f"no user side given for conversations {missing[:3]}")
    out = list(conversations)
    copies: dict[str, dict[str, tuple[str, str]]] = {}
    if name != "none":
        out = []
        for conv in conversations:
            changed, made = _RULES[name](conv, user_roles.get(conv.user_id, "user"))
            out.append(changed)
            if made:
                copies[conv.user_id] = made
    return Perturbed(
        name,
        out,
        Copies(copies),
        (sum(c.n_turns for c in conversations), sum(c.n_turns for c in out)),
        (sum(len(c.sessions) for c in conversations), sum(len(c.sessions) for c in out)),
    )


def load_perturbed(
    path: str | Path, roles: str, limit: int | None, name: str
) -> tuple[Perturbed, dict[str, str]]:
    """Load a bench data file as `bench retrieval` and `bench fit-ranker` store it.

    The conversations are read, cut to the first `limit`, stored under `roles`
    (`reflective_bench.roles.store_roles`) and then perturbed.

    Args:
        path: The conversation file.
        roles: `names` or `ua`.
        limit: Only the first N conversations (`None`: all).
        name: The perturbation (`none` for the data as it is).

    Returns:
        The perturbed conversations and the user side of every conversation `ua` converted.

    Raises:
        ConfigError: Unknown perturbation or roles (before the file is read).
    """
    _check_name(name)
    convs = load_conversations(path)
    if limit is not None:
        convs = convs[:limit]
    convs, sides = store_roles(convs, roles, path)
    users = user_roles(convs, path) if name in _SIDED else {}
    return perturb(convs, name, users), sides


def add_perturb_argument(parser: Any) -> None:
    """Add `--perturb` (the bench commands that load dev conversations share it)."""
    parser.add_argument(
        "--perturb",
        choices=PERTURBATIONS,
        default="none",
        help="messy-history variant of the data: filler (30 and 60 near-duplicate exchanges in "
        "the middle and last session), sessionless (one session id, per-turn times), bare (one "
        "session id, no times), untimed (sessions, no times), unstamped (only the user side's "
        "turns timed), repeated (each user evidence turn said again in two later sessions; a "
        "copy counts as the original), smalltalk (every session opens with small talk of over "
        "two words, in five languages in turn). See reflective_bench.perturb",
    )


def add_data_arguments(parser: Any) -> None:
    """Add `--data FILE[:ROLES]` (repeatable) and `--limit` (the fit commands share them)."""
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        help="conversation file, optionally ':names' or ':ua' (repeatable)",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N conversations")


def load_data_spec(spec: str, limit: int | None, name: str) -> tuple[str, Perturbed]:
    """`FILE[:ROLES]` of `--data` loaded as `load_perturbed` loads it, with its label.

    Raises:
        SystemExit: ROLES is neither `names` nor `ua`.
    """
    path, _, roles = spec.partition(":")
    roles = roles or "names"
    if roles not in ROLES:
        raise SystemExit(f"--data {spec}: roles must be one of {ROLES}")
    data, _ = load_perturbed(path, roles, limit, name)
    return f"{Path(path).name}:{roles}", data
