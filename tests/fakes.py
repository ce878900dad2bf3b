"""Test doubles shared by the test modules."""

from __future__ import annotations


class Scripted:
    """A fake LLM: scripted outputs in order (the last repeats); an Exception is raised."""

    def __init__(self, *outputs):
        self.outputs = list(outputs)
        self.prompts = []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        out = self.outputs[min(len(self.prompts), len(self.outputs)) - 1]
        if isinstance(out, Exception):
            raise out
        return out


#: The words a question uses -> the words its answer was stored with (`QueryDocEmbedder`).
QUERY_ALIASES = {"canine": "beagle pixel", "footwear": "sneakers chewed", "sibling": "sister lea"}


class QueryDocEmbedder:
    """A deterministic asymmetric embedder: queries and documents get different vectors.

    Documents are embedded by `HashingEmbedder`; a query's words are first mapped through
    `QUERY_ALIASES` (as an instruction-tuned model maps a question towards its answer), so a
    question finds its answer only when it is embedded as a query. Every call is recorded in
    `calls` as `("query" | "document", texts)`.
    """

    def __init__(self, dim: int = 64) -> None:
        from reflective_memory import HashingEmbedder

        self.inner = HashingEmbedder(dim)
        self.name = f"querydoc:{dim}"
        self.calls: list[tuple[str, object]] = []

    @property
    def dim(self) -> int:
        return self.inner.dim

    @staticmethod
    def as_query(text: str) -> str:
        words = text.lower().replace("?", " ").split()
        return " ".join(QUERY_ALIASES.get(w, w) for w in words)

    def encode(self, texts):
        self.calls.append(("document", texts))
        return self.inner.encode(texts)

    def encode_query(self, texts):
        self.calls.append(("query", texts))
        if isinstance(texts, str):
            return self.inner.encode(self.as_query(texts))
        return self.inner.encode([self.as_query(t) for t in texts])

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]
