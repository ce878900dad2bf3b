"""Team-draft interleaving: show two rankings at once, so citations say which ranks better.

What citations taught the turn ranker serves only once it has shown that it ranks what the
reader cites better than the weights it would replace (`rmm.turn_learning`, the gate). Judged
on what the serving weights chose alone, that test never sees a turn only the learned weights
would show. An explored retrieval (`retrieve(explore=True)`) of a user with learned offsets
therefore shows an *interleaving* of two rankings (`TurnLearning.rivals`; Radlinski, Kurup and
Joachims 2008, team draft): in each round the two rankings, in random order, each put their
best turn not yet placed next in the list, and the turn is that ranking's (its *team*). A cited
passage counts for the team of its best-placed turn; a turn both rankings would have placed
next is neither team's (its citations compare nothing and only add noise). A reader who cites
at random favours neither team on average, whatever the two rankings are; a reader who cites
what answers favours the ranking that put more of it on top.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["SERVED", "LEARNED", "NEITHER", "team_draft", "interleaved_scores"]

#: Team of a turn the serving weights placed.
SERVED = -1
#: Team of a turn the learned weights placed.
LEARNED = 1
#: Team of a turn both rankings would have placed next (it tells them apart in nothing).
NEITHER = 0

K = TypeVar("K", bound=Hashable)


def team_draft(
    served: Sequence[K], learned: Sequence[K], coin: Callable[[], bool]
) -> tuple[list[K], dict[K, int]]:
    """Interleave two rankings of the same items, team draft.

    Args:
        served: The items, best first, as the serving weights rank them.
        learned: The same items, best first, as the learned weights rank them.
        coin: A fair coin: True when the learned ranking picks first in a tied round.

    Returns:
        The interleaved order and each item's team: `SERVED` or `LEARNED`, or `NEITHER` when
        both rankings would have placed it next (the coin gave it to a team; it counts for
        that team's turns but its citations compare nothing).
    """
    order: list[K] = []
    team: dict[K, int] = {}
    a = b = 0  # next unplaced position in each ranking
    n_served = n_learned = 0
    while True:
        while a < len(served) and served[a] in team:
            a += 1
        while b < len(learned) and learned[b] in team:
            b += 1
        if a >= len(served) and b >= len(learned):
            return order, team
        learned_turn = b < len(learned) and (
            a >= len(served) or n_learned < n_served or (n_learned == n_served and coin())
        )
        agreed = a < len(served) and b < len(learned) and served[a] == learned[b]
        if learned_turn:
            item, side = learned[b], LEARNED
            n_learned += 1
        else:
            item, side = served[a], SERVED
            n_served += 1
        # an item both rankings would place next is the coin's, and says nothing about them
        team[item] = NEITHER if agreed else side
        order.append(item)


def interleaved_scores(
    served: np.ndarray, learned: np.ndarray, coin: Callable[[], bool]
) -> tuple[np.ndarray, np.ndarray]:
    """Scores that rank items in a team-draft interleaving of two score vectors.

    The item placed i-th gets the i-th highest of the served scores, so the scores keep the
    scale the rest of the pipeline reads (the packing, a short turn riding just below its
    anchor) while their order is the interleaving's.

    Args:
        served: The serving weights' log-score of each item.
        learned: The learned weights' log-score of each item.
        coin: A fair coin (see `team_draft`).

    Returns:
        `(scores, teams)`: the new log-score and the team of each item, in input order.
    """
    n = len(served)
    by_served = np.argsort(-served, kind="stable").tolist()
    by_learned = np.argsort(-learned, kind="stable").tolist()
    order, team = team_draft(by_served, by_learned, coin)
    scores = np.empty(n)
    scores[np.asarray(order, dtype=np.int64)] = served[by_served]
    teams = np.array([team[i] for i in range(n)], dtype=np.int64)
    return scores, teams
