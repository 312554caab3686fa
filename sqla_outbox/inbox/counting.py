"""The inbox's Prometheus counter: ``sqla_outbox_inbox_duplicates_total{consumer}``, the
deliveries :func:`~sqla_outbox.inbox.receive` found already processed.

It is how an operator sees the outbox's at-least-once at work on the consumer's side (relays
re-publishing after a crash, brokers redelivering) and that the inbox absorbed it. It lives in
``prometheus_client``'s default registry, which a consumer process serves with
``prometheus_client.start_http_server`` or its web framework's exporter; without the
``prometheus`` extra installed nothing is counted.
"""

from __future__ import annotations

import threading
from typing import Any

from sqla_outbox.metrics import prometheus_available

__all__ = ["DUPLICATES", "count_duplicate"]

DUPLICATES = "sqla_outbox_inbox_duplicates"
"""The counter's name (Prometheus shows it with ``_total``)."""

_counter: Any = None
_lock = threading.Lock()


def count_duplicate(consumer: str) -> None:
    """Count one duplicate delivery absorbed for ``consumer``."""
    counter = _counter if _counter is not None else _create()
    if counter is not None:
        counter.labels(consumer=consumer).inc()


def _create() -> Any:
    global _counter  # noqa: PLW0603 - one counter per process, made on first use
    if not prometheus_available():
        return None
    with _lock:
        if _counter is None:
            from prometheus_client import Counter  # noqa: PLC0415 - optional

            _counter = Counter(
                DUPLICATES,
                "Deliveries the inbox found already processed (duplicates absorbed), by consumer.",
                ["consumer"],
            )
    return _counter
