"""Contract tests for third-party stores, as pytest test mixins (one fixture each).

- `MemoryStoreContract`: every `reflective_memory.storage.base.MemoryStore`; needs a `store`
  fixture yielding an empty store.
- `StateStoreContract`: every `reflective_memory.storage.state.StateStore`; needs a
  `state_store` fixture yielding an empty state store.
- `SurfaceContract` and `SurfaceEvidenceContract`: every way into a memory (the core API, a
  framework adapter, a server, the CLI), driven through one scripted conversation by a
  `SurfaceDriver`; they need `surface_run` / `evidence_run` and `core_run` fixtures
  (`run_surface`), see `reflective_memory.testing.surfaces`.
- `SurfaceFeedbackContract`: every surface that takes feedback, through a `FeedbackDriver`,
  teaches the user's turn ranker and no one else's; it needs a `feedback_driver` fixture.

Subclass one in a `Test...` class of your test suite and define its fixture; every test of the
contract then runs against your implementation. This package needs pytest (the `dev` extra);
the library itself never imports it.
"""

try:
    import pytest  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "reflective_memory.testing holds pytest tests: pip install pytest "
        "(or 'reflective-memory[dev]')"
    ) from exc

from reflective_memory.testing.memory_store import MemoryStoreContract
from reflective_memory.testing.state_store import StateStoreContract
from reflective_memory.testing.surfaces import (
    CoreDriver,
    FeedbackDriver,
    SurfaceContract,
    SurfaceDriver,
    SurfaceEvidenceContract,
    SurfaceFeedbackContract,
    run_surface,
    teach_other_user,
)

__all__ = [
    "MemoryStoreContract",
    "StateStoreContract",
    "SurfaceContract",
    "SurfaceEvidenceContract",
    "SurfaceFeedbackContract",
    "SurfaceDriver",
    "FeedbackDriver",
    "CoreDriver",
    "run_surface",
    "teach_other_user",
]
