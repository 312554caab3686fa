"""Throwaway brokers: a private redis-server or nats-server a test may stop and restart, and a
TCP proxy a test may cut and restore, for a broker that cannot be stopped (the shared RabbitMQ).

The shared brokers on the default ports must never be stopped by a test, so a test that needs a
broker outage starts its own on a free loopback port, with its data in a temporary directory.
:meth:`BrokerProcess.stop` and :meth:`BrokerProcess.start` restart it on the *same* port (and,
for NATS, the same JetStream store directory, so streams and their messages survive), which is
what a client sees when a real broker restarts.

Readiness is the broker's own "ready" log line, polled with a bound, never a fixed sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from support import free_port

START_TIMEOUT = 20.0  # seconds; a broker normally starts in well under one
STOP_TIMEOUT = 10.0
_POLL = 0.02


def find_binary(name: str, *fallbacks: str) -> str:
    """Path of the broker executable, or skip the test saying which one is missing."""
    found = shutil.which(name) or next((p for p in fallbacks if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip(f"{name} is not installed (looked on PATH and in {', '.join(fallbacks)})")
    return found


class BrokerProcess:
    """One broker process on a fixed port, which can be stopped and started again.

    :param name: for messages.
    :param argv: the command line (it already names the port and data directory).
    :param port: the port it listens on.
    :param workdir: where its log is written.
    :param ready_text: the log line that says it accepts clients.
    """

    def __init__(
        self, name: str, argv: list[str], port: int, workdir: Path, ready_text: str
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.workdir = workdir
        self.ready_text = ready_text
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the broker and return once its log says it is ready (or fail with the log)."""
        assert not self.running, f"{self.name} is already running"
        self.starts += 1
        self._log = self.workdir / f"{self.name}-{self.starts}.log"
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process.wait()
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_text()}")
            if self.ready_text in self.log_text():
                return
            time.sleep(_POLL)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {START_TIMEOUT} s:\n{self.log_text()}")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, SIGKILL after a bound) and reap it. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()

    def log_text(self) -> str:
        """The current run's log, for failure messages."""
        if self._log is None or not self._log.exists():
            return ""
        return self._log.read_text(errors="replace")


@contextmanager
def _running(make: Callable[[int], BrokerProcess]) -> Iterator[BrokerProcess]:
    broker = make(free_port())
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


@contextmanager
def redis_server(workdir: Path) -> Iterator[BrokerProcess]:
    """A redis-server on a free port with no persistence, stopped when the block exits."""
    binary = find_binary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")

    def make(port: int) -> BrokerProcess:
        argv = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--daemonize", "no",
        ]  # fmt: skip
        return BrokerProcess("redis-server", argv, port, workdir, "Ready to accept connections")

    with _running(make) as broker:
        yield broker


@contextmanager
def nats_server(workdir: Path) -> Iterator[BrokerProcess]:
    """A nats-server with JetStream on a free port, its store under ``workdir``."""
    binary = find_binary("nats-server", "/usr/sbin/nats-server", "/usr/local/bin/nats-server")
    store = workdir / "jetstream"
    store.mkdir(exist_ok=True)

    def make(port: int) -> BrokerProcess:
        argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
        return BrokerProcess("nats-server", argv, port, workdir, "Server is ready")

    with _running(make) as broker:
        yield broker


class TcpProxy:
    """Forwards a free loopback port to ``upstream_port``; :meth:`cut` ends it, :meth:`start`
    listens again on the same port.

    Cutting closes the listening socket and every connection made through it, so a client
    sees its broker vanish mid-connection, and its reconnects are refused, without the broker
    itself being touched: to the client it is a broker that stopped, and after :meth:`start`
    one that restarted. Use it as a context manager; leaving the block cuts it.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._cut = False
        self._spawn(self._accept)

    def start(self) -> None:
        """Listen on the same port again after :meth:`cut`, as a restarted broker would."""
        with self._lock:
            assert self._cut, "the proxy is already running"
            # create_server sets SO_REUSEADDR: the cut connections' TIME_WAIT does not block it.
            self._listener = socket.create_server(("127.0.0.1", self.port))
            self._sockets, self._threads, self._cut = [], [], False
        self._spawn(self._accept)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cut()

    def cut(self) -> None:
        """Close the listener and every forwarded connection, then join the threads. Idempotent."""
        with self._lock:
            if self._cut:
                return
            self._cut = True
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            # shutdown() wakes a thread blocked in accept() or recv() on it; close() alone
            # does not on Linux. It fails on a socket that is no longer connected.
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(STOP_TIMEOUT)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="tcp-proxy", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        listener = self._listener
        while True:
            try:
                client, _address = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._cut:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
                self._spawn(self._pump, client, upstream)
                self._spawn(self._pump, upstream, client)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass  # cut, or the other side went away: either way this direction is done
