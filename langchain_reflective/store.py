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
TTLs are not supported (`supports_ttl` is False): `put(..., ttl=...)` raises
`NotImplementedError` (LangGraph's own check) and a `PutOp` with a `ttl` passed to `batch`
raises `InvalidInputError`; `refresh_ttl` is ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    validate_op_namespace,
)
from reflective_memory.engine import ReflectiveMemory
from reflective_memory.errors import ConfigError, InvalidInputError, UnknownMemoryError
from reflective_memory.types import Memory

__all__ = ["ReflectiveStore", "StoreNamespaceError", "render_value"]

logger = logging.getLogger(__name__)

#: Marker stored in `Memory.metadata["store"]` for items written by this store.
_MARK = "langgraph"
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


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


def _compare(actual: Any, wanted: Any) -> bool:
    """Whether an item's field value satisfies one filter entry."""
    if isinstance(wanted, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(actual, op, arg) for op, arg in wanted.items())
        return isinstance(actual, dict) and all(
            _compare(actual.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted


def _operator(actual: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return actual == arg
    if op == "$ne":
        return actual != arg
    if op not in _OPERATORS:
        raise InvalidInputError(f"unsupported filter operator {op!r}; use one of {_OPERATORS}")
    try:
        a, b = float(actual), float(arg)
    except (TypeError, ValueError):
        return False
    if op == "$gt":
        return a > b
    if op == "$gte":
        return a >= b
    if op == "$lt":
        return a < b
    return a <= b


def _check_filter(flt: Any) -> None:
    """Refuse filter operators the store does not know, before any item is compared."""
    if isinstance(flt, dict):
        for k, v in flt.items():
            if isinstance(k, str) and k.startswith("$") and k not in _OPERATORS:
                raise InvalidInputError(
                    f"unsupported filter operator {k!r}; use one of {_OPERATORS}"
                )
            _check_filter(v)


def _matches(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    return not flt or all(_compare(value.get(k), v) for k, v in flt.items())


def _path_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    if not path:
        return True
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


class _Entry:
    """A stored item decoded from its memory."""

    __slots__ = ("memory", "namespace", "key", "value", "indexed")

    def __init__(self, memory: Memory) -> None:
        meta = memory.metadata
        self.memory = memory
        self.namespace: tuple[str, ...] = tuple(meta["namespace"])
        self.key: str = meta["key"]
        self.value: dict[str, Any] = json.loads(meta["value"])
        self.indexed: bool = bool(meta.get("indexed", True))

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
    searched and filtered, and the batch semantics.

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

    Raises:
        InvalidInputError: A bad argument.
        ConfigError: `index` asks for something the store cannot do.

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

    supports_ttl = False

    def __init__(
        self,
        *,
        memory: ReflectiveMemory,
        user_id: str | None = None,
        user_position: int = 0,
        index: IndexConfig | None = None,
        allow_cross_user: bool = False,
        mode: str | None = None,
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

    def _entries(self, user: str) -> list[_Entry]:
        out = []
        for mem in self.memory.memories(user):
            e = _entry(mem)
            if e is not None:
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
            if op.ttl is not None:
                raise InvalidInputError("ReflectiveStore does not support TTL; use ttl=None")
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
            _check_filter(op.filter)
        if isinstance(op, ListNamespacesOp):
            if op.limit < 0 or op.offset < 0:
                raise InvalidInputError("list_namespaces limit and offset must be >= 0")
            if op.max_depth is not None and op.max_depth < 1:
                raise InvalidInputError("max_depth must be None or >= 1")

    # -- operations -------------------------------------------------------------------------
    def _get(self, op: GetOp) -> Item | None:
        user = self.user_of(op.namespace)
        try:
            mem = self.memory.get_memory(user, self.memory_id(op.namespace, op.key))
        except UnknownMemoryError:
            return None
        e = _entry(mem)
        if e is None or e.namespace != tuple(op.namespace) or e.key != op.key:
            return None
        return e.item()

    def _put(self, op: PutOp) -> None:
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
        self.memory.put_memory(
            user,
            text,
            memory_id=mid,
            key=key,
            granularity="item",
            metadata={
                "store": _MARK,
                "namespace": list(op.namespace),
                "key": op.key,
                "value": json.dumps(value, ensure_ascii=False),
                "indexed": indexed,
            },
        )

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        users = self._users_for(prefix)
        n = len(prefix)
        need = op.offset + op.limit
        ranked: list[tuple[float, _Entry]] = []
        unranked: list[_Entry] = []
        for user in users:
            entries = [
                e
                for e in self._entries(user)
                if e.namespace[:n] == prefix and _matches(e.value, op.filter)
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
            return [e.search_item(None) for e in unranked[op.offset : need]]
        ranked.sort(key=lambda pair: -pair[0])  # stable: keeps the core's order per user
        page = [e.search_item(s) for s, e in ranked[op.offset : need]]
        if len(page) < op.limit:
            # Items left out of the ranking (not indexed) follow, unscored, like InMemoryStore.
            unindexed = [e for e in unranked if not e.indexed]
            unindexed.sort(key=lambda e: e.memory.updated_at, reverse=True)
            page.extend(e.search_item(None) for e in unindexed[: op.limit - len(page)])
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

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
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
            for e in self._entries(user):
                if all(_path_matches(c, e.namespace) for c in conditions):
                    ns = e.namespace if op.max_depth is None else e.namespace[: op.max_depth]
                    spaces.add(ns)
        return sorted(spaces)[op.offset : op.offset + op.limit]

    # -- BaseStore --------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations; reads see the store before this batch's writes (LangGraph rule).

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
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list(op))
            else:
                puts[(tuple(op.namespace), op.key)] = op  # the last put of an item wins
                results.append(None)
        for op in puts.values():
            self._put(op)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async twin of `batch` (see `ReflectiveMemory.arun`)."""
        return await self.memory.arun(self.batch, list(ops))

    def __repr__(self) -> str:
        who = repr(self.user_id) if self.user_id is not None else f"ns[{self.user_position}]"
        return f"ReflectiveStore(user={who}, fields={self.index_fields})"
