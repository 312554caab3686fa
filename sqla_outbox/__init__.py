"""sqla-outbox: a transactional outbox for SQLAlchemy.

``outbox.enqueue(session, job, input)`` stages a job in the same database transaction as the
business rows; a :class:`Relay` publishes committed rows afterwards, at least once, in order, each
with an idempotency key a consumer can deduplicate on.
"""

from importlib.metadata import PackageNotFoundError, version

from sqla_outbox import ddl as _ddl  # noqa: F401 - registers the table's PostgreSQL DDL
from sqla_outbox.backlog import OutboxStatus, status
from sqla_outbox.dead_letters import DeadLetter, dead_letters, discard_dead, retry_dead
from sqla_outbox.engines import create_engine
from sqla_outbox.errors import (
    ArgumentTypeError,
    ArgumentValueError,
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
    "ArgumentValueError",
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
    "OutboxStatus",
    "PassResult",
    "PublishError",
    "Publisher",
    "PublisherError",
    "Relay",
    "SchemaVersionError",
    "StagingError",
    "__version__",
    "create_engine",
    "dead_letters",
    "discard_dead",
    "enqueue",
    "metadata",
    "purge",
    "retry_dead",
    "staged",
    "status",
]

try:
    __version__ = version("sqla-outbox")
    """The installed distribution's version (PEP 440), as ``sqla-outbox --version`` prints it."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
