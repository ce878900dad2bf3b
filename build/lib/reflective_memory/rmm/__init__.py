"""RMM (Reflective Memory Management): prospective and retrospective reflection.

- `topics` / `topic_prompts`: prospective reflection, topic memories per speaker with Add/Merge.
- `reranker` / `features` / `episodes`: retrospective reflection, a reranker trained by
  REINFORCE from the LLM's citations (with Gumbel top-M exploration).
- `citations`: the numbered-memory answer prompt and the citation parser.
- `feedback`: the engine's reranking stage (one reranker per user or shared) and feedback.
"""

from reflective_memory.rmm.citations import build_answer_prompt, parse_citations
from reflective_memory.rmm.episodes import Episode, FitReport, RerankResult
from reflective_memory.rmm.features import FEATURES, citation_rewards, rank_prior
from reflective_memory.rmm.feedback import FeedbackResult, RerankStage
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, TopicDraft

__all__ = [
    "build_answer_prompt",
    "parse_citations",
    "Episode",
    "FitReport",
    "RerankResult",
    "FEATURES",
    "citation_rewards",
    "rank_prior",
    "FeedbackResult",
    "RerankStage",
    "Reranker",
    "ProspectiveReflector",
    "ReflectionReport",
    "TopicDraft",
]
