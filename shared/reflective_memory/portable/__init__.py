"""Take memory anywhere: export, import, and moving a store onto PostgreSQL.

- `export_memory(memory_or_store, path)` writes users, sessions (open or ended), turns (ids,
  roles, times, text, extra data), memories (every kind, with keys, provenance, times and
  embeddings) and learned state as a streaming, versioned JSON Lines file
  (`reflective_memory.portable.format` documents it).
- `import_memory(memory_or_store, path)` reads it back, line by line: what the target already
  holds is skipped, so importing twice adds nothing; embeddings are reused when the importing
  embedder made them and computed again otherwise (the report says which).
- `migrate(source, target)` streams an export into an import and verifies counts and
  checksums per user; re-run it after an interruption to finish the move.

The same from the command line: `reflective-memory export`, `import` and `migrate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflective_memory.lazy import lazy_exports

if TYPE_CHECKING:
    from reflective_memory.portable.endpoints import Endpoint, endpoint, open_endpoint
    from reflective_memory.portable.export import ExportReport
    from reflective_memory.portable.files import export_memory, import_memory
    from reflective_memory.portable.format import FORMAT_NAME, FORMAT_VERSION
    from reflective_memory.portable.importer import ImportReport
    from reflective_memory.portable.move import MigrationReport, UserCheck, migrate

_EXPORTS = {
    "export_memory": "reflective_memory.portable.files",
    "import_memory": "reflective_memory.portable.files",
    "migrate": "reflective_memory.portable.move",
    "ExportReport": "reflective_memory.portable.export",
    "ImportReport": "reflective_memory.portable.importer",
    "MigrationReport": "reflective_memory.portable.move",
    "UserCheck": "reflective_memory.portable.move",
    "Endpoint": "reflective_memory.portable.endpoints",
    "endpoint": "reflective_memory.portable.endpoints",
    "open_endpoint": "reflective_memory.portable.endpoints",
    "FORMAT_NAME": "reflective_memory.portable.format",
    "FORMAT_VERSION": "reflective_memory.portable.format",
}

__all__ = [
    "export_memory",
    "import_memory",
    "migrate",
    "ExportReport",
    "ImportReport",
    "MigrationReport",
    "UserCheck",
    "Endpoint",
    "endpoint",
    "open_endpoint",
    "FORMAT_NAME",
    "FORMAT_VERSION",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
