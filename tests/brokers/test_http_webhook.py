"""What only the HTTP webhook publisher promises; ``test_conformance.py`` runs the rest.

The shared scenarios (what arrives and in what order, bad URLs, an endpoint that is down or
answers 422, an endpoint restarted under a running relay) run there through
``adapters/http_webhook.py``. This file pins the webhook's own behaviour: the request it makes,
signing, which statuses are outages, redirects, dropped and hanging connections.

The endpoint (``endpoint.py``) is the standard library's ``ThreadingHTTPServer`` on 127.0.0.1 (a
free port), which records every request and answers 204, or whatever the test scripted for a
given message (a status, a dropped connection, a hang). "Server down" is the real thing: the
server is shut and its port refuses connections until a new server is started on the same port.
Waits are bounded polls of real state (the outbox table, the recorded requests), never sleeps
standing in for synchronisation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from support import (
    MakeRelay,
    assert_charged,
    assert_uncharged,
    expire_backoffs,
    row,
    run_cli,
    stage_inputs,
)

from sqla_outbox.errors import PublisherError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import http_webhook

from .endpoint import DROP, HANG, Endpoint
from .outage import is_outage

pytest.importorskip("httpx", reason="httpx is not installed: pip install 'sqla-outbox[http]'")

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ENVELOPE = {"tenant_id": "tenant-7", "enqueued_by": "user:42", "traceparent": TRACEPARENT}


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    """A webhook receiver (``endpoint.py``), shut when the test ends."""
    server = Endpoint()
    yield server
    server.shut()


# --- helpers -----------------------------------------------------------------------------------


def enqueue(engine: Engine, *inputs: Any, commit: bool = True) -> list[OutboxMessage]:
    """Enqueue one job per input in one transaction, committed or rolled back."""
    return stage_inputs(
        engine, "notify_partner", inputs, commit=commit, queue="webhooks", **ENVELOPE
    )


def one_message() -> OutboxMessage:
    """A message built directly, for tests that call the publisher without a relay."""
    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(
        uuid.uuid4(), "notify_partner", "webhooks", {"n": 1}, uuid.uuid4().hex, 3, now, now
    )


def verify(secret: bytes, headers: dict[str, str], body: bytes, tolerance: float = 300) -> bool:
    """What a receiver does (as in docs/brokers/http.md), written without the library."""
    timestamp = headers["X-Outbox-Timestamp"]
    if abs(time.time() - int(timestamp)) > tolerance:
        return False
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(f"sha256={digest}", headers["X-Outbox-Signature"])


# --- delivery ----------------------------------------------------------------------------------


def test_each_post_is_the_message_as_json_with_its_headers(endpoint: Endpoint) -> None:
    """The body is to_dict() as JSON; the headers say what it is and who sent it, with no
    signature or Authorization unless configured; sqla-outbox's options are stripped from the
    URL and the endpoint's own query parameters kept as written."""
    message = one_message()._replace(**ENVELOPE)
    url = endpoint.url(query="source=outbox&timeout=5&tag=a%20b&connect_timeout=2")
    with http_webhook.from_url(url) as publisher:
        publisher.publish(message)

    [request] = endpoint.requests
    assert request.message == message.to_dict()
    assert request.path == "/hooks/outbox?source=outbox&tag=a%20b"
    headers = request.headers
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Outbox-Id"] == str(message.id)
    assert headers["X-Outbox-Job"] == "notify_partner"
    assert headers["User-Agent"].startswith("sqla-outbox/")
    assert "X-Outbox-Signature" not in headers and "Authorization" not in headers


def test_a_500_is_charged_with_its_status_and_body_and_nothing_behind_it_is_sent(
    pg_engine: Engine, endpoint: Endpoint, make_relay: MakeRelay
) -> None:
    """A 500 on message 3 of 5 (one transaction) is a message failure: 1-2 are published, 3 is
    charged with the status and the start of the body, on one line, in last_error, and 4-5 are
    not even sent (one POST at a time) and are handed back uncharged; once the endpoint recovers
    and the backoff ends, the relay delivers 3-5 in order."""
    messages = enqueue(pg_engine, *({"n": n} for n in range(1, 6)))
    endpoint.answers[str(messages[2].id)] = (500, "database is\n  down, try later", {})
    relay = make_relay(pg_engine, http_webhook.from_url(endpoint.url()), retry_base=60)

    assert relay.tick() == 2
    failed = assert_charged(pg_engine, messages[2], "HTTP 500 Internal Server Error")
    assert "'database is down, try later'" in failed.last_error
    assert [r.message["id"] for r in endpoint.requests] == [str(m.id) for m in messages[:3]]
    assert_uncharged(pg_engine, messages[3:])

    del endpoint.answers[str(messages[2].id)]
    assert relay.tick() == 0  # message 3 backs off, and 4-5 wait for it
    expire_backoffs(pg_engine)
    assert relay.drain().published == 3
    assert endpoint.delivered() == [m.to_dict() for m in messages]


def test_a_redirect_is_a_failure_naming_where_it_points(
    pg_engine: Engine, endpoint: Endpoint, make_relay: MakeRelay
) -> None:
    """A 308 is not followed (a redirected POST can lose its body): the error says where to."""
    [message] = enqueue(pg_engine, {"n": 1})
    endpoint.answers[str(message.id)] = (308, "", {"Location": "https://new.example/hook"})
    relay = make_relay(pg_engine, http_webhook.from_url(endpoint.url()))
    assert relay.tick() == 0
    error = row(pg_engine, message).last_error
    assert "HTTP 308" in error and "'https://new.example/hook'" in error
    assert "redirects are not followed" in error


def test_requests_are_signed_with_a_secret_taken_from_the_environment(
    pg_engine: Engine, endpoint: Endpoint, make_relay: MakeRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """?hmac_secret_env names the variable holding the secret: each request carries a
    timestamp and an HMAC-SHA256 the receiver verifies; the secret is never in the URL.
    ?authorization_env sends another variable's value as the Authorization header."""
    secret = f"whsec-{uuid.uuid4().hex}"
    monkeypatch.setenv("TEST_OUTBOX_WEBHOOK_SECRET", secret)
    monkeypatch.setenv("TEST_OUTBOX_WEBHOOK_TOKEN", "Bearer t0ken")
    url = endpoint.url(
        query="hmac_secret_env=TEST_OUTBOX_WEBHOOK_SECRET&authorization_env=TEST_OUTBOX_WEBHOOK_TOKEN"
    )
    messages = enqueue(pg_engine, {"n": 1}, {"n": 2})
    publisher = http_webhook.from_url(url)
    assert secret not in repr(publisher) and secret not in publisher.url
    assert make_relay(pg_engine, publisher).drain().published == 2

    assert endpoint.delivered() == [m.to_dict() for m in messages]
    for request in endpoint.requests:
        assert request.path == "/hooks/outbox"
        assert request.headers["Authorization"] == "Bearer t0ken"
        assert verify(secret.encode(), request.headers, request.body)
        assert request.headers["X-Outbox-Signature"] == http_webhook.signature(
            secret.encode(), request.headers["X-Outbox-Timestamp"], request.body
        )
        assert not verify(b"another secret", request.headers, request.body)
        assert not verify(secret.encode(), request.headers, request.body + b" ")


# --- outage or message failure ----------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(http_webhook.OUTAGE_STATUSES))
def test_answers_that_speak_for_the_service_are_outages(endpoint: Endpoint, status: int) -> None:
    """408, 429, 502, 503 and 504 mean "not now" for every message: the publish raises a
    WebhookUnavailableError, an outage that is still a WebhookError with the status, and its
    sentence quotes the endpoint's Retry-After."""
    message = one_message()
    endpoint.answers[str(message.id)] = (status, "busy", {"Retry-After": "30"})
    with (
        http_webhook.WebhookPublisher(endpoint.url()) as publisher,
        pytest.raises(http_webhook.WebhookUnavailableError) as info,
    ):
        publisher.publish(message)
    assert is_outage(info.value)
    assert isinstance(info.value, http_webhook.WebhookError)
    assert info.value.status_code == status
    assert f"HTTP {status}" in str(info.value) and "(Retry-After: 30)" in str(info.value)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 500, 501, 308])
def test_other_answers_are_message_failures(endpoint: Endpoint, status: int) -> None:
    """A 4xx, a 500 (the receiver's own bug, most often one this payload triggers), the other 5xx
    and a redirect answer for this message: a WebhookError with the status, not an outage."""
    message = one_message()
    endpoint.answers[str(message.id)] = (status, "no", {"Location": "https://new.example/"})
    with (
        http_webhook.WebhookPublisher(endpoint.url()) as publisher,
        pytest.raises(http_webhook.WebhookError) as info,
    ):
        publisher.publish(message)
    assert not is_outage(info.value)
    assert info.value.status_code == status


def test_a_connection_dropped_before_the_answer_is_an_outage(endpoint: Endpoint) -> None:
    """The endpoint reads the request and closes the connection without answering (a receiver
    that crashed mid-request): an outage, whose sentence says the message may have arrived; the
    next publish, on a fresh connection, is delivered."""
    dropped, after = one_message(), one_message()
    endpoint.answers[str(dropped.id)] = (DROP, "", {})
    with http_webhook.WebhookPublisher(endpoint.url()) as publisher:
        with pytest.raises(http_webhook.WebhookUnavailableError) as info:
            publisher.publish(dropped)
        publisher.publish(after)
    assert is_outage(info.value) and info.value.status_code is None
    assert "RemoteProtocolError" in str(info.value) and "may have arrived" in str(info.value)
    assert endpoint.delivered() == [after.to_dict()]


def test_an_endpoint_that_does_not_answer_in_time_is_an_outage(endpoint: Endpoint) -> None:
    """An endpoint that takes the request and hangs fails the publish with a ReadTimeout after
    about ``timeout`` seconds: an outage, not a failure of the message."""
    message = one_message()
    endpoint.answers[str(message.id)] = (HANG, "", {})
    started = time.monotonic()
    with (
        http_webhook.WebhookPublisher(endpoint.url(query="timeout=0.5")) as publisher,
        pytest.raises(http_webhook.WebhookUnavailableError) as info,
    ):
        publisher.publish(message)
    assert time.monotonic() - started < 5
    assert is_outage(info.value) and "ReadTimeout" in str(info.value)


# --- configuration -----------------------------------------------------------------------------


def test_constructor_arguments_override_the_url_and_guard_the_headers_it_sets() -> None:
    """Keywords win over URL options; extra headers may not replace the ones carrying the
    dedup key, trace or signature."""
    publisher = http_webhook.WebhookPublisher(
        "https://example.com/hook?timeout=3", timeout=7, headers={"User-Agent": "billing/1"}
    )
    assert publisher.timeout == 7 and publisher.connect_timeout == 7
    assert http_webhook.from_url("https://example.com/h").timeout == http_webhook.DEFAULT_TIMEOUT
    for name in ("Idempotency-Key", "traceparent", "X-Outbox-Signature", "content-type"):
        with pytest.raises(PublisherError, match=f"headers may not set {name!r}"):
            http_webhook.WebhookPublisher("https://example.com/h", headers={name: "x"})
    with pytest.raises(PublisherError, match="'Authorization' must be a one-line string, got <"):
        http_webhook.WebhookPublisher("https://example.com/h", authorization="Bearer t\n")
    with pytest.raises(PublisherError, match="hmac_secret must be a non-empty"):
        http_webhook.WebhookPublisher("https://example.com/h", hmac_secret="")
    publisher.close()  # never connected: a no-op


# --- command line ------------------------------------------------------------------------------


def test_the_cli_signs_with_the_secret_the_url_names(
    pg_url: URL, pg_engine: Engine, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqla-outbox relay --once --publisher http://...?hmac_secret_env=NAME`` signs every POST
    with the secret it reads from that variable of its own environment."""
    messages = enqueue(pg_engine, {"n": 1}, {"n": 2})
    enqueue(pg_engine, {"n": "rolled back"}, commit=False)
    monkeypatch.setenv("TEST_OUTBOX_WEBHOOK_SECRET", "cli-secret")  # the CLI inherits it
    url = pg_url.render_as_string(hide_password=False)
    publisher = endpoint.url(query="hmac_secret_env=TEST_OUTBOX_WEBHOOK_SECRET&timeout=5")
    result = run_cli("relay", "--once", "--url", url, "--publisher", publisher)
    assert result.returncode == 0, result.stderr
    assert endpoint.delivered() == [m.to_dict() for m in messages]
    assert all(verify(b"cli-secret", r.headers, r.body) for r in endpoint.requests)
