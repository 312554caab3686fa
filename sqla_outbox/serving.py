"""The HTTP endpoint of a running relay: ``/metrics`` and ``/healthz``.

``sqla-outbox relay --metrics-port PORT`` serves, on a small server thread beside the relay:

* ``GET /metrics``: the Prometheus registry the relay records into (see
  :mod:`sqla_outbox.metrics`), in the text format the scraper asks for (OpenMetrics when its
  ``Accept`` header says so);
* ``GET /healthz``: ``200`` while :meth:`Relay.is_alive() <sqla_outbox.Relay.is_alive>` is
  true, ``503`` otherwise, each with a one-line body saying why. Cheap: no I/O, so a liveness
  probe may call it as often as it likes.

The server answers each request on a thread of its own (``ThreadingHTTPServer``), so a slow
scrape never delays a probe, and it never touches the relay's loop: a scrape that needs the
backlog gauges queries on its own connection (at most every few seconds). It needs
``prometheus_client``; the process's requests are not logged (probes would drown the relay's own
lines), only errors while answering one.

The trap: binding ``127.0.0.1`` keeps the endpoint off the network, and out of reach of a
Prometheus or a Kubernetes probe in another container or host too; the CLI binds ``0.0.0.0`` by
default for that reason (``--metrics-host`` narrows it).
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from sqla_outbox.logs import log_event

if TYPE_CHECKING:
    from sqla_outbox.metrics import Registry
    from sqla_outbox.relay import Relay

__all__ = ["Endpoint", "health"]

log = logging.getLogger("sqla_outbox.serving")


def health(relay: Relay) -> tuple[int, str]:
    """The ``/healthz`` status code and its one-line body."""
    bound = f"{relay.liveness_bound:g} s"
    if relay.is_alive():
        return 200, f"ok: relay {relay.relay_id} reached the database within the last {bound}\n"
    return 503, (
        f"unhealthy: relay {relay.relay_id} has not reached the database in the last {bound} "
        "(database unreachable, loop stuck, or not running)\n"
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    relay: Relay
    registry: Registry

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr, outside the structured log.
        log_event(
            log,
            logging.ERROR,
            "serving.request_failed",
            exc_info=True,
            client=client_address[0] if client_address else None,
        )


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            code, text = health(self.server.relay)
            self._answer(code, "text/plain; charset=utf-8", text.encode())
        elif path == "/metrics":
            from prometheus_client.exposition import (  # noqa: PLC0415 - optional extra
                choose_encoder,
            )

            encode, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(200, content_type, encode(self.server.registry))
        else:
            body = b"not found: this server answers /metrics and /healthz\n"
            self._answer(404, "text/plain; charset=utf-8", body)

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # every probe would log a line: see the module docs


class Endpoint:
    """Serves ``/metrics`` (of ``registry``) and ``/healthz`` (of ``relay``) on ``host:port``.

    :meth:`start` binds (raising ``OSError`` if it cannot, e.g. the port is taken) and serves
    on a daemon thread; :meth:`stop` stops serving and closes the socket. Also a context
    manager. ``registry`` ``None`` is prometheus_client's default ``REGISTRY``.
    """

    def __init__(
        self, relay: Relay, *, host: str, port: int, registry: Registry | None = None
    ) -> None:
        self.relay = relay
        self.host = host
        self.port = port
        self.registry = registry
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The host and port actually bound (the port chosen by the system for port 0)."""
        if self._server is None:
            return self.host, self.port
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def start(self) -> None:
        """Bind and start serving on a daemon thread."""
        registry = self.registry
        if registry is None:
            from prometheus_client import REGISTRY  # noqa: PLC0415 - optional extra

            registry = REGISTRY
        server_class = _Server6 if ":" in self.host else _Server
        server = server_class((self.host, self.port), _Handler)
        server.relay = self.relay
        server.registry = registry
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"{self.relay.relay_id}-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, wait for the server thread, close the socket."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Endpoint:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
