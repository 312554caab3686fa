"""The relay's numeric settings, each checked once, where it is written.

A lease or interval the relay cannot honour must fail in the constructor (or as a CLI usage
error) rather than inside a background pass whose only trace is a log line. The lease is the one
that matters most: ``0`` lapses before the claim returns, so every relay reclaims every row on
every pass and the lease buys nothing; ``inf`` never lapses, so the rows of a relay that died are
stranded for ever, the one failure the lease exists to bound.
"""

from __future__ import annotations

import datetime as dt
import math

from sqla_outbox.errors import ArgumentValueError

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CLAIM_LEASE",
    "DEFAULT_POLL_INTERVAL",
    "positive_seconds",
    "resolve_batch_size",
    "resolve_claim_lease",
    "resolve_poll_interval",
]

DEFAULT_CLAIM_LEASE = 30.0
"""Seconds a claim stays its relay's: long for a healthy pass, short for a dead relay's rows."""

DEFAULT_POLL_INTERVAL = 0.2
DEFAULT_BATCH_SIZE = 100


def positive_seconds(name: str, value: object, example: str, default: float) -> float:
    """``value`` (seconds, or a ``timedelta``) as positive, finite seconds, or
    :class:`ConfigurationError` naming ``name``, an ``example`` value and the ``default``: the
    one check every duration setting of the library goes through."""
    seconds: float | None = None
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ArgumentValueError(
            name,
            f"«{name}» must be a positive, finite number of seconds, got {value!r}. "
            f"Pass e.g. «{name}={example}», or omit it for the {default:g} s default.",
        )
    return seconds


def resolve_claim_lease(value: object) -> dt.timedelta:
    """``claim_lease`` (seconds or ``timedelta``) as a ``timedelta``, or ``ConfigurationError``."""
    seconds = positive_seconds("claim_lease", value, "30", DEFAULT_CLAIM_LEASE)
    return dt.timedelta(seconds=seconds)


def resolve_poll_interval(value: object) -> float:
    """``poll_interval`` in seconds, or ``ConfigurationError`` (a ``ValueError``)."""
    return positive_seconds("poll_interval", value, "0.5", DEFAULT_POLL_INTERVAL)


def resolve_batch_size(value: object) -> int:
    """``batch_size`` as a positive ``int``, or ``ConfigurationError`` (a ``ValueError``)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ArgumentValueError(
            "batch_size",
            f"«batch_size» must be a positive whole number, got {value!r}. "
            f"Pass e.g. «batch_size=500», or omit it for the default of {DEFAULT_BATCH_SIZE}.",
        )
    return value
