"""Retry timing for failed publishes, and when a row gives up and becomes a dead letter.

A failed publish is charged to the row that failed (never to the relay, never to the rows
around it): its ``attempts`` goes up and it is not claimed again before
``min(retry_base * 2 ** (attempts - 1), retry_max)`` seconds have passed, on the database's
clock. After ``max_publish_attempts`` failures it becomes a dead letter (``dead_at``): no relay
claims it, and it keeps holding back the later rows of its transaction and ordering key until an
operator retries or discards it (:mod:`sqla_outbox.dead_letters`).

Only message failures count. A broker that cannot be reached is an outage
(:class:`~sqla_outbox.errors.BrokerUnavailableError`): the relay backs off as a whole and charges
nobody, or an outage would dead-letter every healthy message that happened to be next.

No jitter: a row is retried by whichever relay claims it first once it is due, so retries of
many rows do not arrive together the way reconnects of many clients do.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqla_outbox.errors import ArgumentValueError
from sqla_outbox.settings import positive_seconds

__all__ = [
    "DEFAULT_MAX_PUBLISH_ATTEMPTS",
    "DEFAULT_RETRY_BASE",
    "DEFAULT_RETRY_MAX",
    "RetryPolicy",
    "resolve_retry_policy",
]

DEFAULT_MAX_PUBLISH_ATTEMPTS = 10
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_MAX = 300.0

_MAX_EXPONENT = 62
"""``2 ** 62`` seconds is far past any ``retry_max``; capping the exponent keeps the float finite
however many attempts ``max_publish_attempts=None`` lets a row make."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a row that failed ``attempts`` times (this failure included) may be tried again."""

    max_attempts: int | None
    base: float
    cap: float

    def backoff(self, attempts: int) -> dt.timedelta:
        """The wait after the ``attempts``-th failure: ``min(base * 2 ** (attempts - 1), cap)``."""
        exponent = min(max(attempts - 1, 0), _MAX_EXPONENT)
        return dt.timedelta(seconds=min(self.base * 2.0**exponent, self.cap))

    def gives_up(self, attempts: int) -> bool:
        """Whether the ``attempts``-th failure makes the row a dead letter."""
        return self.max_attempts is not None and attempts >= self.max_attempts


def resolve_retry_policy(
    max_publish_attempts: object, retry_base: object, retry_max: object
) -> RetryPolicy:
    """The relay's retry settings, checked where they are written (``ConfigurationError``)."""
    if max_publish_attempts is not None and (
        not isinstance(max_publish_attempts, int)
        or isinstance(max_publish_attempts, bool)
        or max_publish_attempts < 1
    ):
        raise ArgumentValueError(
            "max_publish_attempts",
            f"«max_publish_attempts» must be a whole number of at least 1, or "
            f"«max_publish_attempts=None» to retry for ever, got {max_publish_attempts!r}. Pass "
            f"e.g. «max_publish_attempts=10», or omit it for the default of "
            f"{DEFAULT_MAX_PUBLISH_ATTEMPTS}.",
        )
    base = positive_seconds("retry_base", retry_base, "1", DEFAULT_RETRY_BASE)
    cap = positive_seconds("retry_max", retry_max, "300", DEFAULT_RETRY_MAX)
    if cap < base:
        raise ArgumentValueError(
            "retry_max",
            f"«retry_max» must be at least «retry_base», got «retry_max={retry_max!r}» and "
            f"«retry_base={retry_base!r}». Raise «retry_max» or lower «retry_base».",
        )
    return RetryPolicy(max_publish_attempts, base, cap)
