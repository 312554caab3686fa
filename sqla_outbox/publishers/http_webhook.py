"""HTTP webhook publisher: each message POSTed as JSON to one endpoint, delivered on a 2xx.

``sqla-outbox relay --publisher 'https://jobs.example.com/hooks/outbox?timeout=5'`` builds a
:class:`WebhookPublisher` through :func:`from_url`; the URL, minus the options below, is the
endpoint. Requests are made with httpx's synchronous client, one POST per message, in order.

What the endpoint receives
    ``POST`` with the whole message as a UTF-8 JSON object,
    :meth:`~sqla_outbox.OutboxMessage.to_dict` (``id``, ``job``, ``queue``, ``input``,
    ``idempotency_key``, ``max_attempts``, ``run_at``, ``staged_at``, ``tenant_id``,
    ``traceparent``, ``enqueued_by``, ``ordering_key``), and the headers
    ``Content-Type: application/json``, ``Idempotency-Key`` (the message's idempotency key),
    ``traceparent`` (W3C trace context, when the message has one),
    ``User-Agent: sqla-outbox/<version>``, ``X-Outbox-Id`` and ``X-Outbox-Job``; with a secret
    configured also ``X-Outbox-Timestamp`` and
    ``X-Outbox-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>``; with
    ``authorization_env`` also ``Authorization``.

What it guarantees
    A message counts as published only when the endpoint answered 2xx. Anything else (a 500, a
    404, a redirect, which is not followed) raises :class:`WebhookError` with the status and the
    start of the response body, which the relay records in the row's ``last_error``; the pass
    stops there, so no later message overtakes it, and the next pass sends it again.

Outage or message failure (:mod:`sqla_outbox.publishers.outages`)
    :class:`WebhookUnavailableError` (a :class:`WebhookError` too), an outage, when the endpoint
    cannot take any message now: no answer (connection refused, DNS, TLS, a proxy failing, a
    connect, read or write timeout, the connection dropped before the answer) or one of the
    answers that speak for the service rather than the message: ``408 Request Timeout``, ``429
    Too Many Requests``, ``502 Bad Gateway``, ``503 Service Unavailable``, ``504 Gateway
    Timeout``. Every other answer is a message failure, :class:`WebhookError`: a 4xx (the
    endpoint refused *this* request), a redirect, and the other 5xx, ``500`` included. A 500 is
    what a receiver's own bug answers, most often one this payload triggers; had every 500 been
    an outage, one message that crashes the receiver would stop the relay for good instead of
    being retried and dead-lettered. A receiver that is up but cannot process anything (its
    database is down) should answer 503, ideally with ``Retry-After``, so the relay backs off
    without charging the message.

What it does not do
    No batching and no retries inside a pass: the relay's next pass is the retry. No
    deduplication: an endpoint that took a message but whose answer was lost (a read timeout,
    a relay killed before marking) gets it again with the same ``Idempotency-Key``, so the
    endpoint must deduplicate on that header (or on ``idempotency_key`` in the body).

The traps
    * A 4xx is a message failure like a 500: the relay retries it with backoff and dead-letters
      it after ``max_publish_attempts``, and while it waits it holds up the messages behind it
      in its transaction and ordering key. The status in ``last_error`` says which side to fix.
    * A timeout is an outage, so an endpoint that hangs on one particular message (rather than
      answering 500) holds up the relay without charging that message; set ``timeout`` above
      the endpoint's slowest honest answer and have it answer rather than hang.
    * Secrets do not go in the URL: URLs end up in logs, process lists and shell history. The
      HMAC secret and the ``Authorization`` value are read from environment variables *named* by
      the URL (``?hmac_secret_env=OUTBOX_WEBHOOK_SECRET``), or passed to the constructor.
    * The option names below are reserved: a query parameter of the endpoint's own with one of
      these names cannot be passed through the URL. Every other query parameter is kept, as
      written, in the URL that is POSTed to.
    * httpx's timeouts bound each network operation (connect, each read, each write), not the
      whole request; a server trickling its answer can take longer than ``timeout`` in total.

Options (URL query parameters, removed from the endpoint URL)
    ``timeout``
        Seconds for each read and write, default 10.
    ``connect_timeout``
        Seconds to establish the connection, default: the same as ``timeout``.
    ``hmac_secret_env``
        Name of the environment variable holding the HMAC secret; turns signing on.
    ``authorization_env``
        Name of the environment variable whose value is sent as the ``Authorization`` header
        (e.g. ``Bearer <token>``).
    ``ca_file``
        PEM file of certificate authorities to verify an ``https`` endpoint against, instead of
        the system's.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import os
import ssl
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sqla_outbox.errors import BrokerError, BrokerUnavailableError, PublisherError
from sqla_outbox.message import OutboxMessage, compact_json, spelled, wire_fields
from sqla_outbox.publishers.urls import (
    hide_password,
    positive_seconds,
    require_client,
    split_options,
    split_url,
)

try:
    import httpx
except ImportError:  # pragma: no cover - exercised only without the extra installed
    httpx = None  # type: ignore[assignment]

__all__ = [
    "CARRIED_ELSEWHERE",
    "DEFAULT_TIMEOUT",
    "OPTIONS",
    "OUTAGE_STATUSES",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WebhookError",
    "WebhookPublisher",
    "WebhookUnavailableError",
    "from_url",
    "message_headers",
    "signature",
]

DEFAULT_TIMEOUT = 10.0
"""Seconds for connecting and for each read and write, unless the URL says otherwise."""

SIGNATURE_HEADER = "X-Outbox-Signature"
"""``sha256=<hex>``: HMAC-SHA256 of ``timestamp + "." + body`` under the shared secret."""

TIMESTAMP_HEADER = "X-Outbox-Timestamp"
"""Unix seconds at signing; signed with the body so a receiver can refuse old replays."""

OPTIONS = frozenset(
    {"timeout", "connect_timeout", "hmac_secret_env", "authorization_env", "ca_file"}
)
"""The query parameters this module reads and strips from the endpoint URL."""

OUTAGE_STATUSES = frozenset({408, 429, 502, 503, 504})
"""HTTP statuses that mean "not now" for every message, not "not this one": an outage.

408 (the server gave up waiting for the request) and 504 (a gateway gave up waiting for the
endpoint) are timeouts; 429 is a rate limit, which slowing down fixes and charging the message
does not; 502 and 503 are a proxy with no healthy endpoint behind it, or an endpoint that says it
is down or deploying.
"""

_SNIPPET = 200  # characters of a failed response's body kept in the error
_MAX_ERROR_URL = 200

CARRIED_ELSEWHERE: Mapping[str, str] = MappingProxyType({})
"""None: the body is the whole message, :meth:`~sqla_outbox.OutboxMessage.to_dict` as JSON."""

# Four fields are also headers, so an endpoint can deduplicate, route and trace a request before
# it parses the body: ``X-Outbox-`` and the field's words capitalised, but for the two with
# names of their own, the Idempotency-Key header (IETF draft) and the W3C traceparent.
_HEADER_FIELDS = frozenset({"id", "job", "idempotency_key", "traceparent"})
_OWN_NAMES = {"idempotency_key": "Idempotency-Key", "traceparent": "traceparent"}


def _header_name(field: str) -> str:
    words = (word.capitalize() for word in field.split("_"))
    return _OWN_NAMES.get(field) or "X-Outbox-" + "-".join(words)


WIRE_FIELDS = wire_fields(
    _header_name, text=True, elsewhere=set(OutboxMessage._fields) - _HEADER_FIELDS
)


def message_headers(message: OutboxMessage) -> dict[str, str]:
    """The headers that describe ``message`` (see the module docs), before any signature."""
    headers: dict[str, str] = spelled(message, WIRE_FIELDS)
    headers["Content-Type"] = "application/json"
    return headers


# Headers this module sets itself; a caller's ``headers`` may not replace them, since each one
# carries a guarantee (the dedup key, the trace, the signature over exactly this body).
_OWN_HEADERS = frozenset(
    {
        "content-type",
        *(name.lower() for name, *_ in WIRE_FIELDS),
        SIGNATURE_HEADER.lower(),
        TIMESTAMP_HEADER.lower(),
    }
)


def _version() -> str:
    try:
        return importlib.metadata.version("sqla-outbox")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


USER_AGENT = f"sqla-outbox/{_version()}"
"""The default ``User-Agent``; a caller's ``headers={"User-Agent": ...}`` replaces it."""


class WebhookError(BrokerError):
    """The endpoint did not take a message: a non-2xx answer, or no answer at all.

    ``status_code`` is the HTTP status, or ``None`` when the request failed before an answer
    (connection refused, timeout). The relay records the message in the row's ``last_error``.
    """

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class WebhookUnavailableError(WebhookError, BrokerUnavailableError):
    """The endpoint cannot take any message now: an outage, not a message failure.

    No answer at all (``status_code`` is ``None``: refused, timed out, dropped), or one of
    :data:`OUTAGE_STATUSES`. Still a :class:`WebhookError`, so code catching that catches this.
    """


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Outbox-Signature`` value for ``body`` sent at ``timestamp`` (Unix seconds).

    Public so a receiver written in Python can verify with the same function:
    ``hmac.compare_digest(signature(secret, ts, body), request.headers["X-Outbox-Signature"])``.
    """
    digest = hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def from_url(url: str) -> WebhookPublisher:
    """The publisher for an ``http://`` or ``https://`` endpoint URL (the CLI's ``--publisher``).

    Nothing connects yet. Raises :class:`~sqla_outbox.PublisherError` for a malformed URL, a bad
    option, an environment variable that is named but not set, or httpx not being installed.
    """
    return WebhookPublisher(url)


class WebhookPublisher:
    """POSTs each message to one endpoint and returns once it answered 2xx.

    :param url: the endpoint, ``http(s)://host[:port]/path[?query]``, optionally with the options
        listed in the module docs in its query (they are removed before POSTing).
    :param timeout: seconds for each read and write; overrides the URL's ``timeout``.
    :param connect_timeout: seconds to connect; overrides the URL's ``connect_timeout``.
    :param hmac_secret: the signing secret itself; overrides ``hmac_secret_env``.
    :param authorization: the ``Authorization`` header value; overrides ``authorization_env``.
    :param ca_file: PEM file of CAs for ``https``; overrides the URL's ``ca_file``.
    :param headers: more headers to send with every request (``User-Agent`` may be replaced;
        the headers this publisher sets itself may not).

    Everything is validated here, so a typo fails at start-up rather than on the first message.
    """

    overlap = True
    """Relays claim ahead while this publisher works (:mod:`sqla_outbox.overlap`): with this
    broker it pays, the database being idle while the broker works; the ``brokers`` benchmark's
    "overlap flipped" row checks this default."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        hmac_secret: str | bytes | None = None,
        authorization: str | None = None,
        ca_file: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        require_client(httpx is not None, "The HTTP webhook publisher", "http")
        options, endpoint = _split_url(url)
        self.url = hide_password(endpoint, limit=_MAX_ERROR_URL)
        """The endpoint (options removed, password hidden), for logs and errors."""
        shown = hide_password(url, limit=_MAX_ERROR_URL)
        self.timeout = _seconds(
            "timeout", options.get("timeout") if timeout is None else timeout, shown
        )
        self.connect_timeout = _seconds(
            "connect_timeout",
            options.get("connect_timeout") if connect_timeout is None else connect_timeout,
            shown,
            default=self.timeout,
        )
        if hmac_secret is None and "hmac_secret_env" in options:
            hmac_secret = _from_env("hmac_secret_env", options["hmac_secret_env"], shown)
        self._secret = _secret(hmac_secret)
        if authorization is None and "authorization_env" in options:
            authorization = _from_env("authorization_env", options["authorization_env"], shown)
        self._verify = _verify(options.get("ca_file") if ca_file is None else ca_file, shown)
        self._endpoint = endpoint
        self._headers = {"User-Agent": USER_AGENT}
        if authorization is not None:
            self._headers["Authorization"] = authorization
        for name, value in (headers or {}).items():
            if name.lower() in _OWN_HEADERS:
                raise PublisherError(
                    f"headers may not set {name!r}: the webhook publisher sets it itself for "
                    "every message; remove it from headers."
                )
            self._headers[name] = value
        for name, value in self._headers.items():
            # Caught here rather than as a protocol error on every request of every pass.
            if not isinstance(value, str) or "\r" in value or "\n" in value:
                shown_value = "<hidden>" if name == "Authorization" else repr(value)
                raise PublisherError(
                    f"Header {name!r} must be a one-line string, got {shown_value}; remove the "
                    "line break (a trailing newline from a secrets file is the usual cause)."
                )
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        signed = " signed" if self._secret is not None else ""
        return f"<WebhookPublisher POST {self.url}{signed}>"

    def publish(self, message: OutboxMessage) -> None:
        """POST ``message``; return on a 2xx answer, raise :class:`WebhookError` otherwise."""
        body = compact_json(message.to_dict()).encode()
        headers = message_headers(message)
        if self._secret is not None:
            timestamp = str(int(time.time()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = signature(self._secret, timestamp, body)
        with self._lock:
            client = self._open_client()
            try:
                response = client.post(self._endpoint, content=body, headers=headers)
            except (httpx.LocalProtocolError, httpx.UnsupportedProtocol) as error:
                # The request itself could not be written (a header value httpx refuses): this
                # message's fault, and nothing reached the endpoint. The connection may be
                # mid-request, so it is dropped all the same.
                self._drop()
                raise WebhookError(
                    f"POST of message {message.id} (job {message.job!r}) to {self.url} could not "
                    f"be sent ({type(error).__name__}: {error}); fix the message at enqueue."
                ) from error
            except httpx.TransportError as error:
                # The pooled connection may be half-dead; start the next pass from a new pool.
                self._drop()
                raise WebhookUnavailableError(self._no_answer(message, error)) from error
        if not response.is_success:
            status = response.status_code
            failed = WebhookUnavailableError if status in OUTAGE_STATUSES else WebhookError
            raise failed(self._refused(message, response), status_code=status)

    def close(self) -> None:
        """Close the client and its pooled connections; the next publish opens a new one."""
        with self._lock:
            self._drop()

    def __enter__(self) -> WebhookPublisher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _open_client(self) -> Any:
        if self._client is None:
            self._client = httpx.Client(
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                verify=self._verify,
                # A POST redirected with 301/302 turns into a GET without the body in most
                # clients; a redirect is reported instead, so the URL gets fixed.
                follow_redirects=False,
            )
        return self._client

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _no_answer(self, message: OutboxMessage, error: Exception) -> str:
        if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
            outcome = "it was not delivered"
        else:
            outcome = "it may have arrived, so the endpoint must deduplicate on Idempotency-Key"
        return (
            f"POST of message {message.id} (job {message.job!r}) to {self.url} got no answer "
            f"({type(error).__name__}: {error}); {outcome}, and the next pass sends it again."
        )

    def _refused(self, message: OutboxMessage, response: Any) -> str:
        snippet = " ".join(response.text.split())[:_SNIPPET]
        status = f"{response.status_code} {response.reason_phrase}".strip()
        if response.is_redirect:
            fix = (
                f"redirects are not followed, so use the URL it points to "
                f"({response.headers.get('location')!r}) in the publisher URL"
            )
        elif response.status_code in OUTAGE_STATUSES:
            retry_after = response.headers.get("retry-after")
            asked = f" (Retry-After: {retry_after})" if retry_after else ""
            fix = f"the endpoint is not taking messages now{asked}, and the relay backs off"
        else:
            fix = "the next pass sends it again"
        return (
            f"Webhook {self.url} answered HTTP {status} to message {message.id} "
            f"(job {message.job!r}) with body {snippet!r}; {fix}."
        )


def _split_url(url: str) -> tuple[dict[str, str], str]:
    """This module's options, and the endpoint URL with exactly those removed."""
    if not isinstance(url, str):
        raise PublisherError(
            f"The webhook publisher needs an http:// or https:// URL string, got {url!r}."
        )
    parts, shown = split_url(
        url,
        label="Webhook URL",
        example="e.g. https://example.com/hooks/outbox?timeout=10",
        limit=_MAX_ERROR_URL,
    )
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise PublisherError(
            f"Webhook URL {shown!r} is not an http:// or https:// URL with a host; use e.g. "
            "https://example.com/hooks/outbox."
        )
    # The endpoint's own query parameters reach it byte for byte as the user wrote them.
    return split_options(parts, OPTIONS, label="Webhook URL", shown=shown)


def _seconds(name: str, value: object, shown: str, *, default: float = DEFAULT_TIMEOUT) -> float:
    if value is None:
        return default
    return positive_seconds(name, value, default=default, label="Webhook", shown=shown, coerce=True)


def _from_env(option: str, variable: str, shown: str) -> str:
    value = os.environ.get(variable, "")
    if not variable or not value:
        raise PublisherError(
            f"Webhook option {option}={variable!r} names an environment variable that is not "
            f"set or is empty (publisher {shown!r}); export it before starting the relay."
        )
    return value


def _secret(secret: str | bytes | None) -> bytes | None:
    if secret is None:
        return None
    raw = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(raw, bytes) or not raw:
        raise PublisherError(
            "hmac_secret must be a non-empty str or bytes; pass the shared secret, or omit it "
            "to send unsigned requests."
        )
    return raw


def _verify(ca_file: str | None, shown: str) -> ssl.SSLContext | bool:
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise PublisherError(
            f"Webhook option ca_file={ca_file!r} cannot be loaded ({error}) (publisher "
            f"{shown!r}); point it at a readable PEM file of CA certificates."
        ) from error
