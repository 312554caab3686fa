"""AsyncSession on psycopg's async driver stages and commits exactly like Session."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import uuid

from sqlalchemy import Engine, event, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import (
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session

import sqla_outbox as outbox


def jobs(engine: Engine) -> list[str]:
    with Session(engine) as session:
        stmt = select(outbox.OutboxRow.job).order_by(
            outbox.OutboxRow.staged_at, outbox.OutboxRow.id
        )
        return list(session.scalars(stmt))


def test_async_commit_rollback_and_savepoint(pg_engine: Engine, pg_url: URL) -> None:
    """Commit writes, rollback drops, a rolled-back savepoint drops its own: as with Session."""

    async def scenario() -> None:
        engine = create_async_engine(pg_url.set(drivername="postgresql+psycopg_async"))
        try:
            async with AsyncSession(engine) as session:
                outbox.enqueue(session, "rolled-back")
                assert [m.job for m in outbox.staged(session)] == ["rolled-back"]
                await session.rollback()
                assert outbox.staged(session) == ()

                outbox.enqueue(session, "a")
                savepoint = await session.begin_nested()
                outbox.enqueue(session, "b")
                await savepoint.rollback()
                async with session.begin_nested():
                    outbox.enqueue(session, "c")
                await session.commit()
                assert outbox.staged(session) == ()

            factory = async_sessionmaker(engine)
            scoped = async_scoped_session(factory, scopefunc=asyncio.current_task)
            outbox.enqueue(scoped, "scoped")
            await scoped.commit()
            await scoped.remove()
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert jobs(pg_engine) == ["a", "c", "scoped"]


class HookedSession(Session):
    """The sync session class behind the hooked AsyncSession (listeners stay on it)."""


def test_async_flush_hook_enqueue_is_written(pg_engine: Engine, pg_url: URL) -> None:
    """An AsyncSession's commit writes the jobs its flush hooks stage during that commit
    (the hook gets the sync session, inside the awaited commit)."""

    async def scenario() -> None:
        engine = create_async_engine(pg_url.set(drivername="postgresql+psycopg_async"))
        factory = async_sessionmaker(engine, sync_session_class=HookedSession)

        def after_flush(session: Session, _context: object) -> None:
            if not session.info.get("done"):
                session.info["done"] = True
                outbox.enqueue(session, "from-flush-hook")

        event.listen(HookedSession, "after_flush", after_flush)
        try:
            async with factory() as session:
                outbox.enqueue(session, "before-commit")
                session.add(outbox.OutboxRow(**_row("added-as-a-row")))
                await session.commit()
        finally:
            event.remove(HookedSession, "after_flush", after_flush)
            await engine.dispose()

    asyncio.run(scenario())
    assert jobs(pg_engine) == ["before-commit", "from-flush-hook", "added-as-a-row"]


def _row(job: str) -> dict[str, object]:
    """A hand-made outbox row: any ORM object would do to make the commit flush."""
    now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    return {
        "id": uuid.uuid4(),
        "job": job,
        "queue": "default",
        "input": None,
        "idempotency_key": job,
        "max_attempts": 1,
        "run_at": now,
        "staged_at": now,
    }


def test_import_does_not_pull_in_asyncio_support() -> None:
    """`import sqla_outbox` imports neither SQLAlchemy's asyncio extension nor greenlet."""
    code = (
        "import sys, sqla_outbox; "
        "bad = [m for m in ('sqlalchemy.ext.asyncio', 'greenlet') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
