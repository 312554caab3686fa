"""Turn ``enqueue``'s arguments into an :class:`OutboxMessage`, or refuse them at the call.

Every check runs before anything is staged, so a bad call leaves the session exactly as it was
and the error points at the line that made it, not at a ``commit()`` three functions away.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from typing import Any

from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.ids import new_message_id
from sqla_outbox.message import OutboxMessage
from sqla_outbox.tracing import current_traceparent

__all__ = ["DEFAULT_MAX_ATTEMPTS", "DEFAULT_QUEUE", "build_message", "check_json"]

DEFAULT_QUEUE = "default"
"""The queue of a message whose job names none and whose call passes none."""

DEFAULT_MAX_ATTEMPTS = 3
"""Attempts a consumer should give a job before giving up, unless the job or call says otherwise."""

_MAX_TEXT = 255
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def _job_fields(job: object) -> tuple[str, str | None, int | None]:
    if isinstance(job, str):
        name: object = job
        queue: object = None
        attempts: object = None
    elif isinstance(getattr(job, "name", None), str):
        name = getattr(job, "name")  # noqa: B009 - `job` is any object with a .name
        queue = getattr(job, "queue", None)
        attempts = getattr(job, "max_attempts", None)
    else:
        raise ArgumentTypeError(
            f"job must be a job name (str) or a job handle with a .name, got {job!r}. "
            "Pass e.g. outbox.enqueue(session, 'send_receipt', {...})."
        )
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"job name must be a non-empty string, got {name!r}.")
    if len(name) > _MAX_TEXT:
        raise ConfigurationError(f"job name is longer than {_MAX_TEXT} characters: {name!r}.")
    return (
        name,
        queue if isinstance(queue, str) and queue else None,
        attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else None,
    )


def _find_unserialisable(value: Any, path: str) -> tuple[str, Any] | None:  # noqa: PLR0911
    # One return per JSON kind reads better here than a dispatch table.
    """The first value ``json.dumps`` would choke on, with a readable path to it."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path} (key {key!r})", key)
            found = _find_unserialisable(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _find_unserialisable(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return (path, value)


def check_json(job: str, value: Any) -> None:
    """Raise ``TypeError`` naming the job and the offending value if ``value`` is not JSON.

    Strict JSON: no ``NaN``/``Infinity`` (PostgreSQL's ``jsonb`` refuses them) and string keys only
    (``json.dumps`` would silently turn ``{1: ...}`` into ``{"1": ...}``).
    """
    found = _find_unserialisable(value, "input")
    if found is None:
        return
    where, bad = found
    raise ArgumentTypeError(
        f"input for job {job!r} is not JSON-serialisable: {bad!r} at {where}. "
        "Convert it first (e.g. str() for Decimal, UUID and datetime; a list for a set)."
    )


def _optional_text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ArgumentTypeError(f"{name} must be a non-empty str or None, got {value!r}.")
    if len(value) > _MAX_TEXT:
        raise ConfigurationError(f"{name} is longer than {_MAX_TEXT} characters: {value!r}.")
    return value


def _run_at(value: object, now: dt.datetime) -> dt.datetime:
    if value is None:
        return now
    if isinstance(value, dt.timedelta):
        return now + value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigurationError(
                f"run_at must be timezone-aware, got naive {value!r}. "
                "Use e.g. datetime.now(timezone.utc) + timedelta(minutes=5), or pass a timedelta."
            )
        return value.astimezone(dt.timezone.utc)
    raise ArgumentTypeError(
        f"run_at must be an aware datetime or a timedelta, got {value!r}. "
        "Pass e.g. run_at=timedelta(minutes=5)."
    )


def _max_attempts(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"max_attempts must be an int, got {value!r}.")
    if value < 1:
        raise ConfigurationError(f"max_attempts must be at least 1, got {value!r}.")
    return value


def _traceparent(value: object) -> str | None:
    if value is None:
        return current_traceparent()
    if not isinstance(value, str) or not _TRACEPARENT.match(value):
        raise ConfigurationError(
            f"traceparent must be a W3C traceparent header like "
            f"'00-<32 hex>-<16 hex>-<2 hex>', got {value!r}."
        )
    return value


def build_message(
    job: object,
    input: Any,
    *,
    staged_at: dt.datetime,
    queue: object,
    run_at: object,
    idempotency_key: object,
    tenant_id: object,
    enqueued_by: object,
    traceparent: object,
    max_attempts: object,
) -> OutboxMessage:
    """Validate one ``enqueue`` call and return the message it stages."""
    name, job_queue, job_attempts = _job_fields(job)
    check_json(name, input)
    now = dt.datetime.now(dt.timezone.utc)
    message_id = new_message_id()
    return OutboxMessage(
        id=message_id,
        job=name,
        queue=_optional_text("queue", queue) or job_queue or DEFAULT_QUEUE,
        input=input,
        idempotency_key=_optional_text("idempotency_key", idempotency_key) or str(message_id),
        max_attempts=_max_attempts(max_attempts) or job_attempts or DEFAULT_MAX_ATTEMPTS,
        run_at=_run_at(run_at, now),
        staged_at=staged_at,
        tenant_id=_optional_text("tenant_id", tenant_id),
        traceparent=_traceparent(traceparent),
        enqueued_by=_optional_text("enqueued_by", enqueued_by),
    )
