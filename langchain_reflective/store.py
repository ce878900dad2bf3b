"""`ReflectiveStore`: a LangGraph `BaseStore` whose items are the core's memories.

Give it to `langchain.agents.create_agent(..., store=ReflectiveStore(...))` (or any LangGraph
graph) and tools reach it through `runtime.store` / `langgraph.config.get_store()`.

How namespaces map to users:

* `user_id` given: the store serves that one user; every namespace is a folder of that user.
* `user_id` not given: the namespace element at `user_position` (default 0, the first) is the
  user id, e.g. `("ana", "memories")` belongs to user `ana`. Every operation must name its user:
  a search or namespace listing whose prefix does not reach that position is refused (with
  `allow_cross_user=True` it spans every user of the core instead, for admin tools).

How items are kept: each item is one core memory of granularity `item` (written with
`ReflectiveMemory.put_memory`) whose id is derived from (user, namespace, key), so a put
overwrites and a get is one lookup by id. The memory's metadata keep the full namespace, the key
and the value as JSON; its text is a readable rendering of the value (`field: value` lines),
and its indexed key is that rendering or the text of the fields named by the store's
`index={"fields": [...]}` (or a put's `index=[...]`). Because they are ordinary memories, the
items are also found by the user's `ReflectiveRetriever` and `ReflectiveMemoryMiddleware`.

Search: with a `query` the items under the namespace prefix that pass the filter are ranked by
the core's retrieval (hybrid dense + BM25 by default) and `score` is the core's score; items put
with `index=False` (or whose indexed fields are missing) come after the ranked ones without a
score, as in LangGraph's `InMemoryStore`. Without a query items are listed most recently updated
first. Filters compare the value like LangGraph's stores: exact match, nested dicts, and the
operators `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`.

Batches follow LangGraph's convention: reads (get, search, list) see the store as it was before
the batch's writes, which are applied afterwards; of several puts to one item the last wins.

TTL (`supports_ttl` is True): `put(..., ttl=minutes)` (or a `PutOp.ttl`) makes an item expire
that many minutes after its last write or refreshing read; `ttl_config={"default_ttl": ...}`
gives puts that name no TTL one (`ttl=None` still means never). An item past its expiry is
never returned by get, search or `list_namespaces`, swept or not. A get or search with
`refresh_ttl` (default: `ttl_config["refresh_on_read"]`, else True) moves the expiry of the
items it returns forward, with a metadata-only write: nothing is re-embedded and the user's
index stays valid (`updated_at` stays too). `sweep_ttl()` deletes the expired items of every
user of the core, from every file (`ReflectiveMemory.delete_expired`: one statement decides
and deletes, so a refresh or put at the same moment is never lost);
`start_ttl_sweeper()` runs it every `ttl_config["sweep_interval_minutes"]` (default 5) in a
background thread until `stop_ttl_sweeper()`. Until swept, an expired item is still a memory of
its user, found by the user's `ReflectiveRetriever`. Expiry times come from `clock` (seconds
since the epoch; `time.time` unless given, e.g. a fake clock in tests).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    validate_op_namespace,
)
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ConfigError, InvalidInputError, UnknownMemoryError
from reflective_memory.types import Memory

from langchain_reflective.store_filter import check_filter, matches, path_matches
from langchain_reflective.store_ttl import (
    TTL_DEFAULTS,
    TTLSweeper,
    check_ttl,
    check_ttl_config,
    expiry_fields,
)

__all__ = ["ReflectiveStore", "StoreNamespaceError", "render_value"]

logger = logging.getLogger(__name__)

#: Marker stored in `Memory.metadata["store"]` for items written by this store.
_MARK = "langgraph"


class StoreNamespaceError(InvalidInputError, InvalidNamespaceError):
    """A namespace does not name its user (or is otherwise unusable by `ReflectiveStore`)."""


def render_value(value: Mapping[str, Any]) -> str:
    """A readable rendering of an item's value: one `field: value` line per top-level field.

    Strings are written as they are, everything else as compact JSON.

    Example:
        >>> print(render_value({"food": "pizza", "tags": ["cheese", "thin"]}))
        food: pizza
        tags: ["cheese", "thin"]
    """
    if not value:
        return "{}"
    lines = []
    for field, v in value.items():
        shown = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, sort_keys=True)
        lines.append(f"{field}: {shown}")
    return "\n".join(lines)


class _Entry:
    """A stored item decoded from its memory."""

    __slots__ = ("memory", "namespace", "key", "value", "indexed", "ttl", "expires_at")

    def __init__(self, memory: Memory) -> None:
        meta = memory.metadata
        self.memory = memory
        self.namespace: tuple[str, ...] = tuple(meta["namespace"])
        self.key: str = meta["key"]
        self.value: dict[str, Any] = json.loads(meta["value"])
        self.indexed: bool = bool(meta.get("indexed", True))
        ttl, expires_at = meta.get("ttl"), meta.get("expires_at")
        self.ttl: float | None = None if ttl is None else float(ttl)
        self.expires_at: float | None = None if expires_at is None else float(expires_at)

    def expired(self, now: float) -> bool:
        """Whether the item's expiry is at or before `now` (epoch seconds)."""
        return self.expires_at is not None and self.expires_at <= now

    def item(self) -> Item:
        return Item(
            value=self.value,
            key=self.key,
            namespace=self.namespace,
            created_at=self.memory.created_at,
            updated_at=self.memory.updated_at,
        )

    def search_item(self, score: float | None) -> SearchItem:
        return SearchItem(
            namespace=self.namespace,
            key=self.key,
            value=self.value,
            created_at=self.memory.created_at,
            updated_at=self.memory.updated_at,
            score=score,
        )


def _entry(memory: Memory) -> _Entry | None:
    meta = memory.metadata
    if memory.granularity != "item" or meta.get("store") != _MARK:
        return None
    try:
        return _Entry(memory)
    except (KeyError, TypeError, ValueError):
        logger.warning("memory %s of user %s: unreadable store item", memory.id, memory.user_id)
        return None


class ReflectiveStore(BaseStore):
    """LangGraph store on a `ReflectiveMemory`: namespaces map to users, search is retrieval.

    See the module documentation for the namespace-to-user mapping, how items are stored,
    searched and filtered, the batch semantics and TTLs.

    Args:
        memory: The core memory store.
        user_id: Serve only this user (every namespace is one of its folders). `None`: the
            namespace element at `user_position` names the user.
        user_position: Which namespace element is the user id when `user_id` is `None`.
        index: LangGraph index config; only `fields` is used (JSON paths whose text is indexed
            for query search, default `["$"]`, the whole value). Embeddings always come from the
            core's embedder, so `embed` and `dims` are refused.
        allow_cross_user: Let a search or namespace listing that does not name a user span
            every user of the core (off by default: every operation names its user).
        mode: Ranking override for query search: `hybrid`, `dense` or `lexical` (`None`: the
            core's config).
        ttl_config: LangGraph `TTLConfig`: `default_ttl` (minutes, for puts that name no TTL),
            `refresh_on_read` (default True), `sweep_interval_minutes` (for
            `start_ttl_sweeper`, default 5). `omit_expired` may only be True: expired items are
            never returned. `None`: items expire only when put with a TTL.
        clock: Seconds since the epoch, now (`None`: `time.time`).

    Raises:
        InvalidInputError: A bad argument.
        ConfigError: `index` asks for something the store cannot do, or a bad `ttl_config`.

    Example:
        >>> from reflective_memory import ReflectiveMemory, HashingEmbedder
        >>> store = ReflectiveStore(memory=ReflectiveMemory(embedder=HashingEmbedder()))
        >>> store.put(("ana", "prefs"), "food", {"likes": "spicy ramen"})
        >>> store.get(("ana", "prefs"), "food").value
        {'likes': 'spicy ramen'}
        >>> [i.key for i in store.search(("ana",), query="what food does she like")]
        ['food']
        >>> store.search(("bob",), query="food")
        []
    """

    supports_ttl = True

    def __init__(
        self,
        *,
        memory: ReflectiveMemory,
        user_id: str | None = None,
        user_position: int = 0,
        index: IndexConfig | None = None,
        allow_cross_user: bool = False,
        mode: str | None = None,
        ttl_config: TTLConfig | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(memory, ReflectiveMemory):
            raise InvalidInputError(
                f"memory must be a ReflectiveMemory, got {type(memory).__name__}"
            )
        if user_id is not None and (not isinstance(user_id, str) or not user_id.strip()):
            raise InvalidInputError("user_id must be None or a non-empty str")
        if not isinstance(user_position, int) or isinstance(user_position, bool):
            raise InvalidInputError("user_position must be an int")
        if user_position < 0:
            raise InvalidInputError("user_position must be >= 0")
        if mode not in (None, "hybrid", "dense", "lexical"):
            raise InvalidInputError(f"mode must be None, hybrid, dense or lexical, got {mode!r}")
        if clock is not None and not callable(clock):
            raise InvalidInputError("clock must be None or a callable returning epoch seconds")
        fields: list[str] = ["$"]
        if index is not None:
            if not isinstance(index, Mapping):
                raise ConfigError("index must be a dict like {'fields': ['text']}")
            unsupported = sorted(set(index) - {"fields"})
            if unsupported:
                raise ConfigError(
                    f"ReflectiveStore embeds with the core's embedder; index options "
                    f"{unsupported} are not supported (give only 'fields')"
                )
            fields = self._check_fields(index.get("fields") or ["$"])
        self.memory = memory
        self.user_id = user_id
        self.user_position = user_position
        self.index_fields = fields
        self.allow_cross_user = bool(allow_cross_user)
        self.mode = mode
        self.ttl_config = check_ttl_config(ttl_config)
        self.clock: Callable[[], float] = time.time if clock is None else clock
        self._sweeper = TTLSweeper(self.sweep_ttl)

    # -- mapping ----------------------------------------------------------------------------
    @staticmethod
    def _check_fields(fields: Any) -> list[str]:
        if isinstance(fields, str) or not isinstance(fields, Sequence):
            raise ConfigError("index fields must be a list of JSON paths")
        if not fields or not all(isinstance(f, str) and f for f in fields):
            raise ConfigError("index fields must be non-empty strings")
        return list(fields)

    def user_of(self, namespace: tuple[str, ...]) -> str:
        """The user a namespace belongs to.

        Raises:
            StoreNamespaceError: The namespace is too short to contain the user id.
        """
        if self.user_id is not None:
            return self.user_id
        if len(namespace) <= self.user_position:
            raise StoreNamespaceError(
                f"namespace {namespace!r} does not name a user: ReflectiveStore reads the user "
                f"id from namespace element {self.user_position}"
            )
        return namespace[self.user_position]

    def memory_id(self, namespace: tuple[str, ...], key: str) -> str:
        """The deterministic core memory id of the item at (namespace, key)."""
        user = self.user_of(namespace)
        digest = hashlib.sha256(
            json.dumps([user, list(namespace), key], ensure_ascii=False).encode("utf-8")
        ).hexdigest()
        return f"item-{digest[:32]}"

    def _users_for(self, prefix: tuple[str, ...]) -> list[str]:
        """Users whose items a prefix (possibly with `*` wildcards) can reach."""
        if self.user_id is not None:
            return [self.user_id]
        if len(prefix) > self.user_position and prefix[self.user_position] != "*":
            return [prefix[self.user_position]]
        if not self.allow_cross_user:
            raise StoreNamespaceError(
                f"prefix {prefix!r} does not name a user (namespace element "
                f"{self.user_position}); searching or listing across users needs "
                "allow_cross_user=True"
            )
        return self.memory.users()

    def _entries(self, user: str, now: float) -> list[_Entry]:
        """The user's items, those expired at `now` left out."""
        out = []
        for mem in self.memory.memories(user):
            e = _entry(mem)
            if e is not None and not e.expired(now):
                out.append(e)
        return out

    # -- validation -------------------------------------------------------------------------
    def _validate(self, op: Op) -> None:
        if not isinstance(op, (GetOp, PutOp, SearchOp, ListNamespacesOp)):
            raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        validate_op_namespace(op)
        if isinstance(op, (GetOp, PutOp)):
            if not isinstance(op.key, str) or not op.key:
                raise InvalidInputError("item keys must be non-empty str")
            if not op.namespace:
                raise StoreNamespaceError("namespace must not be empty")
            self.user_of(op.namespace)
        if isinstance(op, PutOp):
            check_ttl(op.ttl)
            if op.value is not None:
                if not isinstance(op.value, Mapping):
                    raise InvalidInputError("item values must be dicts (or None to delete)")
                try:
                    json.dumps(dict(op.value))
                except (TypeError, ValueError) as exc:
                    raise InvalidInputError(f"item value is not JSON-serialisable: {exc}") from exc
            if op.index not in (None, False):
                self._check_fields(op.index)
        if isinstance(op, SearchOp):
            if op.limit < 0 or op.offset < 0:
                raise InvalidInputError("search limit and offset must be >= 0")
            if op.query is not None and not isinstance(op.query, str):
                raise InvalidInputError("search query must be a str or None")
            if op.filter is not None and not isinstance(op.filter, dict):
                raise InvalidInputError("search filter must be a dict or None")
            check_filter(op.filter)
        if isinstance(op, ListNamespacesOp):
            if op.limit < 0 or op.offset < 0:
                raise InvalidInputError("list_namespaces limit and offset must be >= 0")
            if op.max_depth is not None and op.max_depth < 1:
                raise InvalidInputError("max_depth must be None or >= 1")

    # -- operations -------------------------------------------------------------------------
    def _get(self, op: GetOp, now: float) -> _Entry | None:
        user = self.user_of(op.namespace)
        try:
            mem = self.memory.get_memory(user, self.memory_id(op.namespace, op.key))
        except UnknownMemoryError:
            return None
        e = _entry(mem)
        if e is None or e.namespace != tuple(op.namespace) or e.key != op.key or e.expired(now):
            return None
        return e

    def _put(self, op: PutOp, now: float) -> None:
        user = self.user_of(op.namespace)
        mid = self.memory_id(op.namespace, op.key)
        if op.value is None:
            self.memory.delete_memory(user, mid)
            return
        value = json.loads(json.dumps(dict(op.value)))
        text = render_value(value)
        paths = self.index_fields if op.index is None else op.index
        indexed = op.index is not False
        key = text
        if indexed and list(paths) != ["$"]:
            parts: list[str] = []
            for path in paths:
                parts.extend(text if path == "$" else get_text_at_path(value, path))
            parts = [p for p in parts if p.strip()]
            indexed = bool(parts)
            key = "\n".join(parts) if parts else text
        meta: dict[str, Any] = {
            "store": _MARK,
            "namespace": list(op.namespace),
            "key": op.key,
            "value": json.dumps(value, ensure_ascii=False),
            "indexed": indexed,
        }
        ttl = check_ttl(op.ttl)
        if ttl is not None:
            meta.update(expiry_fields(ttl, now))
        self.memory.put_memory(
            user, text, memory_id=mid, key=key, granularity="item", metadata=meta
        )

    def _search(self, op: SearchOp, now: float) -> list[tuple[_Entry, float | None]]:
        prefix = tuple(op.namespace_prefix)
        users = self._users_for(prefix)
        n = len(prefix)
        need = op.offset + op.limit
        ranked: list[tuple[float, _Entry]] = []
        unranked: list[_Entry] = []
        for user in users:
            entries = [
                e
                for e in self._entries(user, now)
                if e.namespace[:n] == prefix and matches(e.value, op.filter)
            ]
            if not op.query or not op.query.strip():
                unranked.extend(entries)
                continue
            indexed = {e.memory.id: e for e in entries if e.indexed}
            found = self._rank(user, op.query, indexed, need)
            ranked.extend(found)
            seen = {e.memory.id for _, e in found}
            unranked.extend(e for e in entries if e.memory.id not in seen)
        if not op.query or not op.query.strip():
            unranked.sort(key=lambda e: (e.namespace, e.key))
            unranked.sort(key=lambda e: e.memory.updated_at, reverse=True)
            return [(e, None) for e in unranked[op.offset : need]]
        ranked.sort(key=lambda pair: -pair[0])  # stable: keeps the core's order per user
        page: list[tuple[_Entry, float | None]] = [(e, s) for s, e in ranked[op.offset : need]]
        if len(page) < op.limit:
            # Items left out of the ranking (not indexed) follow, unscored, like InMemoryStore.
            unindexed = [e for e in unranked if not e.indexed]
            unindexed.sort(key=lambda e: e.memory.updated_at, reverse=True)
            page.extend((e, None) for e in unindexed[: op.limit - len(page)])
        return page

    def _rank(
        self, user: str, query: str, candidates: dict[str, _Entry], need: int
    ) -> list[tuple[float, _Entry]]:
        """Candidates in the core's ranking for `query`, at least `need` of them if possible."""
        if not candidates or need == 0:
            return []
        k = max(2 * need, 16)
        while True:
            retrieval = self.memory.retrieve(user, query, k=k, mode=self.mode)
            found = [
                (h.score, candidates[h.memory.id])
                for h in retrieval.hits
                if h.memory.id in candidates
            ]
            if len(found) >= min(need, len(candidates)) or len(retrieval.hits) < k:
                return found
            k *= 4

    def _list(self, op: ListNamespacesOp, now: float) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        prefixes = [tuple(c.path) for c in conditions if c.match_type == "prefix"]
        for c in conditions:
            if c.match_type not in ("prefix", "suffix"):
                raise InvalidInputError(f"unsupported match type {c.match_type!r}")
        if self.user_id is not None:
            users = [self.user_id]
        else:
            named = [
                p[self.user_position]
                for p in prefixes
                if len(p) > self.user_position and p[self.user_position] != "*"
            ]
            users = [named[0]] if named else self._users_for(())
        spaces: set[tuple[str, ...]] = set()
        for user in users:
            for e in self._entries(user, now):
                if all(path_matches(c, e.namespace) for c in conditions):
                    ns = e.namespace if op.max_depth is None else e.namespace[: op.max_depth]
                    spaces.add(ns)
        return sorted(spaces)[op.offset : op.offset + op.limit]

    # -- BaseStore --------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations; reads see the store before this batch's writes (LangGraph rule).

        Every op sees one time (`clock()` at the start). After the reads, the expiry of the
        items returned by gets and searches with `refresh_ttl` moves forward (metadata only);
        the puts come last.

        Args:
            ops: `GetOp`, `PutOp`, `SearchOp` and `ListNamespacesOp`s.

        Returns:
            One result per op, in order (`None` for puts).

        Raises:
            InvalidInputError: A bad op (nothing of the batch is applied then);
                `StoreNamespaceError` when a namespace does not name its user.
        """
        ops = list(ops)
        for op in ops:
            self._validate(op)
        now = self.clock()
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        refresh: dict[str, dict[str, dict[str, Any]]] = {}  # user -> memory id -> new expiry
        for op in ops:
            if isinstance(op, GetOp):
                e = self._get(op, now)
                results.append(None if e is None else e.item())
                read = [] if e is None else [e]
            elif isinstance(op, SearchOp):
                page = self._search(op, now)
                results.append([e.search_item(score) for e, score in page])
                read = [e for e, _ in page]
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list(op, now))
                continue
            else:
                puts[(tuple(op.namespace), op.key)] = op  # the last put of an item wins
                results.append(None)
                continue
            if op.refresh_ttl:
                for e in read:
                    if e.ttl is not None:
                        mine = refresh.setdefault(e.memory.user_id, {})
                        mine[e.memory.id] = expiry_fields(e.ttl, now)
        for user, updates in refresh.items():
            self.memory.update_memory_metadata(user, updates)
        for op in puts.values():
            self._put(op, now)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async twin of `batch` (see `ReflectiveMemory.arun`)."""
        return await self.memory.arun(self.batch, list(ops))

    # -- TTL ----------------------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """Delete every expired item of every user of the core, from every file.

        Returns:
            How many items were deleted.
        """
        now = self.clock()
        users = [self.user_id] if self.user_id is not None else self.memory.users()
        return sum(self.memory.delete_expired(user, now) for user in users)

    async def asweep_ttl(self) -> int:
        """Async twin of `sweep_ttl` (`ReflectiveMemory.arun`: native on PostgreSQL)."""
        return await self.memory.arun(self.sweep_ttl)

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Run `sweep_ttl` in a background thread every interval, until `stop_ttl_sweeper`.

        Args:
            sweep_interval_minutes: Minutes between sweeps (`None`:
                `ttl_config["sweep_interval_minutes"]`, else 5).

        Returns:
            A future done when the sweeper stops; cancelling it stops the sweeper.
        """
        interval = sweep_interval_minutes
        if interval is None and self.ttl_config is not None:
            interval = self.ttl_config.get("sweep_interval_minutes")
        if interval is None:
            interval = TTL_DEFAULTS["sweep_interval_minutes"]
        return self._sweeper.start(interval)

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; True when it stopped or was not running.

        Args:
            timeout: Seconds to wait for a sweep in progress (`None`: as long as it takes).
        """
        return self._sweeper.stop(timeout)

    def __repr__(self) -> str:
        who = repr(self.user_id) if self.user_id is not None else f"ns[{self.user_position}]"
        return f"ReflectiveStore(user={who}, fields={self.index_fields})"
