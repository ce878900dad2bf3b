"""The `shown` stage: what the packed passages show, as the record the turn ranker learns from.

RMM's retrospective reflection trains the turn ranker that filled the budget
(`reflective_memory.rmm.turn_learning`). Feedback on a retrieval needs the feature rows of the
turns it showed and which passage each belongs to: this stage puts them on the state as a
`RerankRecord` of scope `turns` (`Retrieval.rerank`), so feedback needs nothing else, in this
process or another.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reflective_memory.retrieval.state import RetrievalState
from reflective_memory.types import RerankRecord

__all__ = ["ShownTurns", "TURNS_SCOPE"]

#: `RerankRecord.scope` of a record of shown turns.
TURNS_SCOPE = "turns"


class ShownTurns:
    """Record the shown passages' turns with their feature rows (`state.rerank`).

    Args:
        weights: The weights that ranked a user's turns (their log-scores are recorded).
        episodes: How many episodes the shared weights learned from (recorded as `updates`).
    """

    name = "shown"
    repeat = True

    def __init__(self, weights: Callable[[str], np.ndarray], episodes: Callable[[], int]) -> None:
        self.weights, self.episodes = weights, episodes

    def run(self, state: RetrievalState) -> None:
        """Set `state.rerank` (None when no shown turn has a feature row)."""
        feats, req = state.features, state.request
        state.rerank = None
        if feats is None or not state.hits or len(state.feature_ids) != len(feats.keys):
            return
        row_of = {tid: i for i, tid in enumerate(state.feature_ids)}
        ids: list[str] = []
        groups: list[int] = []
        rows: list[int] = []
        for g, hit in enumerate(state.hits):
            for tid in hit.memory.turn_ids:
                r = row_of.get(tid)
                if r is not None:
                    ids.append(tid)
                    groups.append(g)
                    rows.append(r)
        if not ids:
            return
        matrix = np.round(feats.matrix[rows], 5)
        scores = matrix @ self.weights(req.user_id)
        teams = _passage_teams(state, groups, rows) if state.teams else None
        state.rerank = RerankRecord(
            user_id=req.user_id,
            retrieval_id=req.retrieval_id,
            scope=TURNS_SCOPE,
            top_k=len(ids),
            top_m=len(state.hits),
            explored=req.explore,
            updates=self.episodes(),
            candidates=tuple(ids),
            reranked=tuple(ids),
            prior=tuple(round(float(x), 6) for x in scores),
            features=tuple(tuple(float(v) for v in row) for row in matrix),
            query=state.search_query,
            groups=tuple(groups),
            teams=teams,
        )


def _passage_teams(
    state: RetrievalState, groups: list[int], rows: list[int]
) -> tuple[int, ...] | None:
    """Per recorded turn, the team of its passage: that of the passage's best-voted turn.

    None when a passage has no turn the interleaving placed.
    """
    assert state.features is not None and state.votes is not None
    keys, votes = state.features.keys, state.votes.turn
    best: dict[int, tuple[float, int]] = {}
    for g, r in zip(groups, rows, strict=True):
        team = state.teams.get(keys[r])
        if team is None:
            continue
        vote = votes.get(keys[r], 0.0)
        if g not in best or vote > best[g][0]:
            best[g] = (vote, team)
    if len(best) != len(set(groups)):
        return None
    return tuple(best[g][1] for g in groups)
