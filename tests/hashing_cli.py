"""`reflective-memory` of this checkout with the deterministic hashing embedder (tests only).

Run as a script (`python tests/hashing_cli.py mcp --db ...`): the tests that start the CLI in a
subprocess (the MCP server over stdio or HTTP) use it so the subprocess loads no MiniLM and runs
this checkout's code, whatever `reflective-memory` is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    """Run the CLI with `HashingEmbedder(256)` as the default embedder."""
    sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]
    import reflective_memory.engine as engine
    from reflective_memory import HashingEmbedder
    from reflective_memory.cli import main as cli_main

    engine.default_embedder = lambda: HashingEmbedder(256)
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
