"""`reflective-memory` of this checkout with the deterministic hashing embedder (tests only).

Run as a script (`python tests/hashing_cli.py mcp --db ...`): the tests that start the CLI in a
subprocess (the MCP server over stdio or HTTP) use it so the subprocess loads no MiniLM and runs
this checkout's code, whatever `reflective-memory` is installed. With `CONFIG_ENV` set to a
JSON object of `MemoryConfig` groups (e.g. `{"rerank": {"save_every": 1}}`), a memory opened
without a config gets that one (a test that reads the learned state from the store while the
server runs has it saved at every episode).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The environment variable holding the subprocess's `MemoryConfig` groups as JSON.
CONFIG_ENV = "REFLECTIVE_MEMORY_TEST_CONFIG"


def main() -> int:
    """Run the CLI with `HashingEmbedder(256)` as the default embedder."""
    sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]
    import reflective_memory.engine as engine
    from reflective_memory import HashingEmbedder, MemoryConfig
    from reflective_memory.cli import main as cli_main

    engine.default_embedder = lambda: HashingEmbedder(256)
    settings = os.environ.get(CONFIG_ENV)
    if settings:
        opened = engine.ReflectiveMemory.__init__
        groups = json.loads(settings)

        def with_config(self: Any, *args: Any, config: Any = None, **kw: Any) -> None:
            opened(self, *args, config=MemoryConfig(**groups) if config is None else config, **kw)

        engine.ReflectiveMemory.__init__ = with_config  # type: ignore[method-assign]
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
