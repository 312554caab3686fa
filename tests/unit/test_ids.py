"""Message ids: UUIDv7, strictly increasing within a process, across threads."""

from __future__ import annotations

import threading
import uuid
from itertools import pairwise

from sqla_outbox.ids import new_message_id


def test_ids_are_version_7_and_strictly_increasing() -> None:
    """100,000 ids in a row (many per millisecond) each sort after the one before."""
    ids = [new_message_id() for _ in range(100_000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids[:10])
    assert all(a < b for a, b in pairwise(ids))
    assert all(a.hex < b.hex for a, b in pairwise(ids))  # SQLite stores the hex


def test_ids_are_unique_across_threads() -> None:
    """Threads minting ids at once never collide."""
    results: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def mint(out: list[uuid.UUID]) -> None:
        out.extend(new_message_id() for _ in range(20_000))

    threads = [threading.Thread(target=mint, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for out in results for i in out]
    assert len(set(every)) == len(every)
    assert all(out == sorted(out) for out in results)
