"""Learned state beside the memories: small versioned byte strings, one per `(owner, name)`.

Components that learn (the RMM reranker, a user's offsets) keep what they learned as bytes under
an owner (a user id, or a shared owner such as `__shared__`) and a name. `StateStore` is the
contract; `FileStateStore` keeps the state in files (or in memory) for the embedded store, and
`reflective_memory.storage.pg_state.DatabaseStateStore` keeps it in PostgreSQL so every process
serving the same users shares it.

Every write goes through `StateStore.update`, a read-modify-write that is atomic (concurrent
updates apply one after the other, none is lost) and gives the state a new version. Readers
cache a state with its version and reload it when `version` moves on. A version is never given
twice to the same `(owner, name)`, even after the state was deleted and written again, so a
cache can never mistake new state for erased state.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reflective_memory.errors import InvalidInputError
from reflective_memory.validation import check_encodable

try:  # POSIX: updates from several processes on one directory apply one after the other
    import fcntl
except ImportError:  # pragma: no cover - Windows: updates are atomic within one process
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "StateStore",
    "StateUpdate",
    "SetsAside",
    "FileStateStore",
    "check_state_key",
    "state_bytes",
]

logger = logging.getLogger(__name__)

#: What `StateStore.update` calls: `(version, data)` of the current state (`0, None` when there
#: is none) to the new data (`None`: delete the state).
StateUpdate = Callable[[int, bytes | None], bytes | None]


@runtime_checkable
class StateStore(Protocol):
    """Versioned bytes by `(owner, name)`: what learning components persist their state in."""

    def version(self, owner: str, name: str) -> int:
        """The state's current version; 0 when there is none (cheap: the data is not read)."""
        ...

    def get(self, owner: str, name: str) -> tuple[int, bytes] | None:
        """`(version, data)` of the state, or None when there is none."""
        ...

    def update(self, owner: str, name: str, fn: StateUpdate) -> tuple[int, bytes | None]:
        """Read-modify-write the state atomically.

        `fn(version, data)` gets the current state (`0, None` when there is none) while no other
        update of this state can run, and returns the new data, or None to delete the state.
        If `fn` raises, nothing is written and the exception propagates.

        Returns:
            `(new version, new data)`; `(0, None)` when the state was deleted or not created.
        """
        ...

    def delete(self, owner: str, name: str) -> bool:
        """Delete one state; return whether it existed."""
        ...

    def delete_owner(self, owner: str) -> int:
        """Delete every state of an owner (e.g. when a user is erased); return how many."""
        ...

    def names(self, owner: str) -> list[str]:
        """The names an owner has state under, sorted."""
        ...


@runtime_checkable
class SetsAside(Protocol):
    """A `StateStore` that can keep a damaged state for inspection instead of deleting it."""

    def set_aside(self, owner: str, name: str, version: int) -> str | None:
        """Move the state `(owner, name)` out of the way if it still has `version`.

        Afterwards the state reads as absent (version 0). The moved copy is erased with the
        state (`delete`, `delete_owner`).

        Returns:
            Where the state went (for the log), or None when it had another version or none.
        """
        ...


def check_state_key(owner: Any, name: Any = None) -> None:
    """Check an owner and a name (unless None): non-empty str without NUL or lone surrogates.

    Raises:
        InvalidInputError: Either is not such a str.
    """
    parts = [("owner", owner)] if name is None else [("owner", owner), ("name", name)]
    for label, value in parts:
        if not isinstance(value, str) or not value:
            raise InvalidInputError(f"state {label} must be a non-empty str, got {value!r}")
        if "\x00" in value:
            raise InvalidInputError(f"state {label} contains a NUL character (0x00)")
        check_encodable(f"state {label}", value)


def state_bytes(data: Any) -> bytes:
    """The bytes an update function returned (bytes-like only).

    Raises:
        InvalidInputError: `data` is not bytes, bytearray or memoryview.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInputError(f"a state update must return bytes or None, got {type(data)}")
    return bytes(data)


_MAGIC = b"reflective-memory state 1\n"
_SUFFIX = ".state"
_ASIDE = ".damaged-"
#: What reading a damaged state file raises.
_DAMAGE = (ValueError, KeyError, TypeError, UnicodeDecodeError)


def _digest(text: str) -> str:
    """A file-name-safe name for any id (ids may hold `/`, `..` or anything else)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


class FileStateStore:
    """`StateStore` in files under a directory, or in this process's memory.

    On disk each state is one file, `<directory>/<hash of owner>/<hash of name>.state`, holding
    a header (owner, name, version, size and checksum) and the data. Files are written to a
    temporary name, flushed to disk and renamed over the old one, so a crash leaves the old or
    the new state, never a mix. Updates hold a lock file (`fcntl.flock`), so processes sharing a
    directory update one after the other; versions come from a counter file beside it. A file
    that is damaged is set aside (renamed `<file>.damaged-<UTC time>`, erased with the state)
    with a warning, and read as no state (learned state is relearned, not fatal).

    Args:
        directory: Where the files go (created on the first write); `None`: keep the state in
            memory only.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._lock = threading.RLock()
        self._depth = 0
        self._memory: dict[tuple[str, str], tuple[int, bytes]] = {}
        self._counter = itertools.count(1)

    def __repr__(self) -> str:
        where = "memory" if self.directory is None else str(self.directory)
        return f"FileStateStore({where!r})"

    # -- locking and versions -------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's lock, and the directory's lock file for the outermost holder."""
        with self._lock:
            if self.directory is None or fcntl is None or self._depth > 0:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / ".lock", "a+b") as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _next_version(self, current: int) -> int:
        """A version above `current` and above every version given before (caller locks)."""
        if self.directory is None:
            return max(next(self._counter), current + 1)
        clock = self.directory / ".clock"
        try:
            last = int(clock.read_text("ascii").strip() or 0)
        except FileNotFoundError:
            last = 0
        except ValueError:
            logger.warning("state version counter %s is damaged; restarting it", clock)
            last = 0
        version = max(last, current) + 1
        self._replace(clock, str(version).encode("ascii"))
        return version

    # -- files ----------------------------------------------------------------------------
    def _owner_dir(self, owner: str) -> Path:
        assert self.directory is not None
        return self.directory / _digest(owner)

    def _path(self, owner: str, name: str) -> Path:
        return self._owner_dir(owner) / f"{_digest(name)}{_SUFFIX}"

    @staticmethod
    def _replace(path: Path, payload: bytes) -> None:
        """Write `payload` to `path` atomically and durably (temporary file, fsync, rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _sync_dir(path.parent)

    @staticmethod
    def _header(path: Path, *, with_data: bool = True) -> tuple[dict[str, Any], bytes] | None:
        """The header of a state file and (`with_data`) the rest of it; None without a file."""
        try:
            with open(path, "rb") as f:
                if f.read(len(_MAGIC)) != _MAGIC:
                    raise ValueError("not a state file")
                line = f.readline()
                data = f.read() if with_data else b""
        except FileNotFoundError:
            return None
        if not line.endswith(b"\n"):
            raise ValueError("truncated header")
        head = json.loads(line)
        if not isinstance(head, dict):
            raise ValueError("bad header")
        return head, data

    def _parse(
        self, path: Path, owner: str, name: str, *, verify: bool
    ) -> tuple[int, bytes] | None:
        """`(version, data)` of a state file, None without one.

        Raises:
            ValueError, KeyError, TypeError: The file is damaged (`_DAMAGE`).
        """
        got = self._header(path, with_data=verify)
        if got is None:
            return None
        head, data = got
        if head.get("owner") != owner or head.get("name") != name:
            raise ValueError("the file holds another state")
        if verify and (
            head.get("size") != len(data) or head.get("sha256") != hashlib.sha256(data).hexdigest()
        ):
            raise ValueError("checksum mismatch")
        version = head["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"bad version {version!r}")
        return version, data

    def _read(self, owner: str, name: str, *, verify: bool = True) -> tuple[int, bytes] | None:
        if self.directory is None:
            return self._memory.get((owner, name))
        path = self._path(owner, name)
        try:
            return self._parse(path, owner, name, verify=verify)
        except _DAMAGE as exc:
            return self._damaged(owner, name, path, exc)

    def _damaged(
        self, owner: str, name: str, path: Path, exc: Exception
    ) -> tuple[int, bytes] | None:
        """Set a damaged state file aside (renamed `*.damaged-<time>`) and read it as no state.

        Checked again under the lock first: another process may have replaced the file since.
        """
        with self._locked():
            try:
                return self._parse(path, owner, name, verify=True)
            except FileNotFoundError:
                return None
            except _DAMAGE as again:
                exc = again
            aside = _aside_path(path)
            try:
                os.replace(path, aside)
            except FileNotFoundError:
                return None
            _sync_dir(path.parent)
        logger.warning(
            "damaged learned state %r of %r (%s): set aside as %s; it starts again from scratch",
            name,
            owner,
            exc,
            aside,
        )
        return None

    def _write(self, owner: str, name: str, version: int, data: bytes) -> None:
        if self.directory is None:
            self._memory[(owner, name)] = (version, data)
            return
        head = {
            "owner": owner,
            "name": name,
            "version": version,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        self._replace(self._path(owner, name), _MAGIC + json.dumps(head).encode() + b"\n" + data)

    def _remove(self, owner: str, name: str) -> bool:
        if self.directory is None:
            return self._memory.pop((owner, name), None) is not None
        path = self._path(owner, name)
        for aside in path.parent.glob(f"{path.name}{_ASIDE}*"):  # erased with the state
            aside.unlink(missing_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        _sync_dir(path.parent)
        try:
            path.parent.rmdir()  # the owner's last state: no empty directory names it
        except OSError:
            pass
        return True

    # -- the contract ---------------------------------------------------------------------
    def version(self, owner: str, name: str) -> int:
        """See `StateStore.version` (reads the file's header only)."""
        check_state_key(owner, name)
        got = self._read(owner, name, verify=False)
        return 0 if got is None else got[0]

    def get(self, owner: str, name: str) -> tuple[int, bytes] | None:
        """See `StateStore.get`."""
        check_state_key(owner, name)
        return self._read(owner, name)

    def update(self, owner: str, name: str, fn: StateUpdate) -> tuple[int, bytes | None]:
        """See `StateStore.update`."""
        check_state_key(owner, name)
        with self._locked():
            current = self._read(owner, name)
            version, data = (0, None) if current is None else current
            new = fn(version, data)
            if new is None:
                if current is not None:
                    self._remove(owner, name)
                return 0, None
            out = state_bytes(new)
            version = self._next_version(version)
            self._write(owner, name, version, out)
            return version, out

    def delete(self, owner: str, name: str) -> bool:
        """See `StateStore.delete`."""
        check_state_key(owner, name)
        with self._locked():
            return self._remove(owner, name)

    def delete_owner(self, owner: str) -> int:
        """See `StateStore.delete_owner` (removes the owner's directory)."""
        check_state_key(owner)
        with self._locked():
            if self.directory is None:
                gone = [k for k in self._memory if k[0] == owner]
                for k in gone:
                    del self._memory[k]
                return len(gone)
            folder = self._owner_dir(owner)
            if not folder.is_dir():
                return 0
            n = sum(1 for _ in folder.glob(f"*{_SUFFIX}"))
            shutil.rmtree(folder)
            _sync_dir(folder.parent)
            return n

    def set_aside(self, owner: str, name: str, version: int) -> str | None:
        """See `SetsAside.set_aside`: the file is renamed `*.damaged-<time>` beside it."""
        check_state_key(owner, name)
        with self._locked():
            current = self._read(owner, name, verify=False)
            if current is None or current[0] != version:
                return None
            if self.directory is None:
                del self._memory[(owner, name)]
                return "deleted (in memory)"
            path = self._path(owner, name)
            aside = _aside_path(path)
            os.replace(path, aside)
            _sync_dir(path.parent)
            return str(aside)

    def names(self, owner: str) -> list[str]:
        """See `StateStore.names`."""
        check_state_key(owner)
        if self.directory is None:
            with self._lock:
                return sorted(n for o, n in self._memory if o == owner)
        found: list[str] = []
        for path in sorted(self._owner_dir(owner).glob(f"*{_SUFFIX}")):
            try:
                got = self._header(path, with_data=False)
            except (ValueError, UnicodeDecodeError) as exc:
                logger.warning("ignoring damaged state file %s: %s", path, exc)
                continue
            if got is not None and got[0].get("owner") == owner:
                found.append(str(got[0].get("name")))
        return sorted(found)


def _aside_path(path: Path) -> Path:
    """Where a damaged state file is set aside: beside it, named by the time (UTC)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return path.with_name(f"{path.name}{_ASIDE}{stamp}")


def _sync_dir(path: Path) -> None:
    """Make a rename or unlink in `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
