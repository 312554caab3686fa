"""The inbox table through Alembic: ``op.create_inbox_table(version=1)``, its drop, and
autogenerate writing them (then nothing, once the table is there), on PostgreSQL and SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
import sqlalchemy as sa
from alembic.autogenerate import produce_migrations, render_python_code
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, MetaData
from sqlalchemy.orm import Session

import alembic_ext
from sqla_outbox import inbox
from sqla_outbox.engines import create_engine
from sqla_outbox.errors import ConfigurationError


@pytest.fixture(params=["pg_url", "sqlite_url"])
def empty(request: pytest.FixtureRequest) -> Iterator[Engine]:
    engine = create_engine(request.getfixturevalue(request.param))
    yield engine
    engine.dispose()


def _op(conn: sa.Connection) -> Any:
    return Operations(MigrationContext.configure(conn))


def _upgrade_code(conn: sa.Connection) -> str:
    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    script = produce_migrations(ctx, cast(MetaData, inbox.metadata))
    assert script.upgrade_ops is not None
    return render_python_code(script.upgrade_ops)


def test_the_operations_create_and_drop_the_inbox(empty: Engine) -> None:
    with empty.begin() as conn:
        _op(conn).create_inbox_table(version=1)
    names = {index["name"] for index in sa.inspect(empty).get_indexes(inbox.TABLE_NAME)}
    assert names == {"ix_outbox_inbox_received"}
    with Session(empty) as session:
        assert inbox.receive(session, "k")
        session.commit()
    with empty.begin() as conn:
        _op(conn).drop_inbox_table()
    assert not sa.inspect(empty).has_table(inbox.TABLE_NAME)


def test_autogenerate_writes_the_operation_then_nothing(empty: Engine) -> None:
    with empty.connect() as conn:
        code = _upgrade_code(conn)
    assert "op.create_inbox_table(version=1)" in code
    assert "create_table" not in code.replace("create_inbox_table", "")
    assert "create_index" not in code
    with empty.begin() as conn:
        _op(conn).create_inbox_table(version=1)
    with empty.connect() as conn:
        assert "pass" in _upgrade_code(conn)  # nothing to do


def test_an_unknown_version_is_refused_naming_the_known_one() -> None:
    with pytest.raises(ConfigurationError, match=r"version 2 does not exist.*Pass version=1"):
        alembic_ext.inbox.CreateInboxTableOp(version=2)
