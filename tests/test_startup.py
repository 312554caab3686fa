"""Starting a relay: what it waits for and what it refuses.

A database that cannot be reached yet is waited for by ``sqla-outbox relay`` (a supervisor that
starts it with the database gets a relay, not a restart loop); a server that refuses the login,
and a table the relay cannot use, end it at once. ``Relay.start()`` refuses a table of an older
version instead of looping on the error in the background.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import IO

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from support import (
    REPO,
    WAIT,
    assert_one_clean_error,
    cli_command,
    cli_env,
    free_port,
    run_cli,
    stage_inputs,
    url_of,
)

import alembic_ext  # noqa: F401 - registers op.create_outbox_table
import sqla_outbox as outbox


class Gate:
    """A TCP port on 127.0.0.1 that refuses connections until :meth:`open`, then forwards each
    to ``target``: a database server that is not up yet, then is."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None

    def open(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            end.close()


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _wait_for(lines: queue.Queue[str], text: str, seen: list[str]) -> None:
    """Read ``lines`` until one contains ``text`` (at most :data:`WAIT` seconds)."""
    while True:
        try:
            line = lines.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"no line with {text!r} within {WAIT} s; got {seen}")
        seen.append(line)
        if text in line:
            return


@pytest.fixture
def gate(pg_engine: Engine) -> Iterator[Gate]:
    url = pg_engine.url
    opened = Gate((url.host or "127.0.0.1", url.port or 5432))
    yield opened
    opened.close()


def test_the_relay_waits_for_a_database_that_is_not_up_yet(pg_engine: Engine, gate: Gate) -> None:
    """Started while nothing listens at its URL, `relay` logs `relay.database_unavailable` with
    its backoff and keeps trying; once the server answers it publishes what was committed, and
    SIGTERM ends it with 0."""
    [message] = stage_inputs(pg_engine, "send_receipt", [{"n": 1}])
    url = url_of(pg_engine).replace(f":{pg_engine.url.port}/", f":{gate.port}/")
    out: queue.Queue[str] = queue.Queue()
    err: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    with subprocess.Popen(
        cli_command("relay", "--poll-interval", "0.05"),
        env=cli_env(url=url, publisher="stdout"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        readers = [
            threading.Thread(target=_lines, args=(stream, lines), daemon=True)
            for stream, lines in ((process.stdout, out), (process.stderr, err))
        ]
        for reader in readers:
            reader.start()
        try:
            _wait_for(err, "event=relay.database_unavailable", seen)
            assert "retry_in=" in seen[-1]
            assert process.poll() is None  # still running, not exited
            gate.open()
            _wait_for(out, str(message.id), seen)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=WAIT) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            for reader in readers:  # at the end of its stream, now that the relay has exited
                reader.join(timeout=WAIT)
    while not err.empty():
        seen.append(err.get_nowait())
    assert "Traceback" not in "".join(seen)


def test_a_refused_login_ends_the_relay_at_once(pg_engine: Engine) -> None:
    """A server that answers and refuses (no such role) is not waited for: exit 1, one
    sentence naming the URL and the fix."""
    url = pg_engine.url.set(username="nosuchrole_for_outbox").render_as_string(False)
    result = run_cli("relay", url=url, publisher="stdout")
    assert result.returncode == 1
    line = assert_one_clean_error(result)
    assert "Cannot connect to" in line and "nosuchrole_for_outbox" in line


def test_start_refuses_a_table_of_an_older_version(sqlite_url: URL) -> None:
    """A table of version 4 is refused by `Relay.start()` with the upgrade to run, before any
    thread starts (a loop would log the same error for ever, `is_alive()` False)."""
    engine = outbox.create_engine(sqlite_url)
    with engine.begin() as conn:
        Operations(MigrationContext.configure(conn)).create_outbox_table(version=4)
    relay = outbox.Relay(engine, print)
    try:
        with pytest.raises(outbox.SchemaVersionError, match="upgrade"):
            relay.start()
        assert not relay.is_alive()
        assert relay._thread is None
    finally:
        relay.close()
        engine.dispose()
