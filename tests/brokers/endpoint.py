"""A webhook receiver for the tests: the standard library's HTTP server on a free loopback port.

It records every request and answers 204, or whatever the test scripted for a message (by its
``X-Outbox-Id`` header) or for every message of a queue (by the ``queue`` in its body): a status
with a body and headers, :data:`DROP` (close the connection
without answering, as a receiver that crashed mid-request does) or :data:`HANG` (answer only
once :meth:`Endpoint.shut` is called, as a receiver that hangs does). "Server down" is the real
thing: :meth:`Endpoint.shut` closes the listening socket, and the port refuses connections until
a new endpoint is started on it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support import WAIT

DROP = -1
"""Scripted status: read the request, then close the connection without an answer."""

HANG = -2
"""Scripted status: read the request, then answer nothing until the endpoint is shut."""


@dataclass(frozen=True)
class Request:
    """One POST as the endpoint saw it, and the status it answered."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def message(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.body)
        return result


class Endpoint:
    """A webhook receiver on 127.0.0.1 that records requests; ``answers`` scripts failures.

    ``answers`` maps a message id (the ``X-Outbox-Id`` header) to ``(status, body, headers)``,
    and ``queue_answers`` a queue name to the same, for every message of that queue; every other
    request gets 204.
    """

    def __init__(self, port: int = 0) -> None:
        self.requests: list[Request] = []
        self.answers: dict[str, tuple[int, str, dict[str, str]]] = {}
        self.queue_answers: dict[str, tuple[int, str, dict[str, str]]] = {}
        self._lock = threading.Lock()
        self._released = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, text, headers = endpoint.answer(self.headers.get("X-Outbox-Id", ""), body)
                with endpoint._lock:
                    endpoint.requests.append(Request(self.path, dict(self.headers), body, status))
                if status == DROP:
                    self.close_connection = True
                    return
                if status == HANG:
                    endpoint._released.wait(WAIT)
                    self.close_connection = True
                    return
                payload = text.encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest's output clean

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def answer(self, message_id: str, body: bytes) -> tuple[int, str, dict[str, str]]:
        """What to answer the POST of ``body``: scripted for the message, its queue, or 204."""
        if message_id in self.answers:
            return self.answers[message_id]
        try:
            queue = str(json.loads(body)["queue"])
        except (ValueError, KeyError, TypeError):  # not a message: nothing scripted for it
            queue = ""
        return self.queue_answers.get(queue, (204, "", {}))

    def url(self, path: str = "/hooks/outbox", query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}{'?' + query if query else ''}"

    def delivered(self) -> list[dict[str, Any]]:
        """The messages answered with a 2xx, in arrival order."""
        with self._lock:
            return [r.message for r in self.requests if 200 <= r.status < 300]

    def shut(self) -> None:
        """Release hanging requests, stop serving and close the listening socket: the port
        refuses connections."""
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(WAIT)
