"""RMM (Reflective Memory Management): prospective and retrospective reflection.

- `topics` / `topic_prompts`: prospective reflection, topic memories per speaker with Add/Merge.
- `reranker` / `features` / `episodes`: retrospective reflection, a reranker trained by
  REINFORCE from the LLM's citations (with Gumbel top-M exploration).
- `citations`: the numbered-memory answer prompt and the citation parser.
- `personal`: per-user offsets on top of a prior shared by a memory's users.
- `rerankers`: the engine's learned rerankers (prior + per-user, shared, or isolated), kept in a
  `StateStore`, each state sealed with a checksum (`sealed`).
- `feedback`: the engine's rerank stage: reranking retrievals and texts from any retriever, and
  the one feedback path.
- `answer_feedback`: reading an answer's citations into the items it cited (`FeedbackResult`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.rmm.citations import build_answer_prompt, parse_citations
    from reflective_memory.rmm.config import RerankConfig, TopicConfig
    from reflective_memory.rmm.episodes import Episode, FitReport, RankedTexts, RerankResult
    from reflective_memory.rmm.features import FEATURES, Candidates, citation_rewards, rank_prior
    from reflective_memory.rmm.feedback import CallerReranker, FeedbackResult, RerankStage
    from reflective_memory.rmm.personal import PersonalReranker, UserAdapter
    from reflective_memory.rmm.reranker import Reranker
    from reflective_memory.rmm.rerankers import Rerankers
    from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, TopicDraft

_EXPORTS = {
    "build_answer_prompt": "reflective_memory.rmm.citations",
    "parse_citations": "reflective_memory.rmm.citations",
    "Episode": "reflective_memory.rmm.episodes",
    "FitReport": "reflective_memory.rmm.episodes",
    "RerankResult": "reflective_memory.rmm.episodes",
    "RankedTexts": "reflective_memory.rmm.episodes",
    "FEATURES": "reflective_memory.rmm.features",
    "Candidates": "reflective_memory.rmm.features",
    "citation_rewards": "reflective_memory.rmm.features",
    "rank_prior": "reflective_memory.rmm.features",
    "FeedbackResult": "reflective_memory.rmm.feedback",
    "RerankStage": "reflective_memory.rmm.feedback",
    "CallerReranker": "reflective_memory.rmm.feedback",
    "PersonalReranker": "reflective_memory.rmm.personal",
    "UserAdapter": "reflective_memory.rmm.personal",
    "Reranker": "reflective_memory.rmm.reranker",
    "Rerankers": "reflective_memory.rmm.rerankers",
    "ProspectiveReflector": "reflective_memory.rmm.topics",
    "ReflectionReport": "reflective_memory.rmm.topics",
    "TopicDraft": "reflective_memory.rmm.topics",
    "RerankConfig": "reflective_memory.rmm.config",
    "TopicConfig": "reflective_memory.rmm.config",
}

__all__ = [
    "build_answer_prompt",
    "parse_citations",
    "Episode",
    "FitReport",
    "RerankResult",
    "RankedTexts",
    "FEATURES",
    "Candidates",
    "citation_rewards",
    "rank_prior",
    "FeedbackResult",
    "RerankStage",
    "CallerReranker",
    "PersonalReranker",
    "UserAdapter",
    "Reranker",
    "Rerankers",
    "ProspectiveReflector",
    "ReflectionReport",
    "TopicDraft",
    "RerankConfig",
    "TopicConfig",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
