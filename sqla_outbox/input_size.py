"""How large an ``input`` ``enqueue`` accepts, so that a large one is refused at the call and
never fails the business transaction's COMMIT.

A database refuses a value past its own limit only when the row is written, inside the
application's COMMIT, which then fails and takes the business rows with it (PostgreSQL's
``jsonb`` holds at most :data:`POSTGRESQL_JSONB_LIMIT` bytes; MySQL and MariaDB refuse a
statement larger than ``max_allowed_packet``, 16 MB by default on MariaDB, and drop the
connection). Brokers have limits of their own (Kafka and NATS take about 1 MB by default), and
a relay holds a whole claim's inputs in memory. So ``enqueue`` measures the input as it will
be stored (its JSON text, UTF-8) and refuses one over a cap:

* :data:`DEFAULT_MAX_INPUT_BYTES` (4 MiB), or the engine's execution option
  :data:`MAX_INPUT_BYTES_OPTION` (``engine.execution_options(sqla_outbox_max_input_bytes=N)``,
  read without connecting);
* on PostgreSQL never above :data:`POSTGRESQL_JSONB_LIMIT`;
* on MySQL and MariaDB the size counts the characters the driver escapes in the statement
  twice (a quote travels as ``\\"``): keep the cap under ``max_allowed_packet`` minus room for
  the rest of the row.

Measuring costs one ``json.dumps`` of the input per call; large data belongs elsewhere (an
object store), with its key in the input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError

__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "MAX_INPUT_BYTES_OPTION",
    "POSTGRESQL_JSONB_LIMIT",
    "check_input_size",
    "max_input_bytes",
]

DEFAULT_MAX_INPUT_BYTES = 4 * 1024 * 1024
"""The largest input, as stored JSON in UTF-8 bytes, that ``enqueue`` accepts by default."""
MAX_INPUT_BYTES_OPTION = "sqla_outbox_max_input_bytes"
"""The execution option (on the engine or connection the outbox table is written through) that
sets another cap."""
POSTGRESQL_JSONB_LIMIT = 268_435_455
"""Bytes PostgreSQL's ``jsonb`` holds at most; a cap above it is lowered to it."""


def max_input_bytes(options: Mapping[str, Any], dialect: str) -> int:
    """The cap for a bind with execution ``options`` on ``dialect`` (see the module docs)."""
    cap = options.get(MAX_INPUT_BYTES_OPTION, DEFAULT_MAX_INPUT_BYTES)
    if type(cap) is not int or cap < 1:
        raise ArgumentTypeError(
            f"the execution option {MAX_INPUT_BYTES_OPTION} must be a positive int (bytes), got "
            f"{cap!r}. Pass e.g. engine.execution_options({MAX_INPUT_BYTES_OPTION}=8_388_608)."
        )
    return min(cap, POSTGRESQL_JSONB_LIMIT) if dialect == "postgresql" else cap


def check_input_size(job: str, snapshot: Any, cap: int, dialect: str) -> None:
    """Raise :class:`ConfigurationError` if ``snapshot`` (a plain-JSON input) is larger than
    ``cap`` once stored, naming the job, both sizes and the fix."""
    if snapshot is None:
        return
    # ASCII-only JSON: each character one byte, each non-ASCII one written as a longer escape,
    # so this is at least the UTF-8 size; measured exactly only when it is over.
    text = json.dumps(snapshot)
    if _stored_size(text, dialect) <= cap:
        return
    size = _stored_size(json.dumps(snapshot, ensure_ascii=False), dialect)
    if size <= cap:
        return
    counted = ""
    if _escapes(dialect):
        counted = " (with the quotes and backslashes MySQL's driver escapes)"
    raise ConfigurationError(
        f"input for job {job!r} is {size:,} bytes as stored JSON{counted}, over the "
        f"{cap:,} bytes enqueue accepts: the database or the broker would refuse it, or the "
        "relay hold it in memory. Store large data elsewhere (an object store) and enqueue its "
        f"key, or raise the cap with engine.execution_options({MAX_INPUT_BYTES_OPTION}=N)."
    )


def _escapes(dialect: str) -> bool:
    return dialect in MYSQL_DIALECTS


def _stored_size(text: str, dialect: str) -> int:
    size = len(text.encode()) if not text.isascii() else len(text)
    if _escapes(dialect):
        size += text.count('"') + text.count("\\") + text.count("'")
    return size
