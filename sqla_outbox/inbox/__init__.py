"""The consumer's side of the outbox: process each message effectively once.

The outbox publishes at least once: a relay that dies between publishing and marking publishes
that claim again, and brokers redeliver on their own. Every message carries an idempotency key;
the inbox records it in the transaction that does the consumer's work, so the work runs once per
key however often the message arrives (:func:`receive`). From the producer's commit to the
consumer's commit, that is effectively-once processing.

* :func:`receive` records a key in the caller's transaction and says whether it is new.
* :class:`InboxRow` (table ``outbox_inbox``), :data:`metadata` and :data:`SCHEMA_VERSION`: the
  table, on its own ``MetaData`` (``inbox.metadata.create_all(engine)``, or the application's
  Alembic ``target_metadata``).
* :func:`handler` wraps a consumer's ``fn(session, message)`` to run once per key, committing
  before the broker is acknowledged (:mod:`sqla_outbox.inbox.handling` has the ack order).
* :func:`~sqla_outbox.inbox.celery.inbox_task` does the same for a Celery task (``acks_late``).
* :func:`key_of` reads a message's key from what each bundled broker's client delivers, and
  :func:`fields_of` the other fields the relay sent with it.
* :func:`purge` deletes old keys; its ``older_than`` is the deduplication window
  (:mod:`sqla_outbox.inbox.retention`).

``from sqla_outbox import inbox`` loads it; the outbox alone never does.
"""

from sqla_outbox.inbox.handling import handler
from sqla_outbox.inbox.keys import fields_of, key_of
from sqla_outbox.inbox.model import KEY_LENGTH, SCHEMA_VERSION, TABLE_NAME, InboxRow, metadata
from sqla_outbox.inbox.receiving import DEFAULT_CONSUMER, receive
from sqla_outbox.inbox.retention import purge

__all__ = [
    "DEFAULT_CONSUMER",
    "KEY_LENGTH",
    "SCHEMA_VERSION",
    "TABLE_NAME",
    "InboxRow",
    "fields_of",
    "handler",
    "key_of",
    "metadata",
    "purge",
    "receive",
]
