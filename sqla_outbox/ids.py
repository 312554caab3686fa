"""Message ids that sort in the order they were made.

Claim order is ``(staged_at, id)``. Every message of one transaction shares its ``staged_at``
(the moment the transaction staged its first message), so ``id`` alone has to keep the enqueue
order of a transaction. A random UUID4 would shuffle it; these ids are UUIDv7 (RFC 9562): a
48-bit millisecond timestamp followed by 74 bits that are random for the first id of a
millisecond and count upwards after it (the RFC's "monotonic random" method). Within one process
every id is strictly greater than the one before it, even when the wall clock stands still or
steps backwards, and a database compares them byte-wise (PostgreSQL ``uuid``) or as hex text
(SQLite), which is the same order.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

__all__ = ["new_message_id"]

_COUNTER_BITS = 74
_RAND_B_BITS = 62


class _MonotonicSource:
    """(millisecond, counter) pairs that strictly increase across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = 0
        self._counter = 0

    def next(self) -> tuple[int, int]:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            if now_ms > self._ms:
                self._ms = now_ms
                # 64 random bits of the 74: the top ten stay clear so the counter can count.
                self._counter = int.from_bytes(os.urandom(8), "big")
            else:
                # Same millisecond, or the clock stepped back: count on from the last id, by a
                # small random step so ids stay hard to guess.
                self._counter += 1 + (os.urandom(1)[0] & 0x0F)
                if self._counter >> _COUNTER_BITS:
                    self._ms += 1
                    self._counter = 0
            return self._ms, self._counter


_source = _MonotonicSource()


def new_message_id() -> uuid.UUID:
    """Return a UUIDv7 greater than every id this process returned before."""
    ms, counter = _source.next()
    rand_a = counter >> _RAND_B_BITS
    rand_b = counter & ((1 << _RAND_B_BITS) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)
