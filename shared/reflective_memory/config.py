"""`MemoryConfig`: every setting of a `ReflectiveMemory`, documented and validated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from reflective_memory.errors import ConfigError
from reflective_memory.recall import RecallConfig
from reflective_memory.storage.ann import ANN_KINDS, AnnSettings
from reflective_memory.types import GRANULARITIES

__all__ = ["MemoryConfig"]

_BASE_UNITS = ("turn", "session", "segment")

#: Reranker side features by name (computed in `reflective_memory.rmm.reranker.FEATURES`).
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
#: `rerank_scope` values: prior + per-user adaptation, one shared reranker, one per user alone.
RERANK_SCOPES = ("user", "shared", "isolated")
#: `rerank_baseline` value for the per-episode mean-reward baseline.
EPISODE_BASELINE = "episode"
_MODES = ("hybrid", "dense", "lexical")
_SEGMENTERS = ("auto", "embedding", "llm", "texttiling", "fixed")
_SEGMENT_UNITS = ("exchange", "turn")
_DENOISERS = ("none", "offline", "llmlingua")


@dataclass
class MemoryConfig:
    """Settings of a `ReflectiveMemory`. Every field has a safe default.

    Attributes:
        granularities: Which memory units are built from a session's turns, any of `turn`
            (one unit per utterance, indexed by `add_turn` at once), `session` (the whole
            session) and `segment` (topical segments from the segmenter, built by
            `end_session`). Several may be given; all are searched. Default `("turn",
            "segment")`: turns are the keys that find things, segments add topical context.
        segmenter: How `segment` units are cut: `auto` (the LLM segmenter when an LLM is
            configured, else the offline `embedding` one), `embedding` (learned offline
            segmenter over MiniLM features), `llm` (SeCom's LLM segmenter; needs an LLM; falls
            back to `embedding` per window when the answer is unusable), `texttiling` (embedding
            TextTiling) or `fixed` (windows of `segment_window` turns).
        segment_unit: What segments are made of: `exchange` (a user turn with the replies that
            follow; a question is never split from its answer) or `turn`.
        segment_window: Turns per segment for the `fixed` segmenter.
        segment_llm_window: Most exchanges per LLM segmentation call; longer sessions are cut
            into overlapping windows.
        segment_llm_overlap: Exchanges shared by consecutive LLM windows.
        segment_rubric: Path of a rubric JSON learned by `learn_rubric`, put in front of LLM
            segmentation prompts (`None`: zero-shot).
        retrieval_mode: `hybrid` (dense cosine fused with BM25), `dense` or `lexical`.
        dense_weight: Weight of the dense ranking in reciprocal-rank fusion.
        lexical_weight: Weight of the BM25 ranking in reciprocal-rank fusion.
        rrf_k: The constant of reciprocal-rank fusion, `score = sum(w / (rrf_k + rank))`.
        default_k: Hits returned when neither `k` nor `budget_tokens` is given.
        candidate_k: Candidates each ranker contributes before fusion (at least `k`).
        max_session_turns: A session is ended automatically once it has this many turns
            (default 500; `None`: never). Turns are searchable before their session ends.
        session_idle_seconds: Open sessions of a user whose last turn is older than this (by
            turn timestamps) are ended when that user adds a turn to another session, and
            opening a store directory ends open sessions idle longer than this by the clock
            (default 1800 s, 30 minutes; `None`: never).
        date_prefix: Start each memory's text with its session date when known.
        max_text_chars: Longest accepted turn text (longer raises `InvalidInputError`).
        embed_max_chars: Texts are cut to this many characters before embedding; the stored
            text stays whole.
        embed_batch_size: Texts per embedding call when indexing.
        denoiser: How memory keys are denoised before indexing (SeCom compression; the stored
            `text` always stays raw): `none`, `offline`
            (`reflective_memory.denoise.OfflineDenoiser`, no
            download) or `llmlingua` (`reflective_memory.denoise.LLMLinguaDenoiser` with
            `denoiser_model`). A denoiser object may be passed to `ReflectiveMemory` instead.
            After changing it, call `ReflectiveMemory.redenoise(user_id)` to re-key old memories.
            Default `none`: with turn-level keys the denoised keys would have to be embedded
            again at `end_session` (the raw turn vectors are reused otherwise); see
            `## Retrieval defaults (issue 15)` in BENCHMARKS.md.
        denoise_rate: Fraction of each key kept by the denoiser, in (0, 1] (the SeCom paper
            uses 0.75 with LLMLingua-2).
        denoiser_model: LLMLingua-2 model name or folder for `denoiser="llmlingua"` (`None`:
            `reflective_memory.denoise.DEFAULT_LLMLINGUA_MODEL`).
        denoiser_device: Torch device for the LLMLingua-2 model.
        recall: RF-Mem parameters of the dense stage (`reflective_memory.recall.RecallConfig`: mode
            `rfmem` / `familiarity` / `recollection`, λ, θ_high, θ_low, τ, B, F, R, α, ...); a
            dict of its fields is accepted. Override per call with `retrieve(..., recall=...)`.
            Default: the familiarity path (one top-K search). RF-Mem (`{"mode": "rfmem"}`)
            was never worse and slightly better on the 20-question dev run in BENCHMARKS.md,
            within noise; with MiniLM its gate needs calibrated thresholds
            (`reflective_memory.recall.calibrate_gate`), the paper's route ~90% of queries to
            recollection.
        recall_calibrate: With `recall.mode="rfmem"` and its thresholds left at their defaults,
            calibrate the gate's θ_high, θ_low and τ on each user's own index (stored vectors as
            pseudo-queries, cached per index
            version) instead of the configured numbers (see `## Retrieval defaults (issue 15)`
            in BENCHMARKS.md for the path shares it gives).
        passages: Small-to-big retrieval: resolve the ranking to turns and return `passage`
            memories built for the reader (see `ReflectiveMemory.retrieve` and
            `reflective_memory.passages`); `False` returns the ranked units themselves.
        speaker_keys: Keys of units built from turns start each line with the speaker
            (`Kate: ...`), so keyword search finds what a named person said; dense vectors
            are made from the utterances alone (so vectors of raw turns are reused).
        context_weight: Vote of a coarse unit (segment, session, topic, note) for each of its
            turns, relative to a turn's own key.
        context_full_budget: Below this budget (in `budget_unit`s) the coarse units' votes
            shrink in proportion (`context_weight * budget / context_full_budget`): when only
            a few turns fit, the turn that matches the question should win over its topical
            neighbours. 0 keeps the full context weight at every budget.
        neighbour_weight: Share of a turn hit's vote lent to its neighbours inside its topical
            segment (0: off; the ablation in BENCHMARKS.md found it costs coverage).
        neighbour_span: Farthest neighbour that gets such a vote.
        recency_weight: Present-tense questions ("now", "currently", "these days", "still")
            multiply each turn's vote by `1 + recency_weight * r`, r from 0 (oldest candidate)
            to 1 (newest); 0 turns time-aware ranking off. Only the best turns compete: the
            10 best whose vote is within `recency_margin` (a fraction) of the best vote.
        recency_margin: See `recency_weight`.
        speaker_focus: When a question names exactly one of the speakers of the user's turns
            ("What does Kate do on weekends?"), the votes of the other speakers' turns are
            multiplied by `1 - speaker_focus` (0: off, 1: only the named speaker's turns).
        length_exponent: Budget packing discounts a turn longer than `length_free` times the
            median candidate by `(length / (length_free * median)) ** length_exponent`, so a
            long turn must out-vote the several short ones whose room it would take (the
            best-voted turns filling `length_keep_share` of the budget are packed first, in
            vote order); 0 packs in vote order.
        length_free: See `length_exponent`.
        length_keep_share: See `length_exponent`.
        segment_vectors: Vector of a multi-turn unit with a raw key: `mean` (the normalised
            mean of its turns' vectors, nothing embedded again) or `embed` (embed the key).
        budget_unit: What `budget_tokens` counts: `tokens` (`reflective_memory.llm.count_tokens`)
            or `words` (whitespace words, the retrieval bench's unit).
        ann_threshold: Users with more memories than this are searched with an approximate
            index (`None`: always exact).
        ann_index: `ivf` or `hnsw`.
        ann_probe: IVF lists visited per query (`ivf`) or HNSW search breadth (`hnsw`).
        conditional_memory: `end_session` also builds conditional `note` memories (context +
            knowledge of the user utterances worth remembering; see
            `reflective_memory.conditional.notes`).
            With an LLM: one call per session (per `note_prompt_chars` of conversation);
            without: an offline heuristic, no call.
        note_prompt_chars: Conversation characters per note-making LLM call.
        retrieval_views: Memory kinds `retrieve` searches (e.g. `("note", "segment")`), all in
            one ranking that shares `k` / the budget; `None` searches every stored kind.
        self_reflection: `retrieve` lets the LLM judge the memories and retrieve again with its
            keywords when they do not suffice (see `reflective_memory.conditional.reflection`);
            needs an LLM.
        self_reflection_rounds: Most judging rounds (LLM calls) per reflective retrieval.
        prospective_reflection: RMM prospective reflection: when a session ends and an LLM is
            configured, extract topic memories (granularity `topic`) and Add/Merge them into
            the user's existing topics. Off without an LLM.
        topic_merge_k: Similar existing topics shown to each Add/Merge decision (top-K).
        topic_speakers: Roles to extract topics for (`None`: every role except `system`).
        rerank: RMM retrospective reflection: rerank the head of every ranking with the
            citation-trained reranker (untrained, it keeps the retriever's order).
        rerank_top_k: Retriever candidates the reranker reorders (paper: K = 20).
        rerank_top_m: Memories the reranker selects, sampled while exploring (paper: M = 5).
        rerank_scope: `user` (default): a prior reranker shared by the users of this memory,
            learned from everyone's feedback, plus a small per-user adaptation (feature-weight
            offsets learned from that user's feedback only, pulled back toward the prior by
            `rerank_user_decay`); `shared`: the prior alone; `isolated`: a full reranker per
            user learned from that user's feedback only, nothing shared (RMM's form).
        rerank_explore: Sample the top-M with Gumbel noise at retrieval (for learning); off,
            the reranked order is deterministic. `retrieve(explore=...)` overrides it per call.
        rerank_tau: Gumbel-softmax temperature (paper: 0.5).
        rerank_learning_rate: REINFORCE learning rate (paper: 1e-3; default 1e-4, chosen on
            REALTALK dev with the per-user protocol: at 1e-3 pure-noise feedback cost 1.5
            points of coverage at 250 words, at 1e-4 0.9; see BENCHMARKS.md, issue 19).
        rerank_baseline: REINFORCE baseline: a number (paper: 0.5) or `"episode"` (default),
            the mean reward of the episode's shown memories, so feedback teaches through the
            contrast between cited and uncited memories. With the paper's constant 0.5 most
            shown memories get advantage -1.5 together, and on the feedback bench pure-noise
            citations then cost held-out questions many points (BENCHMARKS.md `## RMM`).
        rerank_batch_size: Feedback episodes per reranker update (paper: 4).
        rerank_optimizer: `sgd` (default: the plain policy-gradient step `W -= eta * grad`)
            or `adam`. Adam moves every weight by about `eta` per step whatever its gradient,
            so the 2 x dim^2 embedding maps learn the trained questions fast but random-walk
            on noisy feedback; plain SGD keeps each step proportional to the evidence.
        rerank_weight_decay: Decoupled L2 decay of the reranker's weights toward zero (the
            identity start) per update; 0 (default) is the paper's update.
        rerank_memory_bias: Extension, not in the paper: add a learned query-independent
            `b . m` term to reranker scores (which kinds of memories get cited). Off by default.
        rerank_features: Extension, not in the paper: side features with a learned weight
            (zero at the start) added to reranker scores, describing what kind of memory gets
            cited in terms that hold for any question and granularity (see
            `reflective_memory.rmm.features`). Default: query overlap, dense and lexical
            score, retriever rank, found-by-both, question cue. `("cost",)` (memory length)
            helped turn units on LongMemEval but hurts segment units (long segments get cited,
            then crowd the budget); `()` is the paper's form.
        rerank_feature_learning_rate: Learning rate of the prior's side-feature weights
            (`None`: `rerank_learning_rate`). Extension: the embedding maps move by the
            paper's `eta`, the few feature weights faster.
        rerank_signed_features: Keep the learned weights of features that restate retriever
            evidence (overlap, dense, lexical, rank, both) and the question cue on their
            natural side of zero (`reflective_memory.rmm.features.FEATURE_SIGNS`), so that
            noisy feedback can sharpen the retriever's order but not invert it. Extension.
        rerank_user_learning_rate: Learning rate of a user's own feature-weight offsets
            (scope `user`), one step per feedback episode.
        rerank_user_decay: Pull of a user's offsets back to zero (the prior) per episode, as a
            fraction of the learning rate (`delta -= lr * decay * delta`).
        rerank_memory_credit: Extension (scope `user`): score credit per advantage unit that a
            memory unit behind a cited (+) or shown-but-uncited (-) passage gets in that user's
            own table (`reflective_memory.rmm.memory_credit`); 0 turns it off.
        rerank_memory_credit_cap: Largest credit of one memory unit, either sign (on the
            prior's cosine scale), bounding what any feedback, noise included, can do.
        rerank_turn_prior: Extension: strength of the turn prior learned from citations
            (`reflective_memory.rmm.turn_prior`): once a few answers were predicted better
            than chance, every voted turn's vote is multiplied by `exp(strength * trust * z)`,
            z how much more than the other voted turns it looks like what answers cite
            (statements, not questions); 0 (default) turns it off. One prior per memory,
            shared by its users; it holds no text. Off by default: at 0.5 it gains on REALTALK
            dev (+0.7 / +0.6 points at 250 / 500 words) and loses on LongMemEval dev100 (-4.7
            / -3.6), BENCHMARKS.md "Per-user reranking".
        rerank_turn_prior_learning_rate: Step of the turn prior per answer.
        rerank_seed: Seed of the exploration noise (`None`: random).
        attribution_fallback: When an answer carries no citation marker, infer the used
            memories from answer-sentence / memory embedding similarity.
        attribution_threshold: Cosine an answer sentence must reach with a memory key for the
            fallback to count it as used (0.55 suits all-MiniLM-L6-v2).
        llm_timeout_s: Longest wait for one LLM call, in seconds; a call that takes longer
            counts as failed and its step falls back offline (`None`: wait forever).
        llm_max_chars: Longest LLM reply used; a longer one is cut to this many characters
            before parsing (lenient parsers read what fits; the rest is repaired offline).
        index_cache_bytes: Memory the in-process index cache may hold, in bytes; the least
            recently used users' indexes are dropped beyond it (they reload from disk).
    """

    granularities: tuple[str, ...] = ("turn", "segment")
    segmenter: str = "auto"
    segment_unit: str = "exchange"
    segment_window: int = 6
    segment_llm_window: int = 40
    segment_llm_overlap: int = 6
    segment_rubric: str | None = None
    retrieval_mode: str = "hybrid"
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    rrf_k: int = 60
    default_k: int = 5
    candidate_k: int = 50
    max_session_turns: int | None = 500
    session_idle_seconds: float | None = 1800.0
    date_prefix: bool = True
    max_text_chars: int = 2_000_000
    embed_max_chars: int = 4000
    embed_batch_size: int = 64
    denoiser: str = "none"
    denoise_rate: float = 0.5
    denoiser_model: str | None = None
    denoiser_device: str = "cpu"
    recall: RecallConfig = field(default_factory=lambda: RecallConfig(mode="familiarity"))
    ann_threshold: int | None = 50_000
    ann_index: str = "ivf"
    ann_probe: int = 32
    conditional_memory: bool = False
    note_prompt_chars: int = 12_000
    retrieval_views: tuple[str, ...] | None = None
    self_reflection: bool = False
    self_reflection_rounds: int = 1
    prospective_reflection: bool = False
    topic_merge_k: int = 5
    topic_speakers: tuple[str, ...] | None = None
    rerank: bool = True
    rerank_top_k: int = 20
    rerank_top_m: int = 5
    rerank_scope: str = "user"
    rerank_explore: bool = False
    rerank_tau: float = 0.5
    rerank_learning_rate: float = 1e-4
    rerank_baseline: float | str = "episode"
    rerank_batch_size: int = 4
    rerank_optimizer: str = "sgd"
    rerank_weight_decay: float = 0.0
    rerank_memory_bias: bool = False
    rerank_features: tuple[str, ...] = ("overlap", "dense", "lexical", "rank", "both", "question")
    rerank_feature_learning_rate: float | None = None
    rerank_signed_features: bool = True
    rerank_user_learning_rate: float = 0.001
    rerank_user_decay: float = 1.0
    rerank_memory_credit: float = 0.0
    rerank_memory_credit_cap: float = 0.05
    rerank_turn_prior: float = 0.0
    rerank_turn_prior_learning_rate: float = 0.5
    rerank_seed: int | None = None
    attribution_fallback: bool = True
    attribution_threshold: float = 0.55
    llm_timeout_s: float | None = 60.0
    llm_max_chars: int = 200_000
    index_cache_bytes: int = 512 * 1024 * 1024
    recall_calibrate: bool = True
    passages: bool = True
    speaker_keys: bool = True
    context_weight: float = 0.25
    context_full_budget: int = 1000
    neighbour_weight: float = 0.0
    neighbour_span: int = 1
    recency_weight: float = 0.25
    recency_margin: float = 0.1
    speaker_focus: float = 0.8
    length_exponent: float = 0.5
    length_free: float = 2.0
    length_keep_share: float = 0.25
    segment_vectors: str = "mean"
    budget_unit: str = "tokens"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> MemoryConfig:
        """Check every field; raise `ConfigError` naming the first bad one."""
        if isinstance(self.granularities, str):
            self.granularities = (self.granularities,)
        self.granularities = tuple(self.granularities)
        if not self.granularities:
            raise ConfigError("granularities must name at least one unit kind")
        for g in self.granularities:
            if g not in _BASE_UNITS:
                raise ConfigError(
                    f"granularities: {g!r} is not built from turns; choose from {_BASE_UNITS} "
                    f"(all kinds: {GRANULARITIES})"
                )
        if self.retrieval_mode not in _MODES:
            raise ConfigError(
                f"retrieval_mode must be one of {_MODES}, got {self.retrieval_mode!r}"
            )
        if self.segmenter not in _SEGMENTERS:
            raise ConfigError(f"segmenter must be one of {_SEGMENTERS}, got {self.segmenter!r}")
        if self.segment_unit not in _SEGMENT_UNITS:
            raise ConfigError(
                f"segment_unit must be one of {_SEGMENT_UNITS}, got {self.segment_unit!r}"
            )
        if not isinstance(self.segment_llm_overlap, int) or not (
            0 <= 2 * self.segment_llm_overlap < self.segment_llm_window
        ):
            raise ConfigError("segment_llm_overlap must be >= 0 and < segment_llm_window / 2")
        for name in (
            "segment_window",
            "segment_llm_window",
            "rrf_k",
            "default_k",
            "candidate_k",
            "max_text_chars",
            "embed_max_chars",
            "embed_batch_size",
            "llm_max_chars",
            "index_cache_bytes",
        ):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ConfigError(f"{name} must be a positive integer, got {val!r}")
        for name in ("dense_weight", "lexical_weight"):
            val = getattr(self, name)
            if not isinstance(val, (int, float)) or val < 0:
                raise ConfigError(f"{name} must be a non-negative number, got {val!r}")
        if self.denoiser not in _DENOISERS:
            raise ConfigError(f"denoiser must be one of {_DENOISERS}, got {self.denoiser!r}")
        rate = self.denoise_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ConfigError(f"denoise_rate must be in (0, 1], got {rate!r}")
        if self.denoiser_model is not None and (
            not isinstance(self.denoiser_model, str) or not self.denoiser_model.strip()
        ):
            raise ConfigError("denoiser_model must be None or a model name or folder")
        if not isinstance(self.denoiser_device, str) or not self.denoiser_device:
            raise ConfigError("denoiser_device must be a torch device string such as 'cpu'")
        if isinstance(self.recall, dict):
            self.recall = RecallConfig.from_dict(self.recall)
        if not isinstance(self.recall, RecallConfig):
            raise ConfigError(f"recall must be a RecallConfig or a dict, got {self.recall!r}")
        if self.ann_index not in ANN_KINDS:
            raise ConfigError(f"ann_index must be one of {ANN_KINDS}, got {self.ann_index!r}")
        self.ann_settings()
        if self.retrieval_views is not None:
            if isinstance(self.retrieval_views, str):
                self.retrieval_views = (self.retrieval_views,)
            self.retrieval_views = tuple(self.retrieval_views)
            bad = [v for v in self.retrieval_views if v not in GRANULARITIES]
            if bad or not self.retrieval_views:
                raise ConfigError(
                    f"retrieval_views must name memory kinds from {GRANULARITIES}, "
                    f"got {self.retrieval_views!r}"
                )
        for name in ("conditional_memory", "self_reflection"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False")
        for name, low in (("note_prompt_chars", 500), ("self_reflection_rounds", 1)):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {val!r}")
        self._validate_rmm()
        t = self.llm_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise ConfigError(f"llm_timeout_s must be None or a positive number, got {t!r}")
        self._validate_passages()
        if self.max_session_turns is not None and self.max_session_turns < 1:
            raise ConfigError("max_session_turns must be None or >= 1")
        if self.session_idle_seconds is not None and self.session_idle_seconds <= 0:
            raise ConfigError("session_idle_seconds must be None or > 0")
        return self

    def _validate_passages(self) -> None:
        for name in ("passages", "speaker_keys", "recall_calibrate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False")
        for name in ("context_weight", "neighbour_weight", "recency_weight", "length_exponent"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not val >= 0:
                raise ConfigError(f"{name} must be a number >= 0, got {val!r}")
        cfb = self.context_full_budget
        if isinstance(cfb, bool) or not isinstance(cfb, int) or cfb < 0:
            raise ConfigError(f"context_full_budget must be an int >= 0, got {cfb!r}")
        for name in ("length_keep_share", "speaker_focus"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 1:
                raise ConfigError(f"{name} must be a number in [0, 1], got {val!r}")
        for name in ("recency_margin", "length_free"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0:
                raise ConfigError(f"{name} must be a number > 0, got {val!r}")
        span = self.neighbour_span
        if isinstance(span, bool) or not isinstance(span, int) or span < 1:
            raise ConfigError(f"neighbour_span must be a positive integer, got {span!r}")
        if self.segment_vectors not in ("mean", "embed"):
            raise ConfigError(
                f"segment_vectors must be 'mean' or 'embed', got {self.segment_vectors!r}"
            )
        if self.budget_unit not in ("tokens", "words"):
            raise ConfigError(f"budget_unit must be 'tokens' or 'words', got {self.budget_unit!r}")

    def ann_settings(self) -> AnnSettings:
        """The exact/approximate switch as `reflective_memory.storage.index.AnnSettings`."""
        return AnnSettings(
            threshold=self.ann_threshold,
            kind=self.ann_index,
            nprobe=self.ann_probe,
            ef_search=self.ann_probe if self.ann_index == "hnsw" else 64,
        )

    def _validate_rmm(self) -> None:
        for name in ("topic_merge_k", "rerank_top_k", "rerank_top_m", "rerank_batch_size"):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ConfigError(f"{name} must be a positive integer, got {val!r}")
        for name in ("rerank_tau", "rerank_learning_rate"):
            val = getattr(self, name)
            if not isinstance(val, (int, float)) or isinstance(val, bool) or not val > 0:
                raise ConfigError(f"{name} must be a positive number, got {val!r}")
        if self.rerank_scope not in RERANK_SCOPES:
            raise ConfigError(
                f"rerank_scope must be one of {list(RERANK_SCOPES)}, got {self.rerank_scope!r}"
            )
        flr = self.rerank_feature_learning_rate
        if flr is not None and (
            not isinstance(flr, (int, float)) or isinstance(flr, bool) or not flr > 0
        ):
            raise ConfigError(f"rerank_feature_learning_rate must be None or > 0, got {flr!r}")
        ulr = self.rerank_user_learning_rate
        if not isinstance(ulr, (int, float)) or isinstance(ulr, bool) or not ulr >= 0:
            raise ConfigError(f"rerank_user_learning_rate must be a number >= 0, got {ulr!r}")
        ud = self.rerank_user_decay
        if (
            not isinstance(ud, (int, float))
            or isinstance(ud, bool)
            or not 0 <= ud < 1 / max(ulr, 1e-12)
        ):
            raise ConfigError(
                f"rerank_user_decay must be >= 0 and below 1 / rerank_user_learning_rate, "
                f"got {ud!r}"
            )
        for name in ("rerank_turn_prior", "rerank_turn_prior_learning_rate"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 5:
                raise ConfigError(f"{name} must be a number in [0, 5], got {v!r}")
        for name in ("rerank_memory_credit", "rerank_memory_credit_cap"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 10:
                raise ConfigError(f"{name} must be a number in [0, 10), got {v!r}")
        if self.rerank_optimizer not in ("adam", "sgd"):
            raise ConfigError(
                f"rerank_optimizer must be 'adam' or 'sgd', got {self.rerank_optimizer!r}"
            )
        wd = self.rerank_weight_decay
        if not isinstance(wd, (int, float)) or isinstance(wd, bool) or not wd >= 0:
            raise ConfigError(f"rerank_weight_decay must be a number >= 0, got {wd!r}")
        if not isinstance(self.rerank_signed_features, bool):
            raise ConfigError(
                f"rerank_signed_features must be a bool, got {self.rerank_signed_features!r}"
            )
        if not isinstance(self.rerank_memory_bias, bool):
            raise ConfigError(f"rerank_memory_bias must be a bool, got {self.rerank_memory_bias!r}")
        b = self.rerank_baseline
        if isinstance(b, str) or isinstance(b, bool) or not isinstance(b, (int, float)):
            if b != EPISODE_BASELINE:
                raise ConfigError(
                    f"rerank_baseline must be a number or {EPISODE_BASELINE!r}, got {b!r}"
                )
        if isinstance(self.rerank_features, str):
            self.rerank_features = (self.rerank_features,)
        self.rerank_features = tuple(self.rerank_features)
        bad = [f for f in self.rerank_features if f not in RERANK_FEATURES]
        if bad or len(set(self.rerank_features)) != len(self.rerank_features):
            raise ConfigError(
                f"rerank_features must be distinct names from {sorted(RERANK_FEATURES)}, "
                f"got {self.rerank_features!r}"
            )
        if not isinstance(self.attribution_threshold, (int, float)) or not (
            -1.0 <= self.attribution_threshold <= 1.0
        ):
            raise ConfigError("attribution_threshold must be a cosine in [-1, 1]")
        if isinstance(self.topic_speakers, str):
            self.topic_speakers = (self.topic_speakers,)
        if self.topic_speakers is not None:
            self.topic_speakers = tuple(self.topic_speakers)
            if not self.topic_speakers or not all(
                isinstance(r, str) and r for r in self.topic_speakers
            ):
                raise ConfigError("topic_speakers must be None or non-empty role names")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-serialisable)."""
        d = asdict(self)
        d["granularities"] = list(self.granularities)
        d["rerank_features"] = list(self.rerank_features)
        if self.retrieval_views is not None:
            d["retrieval_views"] = list(self.retrieval_views)
        if self.topic_speakers is not None:
            d["topic_speakers"] = list(self.topic_speakers)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryConfig:
        """Build from `to_dict` output; unknown keys raise `ConfigError`."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown MemoryConfig fields: {sorted(unknown)}")
        return cls(**data)
