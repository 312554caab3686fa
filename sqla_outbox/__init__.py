"""sqla-outbox: a transactional outbox for SQLAlchemy.

``outbox.enqueue(session, job, input)`` stages a job in the same database transaction as the
business rows; a :class:`Relay` publishes committed rows afterwards, at least once, in order, each
with an idempotency key a consumer can deduplicate on.
"""

from sqla_outbox import ddl as _ddl  # noqa: F401 - registers the table's PostgreSQL DDL
from sqla_outbox.dead_letters import DeadLetter, dead_letters, discard_dead, retry_dead
from sqla_outbox.engines import create_engine
from sqla_outbox.errors import (
    ArgumentTypeError,
    BrokerError,
    BrokerUnavailableError,
    ConfigurationError,
    MissingPrivilegeError,
    MissingTableError,
    OutboxError,
    PublisherError,
    PublishError,
    SchemaVersionError,
    StagingError,
)
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import SCHEMA_VERSION, TABLE_NAME, OutboxRow, metadata
from sqla_outbox.publishers import BatchPublisher, Publisher
from sqla_outbox.relay import PassResult, Relay
from sqla_outbox.retention import purge
from sqla_outbox.staging import enqueue, staged

__all__ = [
    "SCHEMA_VERSION",
    "TABLE_NAME",
    "ArgumentTypeError",
    "BatchPublisher",
    "BrokerError",
    "BrokerUnavailableError",
    "ConfigurationError",
    "DeadLetter",
    "MissingPrivilegeError",
    "MissingTableError",
    "OutboxError",
    "OutboxMessage",
    "OutboxRow",
    "PassResult",
    "PublishError",
    "Publisher",
    "PublisherError",
    "Relay",
    "SchemaVersionError",
    "StagingError",
    "create_engine",
    "dead_letters",
    "discard_dead",
    "enqueue",
    "metadata",
    "purge",
    "retry_dead",
    "staged",
]
