"""RMM (Reflective Memory Management): prospective and retrospective reflection.

- `topics` / `topic_prompts`: prospective reflection, topic memories per speaker with Add/Merge.
- `turn_learning`: retrospective reflection: citations teach the turn ranker that fills the
  budget (the memory's shared offsets and per-user offsets on the shipped prior), kept in a
  `StateStore`, each state sealed with a checksum (`sealed`).
- `text_rows`: the turn ranker's feature rows of texts from any retriever.
- `citations`: the numbered-memory answer prompt and the citation parser.
- `feedback`: the engine's feedback stage: ranking texts from any retriever, and the one
  feedback path.
- `reranker` / `features` / `episodes`: RMM's embedding reranker (REINFORCE, Gumbel top-M), a
  model a caller may rank texts with instead (`CallerReranker`).
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
    from reflective_memory.rmm.reranker import Reranker
    from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, TopicDraft
    from reflective_memory.rmm.turn_learning import TurnLearning

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
    "Reranker": "reflective_memory.rmm.reranker",
    "TurnLearning": "reflective_memory.rmm.turn_learning",
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
    "Reranker",
    "TurnLearning",
    "ProspectiveReflector",
    "ReflectionReport",
    "TopicDraft",
    "RerankConfig",
    "TopicConfig",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
