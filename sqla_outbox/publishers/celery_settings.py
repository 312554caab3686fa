"""The settings of :class:`~sqla_outbox.publishers.celery_tasks.CeleryPublisher`, checked the
same way whether they come as arguments or as a ``celery:`` URL's options; only the wording of
the error differs (an argument names itself, an option shows the URL).

Kept apart from the publisher so it imports and checks everything without Celery installed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl

from sqla_outbox.errors import ArgumentTypeError, ConfigurationError, PublisherError
from sqla_outbox.publishers.urls import checked_options
from sqla_outbox.validation import DEFAULT_QUEUE

__all__ = [
    "DEFAULT_RETRY_POLICY",
    "EXAMPLE_URL",
    "flag",
    "number",
    "resolve_queue_map",
    "resolve_retry_policy",
    "url_options",
]

DEFAULT_RETRY_POLICY: Mapping[str, float] = MappingProxyType(
    {"max_retries": 3, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 1.0}
)
"""Kombu's retry policy for one publish: Celery's stock values, but never the app's own.

An app may set ``task_publish_retry_policy`` to retry for ever, which would hold the relay (and
every row behind the one it is sending) while the broker is down; the relay retries anyway.
"""

EXAMPLE_URL = "celery:myapp.worker:app"
"""The form of a ``celery:`` publisher URL that errors show as the fix."""

# name -> (whole number?, zero allowed?, example). Checked the same way for the constructor and
# the URL; only the wording of the error differs.
_NUMBERS: dict[str, tuple[bool, bool, str]] = {
    "max_retries": (True, True, "3"),
    "interval_start": (False, True, "0"),
    "interval_step": (False, True, "0.2"),
    "interval_max": (False, True, "1"),
    "confirm_timeout": (False, False, "10"),
    "socket_timeout": (False, False, "10"),
}
FLAGS = ("confirm", "pipeline")
_URL_OPTIONS = (*_NUMBERS, *FLAGS)
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _number_rule(name: str) -> str:
    integer, zero_ok, _ = _NUMBERS[name]
    if integer:
        return "a whole number of 0 or more"
    return f"a finite number of seconds {'of 0 or more' if zero_ok else 'above 0'}"


def _number_ok(name: str, value: object) -> bool:
    integer, zero_ok, _ = _NUMBERS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if integer and not isinstance(value, int):
        return False
    if not math.isfinite(value):
        return False
    return value >= 0 if zero_ok else value > 0


def number(name: str, value: object) -> float:
    """``value`` of the numeric setting ``name``, checked by its rule; the error gives an
    example."""
    if not _number_ok(name, value):
        example = _NUMBERS[name][2]
        raise ConfigurationError(
            f"{name} must be {_number_rule(name)}, got {value!r}. Pass e.g. {name}={example}."
        )
    return value  # type: ignore[return-value]  # checked just above


def flag(name: str, value: object) -> bool:
    """``value`` of the flag ``name``: a bool, not anything truthy (``"false"`` is truthy)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}.")
    return value


def resolve_retry_policy(policy: Mapping[str, object] | None) -> dict[str, float]:
    """Kombu's retry policy: :data:`DEFAULT_RETRY_POLICY` with ``policy``'s keys over it, each
    checked, never the app's own (which may retry for ever)."""
    if policy is None:
        return dict(DEFAULT_RETRY_POLICY)
    if not isinstance(policy, Mapping):
        raise ArgumentTypeError(
            f"retry_policy must be a mapping like {dict(DEFAULT_RETRY_POLICY)!r}, got {policy!r}."
        )
    unknown = sorted(set(policy) - set(DEFAULT_RETRY_POLICY))
    if unknown:
        raise ConfigurationError(
            f"retry_policy has unknown keys {unknown!r}; use only "
            f"{', '.join(DEFAULT_RETRY_POLICY)} (kombu's names)."
        )
    merged = {**DEFAULT_RETRY_POLICY, **policy}
    return {key: number(key, value) for key, value in merged.items()}


def resolve_queue_map(queue_map: Mapping[str, str | None] | None) -> dict[str, str | None]:
    """Outbox queue -> Celery queue (``None``: Celery's routing), the default queue always
    routed by Celery unless mapped."""
    resolved: dict[str, str | None] = {DEFAULT_QUEUE: None}
    if queue_map is None:
        return resolved
    if not isinstance(queue_map, Mapping):
        raise ArgumentTypeError(
            f"queue_map must map outbox queue names to Celery queue names (or None for Celery's "
            f"routing), got {queue_map!r}. Pass e.g. queue_map={{'emails': 'mail'}}."
        )
    for key, value in queue_map.items():
        if (
            not isinstance(key, str)
            or not key
            or not (value is None or (isinstance(value, str) and value))
        ):
            raise ArgumentTypeError(
                f"queue_map must map non-empty queue names to non-empty queue names or None, "
                f"got the entry {key!r}: {value!r}. Pass e.g. queue_map={{'emails': 'mail'}}."
            )
        resolved[key] = value
    return resolved


def _url_number(url: str, name: str, text: str) -> float:
    integer = _NUMBERS[name][0]
    value: float | None
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = None
    if value is None or not _number_ok(name, value):
        raise PublisherError(
            f"Option {name}={text!r} in publisher URL {url!r} must be {_number_rule(name)}; "
            f"write e.g. ?{name}={_NUMBERS[name][2]}."
        )
    return value


def _url_flag(url: str, name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered not in _TRUE + _FALSE:
        raise PublisherError(
            f"Option {name}={text!r} in publisher URL {url!r} must be true or false; "
            f"write e.g. ?{name}=true."
        )
    return lowered in _TRUE


def url_options(url: str, query: str) -> dict[str, Any]:
    """The constructor's keyword arguments a ``celery:`` URL's query gives, each checked by the
    constructor's rule; the retry options gathered into ``retry_policy``."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as error:
        raise PublisherError(
            f"The options of publisher URL {url!r} are not a query string ({error}); write "
            f"them as ?name=value&name=value, e.g. {EXAMPLE_URL}?max_retries=3."
        ) from error
    parsed: dict[str, Any] = {}
    for name, text in checked_options(pairs, label="Publisher URL", shown=url, known=_URL_OPTIONS):
        parsed[name] = _url_flag(url, name, text) if name in FLAGS else _url_number(url, name, text)
    retry_policy = {key: parsed.pop(key) for key in list(parsed) if key in DEFAULT_RETRY_POLICY}
    if retry_policy:
        parsed["retry_policy"] = retry_policy
    return parsed
