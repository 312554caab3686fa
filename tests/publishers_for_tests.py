"""Publishers the CLI tests load by spec: ``--publisher tests.publishers_for_tests:<name>``.

The relay runs in a subprocess, so what it published must reach the test through something it
can read: standard output (one JSON line, flushed) or a record file named by an environment
variable (one id per line, flushed and fsynced so a SIGKILL right after cannot lose it).
"""

from __future__ import annotations

import json
import os
import time

from sqla_outbox.message import OutboxMessage

RECORD_ENV = "SQLA_OUTBOX_TEST_RECORD"
"""Environment variable naming the file :func:`slow_recorder` appends message ids to."""

SLOW_SECONDS = 0.05


def _print(message: OutboxMessage) -> None:
    print(json.dumps({"id": str(message.id), "job": message.job}), flush=True)


def fail_on_flag(message: OutboxMessage) -> None:
    """Prints the message, unless its input has ``"fail": true``: then raises (not published)."""
    if isinstance(message.input, dict) and message.input.get("fail"):
        raise RuntimeError(f"broker rejected {message.job} {message.id}")
    _print(message)


def slow_printer(message: OutboxMessage) -> None:
    """Prints the message, then takes a while, so a signal lands in the middle of a pass."""
    _print(message)
    time.sleep(SLOW_SECONDS)


def slow_recorder(message: OutboxMessage) -> None:
    """Appends the id to the record file (durably), then takes a while, like a broker call."""
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as record:
        record.write(f"{message.id}\n")
        record.flush()
        os.fsync(record.fileno())
    time.sleep(SLOW_SECONDS)


class CountingPublisher:
    """A class spec: instantiated with no arguments by the loader; prints like ``stdout``."""

    def __init__(self) -> None:
        self.count = 0

    def publish(self, message: OutboxMessage) -> None:
        """Print one JSON line and count it."""
        self.count += 1
        _print(message)


NOT_A_PUBLISHER = 42
"""A spec target that is neither callable nor has ``publish``: the loader must refuse it."""
