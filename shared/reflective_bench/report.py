"""What a benchmark command does around its measurements: the run's context, its JSON output.

`run_context()` opens a result with when and where it ran (date, machine, load average);
`finish()` adds the load after the run, logs the result and writes it to `--out`;
`json_command(run)` is the `bench ...` entry point that prints the result as JSON, and
`bench_parser` adds a benchmark's sub-command with it (and `--out`).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import time
from collections.abc import Callable
from typing import Any

__all__ = ["bench_parser", "finish", "json_command", "run_context"]

logger = logging.getLogger(__name__)


def run_context() -> dict[str, Any]:
    """`date` (UTC), `machine` (architecture and cores) and `load_before` (1, 5, 15 min)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {mp.cpu_count()} cores",
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def finish(res: dict[str, Any], out: str | None, name: str) -> dict[str, Any]:
    """Add `load_after`, log the result as `name`, write it to `out` (JSON) when given."""
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    logger.info("%s bench: %s", name, res)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
    return res


def json_command(run: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[..., int]:
    """A `bench` command that runs `run(args)` and prints its result as JSON (exit code 0)."""

    def command(args: argparse.Namespace) -> int:
        print(json.dumps(run(args), indent=2))  # noqa: T201 - the command's output
        return 0

    return command


def bench_parser(
    bench: Any, name: str, summary: str, doc: str | None, run: Callable[..., dict[str, Any]]
) -> argparse.ArgumentParser:
    """Add `bench <name>` (its module docstring as `--help`, `--out FILE`) running `run`."""
    p = bench.add_parser(
        name,
        help=summary,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.set_defaults(func=json_command(run))
    return p
