"""RMM (Reflective Memory Management): prospective and retrospective reflection.

- `topics` / `topic_prompts`: prospective reflection, topic memories per speaker with Add/Merge.
- `reranker` / `features` / `episodes`: retrospective reflection, a reranker trained by
  REINFORCE from the LLM's citations (with Gumbel top-M exploration).
- `citations`: the numbered-memory answer prompt and the citation parser.
- `personal`: per-user offsets on top of a prior shared by a memory's users.
- `feedback`: the engine's reranking stage (prior + per-user, shared, or isolated) and feedback.
- `answer_feedback`: reading an answer's citations into the hits it cited (`FeedbackResult`).
- `stored_rerank`: the reranking stage persisted in a database store's versioned blobs.
- `turn_prior` / `turn_prior_stage`: which kind of turn answers, learned from citations (an
  extension) and applied to the votes of every retrieval with a budget.
"""

from reflective_memory.rmm.citations import build_answer_prompt, parse_citations
from reflective_memory.rmm.episodes import Episode, FitReport, RerankResult
from reflective_memory.rmm.features import FEATURES, Candidates, citation_rewards, rank_prior
from reflective_memory.rmm.feedback import FeedbackResult, RerankStage
from reflective_memory.rmm.personal import PersonalReranker, UserAdapter
from reflective_memory.rmm.reranker import Reranker
from reflective_memory.rmm.topics import ProspectiveReflector, ReflectionReport, TopicDraft
from reflective_memory.rmm.turn_prior import TURN_FEATURES, TurnPrior
from reflective_memory.rmm.turn_prior_stage import TurnPriorStage

__all__ = [
    "build_answer_prompt",
    "parse_citations",
    "Episode",
    "FitReport",
    "RerankResult",
    "FEATURES",
    "Candidates",
    "PersonalReranker",
    "UserAdapter",
    "citation_rewards",
    "rank_prior",
    "FeedbackResult",
    "RerankStage",
    "Reranker",
    "ProspectiveReflector",
    "ReflectionReport",
    "TopicDraft",
    "TURN_FEATURES",
    "TurnPrior",
    "TurnPriorStage",
]
