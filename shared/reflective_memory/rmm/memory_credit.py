"""Per-user memory credit: which of a user's memories that user's answers cite.

Extension, not in the RMM paper. RMM's reranker generalises across questions through its
embedding maps and (here) side features; with tens of episodes per user neither moves a ranking
much. A user's questions often come back to the same facts, though: in REALTALK about a quarter
of the evidence turns of a chat's later questions were evidence of its earlier ones. So each user
also keeps a small table `unit id -> credit`, learned with the REINFORCE advantage of RMM's
episode baseline: after an answer, every shown passage gets `r - mean(r)` (r = +1 cited, -1 not)
and each memory unit it was built from moves by `rate` times that advantage, clipped to
`[-cap, cap]`. At retrieval the credit of each reranked candidate is added to its score, on the
prior's cosine scale. An answer that cites nothing (or everything) carries no advantage and
changes nothing; pure-noise citations average to zero per memory and are bounded by `cap`.
The table keeps at most `MAX_CREDITS` entries (the smallest in magnitude go first), stays with
the user's other reranker state and is erased with the user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from reflective_memory.types import Retrieval

__all__ = [
    "MAX_CREDITS",
    "hit_advantages",
    "add_credit",
    "learn_credit",
    "credit_offsets",
    "promote",
]

#: Most unit ids one user's credit table keeps.
MAX_CREDITS = 2048


def _units(hit_memory: object) -> list[str]:
    """The memory units a shown hit stands for: a passage's sources, else the hit itself."""
    meta = getattr(hit_memory, "metadata", None) or {}
    srcs = [s for s in (meta.get("sources") or ()) if isinstance(s, str)]
    return srcs or [str(getattr(hit_memory, "id", ""))]


def hit_advantages(retrieval: Retrieval, cited: Iterable[int]) -> dict[str, float]:
    """Advantage per memory unit of one answer: cited hits +, shown but not cited -.

    Rewards are +1 cited / -1 not, minus their mean over the shown hits (RMM's episode
    baseline); a unit behind several hits sums their advantages. Empty when nothing or
    everything was cited.
    """
    n = len(retrieval.hits)
    chosen = {int(c) for c in cited if 0 <= int(c) < n}
    if n == 0 or not chosen or len(chosen) == n:
        return {}
    r = np.where(np.isin(np.arange(n), list(chosen)), 1.0, -1.0)
    adv = r - r.mean()
    out: dict[str, float] = {}
    for i, hit in enumerate(retrieval.hits):
        for unit in dict.fromkeys(_units(hit.memory)):
            if unit:
                out[unit] = out.get(unit, 0.0) + float(adv[i])
    return out


def add_credit(
    table: dict[str, float], advantages: Mapping[str, float], *, rate: float, cap: float
) -> float:
    """Move `table` by `rate * advantage` per unit, clipped to `[0, cap]`; return the change.

    Entries that come back to zero are dropped; beyond `MAX_CREDITS` entries the smallest in
    magnitude are dropped.
    """
    moved = 0.0
    for unit, a in advantages.items():
        old = table.get(unit, 0.0)
        new = float(np.clip(old + rate * a, 0.0, cap))
        moved += abs(new - old)
        if abs(new) < 1e-9:
            table.pop(unit, None)
        else:
            table[unit] = new
    if len(table) > MAX_CREDITS:
        keep = sorted(table.items(), key=lambda kv: -abs(kv[1]))[:MAX_CREDITS]
        table.clear()
        table.update(keep)
    return moved


def credit_offsets(table: Mapping[str, float], ids: Sequence[str]) -> np.ndarray | None:
    """`(K,)` score offsets of candidates `ids` (None when none of them has credit)."""
    if not table:
        return None
    off = np.asarray([table.get(m, 0.0) for m in ids], dtype=np.float32)
    return off if np.any(off) else None


def learn_credit(
    table: dict[str, float],
    retrieval: Retrieval,
    cited: Iterable[int],
    *,
    rate: float,
    cap: float,
) -> float | None:
    """One answer's step on a user's table: None when it carries no advantage, else the change."""
    adv = hit_advantages(retrieval, cited)
    if not adv:
        return None
    return add_credit(table, adv, rate=rate, cap=cap)


def promote(table: Mapping[str, float], ids: Sequence[str], cosines: np.ndarray) -> list[int]:
    """New order (positions into `ids`) of a whole ranking by rank prior plus credit (stable).

    Args:
        table: The user's credit table.
        ids: Unit ids of the ranking, best first.
        cosines: `(N,)` dense cosines of those units to the query (the rank prior's scale).
    """
    off = credit_offsets(table, ids)
    if off is None:
        return list(range(len(ids)))
    key = np.sort(np.asarray(cosines, dtype=np.float32).reshape(-1))[::-1] + off
    return sorted(range(len(ids)), key=lambda i: -float(key[i]))
