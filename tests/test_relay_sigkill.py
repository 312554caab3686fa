"""A relay killed with SIGKILL mid-batch loses nothing and repeats at most that batch.

The relay runs as a real ``sqla-outbox relay`` process and is killed between publish and mark,
the one crash at-least-once delivery exists for. A second relay then has to wait for the dead
one's claim lease to lapse, take the rows over and finish the job. The record file is the
broker: the publisher fsyncs each id into it before returning, so a kill cannot un-publish.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session
from support import recorded_ids

import sqla_outbox as outbox

pytestmark = pytest.mark.slow  # each test kills a relay process mid-batch and waits on it

REPO = Path(__file__).resolve().parent.parent
ROWS = 60
BATCH = 10
LEASE = 2


def wait_for(condition: object, timeout: float, what: str) -> None:
    """Poll ``condition()`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def test_sigkill_mid_batch_republishes_at_most_one_batch(engine: Engine, tmp_path: Path) -> None:
    """SIGKILL a relay subprocess mid-batch; a second relay (same lease) publishes every row
    once the dead relay's claim lapses. Every row ends up published, every id reaches the
    broker at least once, and the ids sent twice are at most one batch."""
    with Session(engine) as session, session.begin():
        staged = [outbox.enqueue(session, "ship", {"n": n}) for n in range(ROWS)]
    sent, first_life = _kill_mid_batch_then_finish(engine, tmp_path)
    assert set(sent) == {m.id for m in staged}
    duplicates = [message_id for message_id, count in sent.items() if count > 1]
    assert len(duplicates) <= BATCH
    assert all(sent[message_id] == 2 for message_id in duplicates)
    assert set(duplicates) <= set(first_life)


def test_sigkill_with_rows_parked_until_due_loses_none_of_them(
    engine: Engine, tmp_path: Path
) -> None:
    """The same kill with rows scheduled a day ahead staged before the due ones and parked by a
    sweep (sqla_outbox.waiting): neither relay publishes them before their time, the survivor
    finishes the due rows, and once the day has passed its sweep wakes them and each is
    published exactly once."""
    day_ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    with Session(engine) as session, session.begin():
        later = [outbox.enqueue(session, "remind", {"n": n}, run_at=day_ahead) for n in range(5)]
    with Session(engine) as session, session.begin():
        staged = [outbox.enqueue(session, "ship", {"n": n}) for n in range(ROWS)]
    sweeper = outbox.Relay(engine, lambda message: None)
    assert sweeper._statements.sweep().parked == len(later)
    sweeper.close()

    sent, _first_life = _kill_mid_batch_then_finish(engine, tmp_path, waiting=len(later))
    assert set(sent) == {m.id for m in staged}

    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    with engine.begin() as conn:  # the day has passed
        row = outbox.OutboxRow
        conn.execute(update(row).where(row.job == "remind").values(run_at=past, wake_at=past))
    reminded: list[uuid.UUID] = []
    survivor = outbox.Relay(engine, lambda message: reminded.append(message.id))
    assert survivor.drain().published == len(later)
    survivor.close()
    assert Counter(reminded) == Counter(m.id for m in later)
    assert not set(reminded) & set(sent)


def _kill_mid_batch_then_finish(
    engine: Engine, tmp_path: Path, *, waiting: int = 0
) -> tuple[Counter[uuid.UUID], list[uuid.UUID]]:
    """Run ``sqla-outbox relay`` on the due rows, SIGKILL it mid-batch, then drain with a
    second relay until only the ``waiting`` rows (not due) are unpublished. Returns how many
    times each id reached the broker, and the ids the killed relay sent."""
    record = tmp_path / "published.txt"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SQLA_OUTBOX_") or key.startswith("SQLA_OUTBOX_PG_")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["SQLA_OUTBOX_TEST_RECORD"] = str(record)
    env["SQLA_OUTBOX_URL"] = engine.url.render_as_string(hide_password=False)
    command = [
        sys.executable,
        "-m",
        "sqla_outbox.cli",
        "relay",
        "--claim-lease",
        str(LEASE),
        "--batch-size",
        str(BATCH),
        "--poll-interval",
        "0.05",
        "--relay-id",
        "doomed",
        "--publisher",
        "tests.publishers_for_tests:slow_recorder",
    ]
    with subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as proc:
        # Past the first batch and into the second, but nowhere near the end.
        try:
            wait_for(lambda: len(recorded_ids(record)) >= BATCH + 3, 20, "the relay to publish")
        finally:
            proc.kill()
            _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == -9, stderr.decode()
    first_life = recorded_ids(record)
    assert BATCH < len(first_life) < ROWS

    survivor_sent: list[uuid.UUID] = []

    def recorder(message: outbox.OutboxMessage) -> None:
        survivor_sent.append(message.id)

    survivor = outbox.Relay(engine, recorder, batch_size=BATCH, claim_lease=LEASE)
    try:
        # The dead relay's claim blocks its rows until the lease lapses; poll, bounded.
        def drained() -> bool:
            survivor.drain()
            return survivor.pending() == waiting

        wait_for(drained, LEASE * 5, "the survivor to take over the dead relay's rows")
    finally:
        survivor.close()
        if survivor.engine is not engine:
            survivor.engine.dispose()

    with engine.connect() as conn:
        unpublished = conn.scalar(
            select(func.count())
            .select_from(outbox.OutboxRow)
            .where(outbox.OutboxRow.published_at.is_(None))
        )
    assert unpublished == waiting
    return Counter(recorded_ids(record) + survivor_sent), first_life
