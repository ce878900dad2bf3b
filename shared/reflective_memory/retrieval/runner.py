"""`Pipeline`: retrieval as an ordered list of stages over one typed state, each timed.

With a tracer provider set, each stage run is a span named for the stage
(`reflective_memory.tracing`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from reflective_memory import tracing
from reflective_memory.retrieval.state import RetrievalState

__all__ = ["Stage", "Pipeline"]


@runtime_checkable
class Stage(Protocol):
    """One step of retrieval: reads and fills its part of the state.

    Attributes:
        name: Its key in `diagnostics["timings_ms"]`.
        repeat: Whether it runs again when the pipeline widens the candidate pool.
    """

    name: str
    repeat: bool

    def run(self, state: RetrievalState) -> None:
        """Do the stage's work on `state`."""


class Pipeline:
    """Run stages in order; widen the candidate pool while the hits do not fill the cut.

    When the packed hits reach neither `k` nor the budget and the index holds more, the
    candidates per ranker (`state.n`) grow fourfold and the repeating stages run again.
    Removing a stage from the list is its ablation.

    Args:
        stages: The stages, in order.
    """

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)

    def run(self, state: RetrievalState) -> RetrievalState:
        """Run the stages on `state` and return it."""
        todo, widened = self.stages, 0
        while True:
            for stage in todo:
                with tracing.span(stage.name) as span:
                    t0 = time.perf_counter()
                    stage.run(state)
                    ms = state.timings[stage.name] = (time.perf_counter() - t0) * 1000
                    tracing.describe(span, tracing.stage_attributes, stage.name, widened, state, ms)
            if state.filled or state.n >= len(state.index):
                return state
            state.n = min(len(state.index), state.n * 4)
            todo, widened = tuple(s for s in self.stages if s.repeat), widened + 1

    @property
    def names(self) -> list[str]:
        """The stages' names, in order."""
        return [s.name for s in self.stages]
