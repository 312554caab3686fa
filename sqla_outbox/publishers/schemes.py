"""Which module builds the publisher for a broker URL, and which extra it needs.

The command line accepts ``--publisher <url>``; the scheme picks a module under
:mod:`sqla_outbox.publishers`, imported only when used, whose ``from_url(url)`` builds the
publisher. Each broker's client is an optional extra, so a missing one is reported with the
``pip install`` line that fixes it rather than as an ``ImportError``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BROKERS", "Broker"]


@dataclass(frozen=True, slots=True)
class Broker:
    """One broker integration: its module, the extra that installs its client (and that
    client's distribution name), and the ``messaging.system`` its spans name
    (:mod:`sqla_outbox.tracing`: the OpenTelemetry conventions' well-known value where there is
    one, else the broker's own short name)."""

    module: str
    extra: str
    client: str
    system: str

    @property
    def install(self) -> str:
        """The command that installs the broker's client."""
        return f'pip install "sqla-outbox[{self.extra}]"'


_REDIS = Broker("sqla_outbox.publishers.redis_streams", "redis", "redis", "redis")
_AMQP = Broker("sqla_outbox.publishers.rabbitmq", "rabbitmq", "pika", "rabbitmq")
_NATS = Broker("sqla_outbox.publishers.nats_jetstream", "nats", "nats", "nats")
_HTTP = Broker("sqla_outbox.publishers.http_webhook", "http", "httpx", "webhook")
_CELERY = Broker("sqla_outbox.publishers.celery_tasks", "celery", "celery", "celery")
_KAFKA = Broker("sqla_outbox.publishers.kafka", "kafka", "confluent-kafka", "kafka")

BROKERS: dict[str, Broker] = {
    "redis": _REDIS,
    "rediss": _REDIS,
    "amqp": _AMQP,
    "amqps": _AMQP,
    "nats": _NATS,
    "tls": _NATS,
    "http": _HTTP,
    "https": _HTTP,
    "celery": _CELERY,
    "kafka": _KAFKA,
}
"""URL scheme (the part before ``:``) to broker. ``celery:module:attr`` names a Celery app."""
