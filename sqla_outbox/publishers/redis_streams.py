"""Redis Streams publisher: each message is one ``XADD`` entry, each relay pass one pipeline.

``--publisher 'redis://host:6379/0?stream=outbox:{queue}&maxlen=100000'``

What it guarantees
    A message counts as published only once Redis has answered its ``XADD`` with an entry id.
    :meth:`RedisStreamsPublisher.publish_batch` sends a whole pass as one pipeline (no
    ``MULTI``; one round trip), reads every reply in order, and reports the confirmed prefix:
    if the third ``XADD`` of ten is refused, it raises ``PublishError(published=2)`` and the
    relay marks exactly two. Entries of one stream are appended in claim order.

What it writes
    To the stream named by the ``stream`` pattern (``{queue}`` is replaced by the message's
    queue; the default pattern is just ``{queue}``), with the entry id chosen by Redis (``*``),
    one field per message field under the field's own name, every value a string: ``id``,
    ``job``, ``queue``, ``input`` (JSON), ``idempotency_key``, ``max_attempts`` (decimal),
    ``run_at`` and ``staged_at`` (ISO 8601 with offset), and ``tenant_id``, ``traceparent``,
    ``enqueued_by``, ``ordering_key`` *only when set*: a Redis field cannot hold "no value", and
    an empty string would be indistinguishable from a real empty tenant, so an absent field
    means ``None``.

What it does not do
    It does not deduplicate. Delivery is at least once (a relay killed between the ``XADD``
    and its mark re-publishes after the claim lease; a connection lost while reading the
    pipeline's replies leaves Redis holding entries the relay did not see confirmed), and a
    stream has no notion of a message id other than the entry id Redis picked. Consumers
    deduplicate on the ``idempotency_key`` field. It creates no consumer groups either: that
    is the consumer's side (``XGROUP CREATE <stream> <group> $ MKSTREAM``).

Failure behaviour
    One ``redis.Redis`` client per publisher, created lazily, with its retries switched off:
    the relay is the retry loop, and a client retrying a pipeline on its own would both hide
    the outage and send the batch twice. When Redis is down a publish fails within
    ``socket_timeout`` seconds, the relay tries again on a later pass, and the client
    reconnects by itself once Redis is back (stale pooled sockets are dropped).

Outage or message failure (:mod:`sqla_outbox.publishers.outages`)
    :class:`RedisUnavailableError`, an outage, when Redis takes no writes whatever the message:
    it cannot be reached, times out, drops the connection, is loading its data after a
    restart (``LOADING``), refuses the credentials, or answers ``OOM``, ``READONLY``,
    ``CLUSTERDOWN``/``MASTERDOWN``, ``TRYAGAIN``, ``NOREPLICAS``, ``BUSY`` or ``MISCONF``.
    ``published`` is the confirmed prefix: 0 for a connection lost during the pipeline (no reply
    was read), *k* for an ``OOM`` answered to the *k+1*-th ``XADD``. Every other refusal of an
    ``XADD`` (``WRONGTYPE``: the key is not a stream; ``NOPERM`` on the key) is a message
    failure, :class:`~sqla_outbox.PublishError`.

The trap
    ``maxlen`` trims *old* entries, whether or not a consumer has read them: it bounds memory,
    it is not an acknowledgement. Size it for the longest consumer outage you must survive, or
    leave it unset and trim with ``XTRIM MINID`` from the consumer once entries are processed.
    And a Redis without persistence (``appendonly no``) loses confirmed entries on restart:
    "confirmed" means "in Redis's memory", so durability is Redis's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any
from urllib.parse import urlunsplit

from sqla_outbox.errors import BrokerUnavailableError, PublisherError, PublishError
from sqla_outbox.message import OutboxMessage, spelled, wire_fields
from sqla_outbox.publishers.outages import redis_unavailable
from sqla_outbox.publishers.urls import (
    check_scheme,
    hide_password,
    parse_seconds,
    positive_seconds,
    query_options,
    require_client,
    split_publisher_url,
    split_url,
    unknown_option,
)

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:  # pragma: no cover - exercised only without the extra
    _CLIENT_INSTALLED = False
else:
    _CLIENT_INSTALLED = True

__all__ = [
    "CARRIED_ELSEWHERE",
    "DEFAULT_SOCKET_TIMEOUT",
    "RedisStreamsPublisher",
    "RedisUnavailableError",
    "entry_fields",
    "from_url",
]

DEFAULT_SOCKET_TIMEOUT = 5.0
"""Seconds a connect or a reply may take before the publish fails (``socket_timeout``)."""

QUEUE_PLACEHOLDER = "{queue}"

_OPTIONS = ("stream", "maxlen", "socket_timeout")
# redis-py's own TLS settings, passed through unchanged for rediss:// URLs.
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_CERT_REQS = ("none", "optional", "required")
_SCHEMES = ("redis", "rediss")
_LABEL = "Redis publisher URL"


class RedisUnavailableError(BrokerUnavailableError):
    """Redis takes no writes right now, whatever the message: an outage, not a message failure.

    Unreachable, timed out, the connection lost, loading after a restart, or refusing every
    write (out of memory, a read-only replica, a cluster that is down); see the module docs.
    ``published`` is how many messages of the batch Redis confirmed before that.
    """


def _require_client() -> None:
    require_client(_CLIENT_INSTALLED, "The Redis Streams publisher", "redis")


CARRIED_ELSEWHERE: Mapping[str, str] = MappingProxyType({})
"""None: a stream entry is only fields, so every field is one, ``input`` included (as JSON)."""

WIRE_FIELDS = wire_fields(lambda name: name, text=True, elsewhere=CARRIED_ELSEWHERE)


def entry_fields(message: OutboxMessage) -> dict[str, str]:
    """The stream entry written for ``message``: one string field per message field, under the
    field's own name.

    A field that is ``None`` is left out (see the module docs); the others are always present.
    """
    fields: dict[str, str] = spelled(message, WIRE_FIELDS)
    return fields


class RedisStreamsPublisher:
    """Appends each message to a Redis stream, a pass at a time, and reports what Redis confirmed.

    :param url: ``redis://[[user]:password@]host[:port][/db]``, or ``rediss://`` for TLS. Query
        options are not read here; :func:`from_url` parses them into the arguments below.
    :param stream: stream name pattern; ``{queue}`` becomes the message's queue. A pattern
        without ``{queue}`` sends every queue to one stream (the ``queue`` field tells them
        apart).
    :param maxlen: trim each stream to about this many entries (``XADD ... MAXLEN ~ n``); ``None``
        (the default) never trims. Read the trap in the module docs first.
    :param socket_timeout: seconds for a connect or a reply, so a dead Redis fails a publish
        instead of hanging the relay.
    :param client: a ready ``redis.Redis`` to use instead of building one from ``url`` (Sentinel,
        custom TLS). It stays the caller's: :meth:`close` does not close it, and its own retry
        settings apply.
    :param ssl_options: redis-py TLS keyword arguments (``ssl_ca_certs``, ``ssl_cert_reqs``, ...)
        for a ``rediss://`` URL.
    """

    overlap = True
    """Relays claim ahead while this publisher works (:mod:`sqla_outbox.overlap`): with this
    broker it pays, the database being idle while the broker works; the ``brokers`` benchmark's
    "overlap flipped" row checks this default."""

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        stream: str = QUEUE_PLACEHOLDER,
        maxlen: int | None = None,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        client: redis.Redis | None = None,
        ssl_options: dict[str, str] | None = None,
    ) -> None:
        _require_client()
        self.url = url
        self.stream = _check_stream(stream)
        self.maxlen = _check_maxlen(maxlen)
        self.socket_timeout = positive_seconds(
            "socket_timeout", socket_timeout, default=DEFAULT_SOCKET_TIMEOUT
        )
        self._shown = hide_password(url) if client is None else repr(client)
        self._ssl_options = dict(ssl_options or {})
        self._owns_client = client is None
        self._client: redis.Redis | None = client
        if client is None:
            _check_server_url(url)

    def __repr__(self) -> str:
        return f"<RedisStreamsPublisher to {self._shown} stream={self.stream!r}>"

    def stream_for(self, message: OutboxMessage) -> str:
        """The stream ``message`` is appended to: the pattern with its queue filled in."""
        return self.stream.replace(QUEUE_PLACEHOLDER, message.queue)

    def publish(self, message: OutboxMessage) -> None:
        """Append one message; return once Redis has confirmed it, else raise."""
        self.publish_batch([message])

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        """Append ``messages`` in order with one pipeline; raise on a gap.

        Every reply is checked. A refused ``XADD`` ends the confirmed prefix there, even if later
        ones were accepted: the relay re-publishes those later, which is why consumers
        deduplicate. It raises :class:`RedisUnavailableError` when Redis takes no writes at all
        (a lost connection confirms nothing; ``OOM`` or ``READONLY`` confirms the prefix before
        it), and :class:`~sqla_outbox.PublishError` when it refused that one message.
        """
        if not messages:
            return
        client = self._connection()
        names = [self.stream_for(message) for message in messages]
        pipe = client.pipeline(transaction=False)
        try:
            for name, message in zip(names, messages, strict=True):
                pipe.xadd(
                    name,
                    entry_fields(message),  # type: ignore[arg-type]  # dict[str, str] is fine
                    id="*",
                    maxlen=self.maxlen,
                    approximate=True,
                )
            replies = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            self._drop_connections()
            raise RedisUnavailableError(
                f"Redis at {self._shown} did not confirm a batch of {len(messages)}: "
                f"{type(error).__name__}: {str(error).rstrip('.')}. None of it counts as "
                "published; the relay retries on a later pass and the client reconnects by itself.",
                published=0,
            ) from error
        except redis.RedisError as error:
            kind = RedisUnavailableError if redis_unavailable(error) else PublishError
            raise kind(
                f"Redis at {self._shown} failed a batch of {len(messages)}: "
                f"{type(error).__name__}: {str(error).rstrip('.')}.",
                published=0,
            ) from error
        finally:
            pipe.reset()
        confirmed = 0
        for reply in replies:
            if isinstance(reply, BaseException) or reply is None:
                break
            confirmed += 1
        if confirmed < len(messages):
            reply = replies[confirmed] if confirmed < len(replies) else "no reply"
            failed = messages[confirmed]
            where = (
                f"XADD of message {failed.id} (job {failed.job!r}) to stream {names[confirmed]!r}"
            )
            if isinstance(reply, BaseException) and redis_unavailable(reply):
                raise RedisUnavailableError(
                    f"Redis at {self._shown} is taking no writes: it refused {where} with "
                    f"{type(reply).__name__}: {str(reply).rstrip('.')}. The {confirmed} before "
                    "it are confirmed; free memory or point the URL at the primary, and the "
                    "relay retries on a later pass.",
                    published=confirmed,
                )
            raise PublishError(
                f"Redis refused {where}: {reply}. The {confirmed} before it are confirmed; check "
                "that the key is a stream and that the URL's user may write to it.",
                published=confirmed,
            )

    def close(self) -> None:
        """Disconnect the client this publisher built; a client passed in stays open."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            client.close()

    def _connection(self) -> redis.Redis:
        if self._client is None:
            kwargs: dict[str, Any] = dict(self._ssl_options)
            self._client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.socket_timeout,
                # The relay retries on its next pass; see the module docs.
                retry=Retry(NoBackoff(), 0),
                **kwargs,
            )
        return self._client

    def _drop_connections(self) -> None:
        # The failing connection is already discarded by redis-py; the idle ones in the pool
        # point at the same dead server, so drop them too rather than fail on each in turn.
        if self._client is not None and self._owns_client:
            self._client.connection_pool.disconnect()


def from_url(url: str) -> RedisStreamsPublisher:
    """Build a :class:`RedisStreamsPublisher` from a ``redis://`` or ``rediss://`` URL.

    Query options (each at most once):

    ``stream``
        Stream name pattern, ``{queue}`` replaced by the queue (URL-encode the braces as
        ``%7Bqueue%7D`` if your shell or tooling mangles them). Default ``{queue}``.
    ``maxlen``
        Positive integer: trim each stream to about that many entries. Default: never trim.
    ``socket_timeout``
        Seconds (positive) for connecting and for each reply. Default 5.
    ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
        ``rediss://`` only: passed to redis-py (``ssl_cert_reqs`` is ``none``, ``optional`` or
        ``required``).

    Anything else raises :class:`PublisherError` naming the option, so a misspelt ``maxln``
    is not silently ignored.
    """
    _require_client()
    parts, shown = split_publisher_url(
        url, label=_LABEL, example="redis://host:6379/0?stream={queue}"
    )
    check_scheme(parts, _SCHEMES, label=_LABEL, shown=shown)
    options = query_options(parts.query, label=_LABEL, shown=shown)
    known = _OPTIONS + (_TLS_OPTIONS if parts.scheme.lower() == "rediss" else ())
    for name in options:
        if name in _TLS_OPTIONS and name not in known:
            raise PublisherError(
                f"Redis publisher URL {shown!r} sets {name!r}, a TLS option, on a plain "
                "redis:// URL; use rediss:// for TLS, or drop the option."
            )
        if name not in known:
            raise unknown_option(_LABEL, shown, name, known)
    ssl_options = {name: options[name] for name in _TLS_OPTIONS if name in options}
    cert_reqs = ssl_options.get("ssl_cert_reqs")
    if cert_reqs is not None and cert_reqs not in _CERT_REQS:
        raise PublisherError(
            f"Redis publisher URL {shown!r} has ssl_cert_reqs={cert_reqs!r}; use one of "
            f"{', '.join(_CERT_REQS)}."
        )
    server_url = urlunsplit(parts._replace(query="", fragment=""))
    return RedisStreamsPublisher(
        server_url,
        stream=options.get("stream", QUEUE_PLACEHOLDER),
        maxlen=_parse_int("maxlen", options.get("maxlen"), shown),
        socket_timeout=parse_seconds(
            "socket_timeout",
            options.get("socket_timeout"),
            default=DEFAULT_SOCKET_TIMEOUT,
            label=_LABEL,
            shown=shown,
        ),
        ssl_options=ssl_options,
    )


def _parse_int(name: str, text: str | None, shown: str) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise PublisherError(
            f"Redis publisher URL {shown!r} has {name}={text!r}, which is not a whole number; "
            f"use e.g. {name}=100000, or leave it out."
        ) from None


def _check_stream(stream: object) -> str:
    if not isinstance(stream, str) or not stream:
        raise PublisherError(
            f"stream must be a non-empty stream name pattern, got {stream!r}; use e.g. "
            "stream=outbox:{queue}, or leave it out for {queue}."
        )
    rest = stream.replace(QUEUE_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise PublisherError(
            f"stream pattern {stream!r} has braces other than {{queue}}, the only placeholder; "
            "use e.g. stream=outbox:{queue}."
        )
    return stream


def _check_maxlen(maxlen: object) -> int | None:
    if maxlen is None:
        return None
    if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen <= 0:
        raise PublisherError(
            f"maxlen must be a positive whole number of entries, got {maxlen!r}; use e.g. "
            "maxlen=100000, or leave it out to never trim."
        )
    return maxlen


def _check_server_url(url: str) -> None:
    parts, shown = split_url(
        url, label="Redis URL", example="redis://host:6379/0", schemes=_SCHEMES
    )
    if not parts.hostname:
        raise PublisherError(f"Redis URL {shown!r} names no host; use redis://host:6379/0.")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise PublisherError(
            f"Redis URL {shown!r} has database {db!r}, which is not a number; use e.g. "
            "redis://host:6379/0."
        )
