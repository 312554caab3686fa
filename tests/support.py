"""Helpers shared by the test modules: staging messages, reading rows, waiting, running the CLI.

Imported as ``support`` (``from support import wait_until``): ``tests/`` has no ``__init__.py``,
so pytest puts it on ``sys.path`` for the modules below it, ``tests/brokers/*`` included. Fixtures
live in ``conftest.py``; this module holds plain functions and classes.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

import sqla_outbox as outbox
from sqla_outbox.errors import BrokerUnavailableError, PublisherError, PublishError
from sqla_outbox.message import OutboxMessage

REPO = Path(__file__).resolve().parent.parent
WAIT = 30.0  # seconds; a bound on waits that should take well under a second

MakeRelay = Callable[..., outbox.Relay]
"""The ``make_relay`` fixture: builds a :class:`~sqla_outbox.Relay` that is closed at teardown."""


class ManualClock:
    """A monotonic clock that a test moves by hand (``clock.now += seconds``), for the policies
    that take one (trimming, sweeping)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TextlessError(RuntimeError):
    """A publisher error with no text: its ``str()`` raises."""

    def __str__(self) -> str:
        raise ValueError("this error has no text")


async def never_awaited(*_args: object) -> None:
    """What a publisher built around an async client returns: a coroutine nobody runs."""
    raise AssertionError("the relay never awaits")


class ReturnsCoroutines:
    """A synchronous publisher whose ``publish`` and ``publish_batch`` return a coroutine (a
    ``lambda`` around an async client's ``publish``): nothing is ever sent."""

    def publish(self, message: OutboxMessage) -> object:
        return never_awaited(message)

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> object:
        return never_awaited(messages)


# --- staging and reading rows ------------------------------------------------------------------


@contextmanager
def transaction(engine: Engine, *, commit: bool = True) -> Iterator[Session]:
    """A session whose transaction is committed (or rolled back) when the block ends."""
    with Session(engine) as session:
        yield session
        if commit:
            session.commit()
        else:
            session.rollback()


def stage_inputs(
    engine: Engine, job: str, inputs: Iterable[Any], *, commit: bool = True, **options: Any
) -> list[OutboxMessage]:
    """Enqueue ``job`` once per input, all with ``options``, in one transaction that is
    committed or rolled back; return the messages in enqueue order."""
    with transaction(engine, commit=commit) as session:
        return [outbox.enqueue(session, job, value, **options) for value in inputs]


def stage(
    engine: Engine, queue: str, count: int, *, commit: bool = True, **attributes: Any
) -> list[OutboxMessage]:
    """Enqueue ``count`` ``send_email`` messages on ``queue`` in one transaction, then commit or
    roll it back. Inputs are ``{"n": 0, ...}``, ``{"n": 1, ...}``, with non-ASCII text."""
    inputs = ({"n": n, "to": "ünïcode@example.com"} for n in range(count))
    return stage_inputs(engine, "send_email", inputs, commit=commit, queue=queue, **attributes)


def row(engine: Engine, message: OutboxMessage | uuid.UUID) -> Any:
    """The outbox row of ``message`` (or of the message with that id), as it is now."""
    key = message.id if isinstance(message, OutboxMessage) else message
    with Session(engine) as session:
        return session.execute(
            select(outbox.OutboxRow).where(outbox.OutboxRow.id == key)
        ).scalar_one()


def expire_backoffs(engine: Engine) -> int:
    """End every retry backoff now, as if its time had come: ``UPDATE outbox SET retry_at`` to
    an hour ago wherever one is set, and a row a sweep parked until its backoff's end woken, as
    a relay running all that time would have woken it (sqla_outbox.waiting). Tests use it
    instead of sleeping out a backoff; returns how many rows it touched."""
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    row = outbox.OutboxRow
    with engine.begin() as conn:
        conn.execute(
            update(row)
            .where(row.retry_at.is_not(None), row.wake_at.is_not(None))
            .values(parked=False, wake_at=None)
        )
        return conn.execute(
            update(row).where(row.retry_at.is_not(None)).values(retry_at=past)
        ).rowcount


def assert_charged(
    engine: Engine, message: OutboxMessage | uuid.UUID, error: str, *, attempts: int = 1
) -> Any:
    """A message failure was charged to the row: unpublished and handed back (unclaimed), with
    ``attempts`` failed publishes, ``error`` in ``last_error``, and a retry backoff that has not
    ended yet (not a dead letter). Returns the row."""
    charged = row(engine, message)
    assert charged.published_at is None and charged.claimed_by is None
    assert charged.attempts == attempts and charged.dead_at is None
    assert charged.last_error is not None and error in charged.last_error, charged.last_error
    assert charged.retry_at is not None
    assert charged.retry_at > dt.datetime.now(dt.timezone.utc), "the backoff already ended"
    return charged


def assert_uncharged(engine: Engine, messages: Iterable[OutboxMessage | uuid.UUID]) -> None:
    """The rows were handed back blameless: unclaimed, unpublished, no attempt charged, no
    error, no backoff (an outage, a graceful stop, or rows a failure held back)."""
    for message in messages:
        handed_back = row(engine, message)
        assert handed_back.claimed_by is None and handed_back.published_at is None
        assert (handed_back.attempts, handed_back.last_error) == (0, None)
        assert handed_back.retry_at is None and handed_back.dead_at is None


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    """The lines logged as ``event`` (``event=relay.broker_unavailable ...``), in order."""
    lines = (record.getMessage() for record in caplog.records)
    return [line for line in lines if line.startswith(f"event={event} ")]


# --- waiting and ports -------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` (real state, not time) until true, or fail saying ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- brokers and publishers --------------------------------------------------------------------


@contextmanager
def reachable_redis(url: str, **options: Any) -> Iterator[Any]:
    """A redis-py client of ``url``, closed on leaving; skips the test if Redis does not answer."""
    import redis  # noqa: PLC0415 - an optional extra: only the Redis and Celery tests import it

    client = redis.Redis.from_url(url, **options)
    try:
        client.ping()
    except redis.RedisError as error:
        client.close()
        pytest.skip(f"Redis is not reachable at {url}: {error}")
    try:
        yield client
    finally:
        client.close()


def publisher_error(build: Callable[[str], object], url: str, *, match: str | None = None) -> str:
    """The text of the :class:`PublisherError` that ``build(url)`` raises (matching ``match``),
    checked to be one sentence: no line break, and a full stop at the end."""
    with pytest.raises(PublisherError, match=match) as info:
        build(url)
    text = str(info.value)
    assert "\n" not in text and text.endswith("."), text
    return text


class Recorder:
    """Wraps a batch publisher: records what it confirmed and can hold the relay after a count.

    Once ``pause_after`` messages are confirmed, the call that confirmed them sets ``paused``
    and waits for ``resume`` before returning, so the test can act while the relay is parked
    between two passes with a known number delivered.
    """

    def __init__(self, inner: Any, *, pause_after: int | None = None) -> None:
        self.inner = inner
        self.pause_after = pause_after
        self.confirmed: list[OutboxMessage] = []
        self.failures: list[tuple[BaseException, float]] = []
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.failed = threading.Event()

    def publish(self, message: OutboxMessage) -> None:
        self.publish_batch([message])

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        started = time.monotonic()
        try:
            self.inner.publish_batch(messages)
        except Exception as error:
            confirming = (PublishError, BrokerUnavailableError)  # both carry the confirmed count
            done = error.published if isinstance(error, confirming) else 0
            self.confirmed.extend(messages[:done])
            self.failures.append((error, time.monotonic() - started))
            self.failed.set()
            raise
        self.confirmed.extend(messages)
        if (
            self.pause_after is not None
            and len(self.confirmed) >= self.pause_after
            and not self.paused.is_set()
        ):
            self.paused.set()
            self.resume.wait(WAIT)

    def close(self) -> None:
        self.inner.close()


# --- the command line and other subprocesses ---------------------------------------------------


def cli_env(**settings: str) -> dict[str, str]:
    """The test process's environment without stray SQLA_OUTBOX_* settings, plus ``settings``.

    The repository root goes on PYTHONPATH so ``tests.publishers_for_tests`` is importable.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SQLA_OUTBOX_") or key.startswith("SQLA_OUTBOX_PG_")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update({f"SQLA_OUTBOX_{key.upper()}": value for key, value in settings.items()})
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sqla_outbox.cli", *args]


def run_cli(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """Run ``sqla-outbox *args`` to completion with ``SQLA_OUTBOX_<KEY>=value`` settings."""
    return subprocess.run(
        cli_command(*args),
        env=cli_env(**settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def assert_one_clean_error(result: subprocess.CompletedProcess[str]) -> str:
    """Non-zero exit, no traceback, exactly one ``Error:`` line; return that line."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    return lines[0]


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def without_client(client: str, module: str, *calls: str) -> subprocess.CompletedProcess[str]:
    """Run ``calls`` in a fresh interpreter in which the package ``client`` cannot be imported.

    Each call is a Python expression using ``module``, imported from ``sqla_outbox.publishers``
    first (so the module must import without its client); the message of each
    :class:`PublisherError` a call raises is printed on a line of the result's ``stdout``, and any
    other exception fails the run.
    """
    lines = [
        f"import sys; sys.modules[{client!r}] = None",
        "from sqla_outbox.errors import PublisherError",
        f"from sqla_outbox.publishers import {module}",
    ]
    for call in calls:
        lines += ["try:", f"    {call}", "except PublisherError as error:", "    print(error)"]
    command = [sys.executable, "-c", "\n".join(lines)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=True)


def recorded_ids(record: Path) -> list[uuid.UUID]:
    """The ids a recording publisher appended to ``record``, one per line, up to its last
    complete line: a relay killed with SIGKILL may leave the last one half-written."""
    text = record.read_text(encoding="utf-8") if record.exists() else ""
    return [uuid.UUID(line) for line in text[: text.rfind("\n") + 1].split()]


def pg_rows_read(plan: dict[str, Any]) -> int:
    """Table and index rows a PostgreSQL JSON ``EXPLAIN ANALYZE`` plan node and its children
    read, over their loops."""
    read = 0
    if "Relation Name" in plan or "Index Name" in plan:
        rows = plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
        read += int(rows * plan["Actual Loops"])
    return read + sum(pg_rows_read(child) for child in plan.get("Plans", []))
