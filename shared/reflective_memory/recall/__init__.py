"""RF-Mem adaptive recollection: confident queries take one top-K, uncertain ones expand.

- `vectors`: what RF-Mem searches (`VectorIndex`) and an exact in-memory index.
- `rfmem`: the gate (mean score + entropy), familiarity, recollection and `recall`.
- `calibration`: the gate's thresholds, fitted per embedder on where recollection helps.
"""

from reflective_memory.recall.calibration import (
    GATE_CALIBRATION_FILE,
    GateCalibration,
    calibrate_from_signals,
    calibrate_gate,
    fit_gate,
    fitted_gate,
    gate_routes,
    write_gate_calibration,
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
    "fit_gate",
    "gate_routes",
    "fitted_gate",
    "write_gate_calibration",
    "GATE_CALIBRATION_FILE",
]
