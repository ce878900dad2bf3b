"""Read a JSON file within bounds and check its shape, failing with one typed error.

`read_json` refuses a file larger than `MAX_FILE_BYTES` (checked on disk before reading, and
again on the decompressed bytes of a `.gz`), bytes that are not UTF-8, malformed JSON, nesting
deeper than `MAX_DEPTH` (a file nested 100,000 deep fails in the parser, which is bounded by the
interpreter's recursion limit, not by the stack), integers of more than `MAX_INT_DIGITS` digits
and numbers that are not finite (`NaN`, `Infinity`, `1e999`). `read_text_file` reads a small
file a setting names (a learned model, a tokens file): a regular file only (a FIFO or a device
is refused without blocking), within a size cap, UTF-8; `loads_bounded` parses JSON text with
the same limits as `read_json`. `FileShape` walks the parsed value and names the file, the path
inside it (`sessions[0].turns[3].text`) and the problem in every `InvalidFileError`.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, AnyStr

from reflective_memory.errors import InvalidFileError

__all__ = [
    "read_json",
    "bounded_lines",
    "MAX_LINE_BYTES",
    "read_text_file",
    "loads_bounded",
    "open_regular",
    "MAX_INT_DIGITS",
    "MAX_MODEL_FILE_BYTES",
    "json_depth",
    "FileShape",
    "MAX_FILE_BYTES",
    "MAX_IMPORT_BYTES",
    "MAX_DEPTH",
]

#: Largest conversation file read (bytes on disk, and bytes after gzip decompression): 256 MiB.
#: LongMemEval-S's 500-question file is about 265 MB; raise it with `max_bytes=` (or the
#: CLI's `--max-file-mb`) for larger files.
MAX_FILE_BYTES = 256 * 2**20

#: Largest export file `import` reads, counted after gzip decompression while reading: 1024 MiB.
#: An export is read line by line, so this bounds the time of an import, not its memory; raise
#: it with `max_bytes=` (`reflective_memory.portable.import_memory`) or `import --max-file-mb`.
MAX_IMPORT_BYTES = 1024 * 2**20

#: Deepest nesting of lists and objects accepted (the supported formats need 6).
MAX_DEPTH = 32

#: Longest line a line-by-line reader takes (JSON Lines, exports), after decompression: a
#: memory with its vector or a chat message is a few KiB; 64 MiB is a guard.
MAX_LINE_BYTES = 64 * 2**20

#: Largest learned-model or settings file a setting names (a turn ranker, segmenter weights, a
#: rubric): the shipped ones are under 1 KiB.
MAX_MODEL_FILE_BYTES = 2**20

#: Most digits of an integer in a JSON file (a float holds about 309; Python refuses to read
#: an integer of more than 4,300 digits, and converts none of over 308 to a float).
MAX_INT_DIGITS = 300

_KINDS: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def json_depth(data: Any) -> int:
    """The deepest nesting of lists and objects in `data` (iterative: no recursion)."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def bounded_lines(
    fh: IO[AnyStr],
    name: str | Path,
    *,
    max_total: int | None,
    too_large: str,
    max_line: int = MAX_LINE_BYTES,
    unit: str = "bytes",
) -> Iterator[tuple[int, AnyStr]]:
    """`(line number, line)` of an open stream, no line read past what the limits allow.

    Each line is read with `readline(limit)`, so a line of any length (a gzip member that
    inflates to one 600 MB line) costs at most the room left under `max_total` or
    `max_line`, never its whole length.

    Args:
        fh: A text or binary stream (lengths are characters or bytes).
        name: The file, for errors.
        max_total: Most characters or bytes of the whole stream (None: no limit).
        too_large: What is wrong when the stream passes `max_total`.
        max_line: Longest line.
        unit: What lengths count, for errors (`bytes`, or `characters` for a text stream).

    Raises:
        InvalidFileError: Naming the line: the stream passes `max_total`, a line is longer
            than `max_line`, or the stream cannot be read (a damaged `.gz`).
    """
    n = total = 0
    while True:
        room = max_line if max_total is None else min(max_line, max_total - total)
        try:
            line = fh.readline(room + 1)
        except (OSError, EOFError) as exc:
            raise InvalidFileError(name, f"line {n + 1}", f"cannot be read ({exc})") from None
        if not line:
            return
        n += 1
        total += len(line)
        if max_total is not None and total > max_total:
            raise InvalidFileError(name, f"line {n}", too_large)
        if len(line) > max_line:
            raise InvalidFileError(name, f"line {n}", f"is longer than {max_line:,} {unit}")
        yield n, line


def open_regular(path: str | Path) -> io.BufferedReader:
    """Open a regular file for reading; anything else is refused before a byte is read.

    The file is opened without blocking and checked on the open descriptor, so a FIFO (which
    would wait for a writer forever) or a device (`/dev/zero` never ends) is refused at once,
    and nothing can swap the path between the check and the read.

    Raises:
        InvalidFileError: The path is missing, unreadable, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        problem = "no such file" if isinstance(exc, FileNotFoundError) else None
        raise InvalidFileError(
            path, "", problem or f"cannot be read ({exc.strerror or exc})"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidFileError(path, "", "is not a regular file (a FIFO, a device or a folder)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _bounded(fh: io.BufferedReader, path: str | Path, max_bytes: int) -> bytes:
    """At most `max_bytes` of an open file, refused whole when it holds more."""
    size = os.fstat(fh.fileno()).st_size
    if size > max_bytes:
        raise InvalidFileError(
            path, "", f"is {size:,} bytes, more than the maximum of {max_bytes:,}"
        )
    raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:  # it grew since (or reports no size)
        raise InvalidFileError(path, "", f"holds more than the maximum of {max_bytes:,} bytes")
    return raw


def read_text_file(path: str | Path, *, max_bytes: int) -> str:
    """The UTF-8 text of a small regular file, read within `max_bytes`.

    Raises:
        InvalidFileError: The file is missing, not a regular file, larger than `max_bytes` or
            not UTF-8 (a byte order mark is allowed).
    """
    try:
        with open_regular(path) as fh:
            raw = _bounded(fh, path, max_bytes)
    except OSError as exc:
        raise InvalidFileError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    return _utf8(raw, path)


def _utf8(raw: bytes, path: str | Path) -> str:
    """`raw` as UTF-8 text (a byte order mark dropped), or the error naming the byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidFileError(path, "", f"is not UTF-8 text (byte {exc.start})") from None


class _NumberProblem(ValueError):
    """A number JSON text may hold but a bounded reader refuses."""


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _NumberProblem(f"an integer has {len(digits):,} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NumberProblem(f"the number {text[:40]} is too large to be finite")
    return value


def _constant(name: str) -> float:
    raise _NumberProblem(f"{name} is not a number JSON allows")


def loads_bounded(text: str, path: str | Path, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text within bounds: nesting, integer digits, finite numbers.

    Raises:
        InvalidFileError: Naming `path`: the text is not JSON, nests deeper than `max_depth`,
            holds an integer of more than `MAX_INT_DIGITS` digits, or a number that is not
            finite (`NaN`, `Infinity`, `1e999`).
    """
    try:
        data = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _NumberProblem as exc:
        raise InvalidFileError(path, "", f"is not a readable JSON file: {exc}") from None
    except json.JSONDecodeError as exc:
        problem = f"is not a readable JSON file: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise InvalidFileError(path, "", problem) from None
    except RecursionError:
        raise InvalidFileError(path, "", f"is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise InvalidFileError(path, "", f"is not a readable JSON file: {exc}") from None
    if json_depth(data) > max_depth:
        raise InvalidFileError(path, "", f"is nested deeper than {max_depth} levels")
    return data


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    with open_regular(path) as fh:
        raw = _bounded(fh, path, max_bytes)
    if path.suffix != ".gz":
        return raw
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
            data = gz.read(max_bytes + 1)  # bounded: a small .gz cannot inflate past the limit
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidFileError(path, "", f"is not a readable gzip file ({exc})") from None
    if len(data) > max_bytes:
        raise InvalidFileError(
            path, "", f"decompresses to more than the maximum of {max_bytes:,} bytes"
        )
    return data


def read_json(path: Path, *, max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a `.json` or `.json.gz` file within bounds.

    Args:
        path: The file.
        max_bytes: Largest file (and decompressed content) accepted.
        max_depth: Deepest nesting of lists and objects accepted.

    Returns:
        The parsed value.

    Raises:
        InvalidFileError: The file is missing, not a regular file, too large, not gzip (for
            `.gz`), not UTF-8, not JSON, nested too deep, or holds a number out of bounds.
    """
    try:
        raw = _read_bytes(path, max_bytes)
    except OSError as exc:
        raise InvalidFileError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    return loads_bounded(_utf8(raw, path), path, max_depth=max_depth)


@dataclass(frozen=True)
class FileShape:
    """Typed access to a parsed file; every failure names the file and the path inside it.

    Args:
        path: The file, for messages.
    """

    path: Path

    def fail(self, where: str, problem: str) -> InvalidFileError:
        """The error for `problem` at `where` (returned, for the caller to raise)."""
        return InvalidFileError(self.path, where, problem)

    def expect(self, value: Any, where: str, *types: type) -> Any:
        """`value` if it is one of `types` (a bool is not an int), else raise."""
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            want = " or ".join(_KINDS.get(t, t.__name__) for t in types)
            raise self.fail(where, f"must be {want}, got {_kind(value)}")
        return value

    def field(
        self, obj: dict[str, Any], key: str, where: str, *types: type, required: bool = True
    ) -> Any:
        """`obj[key]` checked against `types`; `None` when optional and absent (or null)."""
        at = f"{where}.{key}" if where else key
        if key not in obj or (obj[key] is None and not required):
            if required:
                raise self.fail(where or "top level", f"missing key {key!r}")
            return None
        return self.expect(obj[key], at, *types)

    def only(self, obj: dict[str, Any], where: str, allowed: set[str]) -> None:
        """Raise on a key of `obj` outside `allowed`."""
        extra = sorted(set(obj) - allowed)
        if extra:
            raise self.fail(
                where or "top level",
                f"unknown key {extra[0]!r} (allowed: {', '.join(sorted(allowed))})",
            )
