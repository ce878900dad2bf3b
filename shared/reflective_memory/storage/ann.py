"""When a user's dense index switches from exact to approximate search (no FAISS import here)."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError
from reflective_memory.settings import check_choice, check_int

__all__ = ["ANN_KINDS", "AnnSettings", "IndexConfig"]

#: Approximate index kinds (FAISS IVF or HNSW).
ANN_KINDS = ("ivf", "hnsw")


@dataclass(frozen=True)
class AnnSettings:
    """When and how a user's dense index switches from exact to approximate search.

    Attributes:
        threshold: Users with more memories than this get an approximate index (`None`: always
            exact).
        kind: `ivf` (FAISS `IndexIVFFlat`: k-means lists, quick to build) or `hnsw`
            (`IndexHNSWFlat`: graph, slow to build at a million vectors).
        nprobe: IVF lists visited per query.
        nlist: IVF lists (`None`: `4·sqrt(n)`, at least 16, at most `n / 39`).
        hnsw_m: HNSW links per node.
        ef_search: HNSW search breadth (raised to `n` for larger requests).
        ef_construction: HNSW build breadth.
        seed: Seed of the IVF training sample and k-means.
    """

    threshold: int | None = 50_000
    kind: str = "ivf"
    nprobe: int = 32
    nlist: int | None = None
    hnsw_m: int = 32
    ef_search: int = 64
    ef_construction: int = 80
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ANN_KINDS:
            raise ConfigError(f"ann kind must be one of {ANN_KINDS}, got {self.kind!r}")
        if self.threshold is not None and (
            not isinstance(self.threshold, int) or self.threshold < 0
        ):
            raise ConfigError(f"ann threshold must be None or >= 0, got {self.threshold!r}")
        for name in ("nprobe", "hnsw_m", "ef_search", "ef_construction"):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ConfigError(f"ann {name} must be a positive integer, got {val!r}")
        if self.nlist is not None and (not isinstance(self.nlist, int) or self.nlist < 1):
            raise ConfigError(f"ann nlist must be None or a positive integer, got {self.nlist!r}")

    def kind_for(self, n: int) -> str:
        """`exact`, `ivf` or `hnsw` for a user with `n` memories."""
        if self.threshold is None or n <= self.threshold:
            return "exact"
        return self.kind


@dataclass(frozen=True)
class IndexConfig:
    """The in-process index caches of a `ReflectiveMemory`.

    Attributes:
        ann_threshold: Users with more memories than this are searched with an approximate
            index (`None`: always exact).
        ann_kind: `ivf` or `hnsw`.
        ann_probe: IVF lists visited per query (`ivf`) or HNSW search breadth (`hnsw`).
        cache_bytes: Memory the in-process index cache may hold, in bytes; the least recently
            used users' indexes are dropped beyond it (they reload from disk).
    """

    ann_threshold: int | None = 50_000
    ann_kind: str = "ivf"
    ann_probe: int = 32
    cache_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        check_int("index.ann_threshold", self.ann_threshold, 0, optional=True)
        check_choice("index.ann_kind", self.ann_kind, ANN_KINDS)
        check_int("index.ann_probe", self.ann_probe)
        check_int("index.cache_bytes", self.cache_bytes)

    def ann(self) -> AnnSettings:
        """The exact/approximate switch as `AnnSettings`."""
        return AnnSettings(
            threshold=self.ann_threshold,
            kind=self.ann_kind,
            nprobe=self.ann_probe,
            ef_search=self.ann_probe if self.ann_kind == "hnsw" else 64,
        )
