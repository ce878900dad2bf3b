"""The documented configuration is the code's: docs/configuration.md and the README cannot drift.

docs/configuration.md holds one `## group` section per field of `MemoryConfig`, each with a
`| field | default | meaning |` table and the group's config class in backticks
(`module.ClassName`). Defaults are written as Python literals (`None`, tuples, `1e-4`,
`2_000_000`, strings), so each is compared with `MemoryConfig()` after `ast.literal_eval`. The
page's "Old flat names" and "Removed settings" tables are checked against what the config does
with those names.

Elsewhere in the README and docs/, a backticked `name=value` (`denoise.kind="none"`, or a field
name that only one group has, or an old flat name) states a default and must match it; write
other values as `MemoryConfig(group={...})`.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from reflective_memory import MemoryConfig
from reflective_memory.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG_PAGE = DOCS / "configuration.md"
#: Pages whose backticked `name=value` statements are checked (the lead's ARCHITECTURE.md and
#: the configuration page itself, checked table by table, are not).
PROSE_PAGES = [
    README,
    *sorted(p for p in DOCS.glob("*.md") if p.name not in ("configuration.md", "ARCHITECTURE.md")),
]
README_MAX_BYTES = 12_000

_HEADING = re.compile(r"^## +(.+?) *$", re.M)
_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?) *= *(.+)$")


def _sections(text: str) -> dict[str, str]:
    """`## heading` (backticks stripped) -> the text up to the next `## ` heading."""
    marks = list(_HEADING.finditer(text))
    return {
        m.group(1).strip("`"): text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else None]
        for i, m in enumerate(marks)
    }


def _table(section: str, header: tuple[str, ...]) -> list[list[str]]:
    """Rows of the first table in `section` whose header is `header`, cells unquoted."""
    lines = [ln.strip() for ln in section.splitlines()]
    for i, line in enumerate(lines):
        if _cells(line) == list(header):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                assert len(cells) == len(header), f"row with stray '|': {row}"
                rows.append(cells)
            return rows
    return []


def _cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    return cell.strip().removeprefix("`").removesuffix("`")


def _same(documented: Any, actual: Any) -> bool:
    """Equal and of the same kind (`True` is not `1`; `1000` may stand for `1000.0`)."""
    if isinstance(documented, bool) or isinstance(actual, bool):
        return documented is actual
    if isinstance(documented, (int, float)) and isinstance(actual, (int, float)):
        return documented == actual
    return type(documented) is type(actual) and documented == actual


PAGE = CONFIG_PAGE.read_text("utf-8")
SECTIONS = _sections(PAGE)
FIELD_HEADER = ("field", "default", "meaning")


def _groups() -> dict[str, Any]:
    cfg = MemoryConfig()
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _documented_rows() -> list[tuple[str, str, str]]:
    out = []
    for heading, body in SECTIONS.items():
        for field, default, _meaning in _table(body, FIELD_HEADER):
            out.append((heading, _unquote(field), _unquote(default)))
    return out


def _flat_names() -> dict[str, str]:
    rows = _table(SECTIONS["Old flat names"], ("old name", "new place"))
    return {_unquote(old): _unquote(new) for old, new in rows}


def _removed_names() -> list[str]:
    rows = _table(SECTIONS["Removed settings"], ("old name", "what it was"))
    return [name.strip("` ") for cell, _ in rows for name in cell.split(",")]


def test_every_group_and_field_is_documented() -> None:
    groups = _groups()
    documented = {g for g, _, _ in _documented_rows()}
    assert documented == set(groups), "## sections with field tables vs MemoryConfig's groups"
    for group, value in groups.items():
        assert dataclasses.is_dataclass(value), f"MemoryConfig().{group} is not a group config"
        fields = [f.name for f in dataclasses.fields(value)]
        rows = [f for g, f, _ in _documented_rows() if g == group]
        assert sorted(rows) == sorted(fields), f"## {group}: documented fields vs the code's"
        assert len(rows) == len(set(rows)), f"## {group}: a field is documented twice"
        cls = type(value)
        assert f"`{cls.__module__}.{cls.__qualname__}`" in SECTIONS[group], (
            f"## {group} should name its class `{cls.__module__}.{cls.__qualname__}`"
        )


@pytest.mark.parametrize(
    "group,field,default", _documented_rows(), ids=[f"{g}.{f}" for g, f, _ in _documented_rows()]
)
def test_documented_default_is_the_code_default(group: str, field: str, default: str) -> None:
    actual = getattr(getattr(MemoryConfig(), group), field)
    documented = ast.literal_eval(default)
    assert _same(documented, actual), f"{group}.{field}: docs say {default}, code has {actual!r}"


def test_old_flat_names_go_where_the_page_says() -> None:
    defaults = MemoryConfig()
    flat = _flat_names()
    assert len(flat) > 50
    for old, new in flat.items():
        group, field = new.split(".")
        value = getattr(getattr(defaults, group), field)
        with pytest.warns(DeprecationWarning, match=re.escape(new)):
            cfg = MemoryConfig(**{old: value})
        assert getattr(getattr(cfg, group), field) == value, old
    with pytest.warns(DeprecationWarning, match=re.escape("rerank.top_k")):
        cfg = MemoryConfig.from_dict({"rerank_top_k": 7})
    assert cfg.rerank.top_k == 7


def test_removed_names_raise() -> None:
    removed = _removed_names()
    assert "rerank_turn_prior" in removed and "neighbour_weight" in removed
    for name in removed:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with pytest.raises(ConfigError, match="removed"):
                MemoryConfig(**{name: 0})


def _resolve(name: str) -> tuple[str, str] | None:
    """A backticked assignment's target as (group, field); None if it names no config field.

    A dotted name with a known group is returned even if the group lacks the field, so the
    caller reports it.
    """
    groups = _groups()
    if "." in name:
        group, field = name.split(".")
        return (group, field) if group in groups else None  # else e.g. `hnsw.ef_search=...`
    flat = _flat_names()
    if name in flat:
        group, field = flat[name].split(".")
        return group, field
    owners = [g for g, v in groups.items() if name in {f.name for f in dataclasses.fields(v)}]
    return (owners[0], name) if len(owners) == 1 else None


def _stated_defaults() -> list[tuple[str, str, str]]:
    """(page, name, value) of every backticked `name=value` outside code blocks."""
    out = []
    for page in PROSE_PAGES:
        text = re.sub(r"```.*?```", "", page.read_text("utf-8"), flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", text):
            m = _ASSIGNMENT.match(span.strip())
            if m:
                out.append((page.name, m.group(1), m.group(2)))
    return out


def test_defaults_stated_in_prose_match() -> None:
    defaults = MemoryConfig()
    checked, wrong = [], []
    for page, name, value in _stated_defaults():
        target = _resolve(name)
        if target is None:
            continue
        group, field = target
        if field not in {f.name for f in dataclasses.fields(getattr(defaults, group))}:
            wrong.append(f"{page}: `{name}={value}`, but {group} has no field {field!r}")
            continue
        actual = getattr(getattr(defaults, group), field)
        try:
            stated = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            wrong.append(f"{page}: `{name}={value}` is not a Python literal")
            continue
        checked.append((page, name))
        if not _same(stated, actual):
            wrong.append(f"{page}: `{name}={value}`, but {group}.{field} defaults to {actual!r}")
    assert not wrong, "\n".join(wrong)
    assert any(page == "README.md" for page, _ in checked), "the README states no default"


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail to docs/"


def test_langgraph_store_ttl_defaults_match() -> None:
    """The TTL table of docs/langgraph_store.md states `TTL_DEFAULTS` of the store."""
    pytest.importorskip("langgraph")
    from langchain_reflective.store_ttl import TTL_DEFAULTS

    section = _sections((DOCS / "langgraph_store.md").read_text("utf-8"))["TTL"]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", section, re.M)
    stated = {name: ast.literal_eval(value) for name, value in rows}
    assert stated == TTL_DEFAULTS


_DOTTED = re.compile(
    r"\b((?:reflective_memory|reflective_bench|langchain_reflective|llamaindex_reflective)"
    r"(?:\.\w+)+)"
)
#: A version the docs speak of as released: "**To 0.2**", "From 0.1", "Version 0.1 had",
#: "removed in 0.2", "deleted in 0.2".
_RELEASED = re.compile(
    r"(?:\*\*To |\*\*From |\bVersion |\bremoved in |\bdeleted in )(\d+)\.(\d+)\b"
)
ALL_PAGES = [README, ROOT / "BENCHMARKS.md", *sorted(DOCS.glob("*.md"))]


def _resolves(name: str) -> bool:
    """Whether a dotted name is a module, or an attribute chain of the longest module prefix."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                found = getattr(found, attr)
        except AttributeError:
            return False
        return True
    return False


def test_docs_name_only_modules_and_objects_that_exist() -> None:
    """A dotted `reflective_memory.x.y` (or bench, adapter) name in the docs is importable."""
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    missing = [
        f"{page.relative_to(ROOT)}: {m.group(1)}"
        for page in ALL_PAGES
        for m in _DOTTED.finditer(page.read_text("utf-8"))
        if not _resolves(m.group(1).rstrip("."))
    ]
    assert missing == []


def test_docs_speak_of_no_release_after_this_version() -> None:
    """The upgrade notes and removal messages name this version or older ones, never a later one."""
    from reflective_memory import __version__

    current = tuple(int(x) for x in __version__.split(".")[:2])
    named = [
        (page.relative_to(ROOT), (int(m.group(1)), int(m.group(2))))
        for page in ALL_PAGES
        for m in _RELEASED.finditer(page.read_text("utf-8"))
    ]
    assert named, "the upgrade notes name no version"
    assert [(page, v) for page, v in named if v > current] == []
    with pytest.raises(ConfigError) as removed:
        MemoryConfig(rerank_optimizer="adam")
    (said,) = re.findall(r"removed in (\d+)\.(\d+)", str(removed.value))
    assert tuple(int(x) for x in said) <= current
