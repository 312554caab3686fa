"""HTTP webhook: a receiver in the test process (``endpoint.py``) that records every POST.

Every queue goes to the one endpoint; a message's queue is in its body, so reading a queue back
is filtering what the endpoint answered 2xx. A refused queue is one the endpoint answers 422 for.
The restartable broker is the endpoint itself: shut (its port refuses connections), then a new
one on the same port.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from ..conformance import PASSWORD, BadUrl, BrokerAdapter, Delivery, wait_for
from ..endpoint import Endpoint


def deliveries(endpoints: list[Endpoint], queue: str) -> list[Delivery]:
    """What ``endpoints`` answered 2xx for ``queue``, in order."""
    return [
        Delivery(
            request.message, request.headers["Idempotency-Key"], request.headers.get("traceparent")
        )
        for endpoint in endpoints
        for request in list(endpoint.requests)
        if 200 <= request.status < 300 and request.message["queue"] == queue
    ]


class _Receiver:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.url = self.cli_url = endpoint.url(query="timeout=3")
        self.run = uuid.uuid4().hex[:10]

    def queue(self, label: str) -> str:
        return f"{label}-{self.run}"

    def refused_queue(self) -> str:
        name = f"refused-{uuid.uuid4().hex[:6]}"
        self.endpoint.queue_answers[name] = (422, '{"error": "unknown job"}', {})
        return name

    def accept(self, queue: str) -> None:
        del self.endpoint.queue_answers[queue]

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return wait_for(lambda: deliveries([self.endpoint], queue), count, f"queue {queue!r}")


class _Restartable:
    def __init__(self) -> None:
        self.endpoints = [Endpoint()]
        self.port = self.endpoints[0].port
        self.url = self.endpoints[0].url(query="timeout=1")

    def queue(self, label: str) -> str:
        return label

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return wait_for(lambda: deliveries(self.endpoints, queue), count, f"queue {queue!r}")

    def stop(self) -> None:
        self.endpoints[-1].shut()

    def start(self) -> None:
        self.endpoints.append(Endpoint(self.port))

    def shut(self) -> None:
        self.endpoints[-1].shut()  # idempotent: a shut endpoint is shut again harmlessly


class HttpAdapter(BrokerAdapter):
    name = "http"
    module = "sqla_outbox.publishers.http_webhook"
    docs_page = "http.md"
    example_url = "https://hooks.example.com/outbox?timeout=5"
    constructor = "http_webhook.WebhookPublisher('http://localhost/')"
    outage_within = 5.0
    unreachable_says = r"ConnectError.*it was not delivered"
    refusal_says = r"HTTP 422"
    bad_urls: ClassVar[Mapping[str, BadUrl]] = {
        "malformed": BadUrl.of("http://127.0.0.1:notaport/hook", "is malformed"),
        "scheme": BadUrl.of("ftp://example.com/hook", "not an http:// or https:// URL"),
        "option twice": BadUrl.of("http://example.com/hook?timeout=1&timeout=2", "'timeout' twice"),
        "password": BadUrl.of(
            f"http://u:{PASSWORD}@example.com/hook?timeout=0", "http://u:***@example.com/hook"
        ),
        "no host": BadUrl.of("http:///hook", "not an http:// or https:// URL"),
        "zero timeout": BadUrl.of(
            "http://example.com/hook?timeout=0", "timeout must be a positive, finite number"
        ),
        "text timeout": BadUrl.of("http://example.com/hook?timeout=soon", "got 'soon'"),
        "negative connect timeout": BadUrl.of(
            "http://example.com/hook?connect_timeout=-1", "connect_timeout must be"
        ),
        "unset secret variable": BadUrl.of(
            "http://example.com/hook?hmac_secret_env=SQLA_OUTBOX_TEST_UNSET", "not set"
        ),
        "empty authorization variable": BadUrl.of(
            "http://example.com/hook?authorization_env=", "not set"
        ),
        "missing CA file": BadUrl.of(
            "http://example.com/hook?ca_file=/nonexistent/ca.pem", "ca_file='/nonexistent/ca.pem'"
        ),
    }

    @contextmanager
    def sandbox(self) -> Iterator[_Receiver]:
        endpoint = Endpoint()
        try:
            yield _Receiver(endpoint)
        finally:
            endpoint.shut()

    def unreachable_url(self, port: int) -> str:
        return f"http://relay:{PASSWORD}@127.0.0.1:{port}/hook?timeout=2"

    @contextmanager
    def restartable(self, workdir: Path) -> Iterator[_Restartable]:
        receiver = _Restartable()
        try:
            yield receiver
        finally:
            receiver.shut()


ADAPTER = HttpAdapter()
