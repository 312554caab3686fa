"""The exceptions the library raises on purpose.

Every message is written for the person who has to fix it: what is wrong, the offending value
(quoted with ``!r``), and what to do instead. The CLI prints them as they are, without a
traceback, so a message that needs a traceback to be understood is a bug in the message.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "BrokerError",
    "BrokerUnavailableError",
    "ConfigurationError",
    "MissingPrivilegeError",
    "MissingTableError",
    "OutboxError",
    "PublishError",
    "PublisherError",
    "SchemaVersionError",
    "StagingError",
]


class OutboxError(Exception):
    """Base of every error sqla-outbox raises deliberately; catch it to catch them all."""


class ConfigurationError(OutboxError, ValueError):
    """An option has a value the library cannot honour (a lease of zero, a bad batch size).

    It is also a ``ValueError`` so callers validating arguments the standard way catch it.
    """


class ArgumentValueError(ConfigurationError):
    """A setting's value refused, with the fix, written so that each front end spells the
    settings its own way: Python as ``batch_size=500``, the command line as ``--batch-size 500``.

    ``template`` marks each setting it names as ``«name»`` and each suggested value as
    ``«name=value»``; :meth:`render` spells them, and ``str()`` is the Python spelling.
    ``argument`` is the setting the error is about.
    """

    def __init__(self, argument: str, template: str) -> None:
        self.argument = argument
        self.template = template
        super().__init__(self.render(_python_spelling))

    def render(self, spell: Callable[[str, str | None], str]) -> str:
        """The message with each ``«name»`` as ``spell(name, None)`` and each ``«name=value»``
        as ``spell(name, value)``."""

        def spelled(match: re.Match[str]) -> str:
            return spell(match.group(1), match.group(2))

        return _SETTING.sub(spelled, self.template)


_SETTING = re.compile(r"«(\w+)(?:=([^»]*))?»")


def _python_spelling(name: str, value: str | None) -> str:
    return name if value is None else f"{name}={value}"


class ArgumentTypeError(OutboxError, TypeError):
    """An argument has the wrong type (input that is not JSON, a job that is not a name).

    It is also a ``TypeError``, which is what Python code expects for a wrong type.
    """


class StagingError(OutboxError):
    """``enqueue`` was called where no transaction can carry the message."""


class MissingTableError(OutboxError):
    """The database is reachable but has no outbox table: the migration has not been run."""


class SchemaVersionError(OutboxError):
    """The outbox table is an older schema version than this sqla-outbox needs.

    The message names the table, both versions, and the migration that fixes it
    (``op.upgrade_outbox_table(found, needed)``). Raised at start-up (:meth:`Relay.check`) and
    in place of the driver's "column does not exist" when a statement meets the older table.
    """


class MissingPrivilegeError(OutboxError):
    """The database role may not do what sqla-outbox needs on the outbox table (PostgreSQL).

    The message names the role, each missing privilege, the table, and the ``GRANT`` that fixes
    it. Raised at start-up (:meth:`Relay.check`, ``sqla-outbox status``) rather than left to a
    relay that would otherwise retry a "permission denied" forever.
    """


class BrokerError(OutboxError):
    """A broker did not take a message: it refused it, answered with an error, or was unreachable.

    Each broker publisher raises its own subclass (``RabbitMQError``, ``WebhookError``) carrying
    that broker's details. They share this base so that code publishing through whichever broker
    is configured catches every broker's delivery failure with one ``except BrokerError``, without
    importing the broker modules, whose client libraries are optional extras. A partial batch is
    reported as :class:`PublishError` instead, whose ``__cause__`` may be a ``BrokerError``.
    """


class PublisherError(OutboxError):
    """A publisher spec cannot be turned into a publisher (bad import path, missing extra)."""


class PublishError(BrokerError):
    """Raised by a publisher's ``publish_batch`` when only part of the batch was confirmed.

    ``published`` is how many messages, from the start of the batch, the broker confirmed; the
    relay marks exactly those and records the failure on the next one. Any other exception from
    ``publish_batch`` counts as none confirmed: the batch is published again later, never lost.
    """

    def __init__(self, message: str, *, published: int) -> None:
        super().__init__(message)
        self.published = published


class BrokerUnavailableError(BrokerError):
    """The broker cannot be reached at all: connection refused, a timeout, a broker restarting.

    An outage, not a verdict on the message: the relay hands the rest of the pass back, charges
    no row an attempt, and backs off as a whole until the broker answers again. Every other
    exception a publisher raises is charged to the message being published (retried with
    backoff, dead-lettered after ``max_publish_attempts``).

    A custom publisher raises it (or an exception whose ``__cause__`` is one) for "could not talk
    to the broker". A ``publish_batch`` that got ``k`` messages confirmed before the broker went
    away passes ``published=k``; the relay marks exactly those.
    """

    def __init__(self, message: str, *, published: int = 0) -> None:
        super().__init__(message)
        self.published = published
