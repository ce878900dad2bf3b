"""RF-Mem adaptive recollection: confident queries take one top-K, uncertain ones expand.

- `vectors`: what RF-Mem searches (`VectorIndex`) and an exact in-memory index.
- `rfmem`: the gate (mean score + entropy), familiarity, recollection and `recall`.
- `calibration`: gate thresholds proposed from a user's own score distribution.
"""

from reflective_memory.recall.calibration import (
    GateCalibration,
    calibrate_from_signals,
    calibrate_gate,
)
from reflective_memory.recall.rfmem import (
    MODES,
    PATHS,
    RecallConfig,
    RecallResult,
    RecollectionTrace,
    choose_path,
    familiarity,
    gate_signals,
    recall,
    recollect,
)
from reflective_memory.recall.vectors import ArrayIndex, VectorIndex, as_vector_index

__all__ = [
    "VectorIndex",
    "ArrayIndex",
    "as_vector_index",
    "RecallConfig",
    "RecallResult",
    "RecollectionTrace",
    "GateCalibration",
    "PATHS",
    "MODES",
    "gate_signals",
    "choose_path",
    "familiarity",
    "recollect",
    "recall",
    "calibrate_gate",
    "calibrate_from_signals",
]
