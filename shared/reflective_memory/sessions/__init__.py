"""Sessions: when a session ends and how its turns become memories (the write side)."""

__all__: list[str] = []
