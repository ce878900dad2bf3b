from __future__ import annotations

import threading

from reflective_memory import HashingEmbedder, MemoryConfig, ReflectiveMemory


def test_threads_adding_and_retrieving(tmp_path) -> None:
    cfg = MemoryConfig(units={"granularities": ("turn",)}, sessions={"max_turns": 5})
    errors: list[BaseException] = []
    with ReflectiveMemory(tmp_path / "db", embedder=HashingEmbedder(64), config=cfg) as mem:

        def writer(w: int) -> None:
            try:
                for i in range(40):
                    mem.add_turn(f"user{w % 2}", f"w{w}-s{i // 5}", "user", f"note {i} from w{w}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def reader(w: int) -> None:
            try:
                for _ in range(40):
                    r = mem.retrieve(f"user{w % 2}", "note from", k=5)
                    assert all(h.memory.user_id == f"user{w % 2}" for h in r)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        threads += [threading.Thread(target=reader, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(len(mem.turns(u)) for u in ("user0", "user1")) == 160
        assert mem.stats("user0")["memories"] == 80
        assert len(mem.retrieve("user1", "note 3 from 1", k=80)) == 80
