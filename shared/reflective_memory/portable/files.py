"""`export_memory` and `import_memory`: the export format to and from files or text streams."""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from reflective_memory.errors import InvalidFileError, InvalidInputError
from reflective_memory.jsonfile import MAX_IMPORT_BYTES, MAX_LINE_BYTES, bounded_lines
from reflective_memory.portable.endpoints import endpoint
from reflective_memory.portable.export import ExportReport, iter_records, write_records
from reflective_memory.portable.format import check_header
from reflective_memory.portable.importer import Importer, ImportReport

if TYPE_CHECKING:
    from reflective_memory.embed import Embedder
    from reflective_memory.storage.state import StateStore

__all__ = [
    "export_memory",
    "import_memory",
    "check_import_file",
    "read_lines",
    "MAX_LINE_BYTES",
    "MAX_IMPORT_BYTES",
]


def export_memory(
    source: Any,
    fp: str | Path | IO[str],
    *,
    users: Sequence[str] | None = None,
    vectors: bool = True,
    state: StateStore | None = None,
) -> ExportReport:
    """Write a store's users, sessions, turns, memories and learned state as JSON Lines.

    Streams one user at a time (memory is bounded by the largest user, not the store). A file
    path is written under a temporary name of its own beside it (`.<name>.<random>.part`, so
    no other file is touched) and renamed when complete, so a failed export leaves no partial
    file; a `.gz` path is gzip-compressed. An export holds every exported user's memory: a new
    file is created readable by its owner only (mode 0600); a regular file replaced keeps its
    permissions. A path that is a symbolic link or anything but a regular file (`/dev/null`, a
    FIFO) is refused before anything is written.

    Args:
        source: A `ReflectiveMemory` or a `MemoryStore` (`reflective_memory.portable.endpoints`).
        fp: A file path, or a text stream to write to.
        users: Only these users (default: all).
        vectors: Carry each memory's embedding (an import then need not embed again).
        state: Learned state to carry (default: the memory's or the store's own).

    Returns:
        What was written.

    Raises:
        UnknownUserError: A user in `users` has nothing stored.

    Example:
        >>> import io
        >>> from reflective_memory import HashingEmbedder, ReflectiveMemory
        >>> with ReflectiveMemory(embedder=HashingEmbedder()) as mem:
        ...     _ = mem.add_turn("ana", "s1", "user", "My dog Pixel loves the beach.")
        ...     out = io.StringIO()
        ...     export_memory(mem, out).counts
        {'session': 1, 'turn': 1}
    """
    ep = endpoint(source, state=state)
    report = ExportReport()
    records = iter_records(ep, users=users, vectors=vectors, report=report)
    if not isinstance(fp, (str, Path)):
        write_records(records, fp)
        return report
    path = Path(fp)
    _check_output(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    part = Path(name)  # a name no other file has (mode 0600: an export holds every user's text)
    try:
        with ExitStack() as files:  # closed in reverse: text, then gzip (its trailer), then file
            stream: IO[bytes] = files.enter_context(os.fdopen(fd, "wb"))
            if path.suffix == ".gz":
                stream = files.enter_context(gzip.GzipFile(fileobj=stream, mode="wb"))
            out = files.enter_context(io.TextIOWrapper(stream, encoding="utf-8", newline="\n"))
            write_records(records, out)
        with part.open("rb") as done:
            os.fsync(done.fileno())
        if path.exists():  # keep the replaced file's own permissions
            os.chmod(part, stat.S_IMODE(path.stat().st_mode))
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return report


def _check_output(path: Path) -> None:
    """Refuse to replace anything but a regular file (a symlink, a device, a FIFO, a folder).

    Raises:
        InvalidInputError: `path` is a symbolic link, or exists and is not a regular file.
    """
    if path.is_symlink():
        raise InvalidInputError(
            f"{path} is a symbolic link: export writes only to a new path or a regular file"
        )
    if path.exists() and not path.is_file():
        raise InvalidInputError(
            f"{path} is not a regular file (a device, FIFO or folder): export will not replace it"
        )


def read_lines(
    fp: str | Path | IO[bytes], *, name: str | None = None, max_bytes: int | None = None
) -> Iterator[Any]:
    """The parsed JSON of each line of an export file (a path or a binary stream).

    Args:
        fp: The file (`.gz`: read compressed) or a binary stream.
        name: The stream's name in errors.
        max_bytes: Most bytes read (after decompression), counted as lines are read: the line
            that passes it raises before more is read (default: no limit).

    Raises:
        InvalidFileError: A line is not UTF-8, not JSON, or longer than `MAX_LINE_BYTES`, or
            the file holds more than `max_bytes`; the error names the line.
    """
    if isinstance(fp, (str, Path)):
        path = Path(fp)
        if not path.is_file():
            raise InvalidFileError(path, "", "no such file")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            yield from _parse(cast(IO[bytes], fh), str(path), max_bytes)
        return
    yield from _parse(fp, name or "<stream>", max_bytes)


def _too_large(max_bytes: int) -> str:
    return (
        f"holds more than the maximum of {max_bytes:,} bytes "
        f"({max_bytes / 2**20:g} MiB, decompressed; import --max-file-mb raises it)"
    )


def _parse(fh: IO[bytes], name: str, max_bytes: int | None = None) -> Iterator[Any]:
    too_large = "" if max_bytes is None else _too_large(max_bytes)
    for n, raw in bounded_lines(fh, name, max_total=max_bytes, too_large=too_large):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidFileError(name, f"line {n}", f"is not UTF-8 (byte {exc.start})") from None
        if not text.strip():
            raise InvalidFileError(name, f"line {n}", "is empty")
        try:
            yield json.loads(text)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            problem = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise InvalidFileError(name, f"line {n}", f"is not JSON: {problem}") from None


def check_size(path: Path, max_bytes: int) -> None:
    """Refuse a file holding more than `max_bytes`, before anything of it is imported.

    A plain file is measured on disk; a `.gz` is decompressed in 1 MiB chunks, counted, and
    the count stops as soon as it passes `max_bytes` (a gzip bomb costs `max_bytes` of
    decompression, not its whole size, and no memory). A damaged `.gz` is left for the import
    to report, naming the line.

    Raises:
        InvalidFileError: The file holds more than `max_bytes`.
    """
    if not path.is_file():
        return  # read_lines says so
    if path.stat().st_size > max_bytes:
        raise InvalidFileError(path, "", _too_large(max_bytes))
    if path.suffix != ".gz":
        return
    total = 0
    try:
        with gzip.open(path, "rb") as fh:
            while chunk := fh.read(min(2**20, max_bytes - total + 1)):
                total += len(chunk)
                if total > max_bytes:
                    raise InvalidFileError(path, "", _too_large(max_bytes))
    except (OSError, EOFError):
        return


def check_import_file(path: str | Path, max_bytes: int | None = MAX_IMPORT_BYTES) -> None:
    """Check an export file's size and header before any store is opened or created.

    The size is measured as `check_size` does (a gzip bomb costs `max_bytes` of decompression,
    no memory); the header line must be an export's. The lines are checked as they are
    imported.

    Raises:
        InvalidFileError: The file is missing, larger than `max_bytes`, or not an export.
    """
    path = Path(path)
    if max_bytes is not None:
        check_size(path, max_bytes)
    header = next(read_lines(path, max_bytes=max_bytes), None)
    if header is None:
        raise InvalidFileError(path, "", "is empty (no header line)")
    check_header(path, header)


def import_memory(
    target: Any,
    fp: str | Path | IO[bytes],
    *,
    embedder: Embedder | None = None,
    reembed: bool = True,
    state: StateStore | None = None,
    max_bytes: int | None = MAX_IMPORT_BYTES,
    measure: bool = True,
) -> ImportReport:
    """Import an export file into a store; what the store already holds is skipped.

    Each user's block is staged and checked whole before anything of it is written (a
    malformed line or a block that does not match its checksum raises `InvalidFileError`
    naming the line; nothing of that user's block is written, users before it stay imported,
    and a run on the fixed file finishes the job). Embeddings: a memory's vector from the file
    is reused when the importing embedder made it (same name and size), and computed again
    from its key otherwise; without an embedder (a bare store, `reembed=False`) vectors are
    stored as the file has them, under the model that made them. `ImportReport.vectors` says
    which.

    Args:
        target: A `ReflectiveMemory` (its embedder is the importing one) or a `MemoryStore`.
        fp: The file (a path; `.gz` is read compressed) or a binary stream.
        embedder: The importing embedder (default: the memory's; none for a bare store).
        reembed: Embed again when another embedder made a vector (else keep it).
        state: Where learned state goes (default: the memory's or the store's own).
        max_bytes: Largest file accepted, in bytes after decompression (`None`: no limit). A
            path is measured before anything is written (a `.gz` by decompressing it, stopping
            as soon as the count passes the limit); a stream is counted as it is read, so the
            users before the line that passes the limit stay imported.
        measure: Measure a path before importing (False: the caller did, with
            `check_import_file`, before it opened the target).

    Returns:
        Counts of what was added and skipped, by kind.

    Raises:
        InvalidFileError: The file is not an export, is malformed (naming the line), cut, or
            larger than `max_bytes`.
    """
    ep = endpoint(target, state=state, embedder=embedder)
    name = str(fp) if isinstance(fp, (str, Path)) else "<stream>"
    if measure and max_bytes is not None and isinstance(fp, (str, Path)):
        check_size(Path(fp), max_bytes)
    return Importer(ep, path=name, reembed=reembed).run(read_lines(fp, max_bytes=max_bytes))
