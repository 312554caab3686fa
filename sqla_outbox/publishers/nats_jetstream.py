"""NATS JetStream publisher: one message per outbox row, acknowledged by the stream, deduplicated.

``--publisher 'nats://host:4222?subject_prefix=jobs.&timeout=5'``

What it guarantees
    A message counts as published only once JetStream has answered it with a ``PubAck``, which
    the server sends after the stream stored it. Each message carries the header
    ``Nats-Msg-Id: <idempotency_key>``, so JetStream drops a second copy that arrives within the
    stream's *duplicate window* (2 minutes unless the stream says otherwise) and acks it as a
    duplicate: a relay that crashes between publish and mark, and re-publishes after the claim
    lease, leaves exactly one stream entry. :meth:`NatsJetStreamPublisher.publish_batch`
    pipelines a pass (every message sent, then the acks awaited in order) and reports the acked
    prefix with ``PublishError(published=k)``.

What it writes
    Subject: the queue name, behind ``subject_prefix`` if one is set (``jobs.`` + ``emails``).
    Payload: the message's ``input`` as UTF-8 JSON, nothing else, so a consumer decodes the job's
    arguments directly. Everything else travels in headers (absent when ``None``):
    ``Content-Type: application/json``, and each field as ``Outbox-`` and its words capitalised
    (``Outbox-Id``, ``Outbox-Job``, ``Outbox-Queue``, ``Outbox-Max-Attempts``, ``Outbox-Run-At``
    and ``Outbox-Staged-At`` in ISO 8601, ``Outbox-Tenant-Id``, ``Outbox-Enqueued-By``), but for
    two with names of their own: ``Nats-Msg-Id`` (the idempotency key) and the W3C
    ``traceparent``. ``ordering_key`` is not sent.

What it does not do
    It never creates or changes streams: the stream, its subjects, retention, replicas and
    duplicate window are the operator's decisions. A subject that no stream covers fails with a
    sentence naming the subject and asking for a stream that covers it (JetStream itself only
    says "no responders"). It does not replace the consumer's own deduplication: a re-publish
    *after* the duplicate window is stored again, so a consumer still checks ``Nats-Msg-Id``.

Failure behaviour
    nats-py is asyncio-only and the relay is threaded, so each publisher runs a private event
    loop in a daemon thread it owns (started on first publish, stopped and joined by
    :meth:`~NatsJetStreamPublisher.close`) and hands it coroutines. The connection is made once
    and nats-py reconnects by itself after a server restart, without limit. While it is
    disconnected a publish fails at once, and a publish whose acks do not come back fails after
    ``timeout`` seconds, so an outage never hangs the relay: it records the failure and retries
    on a later pass, and the re-publish of anything that did get stored is deduplicated.

Outage or message failure (:mod:`sqla_outbox.publishers.outages`)
    :class:`NatsUnavailableError`, an outage: the server cannot be reached or refuses the
    connection (credentials included), the client is disconnected and reconnecting, the
    connection is closed, stale or its buffer full, acks did not come back within ``timeout``,
    or JetStream answers that it is unavailable as a whole (``10008`` temporarily unavailable,
    ``10023`` insufficient resources, ``10039``/``10076`` not enabled). ``published`` is the
    acked prefix. Every other refusal is a message failure, :class:`~sqla_outbox.PublishError`:
    no stream covers the subject ("no responders"), a stream limit refuses it (``10077``
    ``maximum messages exceeded`` with ``discard: new``, ``10054`` larger than
    ``max_msg_size``), another stream than ``stream`` covers it, or the subject, a header or the
    payload size is one NATS cannot carry.

The trap
    The duplicate window must be longer than the relay's ``claim_lease`` plus the time a
    re-publish can take; a window shorter than the lease lets a crashed relay's rows come back
    as second entries. And pipelining has one cost: if JetStream refuses message *k* for a reason
    of its own (*k* is larger than the stream's ``max_msg_size``) while accepting *k+1*,
    *k+1* is stored before *k*. The relay still stops at *k* and retries it; only the order
    across that refusal is lost. Keep stream limits (``max_msg_size``, ``max_msgs`` with
    ``discard: new``) above what the outbox sends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import math
import re
import ssl
import threading
from collections.abc import Coroutine, Sequence
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import urlunsplit

from sqla_outbox.errors import BrokerUnavailableError, PublisherError, PublishError
from sqla_outbox.logs import log_event
from sqla_outbox.message import OutboxMessage, compact_json, spelled, wire_fields
from sqla_outbox.publishers.urls import (
    hide_password,
    parse_seconds,
    positive_seconds,
    query_options,
    require_client,
    split_publisher_url,
    split_url,
)

try:
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.js.api import PubAck
except ImportError:  # pragma: no cover - exercised only without the extra
    _CLIENT_INSTALLED = False
else:
    _CLIENT_INSTALLED = True

__all__ = [
    "CARRIED_ELSEWHERE",
    "DEFAULT_TIMEOUT",
    "NatsJetStreamPublisher",
    "NatsUnavailableError",
    "from_url",
    "message_headers",
]

log = logging.getLogger("sqla_outbox.publishers.nats")

DEFAULT_TIMEOUT = 5.0
"""Seconds to connect, and seconds for a batch's acks, before a publish fails (``timeout``)."""

_OPTIONS = ("subject_prefix", "timeout", "stream")
_LABEL = "NATS publisher URL"
_RECONNECT_WAIT = 1  # seconds between nats-py's reconnect attempts
_PING_INTERVAL = 30  # seconds; two missed pings mark a half-open connection as dead
_T = TypeVar("_T")

# JetStream's err_codes for "JetStream itself cannot take anything now", as opposed to a refusal
# of one message or of its stream: 10008 system temporarily unavailable, 10023 insufficient
# resources, 10039 not enabled for the account, 10076 not enabled. A full stream (10077 with
# discard: new) also answers 503, but only that stream's messages are refused.
_JETSTREAM_UNAVAILABLE = frozenset({10008, 10023, 10039, 10076})


def _require_client() -> None:
    require_client(_CLIENT_INSTALLED, "The NATS JetStream publisher", "nats")


CARRIED_ELSEWHERE = MappingProxyType(
    {
        "input": "the payload",
        # A stream keeps one order and has no partition key to route by, and an ordering key
        # travels where the broker has a use for it (docs/brokers/writing.md).
        "ordering_key": "not sent",
    }
)
"""The fields that travel outside the headers, and where; every other field is a header."""

# Names of their own: JetStream deduplicates on Nats-Msg-Id, and OpenTelemetry's propagators
# read the W3C header under its own name.
_OWN_NAMES = {"idempotency_key": "Nats-Msg-Id", "traceparent": "traceparent"}


def _header_name(field: str) -> str:
    """``Outbox-`` and the field's words capitalised (``Outbox-Tenant-Id``), or its own name."""
    return _OWN_NAMES.get(field) or "Outbox-" + "-".join(
        word.capitalize() for word in field.split("_")
    )


WIRE_FIELDS = wire_fields(_header_name, text=True, elsewhere=CARRIED_ELSEWHERE)


def message_headers(message: OutboxMessage) -> dict[str, str]:
    """The NATS headers sent with ``message`` (see the module docs); ``None`` values left out."""
    headers: dict[str, str] = spelled(message, WIRE_FIELDS)
    headers["Content-Type"] = "application/json"
    return headers


class NatsUnavailableError(BrokerUnavailableError):
    """NATS or JetStream cannot take any message now: an outage, not a message failure.

    Unreachable, disconnected, acks that did not come back within ``timeout``, or JetStream
    unavailable as a whole; see the module docs. ``published`` is the acked prefix.
    """


class _NotConnectedError(ConnectionError):
    """The client exists but is between connections (nats-py is reconnecting)."""


class NatsJetStreamPublisher:
    """Publishes each message to JetStream with ``Nats-Msg-Id`` and waits for the stream's ack.

    :param url: ``nats://[user:password@]host[:port]`` or ``tls://...``. Query options are not
        read here; :func:`from_url` parses them into the arguments below. A client connected to
        one server of a cluster learns the others from it and fails over to them.
    :param subject_prefix: put before the queue name to make the subject; must end with ``.``
        (``"jobs."`` sends queue ``emails`` to ``jobs.emails``). Empty by default.
    :param timeout: seconds allowed to connect, and for a batch's acks to come back.
    :param stream: if set, the stream every message must land in (``Nats-Expected-Stream``):
        JetStream refuses a message whose subject belongs to another stream.
    :param tls: an ``ssl.SSLContext`` for a server with a private CA or client certificates;
        ``tls://`` alone uses the system trust store.
    """

    overlap = True
    """Relays claim ahead while this publisher works (:mod:`sqla_outbox.overlap`): with this
    broker it pays, its confirmations leaving the database idle otherwise; the ``brokers``
    benchmark's "overlap flipped" row checks this default."""

    def __init__(
        self,
        url: str = "nats://localhost:4222",
        *,
        subject_prefix: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        stream: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        _require_client()
        self.url = _check_server_url(url)
        self.subject_prefix = _check_prefix(subject_prefix)
        self.timeout = positive_seconds("timeout", timeout, default=DEFAULT_TIMEOUT)
        self.stream = _check_stream(stream)
        self._tls = tls
        self._shown = hide_password(url)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched only on the publisher's own event loop.
        self._nc: NatsClient | None = None
        self._inbox = ""
        self._tokens = itertools.count()
        self._acks: dict[str, asyncio.Future[PubAck]] = {}

    def __repr__(self) -> str:
        return f"<NatsJetStreamPublisher to {self._shown} prefix={self.subject_prefix!r}>"

    def subject_for(self, message: OutboxMessage) -> str:
        """The subject ``message`` is published on: the prefix, then its queue."""
        return f"{self.subject_prefix}{message.queue}"

    def publish(self, message: OutboxMessage) -> None:
        """Publish one message; return once JetStream has stored it (or had it already)."""
        self.publish_batch([message])

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        """Publish ``messages`` pipelined, in order; raise ``PublishError`` unless all are acked.

        ``published`` on the error is the length of the acked prefix. Messages after the first
        failure may have been stored too; their re-publish is deduplicated by ``Nats-Msg-Id``.
        """
        if not messages:
            return
        with self._lock:
            try:
                confirmed, failure = self._run(self._publish_all(list(messages)))
            except Exception as error:  # not connected, connect failed, backstop timeout
                confirmed, failure = 0, error
        if failure is not None:
            kind = NatsUnavailableError if _unavailable(failure) else PublishError
            raise kind(
                self._explain(messages[confirmed], failure, confirmed), published=confirmed
            ) from failure

    def close(self) -> None:
        """Close the connection, stop the event loop and join its thread.

        Idempotent. A later publish starts a fresh loop and connection, so a relay can be stopped
        and started again with the same publisher.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            if loop is None or thread is None:
                return
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            try:
                future.result(timeout=self.timeout + 5)
            except Exception as error:  # closing must not raise: the relay is stopping anyway
                log_event(log, logging.WARNING, "nats.close_failed", error=repr(error))
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    # -- the event loop thread ---------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        future = asyncio.run_coroutine_threadsafe(coro, self._event_loop())
        # The coroutine bounds itself (connect, then acks); this is only the backstop.
        try:
            return future.result(timeout=2 * self.timeout + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name=f"sqla-outbox-nats-{id(self):x}", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    async def _connected(self) -> NatsClient:
        nc = self._nc
        if nc is not None and nc.is_closed:
            self._nc = None  # closed for good (by an error); start over
            nc = None
        if nc is None:
            nc = NatsClient()
            options: dict[str, Any] = {"tls": self._tls} if self._tls is not None else {}
            try:
                await asyncio.wait_for(
                    nc.connect(
                        servers=[self.url],
                        name="sqla-outbox-relay",
                        connect_timeout=max(1, math.ceil(self.timeout)),
                        reconnect_time_wait=_RECONNECT_WAIT,
                        max_reconnect_attempts=-1,
                        ping_interval=_PING_INTERVAL,
                        error_cb=self._on_error,
                        disconnected_cb=self._on_disconnected,
                        reconnected_cb=self._on_reconnected,
                        **options,
                    ),
                    self.timeout,
                )
                # One wildcard subscription receives every ack; nats-py renews it on reconnect.
                self._inbox = nc.new_inbox()
                await nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)
            except BaseException as error:
                last = nc.last_error
                await _close_quietly(nc, self.timeout)
                if isinstance(error, (asyncio.TimeoutError, TimeoutError)) and last is not None:
                    raise ConnectionError(f"{type(last).__name__}: {last}") from error
                raise
            self._nc = nc
        if not nc.is_connected:
            raise _NotConnectedError
        return nc

    async def _publish_all(self, messages: list[OutboxMessage]) -> tuple[int, BaseException | None]:
        # What JetStreamContext.publish_async does, with our own ack handling: in nats-py 2.16 a
        # JetStream error reply leaves publish_async's future pending forever
        # (nats-io/nats.py#985), which would turn every refusal into a timeout. Messages are
        # sent one after another on one connection, so the stream receives them in order.
        nc = await self._connected()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        acks: list[tuple[str, asyncio.Future[PubAck]]] = []
        send_error: BaseException | None = None
        for message in messages:
            reply = f"{self._inbox}.{next(self._tokens)}"
            try:
                subject = self._checked_subject(message)
                headers = message_headers(message)
                if self.stream is not None:
                    headers["Nats-Expected-Stream"] = self.stream
                _check_header_values(headers)
                payload = compact_json(message.input)
                future: asyncio.Future[PubAck] = loop.create_future()
                self._acks[reply] = future
                acks.append((reply, future))
                await nc.publish(subject, payload.encode(), reply=reply, headers=headers)
            except Exception as error:
                # Nothing after an unsendable message is sent, so it cannot overtake it.
                if acks and acks[-1][0] == reply:
                    acks.pop()
                    self._acks.pop(reply, None)
                send_error = error
                break
        confirmed = 0
        try:
            for _reply, future in acks:
                try:
                    await asyncio.wait_for(future, max(deadline - loop.time(), 0))
                except Exception as error:  # a timeout, or JetStream's refusal
                    return confirmed, error
                confirmed += 1
        finally:
            for reply, future in acks[confirmed:]:
                self._acks.pop(reply, None)  # a late ack for it is ignored
                future.cancel()
        return confirmed, send_error

    async def _on_ack(self, msg: Msg) -> None:
        future = self._acks.pop(msg.subject, None)
        if future is None or future.done():
            return
        try:
            future.set_result(_parse_ack(msg))
        except Exception as error:
            future.set_exception(error)

    async def _shutdown(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            await _close_quietly(nc, self.timeout)
        current = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()

    # -- callbacks from nats-py, on the loop -------------------------------------------------

    # ``self._nc`` is set only once a connection is made and cleared before closing it, so
    # these stay quiet about a first connect that fails (the publish error says it) and about
    # our own close.

    async def _on_error(self, error: Exception) -> None:
        nc = self._nc
        if nc is None or nc.is_reconnecting:
            return  # one line per refused reconnect attempt would drown the log
        log_event(log, logging.WARNING, "nats.error", url=self._shown, error=repr(error))

    async def _on_disconnected(self) -> None:
        if self._nc is not None:
            log_event(log, logging.WARNING, "nats.disconnected", url=self._shown)

    async def _on_reconnected(self) -> None:
        log_event(log, logging.INFO, "nats.reconnected", url=self._shown)

    # -- messages ----------------------------------------------------------------------------

    def _checked_subject(self, message: OutboxMessage) -> str:
        subject = self.subject_for(message)
        if not _valid_subject(subject):
            raise _BadSubjectError(subject)
        return subject

    def _explain(  # noqa: PLR0911 - one sentence per kind of failure, each returned as is
        self, message: OutboxMessage, error: BaseException, confirmed: int
    ) -> str:
        where = f"message {message.id} (job {message.job!r})"
        subject = self.subject_for(message)
        after = f" The {confirmed} before it are confirmed." if confirmed else ""
        if isinstance(error, _BadSubjectError):
            return (
                f"Queue {message.queue!r} of {where} makes subject {subject!r}, which is not a "
                "valid NATS subject (no spaces, no '*' or '>', no empty tokens); rename the "
                f"queue.{after}"
            )
        if isinstance(error, _BadHeaderError):
            return (
                f"Header {error.args[0]!r} of {where} contains a line break, which NATS headers "
                f"cannot carry; fix the value at enqueue.{after}"
            )
        if isinstance(error, nats.js.errors.NoStreamResponseError):
            covering = f"{self.subject_prefix}>" if self.subject_prefix else subject
            return (
                f"No JetStream stream covers subject {subject!r} (JetStream answered 'no "
                "responders'): create a stream whose subjects include it, e.g. nats stream add "
                f"OUTBOX --subjects '{covering}'.{after}"
            )
        if isinstance(error, nats.js.errors.APIError) and _unavailable(error):
            return (
                f"JetStream at {self._shown} is unavailable and took no message ({error}); "
                f"the relay retries on a later pass.{after}"
            )
        if isinstance(error, nats.js.errors.APIError):
            return f"JetStream refused {where} on subject {subject!r}: {error}.{after}"
        if isinstance(error, _NotConnectedError):
            return (
                f"NATS at {self._shown} is disconnected and the client is reconnecting in the "
                "background; the relay retries on a later pass."
            )
        if isinstance(error, (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)):
            return (
                f"JetStream did not acknowledge {where} on subject {subject!r} within "
                f"{self.timeout:g} s; it may or may not be stored, and its re-publish is "
                f"deduplicated by Nats-Msg-Id.{after}"
            )
        if isinstance(error, (OSError, nats.errors.Error)):
            return (
                f"Could not publish to NATS at {self._shown}: {type(error).__name__}: "
                f"{error}; the relay retries on a later pass.{after}"
            )
        return f"Publishing {where} to {subject!r} failed: {type(error).__name__}: {error}.{after}"


class _BadSubjectError(ValueError):
    pass


class _BadHeaderError(ValueError):
    pass


def _unavailable(error: BaseException) -> bool:
    """Whether ``error`` means no message could be published now (see the module docs)."""
    if isinstance(error, (_BadSubjectError, _BadHeaderError)):
        return False
    if isinstance(error, nats.js.errors.APIError):
        return error.err_code in _JETSTREAM_UNAVAILABLE
    if isinstance(error, nats.js.errors.Error):  # no responders: no stream for this subject
        return False
    if isinstance(
        error,
        (nats.errors.MaxPayloadError, nats.errors.BadSubjectError, nats.errors.BadHeaderError),
    ):
        return False
    # What is left is the connection's: nats-py's own errors (closed, stale, no servers, refused
    # credentials, a full outbound buffer, its timeouts), socket errors and our ack deadline.
    return isinstance(
        error,
        (
            nats.errors.Error,
            OSError,
            TimeoutError,
            asyncio.TimeoutError,
            concurrent.futures.TimeoutError,
        ),
    )


def _parse_ack(msg: Msg) -> PubAck:
    """JetStream's reply to one publish: its ack, or the error it stands for (raised)."""
    if (msg.headers or {}).get("Status") == "503":
        raise nats.js.errors.NoStreamResponseError
    response = json.loads(msg.data)
    if "error" in response:
        raise _api_error(response["error"])
    return PubAck.from_response(response)


def _api_error(error: dict[str, Any]) -> Exception:
    # nats-py's from_error raises the error rather than returning it; accept either.
    try:
        made = nats.js.errors.APIError.from_error(error)
    except nats.js.errors.APIError as raised:
        return raised
    return made if isinstance(made, Exception) else nats.js.errors.APIError(**error)


def _check_header_values(headers: dict[str, str]) -> None:
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            raise _BadHeaderError(name)


async def _close_quietly(nc: NatsClient, timeout: float) -> None:
    try:
        await asyncio.wait_for(nc.close(), timeout)
    except Exception as error:
        log_event(log, logging.DEBUG, "nats.close_failed", error=repr(error))


_TOKEN = re.compile(r"[^\s.*>]+")


def _valid_subject(subject: str) -> bool:
    return all(_TOKEN.fullmatch(token) for token in subject.split("."))


def from_url(url: str) -> NatsJetStreamPublisher:
    """Build a :class:`NatsJetStreamPublisher` from a ``nats://`` or ``tls://`` URL.

    Query options (each at most once):

    ``subject_prefix``
        Put before the queue name to form the subject; must end with ``.``. Default: none, the
        subject is the queue name.
    ``timeout``
        Seconds (positive) to connect and to wait for a batch's acks. Default 5.
    ``stream``
        Name of the stream the messages must land in (sent as ``Nats-Expected-Stream``).
        Default: whichever stream covers the subject.

    Anything else raises :class:`PublisherError` naming the option.
    """
    _require_client()
    parts, shown = split_publisher_url(
        url,
        label=_LABEL,
        example="nats://host:4222?subject_prefix=jobs",  # the full stop ends the prefix too
    )
    options = query_options(parts.query, label=_LABEL, shown=shown, known=_OPTIONS)
    return NatsJetStreamPublisher(
        urlunsplit(parts._replace(query="", fragment="")),
        subject_prefix=options.get("subject_prefix", ""),
        timeout=parse_seconds(
            "timeout", options.get("timeout"), default=DEFAULT_TIMEOUT, label=_LABEL, shown=shown
        ),
        stream=options.get("stream") or None,
    )


def _check_server_url(url: object) -> str:
    if not isinstance(url, str):
        raise PublisherError(f"A NATS server URL must be a string, got {url!r}.")
    parts, shown = split_url(
        url, label="NATS URL", example="nats://host:4222", schemes=("nats", "tls")
    )
    if not parts.hostname:
        raise PublisherError(f"NATS URL {shown!r} names no host; use nats://host:4222.")
    if parts.path.strip("/"):
        raise PublisherError(
            f"NATS URL {shown!r} has a path {parts.path!r}, which NATS does not use; put the "
            "subject prefix in ?subject_prefix= instead."
        )
    return url


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise PublisherError(f"subject_prefix must be a string, got {prefix!r}.")
    if prefix and (not prefix.endswith(".") or not _valid_subject(prefix[:-1])):
        raise PublisherError(
            f"subject_prefix must be dot-separated subject tokens ending with '.', got "
            f"{prefix!r}; use e.g. subject_prefix=jobs. so queue 'emails' goes to 'jobs.emails'."
        )
    return prefix


def _check_stream(stream: object) -> str | None:
    if stream is None:
        return None
    if not isinstance(stream, str) or not re.fullmatch(r"[^\s.*>/\\]+", stream):
        raise PublisherError(
            f"stream must be a JetStream stream name (no spaces, '.', '*', '>', slashes), got "
            f"{stream!r}; use e.g. stream=OUTBOX, or leave it out."
        )
    return stream
