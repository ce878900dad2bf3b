"""When a user's dense index switches from exact to approximate search (no FAISS import here)."""

from __future__ import annotations

from dataclasses import dataclass

from reflective_memory.errors import ConfigError

__all__ = ["ANN_KINDS", "AnnSettings"]

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
