"""The HTTP webhook publisher against a real HTTP server running in the test process.

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
import logging
import os
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
    logged,
    publisher_error,
    row,
    run_cli,
    stage_inputs,
    wait_until,
    without_client,
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


def test_committed_messages_are_posted_in_order_with_their_headers(
    pg_engine: Engine, endpoint: Endpoint, make_relay: MakeRelay
) -> None:
    """Only committed jobs are POSTed, in enqueue order, as to_dict() JSON with the dedup key
    and trace context in headers; sqla-outbox's options are stripped from the URL, the
    endpoint's own query parameters kept as written."""
    first = enqueue(pg_engine, {"order": 1}, {"order": 2})
    enqueue(pg_engine, {"order": "rolled back"}, commit=False)
    second = enqueue(pg_engine, {"order": 3, "name": "Zoë"})
    committed = first + second
    url = endpoint.url(query="source=outbox&timeout=5&tag=a%20b&connect_timeout=2")

    relay = make_relay(pg_engine, http_webhook.from_url(url))
    assert relay.drain().published == 3

    assert endpoint.delivered() == [m.to_dict() for m in committed]
    for request, message in zip(endpoint.requests, committed, strict=True):
        assert request.path == "/hooks/outbox?source=outbox&tag=a%20b"
        headers = request.headers
        assert headers["Content-Type"] == "application/json"
        assert headers["Idempotency-Key"] == message.idempotency_key
        assert headers["traceparent"] == TRACEPARENT
        assert headers["X-Outbox-Id"] == str(message.id)
        assert headers["X-Outbox-Job"] == "notify_partner"
        assert headers["User-Agent"].startswith("sqla-outbox/")
        assert "X-Outbox-Signature" not in headers and "Authorization" not in headers
    assert relay.pending() == 0


def test_a_500_stops_the_pass_records_the_status_and_the_next_pass_sends_the_rest(
    pg_engine: Engine, endpoint: Endpoint, make_relay: MakeRelay
) -> None:
    """A 500 on message 3 of 5 (one transaction) is a message failure: 1-2 are published, 3 is
    charged with the status and the start of the body in last_error and backs off, 4-5 are not
    even sent and are handed back uncharged; once the endpoint recovers and the backoff ends,
    the relay delivers 3-5 in order."""
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


# --- endpoint down -----------------------------------------------------------------------------


def test_a_down_endpoint_fails_passes_without_marking_and_the_running_relay_delivers_later(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Connection refused is an outage: every pass fails, nothing is marked, no row is charged
    an attempt, the error is logged, and the background relay keeps trying, backing off as a
    whole; once a server listens on the port again it delivers all, in order, without a
    restart."""
    first = Endpoint()
    port = first.port
    first.shut()
    messages = enqueue(pg_engine, {"n": 1}, {"n": 2}, {"n": 3})
    relay = make_relay(pg_engine, http_webhook.from_url(f"http://127.0.0.1:{port}/hook"))
    relay.max_backoff = 0.5  # retry soon after the endpoint is back

    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        relay.start()
        # Two outage passes: the loop survived a failed pass and tried again.
        wait_until(lambda: len(logged(caplog, "relay.broker_unavailable")) >= 2, "two outages")
        line = logged(caplog, "relay.broker_unavailable")[0]
        assert "ConnectError" in line and "it was not delivered" in line
        assert "published=0 handed_back=3" in line
        # Between passes the rows are handed back, blameless.
        wait_until(
            lambda: all(row(pg_engine, m).claimed_by is None for m in messages), "a hand-back"
        )
        for message in messages:
            handed_back = row(pg_engine, message)
            assert (handed_back.attempts, handed_back.last_error) == (0, None)
        assert relay.pending() == 3

    back = Endpoint(port)
    try:
        wait_until(lambda: relay.pending() == 0, "delivery after the endpoint came back")
        relay.stop()
        assert back.delivered() == [m.to_dict() for m in messages]
    finally:
        back.shut()


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


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:notaport/hook", "is malformed"),
        ("ftp://example.com/hook", "not an http:// or https:// URL"),
        ("http:///hook", "not an http:// or https:// URL"),
        ("http://example.com/hook?timeout=0", "timeout must be a positive, finite number"),
        ("http://example.com/hook?timeout=soon", "got 'soon'"),
        ("http://example.com/hook?connect_timeout=-1", "connect_timeout must be"),
        ("http://example.com/hook?timeout=1&timeout=2", "'timeout' twice"),
        ("http://example.com/hook?hmac_secret_env=SQLA_OUTBOX_TEST_UNSET", "not set"),
        ("http://example.com/hook?authorization_env=", "not set"),
        ("http://example.com/hook?ca_file=/nonexistent/ca.pem", "ca_file='/nonexistent/ca.pem'"),
        ("http://u:hunter2@example.com/hook?timeout=0", "http://u:***@example.com/hook"),
    ],
)
def test_from_url_rejects_a_bad_url_in_one_sentence(url: str, expected: str) -> None:
    """A malformed URL or bad option is a PublisherError with the value (password hidden) and
    the fix, raised by from_url before any request is made."""
    assert "SQLA_OUTBOX_TEST_UNSET" not in os.environ
    text = publisher_error(http_webhook.from_url, url)
    assert expected in text and "hunter2" not in text


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


def test_cli_relay_once_posts_the_committed_messages(
    pg_url: URL, pg_engine: Engine, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqla-outbox relay --once --publisher http://...`` POSTs what is committed, signed with
    the secret from the environment variable the URL names."""
    messages = enqueue(pg_engine, {"n": 1}, {"n": 2})
    enqueue(pg_engine, {"n": "rolled back"}, commit=False)
    monkeypatch.setenv("TEST_OUTBOX_WEBHOOK_SECRET", "cli-secret")  # the CLI inherits it
    url = pg_url.render_as_string(hide_password=False)
    publisher = endpoint.url(query="hmac_secret_env=TEST_OUTBOX_WEBHOOK_SECRET&timeout=5")
    result = run_cli("relay", "--once", "--url", url, "--publisher", publisher)
    assert result.returncode == 0, result.stderr
    assert endpoint.delivered() == [m.to_dict() for m in messages]
    assert all(verify(b"cli-secret", r.headers, r.body) for r in endpoint.requests)


def test_without_httpx_the_module_imports_and_from_url_names_the_install_line() -> None:
    """The module stays importable without the extra; from_url says what to pip install."""
    result = without_client("httpx", "http_webhook", "http_webhook.from_url('http://localhost/')")
    assert "needs the httpx client" in result.stdout
    assert 'pip install "sqla-outbox[http]"' in result.stdout
