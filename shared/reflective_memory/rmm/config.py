"""RMM's settings: `RerankConfig` (retrospective reflection) and `TopicConfig` (prospective)."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError
from reflective_memory.settings import (
    check_bool,
    check_choice,
    check_int,
    check_names,
    check_number,
    set_field,
)

__all__ = [
    "RerankConfig",
    "TopicConfig",
    "RERANK_FEATURES",
    "RERANK_SCOPES",
    "EPISODE_BASELINE",
    "TURN_UPDATES",
]

#: Reranker side features by name (computed in `reflective_memory.rmm.features`).
RERANK_FEATURES = (
    "cost",
    "overlap",
    "dense",
    "lexical",
    "rank",
    "both",
    "recency",
    "size",
    "question",
    "derived",
)
#: `RerankConfig.scope` values: prior + per-user adaptation, one shared reranker, one per user.
RERANK_SCOPES = ("user", "shared", "isolated")
#: `RerankConfig.turn_update` values (`reflective_memory.rmm.turn_learning.passage_gradient`).
TURN_UPDATES = ("expected", "reinforce", "pairwise")
#: `RerankConfig.baseline` value for the per-episode mean-reward baseline.
EPISODE_BASELINE = "episode"


@dataclass(frozen=True)
class RerankConfig:
    """RMM retrospective reflection: the citation-trained reranker over the retriever's head.

    Attributes:
        enabled: Rerank the head of every ranking (untrained, the reranker keeps the
            retriever's order) and learn from `feedback`.
        top_k: Retriever candidates the reranker reorders (paper: K = 20).
        top_m: Memories the reranker selects, sampled while exploring (paper: M = 5).
        scope: `user`: a prior shared by the users of this memory plus a small per-user
            adaptation (feature-weight offsets learned from that user's feedback only, pulled
            back toward the prior by `user_decay`); `shared`: the prior alone; `isolated`: a
            full reranker per user learned from that user's feedback only (RMM's form).
        explore: Retrieve for learning: once citations taught the user's weights something,
            show the team-draft interleaving of the learned and the served ranking, whose
            citations judge what was learned (`rmm.turn_learning`, the gate); before, sample
            what is shown with Gumbel noise. Off, the order is deterministic.
            `retrieve(explore=...)` overrides it per call.
        tau: Gumbel-softmax temperature (paper: 0.5).
        learning_rate: REINFORCE step `eta` (paper: 1e-3; 1e-4 here: at 1e-3 pure-noise
            feedback cost 1.5 points of coverage at 250 words on REALTALK dev, at 1e-4 0.9).
        baseline: REINFORCE baseline: a number (paper: 0.5) or `"episode"`, the mean reward of
            the episode's shown memories, so feedback teaches through the contrast between
            cited and uncited memories (with 0.5, pure-noise citations cost held-out
            questions many points on the feedback bench).
        batch_size: Feedback episodes per reranker update (paper: 4).
        features: Extension: side features with a learned weight (zero at the start) added to
            the reranker's scores, in terms that hold for any question (see
            `reflective_memory.rmm.features`); `()` is the paper's form.
        feature_learning_rate: Learning rate of the side-feature weights (`None`:
            `learning_rate`).
        signed_features: Keep the weights of features that restate retriever evidence on
            their natural side of zero, so noisy feedback can sharpen the retriever's order
            but not invert it.
        user_learning_rate: Learning rate of a user's own feature-weight offsets (scope
            `user`), one step per feedback episode.
        user_decay: Pull of a user's offsets back to the prior per episode, as a fraction of
            `user_learning_rate` (`delta -= lr * decay * delta`).
        seed: Seed of the exploration noise (`None`: random).
        attribution_fallback: When an answer carries no citation marker, infer the used
            memories from answer-sentence / memory embedding similarity.
        attribution_threshold: Cosine an answer sentence must reach with a memory key for the
            fallback to count it as used (0.55 suits all-MiniLM-L6-v2).
        turn_update: How citations teach the turn ranker (`rmm/turn_learning.py`):
            `expected` (the gradient of the expected reward under a softmax over the shown
            passages: REINFORCE's step in expectation, fading once the cited passages lead),
            `reinforce` (REINFORCE, the episode's mean reward as baseline) or `pairwise`
            (logistic loss of each cited passage over each shown one not cited).
        turn_learning_rate: Step of the memory's shared offsets to the turn ranker's weights,
            per feedback episode (0.25: from an uninformed start it recovers over half of the
            gap to the fitted prior on REALTALK and LongMemEval behind the interleaved gate;
            0.15 fell short at 500 words on LongMemEval, 0.05 recovered a third; BENCHMARKS.md).
        turn_prior_pull: Pull of the shared offsets back to the shipped prior per episode
            (L2, as a multiple of the offsets).
        turn_user_learning_rate: Step of a user's own offsets (scope `user`).
        turn_pull: Pull of a user's offsets back to the shared weights per episode.
        save_every: Feedback episodes learned in memory before they are stored (a crash
            loses at most this many, or `save_seconds` of them).
        save_seconds: Seconds after which learned episodes are stored at the next feedback.
    """

    enabled: bool = True
    top_k: int = 20
    top_m: int = 5
    scope: str = "user"
    explore: bool = False
    tau: float = 0.5
    learning_rate: float = 1e-4
    baseline: float | str = EPISODE_BASELINE
    batch_size: int = 4
    features: tuple[str, ...] = ("overlap", "dense", "lexical", "rank", "both", "question")
    feature_learning_rate: float | None = None
    signed_features: bool = True
    user_learning_rate: float = 1e-5
    user_decay: float = 1.0
    seed: int | None = None
    attribution_fallback: bool = True
    attribution_threshold: float = 0.55
    turn_update: str = "expected"
    turn_learning_rate: float = 0.25
    turn_prior_pull: float = 0.0
    turn_user_learning_rate: float = 0.25
    turn_pull: float = 0.1
    save_every: int = 16
    save_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("enabled", "explore", "signed_features", "attribution_fallback"):
            check_bool(f"rerank.{name}", getattr(self, name))
        for name in ("top_k", "top_m", "batch_size"):
            check_int(f"rerank.{name}", getattr(self, name))
        check_choice("rerank.scope", self.scope, RERANK_SCOPES)
        check_number("rerank.tau", self.tau, 0, open_low=True)
        check_number("rerank.learning_rate", self.learning_rate, 0, open_low=True)
        check_number(
            "rerank.feature_learning_rate", self.feature_learning_rate, 0, open_low=True,
            optional=True,
        )  # fmt: skip
        check_number("rerank.user_learning_rate", self.user_learning_rate, 0)
        check_number("rerank.user_decay", self.user_decay, 0)
        if not self.user_decay < 1 / max(self.user_learning_rate, 1e-12):
            raise ConfigError("rerank.user_decay must be below 1 / rerank.user_learning_rate")
        b = self.baseline
        if isinstance(b, str) or isinstance(b, bool) or not isinstance(b, (int, float)):
            if b != EPISODE_BASELINE:
                raise ConfigError(
                    f"rerank.baseline must be a number or {EPISODE_BASELINE!r}, got {b!r}"
                )
        set_field(self, "features", check_names("rerank.features", self.features, RERANK_FEATURES))
        check_int("rerank.seed", self.seed, 0, optional=True)
        check_number("rerank.attribution_threshold", self.attribution_threshold, -1.0, 1.0)
        check_choice("rerank.turn_update", self.turn_update, TURN_UPDATES)
        for name in ("turn_learning_rate", "turn_prior_pull", "turn_user_learning_rate"):
            check_number(f"rerank.{name}", getattr(self, name), 0)
        check_number("rerank.turn_pull", self.turn_pull, 0)
        check_int("rerank.save_every", self.save_every)
        check_number("rerank.save_seconds", self.save_seconds, 0)


@dataclass(frozen=True)
class TopicConfig:
    """RMM prospective reflection: topic memories with Add/Merge, built when a session ends.

    Attributes:
        enabled: When a session ends and an LLM is configured, extract topic memories
            (granularity `topic`) and Add/Merge them into the user's existing topics. Off
            without an LLM.
        merge_k: Similar existing topics shown to each Add/Merge decision (top-K).
        speakers: Roles to extract topics for (`None`: every role except `system`).
    """

    enabled: bool = False
    merge_k: int = 5
    speakers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_bool("topics.enabled", self.enabled)
        check_int("topics.merge_k", self.merge_k)
        if self.speakers is not None:
            names = check_names("topics.speakers", self.speakers, distinct=False)
            if not names:
                raise ConfigError("topics.speakers must be None or non-empty role names")
            set_field(self, "speakers", names)
