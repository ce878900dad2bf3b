"""RMM's retrospective reflection: citations teach the turn ranker, the model that fills the budget.

The learned `TurnRanker` (`reflective_memory.retrieval.ranker`) scores every voted turn
`exp(w · x)`; its weights ship fitted offline (the *prior*). `TurnLearning` keeps what
citations teach on top of it, as offsets by feature name:

- the memory's *shared* offsets (owner `PRIOR_OWNER`), learned from every user's feedback;
- each user's own offsets (scope `user`), learned from that user's feedback and pulled back
  toward zero (the shared weights) by `RerankConfig.turn_pull` at every step.

An episode is one feedback call on a retrieval: its shown passages, each a group of turn
feature rows, cited or not. A passage's log-score is the log of its turns' summed scores
(`logsumexp(w · x)`); the update
(`RerankConfig.turn_update`) is one step on the shown passages: by default (`expected`) up
the gradient of the expected reward (+1 cited, -1 not) under a softmax over them, RMM's
REINFORCE step in expectation; `reinforce` weighs each passage alike with the episode's mean
reward as baseline; `pairwise` steps on every (cited, not cited) pair's logistic loss. Under
the first two, citations that do not depend on the passages teach nothing on average.

**The gate.** What is learned ranks only once it has shown that it ranks citations better
than the weights it would replace. Each episode judges the offsets learned so far
(prequential: on citations they have not learned from), and offsets serve while the mean of
their gains is above `GATE_SIGMAS` (2.5) standard errors (`_beats`). The gain of an episode is:

- for an *explored* retrieval (`retrieve(explore=True)`), an interleaved comparison
  (`interleaved_gain`): the retrieval showed the team-draft interleaving of two rankings
  (`rivals`: the served weights against the weights with every learned offset while some do
  not serve yet; once all serve, the prior against them, so they keep being judged), and the
  gain is the share of the learned team's passages cited minus that of the other team's. It
  sees the turns only the learned weights would show; a reader citing at random favours
  neither team whatever the rankings are (`retrieval.interleave`);
- otherwise, the average precision of the cited passages among the shown ones
  (`average_precision`) under the learned weights minus that under the weights without them
  (the shared offsets against the prior, a user's own against the prior plus the shared
  offsets if those serve). Random citations give every ranking of the shown passages the same
  expected precision; consistent citations the prior ranks badly pass.

A user's weights are the prior, plus the shared offsets if they serve, plus the user's own if
they serve; `inspect` shows each gate (`judged`, `mean_gain`, `serves`).

Saving is batched: an episode changes the weights in memory at once (the next retrieval of
this process ranks with them); the change is written to the `StateStore` when
`RerankConfig.save_every` episodes are waiting or `save_seconds` passed since the last save,
and at `flush` / engine close; a retrieval stores what waits once `save_seconds` passed. A
crash loses at most that window. A save adds this process's change since its last save to
what is stored (a read-modify-write), so processes sharing a store lose none of each other's
updates; after a save a process reads the offsets again when next used, so it sees the others'
updates (and a user deleted elsewhere) within one save window.

**A deletion anywhere wins.** A user's stored offsets carry a *generation*: a random id given
when the state is first stored (before the user's first episode is learned on it) and kept by
every save after. `delete_user` erases the state, so a state stored again later has another
generation. A save adds a user's unsaved change only to the generation it was learned on,
checked inside the store's atomic update: when the user was deleted since (in this process or
any other sharing the store), the change is dropped, never written, and the process starts
from what is stored now. The shared offsets keep what the user's citations taught them, saved
or not, exactly as `forget` (an in-process `delete_user`) leaves them: a few aggregate weights
learned from everyone, no text.

Each state is one JSON document (`FORMAT`: feature names, offsets, episode count) sealed with
a checksum (`reflective_memory.rmm.sealed`), checked when read: a damaged one is set aside with
a warning and learning starts again from zero. Offsets are stored by feature name, so a
feature added to the ranker starts at zero and one removed is dropped.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from reflective_memory.errors import ModelLoadError
from reflective_memory.retrieval.features import FEATURES
from reflective_memory.retrieval.interleave import LEARNED, SERVED
from reflective_memory.retrieval.ranker import TurnRanker
from reflective_memory.rmm.config import RerankConfig
from reflective_memory.rmm.sealed import seal, unseal
from reflective_memory.storage.state import SetsAside, StateStore

__all__ = [
    "TurnLearning",
    "TurnEpisode",
    "TurnFit",
    "FORMAT",
    "PRIOR_OWNER",
    "SHARED_STATE",
    "USER_STATE",
    "passage_gradient",
    "average_precision",
    "GATE_SIGMAS",
    "gate_t",
    "episode_from_record",
    "interleaved_gain",
]

logger = logging.getLogger(__name__)

FORMAT = "reflective-memory/turn-ranker-offsets/1"
#: State owner of the memory's shared offsets.
PRIOR_OWNER = "__shared__"
#: State name of the shared offsets (owner `PRIOR_OWNER`).
SHARED_STATE = "rmm.turn_ranker"
#: State name of a user's own offsets (owner: the user id).
USER_STATE = "rmm.turn_ranker.user"
#: Largest offset magnitude a stored state may hold (a bigger one is damage, not learning).
_MAX_OFFSET = 1e3
#: Users whose offsets a process keeps in memory.
_USER_CACHE = 4096
#: Learned offsets serve while the mean of their prequential gains (see `TurnLearning.learn`)
#: is above this many standard errors: a one-sided test at about 0.6% by chance. A REALTALK
#: run of `bench feedback` keeps 18 gates (a shared and five users' per split, three splits);
#: at 2.0 (2.3% each) random citations opened one in about every other run (+0.5 points at
#: 250 words), at 2.5 none did, and the cosine start still opens in every split (BENCHMARKS.md).
GATE_SIGMAS = 2.5


class _Erased(Exception):
    """The stored state a user's unsaved change was learned on is gone (the user was deleted)."""


@dataclass(frozen=True)
class TurnEpisode:
    """One feedback episode: the shown passages as groups of turn feature rows.

    Attributes:
        rows: Feature rows of the shown turns (`FEATURES` columns), `(n, len(FEATURES))`.
        groups: The shown passage (0, 1, ...) each row belongs to.
        cited: Per shown passage, whether the answer cited it.
        teams: Per shown passage, the team of an interleaved retrieval that placed it
            (`retrieval.interleave`: `LEARNED`, `SERVED`), or None when the retrieval was not
            interleaved.
    """

    rows: np.ndarray
    groups: np.ndarray
    cited: tuple[bool, ...]
    teams: tuple[int, ...] | None = None


@dataclass
class TurnFit:
    """What one episode did to the weights.

    Attributes:
        loss: The episode's loss before the step.
        step: Size (L2) of the change of the served weights.
        episodes: Episodes the shared offsets learned from, this one included.
        pending: Episodes learned but not yet saved.
        serving: Whether what this user's feedback taught ranks their next retrieval (the
            gate, see `TurnLearning`).
    """

    loss: float
    step: float
    episodes: int
    pending: int
    serving: bool = False


def _logsumexp_groups(
    scores: np.ndarray, groups: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per group, `log Σ exp(score)` and each row's share of its group's sum.

    A group without rows (a shown passage none of whose turns has a feature row) scores -inf.
    """
    top = np.full(n, -np.inf)
    np.maximum.at(top, groups, scores)
    e = np.exp(scores - top[groups])
    total = np.zeros(n)
    np.add.at(total, groups, e)
    with np.errstate(divide="ignore"):
        return top + np.log(total), e / total[groups]


def passage_gradient(
    weights: np.ndarray, episode: TurnEpisode, update: str
) -> tuple[float, np.ndarray] | None:
    """Loss and gradient (w.r.t. the weights) of one episode; None when it teaches nothing.

    A passage's log-score is `logsumexp` of its turns' `w · x`; its gradient is its turns'
    rows weighed by their share of the passage's score.

    Args:
        weights: The weights to step from, `(len(FEATURES),)`.
        episode: The episode.
        update: `expected` (minus the expected reward, +1 cited / -1 not, under a softmax
            over the shown passages' log-scores: REINFORCE's step in expectation, which fades
            once the cited passages are the likely ones), `reinforce` (REINFORCE with the
            episode's mean reward as baseline, each passage weighed alike) or `pairwise` (mean
            logistic loss over every cited / not-cited pair).

    Returns:
        `(loss, gradient)`, or None when no passage or every passage is cited.
    """
    cited = np.asarray(episode.cited, dtype=bool)
    if len(cited) < 2 or cited.all() or not cited.any():
        return None
    n, rows, groups = len(cited), episode.rows, episode.groups
    s, share = _logsumexp_groups(rows @ weights, groups, n)
    g = np.zeros((n, rows.shape[1]))
    np.add.at(g, groups, rows * share[:, None])
    pos, neg = np.flatnonzero(cited), np.flatnonzero(~cited)
    if update == "pairwise":
        margin = s[pos][:, None] - s[neg][None, :]
        loss = float(np.mean(np.logaddexp(0.0, -margin)))
        coef = -1.0 / (1.0 + np.exp(margin))  # d loss / d margin
        grad = (coef.sum(1) @ g[pos] - coef.sum(0) @ g[neg]) / margin.size
        return loss, grad
    r = np.where(cited, 1.0, -1.0)
    p = np.exp(s - s.max())
    p /= p.sum()
    if update == "expected":
        # the gradient of the expected reward under the softmax: weighted by each passage's
        # probability, it fades once the cited passages are the likely ones
        rbar = float(p @ r)
        return 1.0 - rbar, -((p * (r - rbar)) @ g)
    # reinforce: each shown passage's reward (+1 cited, -1 not) minus the episode's mean, times
    # the gradient of its log-probability under a softmax over the shown passages; the mean
    # baseline makes rewards that do not depend on the passages (noise) teach nothing on average
    adv = r - r.mean()
    loss = -float(adv @ np.log(np.maximum(p, 1e-300))) / n
    return loss, -(adv @ (g - p @ g)) / n


def average_precision(weights: np.ndarray, episode: TurnEpisode) -> float | None:
    """How well `weights` put the cited passages first among the shown ones.

    Each shown passage scores the `logsumexp` of its turns' log-scores; the result is the
    average precision of the cited passages in that ranking (1.0: every cited passage above
    every other). Citations that do not depend on the passages give every ranking the same
    expected precision. (Ranked among the best unshown turns too, never cited, random
    citations favoured weights that keep unshown turns down: the gate opened on them.)

    Returns:
        The average precision, or None when nothing is cited.
    """
    cited = np.asarray(episode.cited, dtype=bool)
    if not cited.any():
        return None
    scores, _ = _logsumexp_groups(episode.rows @ weights, episode.groups, len(cited))
    hit = cited[np.argsort(-scores, kind="stable")]
    ranks = np.flatnonzero(hit) + 1
    return float(np.mean(np.arange(1, len(ranks) + 1) / ranks))


@dataclass
class _Offsets:
    """One owner's offsets as this process sees them: stored base plus unsaved change."""

    base: np.ndarray
    change: np.ndarray
    episodes: int = 0
    unsaved: int = 0
    version: int = 0
    judged: int = 0
    gain: float = 0.0
    gain2: float = 0.0
    new_judged: int = 0
    new_gain: float = 0.0
    new_gain2: float = 0.0
    generation: str | None = None

    @property
    def value(self) -> np.ndarray:
        return self.base + self.change

    @property
    def serves(self) -> bool:
        """Whether the offsets beat the weights they would replace (see `_beats`)."""
        return _beats(*self.gate())

    def adopt(self, other: _Offsets) -> None:
        """Become `other` (in place: callers hold this object)."""
        vars(self).update(vars(other))

    def gate(self) -> tuple[int, float, float]:
        """Episodes judged, and the sum and sum of squares of their gains."""
        return (
            self.judged + self.new_judged,
            self.gain + self.new_gain,
            self.gain2 + self.new_gain2,
        )

    def judge(self, gain: float) -> None:
        """Count one episode's prequential gain."""
        self.new_judged += 1
        self.new_gain += gain
        self.new_gain2 += gain * gain


def interleaved_gain(episode: TurnEpisode) -> float | None:
    """How much more the reader cited the learned weights' passages than the served weights'.

    The share of the passages the learned weights placed that were cited, minus that share
    of the passages the serving weights placed (`retrieval.interleave`). A reader citing at
    random gives both teams the same expected share, whatever the two rankings are.

    Returns:
        The difference, or None when the episode was not interleaved, a team placed no shown
        passage, or nothing was cited.
    """
    if episode.teams is None or not any(episode.cited):
        return None
    teams, cited = np.asarray(episode.teams), np.asarray(episode.cited, dtype=bool)
    learned, served = teams == LEARNED, teams == SERVED
    if not learned.any() or not served.any():
        return None
    return float(cited[learned].mean() - cited[served].mean())


def _judge(off: _Offsets, episode: TurnEpisode, learned: np.ndarray, base: np.ndarray) -> None:
    """Count whether `learned` ranked the episode's citations better than `base` (prequential)."""
    if not off.value.any():
        return
    a, b = average_precision(learned, episode), average_precision(base, episode)
    if a is not None and b is not None:
        off.judge(a - b)


def _gate(off: _Offsets) -> dict[str, Any]:
    """An owner's gate as `inspect` shows it."""
    n, total, squares = off.gate()
    return {
        "judged": n,
        "mean_gain": total / n if n else 0.0,
        "t": gate_t(n, total, squares),
        "serves": off.serves,
    }


def gate_t(n: int, total: float, squares: float) -> float:
    """The mean gain of `n` judged episodes in standard errors (0.0 under two episodes).

    Gains lie in [-1, 1]. The spread is estimated with one more episode of the largest
    variance a gain can have (1): a few equal gains (a reader citing at random gives
    interleaved gains of exactly +-0.5 often) do not look certain.
    """
    if n < 2:
        return 0.0
    var = (max(squares - total * total / n, 0.0) + 1.0) / n
    return (total / n) / math.sqrt(var / n)


def _beats(n: int, total: float, squares: float) -> bool:
    """Whether the mean gain of `n` judged episodes is above `GATE_SIGMAS` standard errors."""
    return total > 0 and gate_t(n, total, squares) > GATE_SIGMAS


def _encode(
    values: np.ndarray, episodes: int, gate: tuple[int, float, float], generation: str
) -> bytes:
    doc = {
        "format": FORMAT,
        "features": list(FEATURES),
        "offsets": [float(v) for v in values],
        "episodes": int(episodes),
        "judged": int(gate[0]),
        "gain": float(gate[1]),
        "gain2": float(gate[2]),
        "generation": generation,
    }
    return seal(json.dumps(doc, separators=(",", ":")).encode())


@dataclass(frozen=True)
class _Stored:
    """A stored state, decoded: offsets in `FEATURES` order, episodes, gate sums, generation."""

    values: np.ndarray
    episodes: int
    gate: tuple[int, float, float]
    generation: str

    def offsets(self, version: int) -> _Offsets:
        """Offsets resting on this state (stored as `version`), with nothing unsaved."""
        judged, gain, gain2 = self.gate
        return _Offsets(
            self.values,
            np.zeros(len(FEATURES)),
            self.episodes,
            version=version,
            judged=judged,
            gain=gain,
            gain2=gain2,
            generation=self.generation,
        )


def _decode(data: bytes) -> _Stored:
    """A stored state's bytes, decoded (a state stored before generations has generation "").

    Raises:
        ModelLoadError: The seal, format, names or values are wrong.
    """
    payload, _ = unseal(data)
    try:
        doc = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"turn ranker offsets are not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelLoadError(f"turn ranker offsets are not a {FORMAT} document")
    names, values, episodes = doc.get("features"), doc.get("offsets"), doc.get("episodes")
    judged, gain, gain2 = doc.get("judged", 0), doc.get("gain", 0.0), doc.get("gain2", 0.0)
    generation = doc.get("generation", "")
    counts_ok = all(
        not isinstance(c, bool) and isinstance(c, int) and c >= 0 for c in (episodes, judged)
    )
    sums_ok = all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        for v in (gain, gain2)
    )
    if (
        not isinstance(names, list)
        or not isinstance(values, list)
        or len(names) != len(values)
        or not counts_ok
        or not sums_ok
        or gain2 < 0
        or abs(gain) > judged
        or not isinstance(generation, str)
    ):
        raise ModelLoadError(
            "turn ranker offsets: features, offsets, episodes, the gate's sums or the "
            "generation malformed"
        )
    out = np.zeros(len(FEATURES))
    where = {n: i for i, n in enumerate(FEATURES)}
    for name, v in zip(names, values, strict=True):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ModelLoadError(f"turn ranker offset {name!r} is not a finite number")
        if abs(v) > _MAX_OFFSET:
            raise ModelLoadError(f"turn ranker offset {name!r} is out of bounds ({v})")
        if name in where:  # a feature the ranker no longer has is dropped
            out[where[name]] = float(v)
    gate = (cast(int, judged), float(gain), float(gain2))
    return _Stored(out, cast(int, episodes), gate, generation)


class TurnLearning:
    """The turn ranker's weights per user, taught by citations (see the module docs).

    Args:
        config: The feedback settings (`MemoryConfig.rerank`).
        prior: The fitted ranker retrieval starts from (`passages.ranker`).
        state: Where the offsets are stored.
        clock: Seconds, for `save_seconds` (a test may pass its own).
    """

    def __init__(
        self,
        config: RerankConfig,
        prior: TurnRanker,
        state: StateStore,
        clock: Any = time.monotonic,
    ) -> None:
        self.config, self.prior, self.state, self.clock = config, prior, state, clock
        self.prior_vector = prior.vector.astype(np.float64)
        self.lock = threading.RLock()
        self._shared: _Offsets | None = None
        self._users: OrderedDict[str, _Offsets] = OrderedDict()
        self._saved_at = clock()
        self._rng = np.random.default_rng(config.seed)

    # ------------------------------------------------------------------ reading
    def _load(self, owner: str, name: str) -> _Offsets:
        """An owner's stored offsets (zero when none or damaged: set aside with a warning)."""
        got = self.state.get(owner, name)
        if got is None:
            return _Offsets(np.zeros(len(FEATURES)), np.zeros(len(FEATURES)))
        version, data = got
        try:
            return _decode(data).offsets(version)
        except ModelLoadError as exc:
            self._set_aside(owner, name, version, exc)
            return _Offsets(np.zeros(len(FEATURES)), np.zeros(len(FEATURES)))

    def _set_aside(self, owner: str, name: str, version: int, exc: Exception) -> None:
        if isinstance(self.state, SetsAside):
            where = self.state.set_aside(owner, name, version)
            done = "still in place" if where is None else f"set aside as {where}"
        else:
            self.state.delete(owner, name)
            done = "deleted"
        logger.warning(
            "damaged learned state %r of %r (%s): %s; it starts again from zero",
            name,
            owner,
            exc,
            done,
        )

    def _shared_offsets(self) -> _Offsets:
        if self._shared is None:
            self._shared = self._load(PRIOR_OWNER, SHARED_STATE)
        return self._shared

    def _user_offsets(self, user_id: str) -> _Offsets:
        got = self._users.get(user_id)
        if got is None:
            got = self._users[user_id] = self._load(user_id, USER_STATE)
            while len(self._users) > _USER_CACHE:
                old, off = next(iter(self._users.items()))
                if off.unsaved:
                    self._save(old, USER_STATE, off)
                self._users.pop(old)
        self._users.move_to_end(user_id)
        return got

    def weights(self, user_id: str) -> np.ndarray:
        """The weights that rank `user_id`'s turns, in `FEATURES` order.

        The prior when learning is off; else the prior plus the shared offsets (scopes `user`
        and `shared`) and the user's own (scopes `user` and `isolated`), each only while it
        serves (has beaten what it would replace, see the module docs).
        """
        if not self.config.enabled:
            return self.prior_vector
        with self.lock:
            if self.clock() - self._saved_at >= self.config.save_seconds:
                self.flush()  # store what waits, see what other processes stored
            return self._served(user_id)[0]

    def _served(self, user_id: str) -> tuple[np.ndarray, np.ndarray]:
        """The weights that rank the user's turns, and those without the user's own offsets."""
        scope = self.config.scope
        w = self.prior_vector
        if scope != "isolated":
            shared = self._shared_offsets()
            if shared.serves:
                w = w + shared.value
        if scope != "shared":
            own = self._user_offsets(user_id)
            if own.serves:
                return w + own.value, w
        return w, w

    def _learned_offsets(self, user_id: str) -> list[_Offsets]:
        """The user's offsets (shared, own, as the scope has them) that hold something."""
        scope, out = self.config.scope, []
        if scope != "isolated" and self._shared_offsets().value.any():
            out.append(self._shared_offsets())
        if scope != "shared" and self._user_offsets(user_id).value.any():
            out.append(self._user_offsets(user_id))
        return out

    def _judged(self, user_id: str) -> list[_Offsets]:
        """The offsets an interleaving of `rivals` judges: those that do not serve, else all."""
        learned = self._learned_offsets(user_id)
        waiting = [off for off in learned if not off.serves]
        return waiting or learned

    def rivals(self, user_id: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The two weights an explored retrieval interleaves, so citations judge what is learned.

        `(served, learned)`: the served weights against those with every learned offset, while
        some offsets do not serve yet; once all serve, the prior against them, so what serves
        keeps being judged (and stops serving when later citations say so). An explored
        retrieval shows their team-draft interleaving (`retrieval.interleave`) and its
        citations judge the offsets (`learn`). None when learning is off or nothing is learned.
        """
        if not self.config.enabled:
            return None
        with self.lock:
            learned = self._learned_offsets(user_id)
            if not learned:
                return None
            w = self.prior_vector + sum(off.value for off in learned)
            if any(not off.serves for off in learned):
                return self._served(user_id)[0], w
            return self.prior_vector, w

    def coin(self) -> bool:
        """A fair coin from the learner's seeded generator (who picks first when interleaving)."""
        with self.lock:
            return bool(self._rng.random() < 0.5)

    def explore_noise(self, n: int) -> np.ndarray:
        """Gumbel noise for `n` turn log-scores at temperature `rerank.tau` (exploration).

        Added to the scores of a `retrieve(explore=True)`, it samples what is shown as RMM
        samples its top-M: a turn just below the budget is sometimes shown, and citations of
        it teach what the ranker's own choice could not.
        """
        with self.lock:
            u = self._rng.random(n)
        return -np.log(-np.log(np.clip(u, 1e-12, 1 - 1e-12))) * self.config.tau

    def episodes(self) -> int:
        """Episodes the shared offsets learned from (stored and unsaved)."""
        with self.lock:
            return self._shared_offsets().episodes

    def inspect(self, user_id: str | None = None) -> dict[str, Any]:
        """The prior, the shared offsets and (given a user) the user's, by feature name.

        Returns:
            `{"features": [...], "prior": {...}, "shared": {...}, "weights": {...},
            "episodes": n, "shared_gate": {...}}` and, for a user, `"user": {...}`,
            `"user_episodes": n`, `"user_gate": {...}`; `weights` are the ones that rank (the
            user's when given); a gate is `{"judged": n, "mean_gain": x, "t": x, "serves":
            bool}`, `t` the mean gain in standard errors (`gate_t`; it serves above
            `GATE_SIGMAS`).
        """
        with self.lock:
            shared = self._shared_offsets()
            out: dict[str, Any] = {
                "features": list(FEATURES),
                "prior": dict(zip(FEATURES, self.prior_vector.tolist(), strict=True)),
                "shared": dict(zip(FEATURES, shared.value.tolist(), strict=True)),
                "episodes": shared.episodes,
                "shared_gate": _gate(shared),
            }
            w = self.prior_vector + shared.value if shared.serves else self.prior_vector
            if user_id is not None:
                own = self._user_offsets(user_id)
                out["user"] = dict(zip(FEATURES, own.value.tolist(), strict=True))
                out["user_episodes"] = own.episodes
                out["user_gate"] = _gate(own)
                w = self.weights(user_id)
            out["weights"] = dict(zip(FEATURES, w.tolist(), strict=True))
            return out

    # ----------------------------------------------------------------- learning
    def learn(self, user_id: str, episode: TurnEpisode) -> TurnFit | None:
        """One step on an episode (None when it teaches nothing: all or none cited).

        First the episode judges what was learned so far, before learning from it: the shared
        offsets against the prior, the user's against the weights without them (see
        `average_precision`). Then the shared offsets (scopes `user`, `shared`) step at
        `turn_learning_rate`, pulled toward the prior by `turn_prior_pull`; the user's own
        (scopes `user`, `isolated`) at `turn_user_learning_rate`, pulled toward the shared
        weights by `turn_pull`. The step is taken at the learned weights, served or not.
        """
        cfg = self.config
        with self.lock:
            if self.clock() - self._saved_at >= cfg.save_seconds:
                self.flush()
            prior = self.prior_vector
            shared = self._shared_offsets()
            learned = prior.copy()
            gain = interleaved_gain(episode)
            if gain is not None:
                # an interleaved retrieval: its citations judge the offsets the learned team
                # ranked with and the other team did not (see `rivals`)
                for off in self._judged(user_id):
                    off.judge(gain)
            if cfg.scope != "isolated":
                learned += shared.value
                if episode.teams is None:
                    _judge(shared, episode, prior + shared.value, prior)
            if cfg.scope != "shared":
                own = self._user_offsets(user_id)
                _, base = self._served(user_id)  # what ranks without the user's own offsets
                if episode.teams is None:
                    _judge(own, episode, base + own.value, base)
                learned += own.value
            got = passage_gradient(learned, episode, cfg.turn_update)
            if got is None:
                return None
            loss, grad = got
            step = np.zeros(len(FEATURES))
            if cfg.scope != "isolated":
                step = -cfg.turn_learning_rate * (grad + cfg.turn_prior_pull * shared.value)
                shared.change += step
                shared.episodes += 1
                shared.unsaved += 1
            if cfg.scope != "shared":
                if own.generation is None:  # nothing stored yet: zero offsets, judged nothing
                    self._begin(user_id, own)
                lr = cfg.turn_user_learning_rate
                d_own = -lr * (grad + cfg.turn_pull * own.value)
                own.change += d_own
                own.episodes += 1
                own.unsaved += 1
                step = step + d_own
            pending = max(shared.unsaved, 0 if cfg.scope == "shared" else own.unsaved)
            if pending >= cfg.save_every or self.clock() - self._saved_at >= cfg.save_seconds:
                self.flush()
                pending = 0
            served, _ = self._served(user_id)
            return TurnFit(
                loss,
                float(np.linalg.norm(step)),
                shared.episodes,
                pending,
                bool(not np.array_equal(served, prior)),
            )

    # ------------------------------------------------------------------- saving
    def _save(self, owner: str, name: str, off: _Offsets) -> None:
        """Add an owner's unsaved change to what is stored (read-modify-write).

        A user's change is added only to the generation it was learned on (see the module
        docs); when that state was erased since, the change is dropped, never written, and
        `off` rests on what is stored now.
        """
        change, unsaved = off.change.copy(), off.unsaved
        new = (off.new_judged, off.new_gain, off.new_gain2)
        box: dict[str, Any] = {}

        def update(_version: int, data: bytes | None) -> bytes:
            stored = self._stored(owner, name, data)
            if name == USER_STATE and data is None:
                raise _Erased  # checked under the store's lock: nothing is written
            if name == USER_STATE and stored is not None and stored.generation != off.generation:
                raise _Erased  # erased, then stored again by another process
            if stored is None:
                gen = uuid.uuid4().hex if off.generation is None else off.generation
                stored = _Stored(np.zeros(len(FEATURES)), 0, (0, 0.0, 0.0), gen)
            box["base"], box["episodes"] = stored.values + change, stored.episodes + unsaved
            box["gate"] = tuple(a + b for a, b in zip(stored.gate, new, strict=True))
            box["generation"] = stored.generation
            return _encode(box["base"], box["episodes"], box["gate"], stored.generation)

        try:
            version, _ = self.state.update(owner, name, update)
        except _Erased:
            logger.info("dropped %d unsaved episodes of a user deleted since", unsaved)
            off.adopt(self._load(owner, name))
            return
        off.base, off.change = box["base"], off.change - change
        off.episodes, off.unsaved, off.version = box["episodes"], off.unsaved - unsaved, version
        off.judged, off.gain, off.gain2 = box["gate"]
        off.generation = box["generation"]
        off.new_judged -= new[0]
        off.new_gain -= new[1]
        off.new_gain2 -= new[2]

    def _stored(self, owner: str, name: str, data: bytes | None) -> _Stored | None:
        """Stored bytes met in an update, decoded; None when absent or damaged (warned)."""
        if data is None:
            return None
        try:
            return _decode(data)
        except ModelLoadError as exc:
            logger.warning("damaged learned state %r of %r (%s): replaced", name, owner, exc)
            return None

    def _begin(self, user_id: str, off: _Offsets) -> None:
        """Store a user's state before a first step is learned on it: its generation.

        `off` rests on no stored state (nothing unsaved). Stores zero offsets under a new
        generation, or, when another process stored the user's state since `off` was read,
        rests `off` on that one.
        """

        def update(_version: int, data: bytes | None) -> bytes:
            if data is not None and self._stored(user_id, USER_STATE, data) is not None:
                return data
            return _encode(np.zeros(len(FEATURES)), 0, (0, 0.0, 0.0), uuid.uuid4().hex)

        version, data = self.state.update(user_id, USER_STATE, update)
        assert data is not None  # the update always writes
        off.adopt(_decode(data).offsets(version))

    def flush(self) -> None:
        """Store every unsaved change now; read again what other processes stored.

        Offsets with nothing unsaved are dropped from memory and read again when next used,
        so a change of another process (its saves, a `delete_user`) is seen within one save
        window.
        """
        with self.lock:
            if self._shared is not None:
                if self._shared.unsaved:
                    self._save(PRIOR_OWNER, SHARED_STATE, self._shared)
                else:
                    self._shared = None
            for user_id, off in list(self._users.items()):
                if off.unsaved:
                    self._save(user_id, USER_STATE, off)
                else:
                    del self._users[user_id]
            self._saved_at = self.clock()

    def forget(self, user_id: str) -> None:
        """Erase a user's own offsets, in memory and in the store.

        Every learned state stored under the user goes (also what an earlier version of the
        library kept there). The shared offsets keep what they learned from everyone (a few
        aggregate weights, no text). What another process learned from the user and has not
        stored yet is dropped at its next save (the state's generation is gone).
        """
        with self.lock:
            self._users.pop(user_id, None)
            self.state.delete_owner(user_id)


def episode_from_record(
    features: Sequence[Sequence[float]],
    groups: Sequence[int],
    cited: Sequence[bool],
    teams: Sequence[int] | None = None,
) -> TurnEpisode:
    """A `TurnEpisode` from a record's rows, their passages and the passages' citations.

    Args:
        features: The shown turns' feature rows.
        groups: The shown passage of each row.
        cited: Per shown passage, whether it was cited.
        teams: Per row, the interleaving team of its passage (`RerankRecord.teams`), or None.
    """
    rows = np.asarray(features, dtype=np.float64).reshape(len(features), len(FEATURES))
    g = np.asarray(groups, dtype=np.int64)
    per_passage = None
    if teams is not None:
        team_of = dict(zip(g.tolist(), (int(t) for t in teams), strict=True))
        per_passage = tuple(team_of.get(i, 0) for i in range(len(cited)))
    return TurnEpisode(rows, g, tuple(bool(c) for c in cited), per_passage)
