"""What only the Celery publisher promises; ``test_conformance.py`` runs the rest.

The shared scenarios (what arrives and in what order, bad URLs, outages, a refused message,
restarts) run against Celery on Redis there through ``adapters/celery_tasks.py``, which reads
what Redis holds and publishes one message at a time. This file pins Celery's own behaviour,
mostly through a real worker: how a message becomes a task, pipelining, Celery's router, eta and
queue_map, OpenTelemetry's instrumentation, and Celery on RabbitMQ (publisher confirms).

Jobs are staged with ``outbox.enqueue`` on PostgreSQL, the relay publishes them through
``CeleryPublisher``, and an embedded worker (``celery.contrib.testing.worker``, solo pool, in a
thread of this process) runs ``tests.add_to_log``, which records each run in
``tests.brokers.celery_app_for_tests``. Tests wait on those records with a bound, never sleep.

Redis (db 10 by default; see that module) is the main broker; RabbitMQ tests pin what the docs
say about publisher confirms. Each test uses its own queue and deletes it afterwards, so tests
never see each other's messages and the database is never flushed.
"""

from __future__ import annotations

import datetime as dt
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from support import (
    MakeRelay,
    free_port,
    reachable_redis,
    row,
    transaction,
)

import sqla_outbox as outbox
from sqla_outbox import inbox
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError, PublishError
from sqla_outbox.inbox.celery import inbox_task
from sqla_outbox.message import OutboxMessage

pytest.importorskip("celery", reason='the Celery publisher needs pip install "sqla-outbox[celery]"')
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.signals import after_task_publish, task_postrun
from kombu import Connection, Exchange, Queue

from sqla_outbox.publishers.celery_tasks import CeleryPublisher, CeleryUnavailableError, from_url

from . import celery_app_for_tests as tasks
from . import throwaway
from .outage import confirmed, is_outage

WAIT = 20.0  # seconds; a bound on waits that should take milliseconds
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# -- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_db() -> Iterator[redis.Redis]:
    """A client on the tests' Redis database, or a skip saying why there is none."""
    with reachable_redis(tasks.REDIS_URL, socket_timeout=5) as client:
        yield client


@pytest.fixture
def queue(redis_db: redis.Redis) -> Iterator[str]:
    """A queue name no other test uses; its Redis keys are deleted afterwards."""
    name = f"sqla_outbox_celery_{uuid.uuid4().hex[:12]}"
    yield name
    for key in redis_db.scan_iter(match=f"*{name}*"):
        redis_db.delete(key)


@contextmanager
def worker(app: Celery, queue: str) -> Iterator[None]:
    """A solo Celery worker consuming ``queue``, in a thread, stopped on leaving the block."""
    with start_worker(app, perform_ping_check=False, pool="solo", queues=[queue]):
        yield


@pytest.fixture
def publisher() -> Iterator[CeleryPublisher]:
    """The publisher the CLI would build, on the Redis test app; closed afterwards."""
    made = CeleryPublisher(tasks.app)
    yield made
    made.close()


def enqueue_all(engine: Engine, calls: list[tuple[Any, dict[str, Any]]], *, commit: bool) -> list:
    """Stage ``(input, options)`` pairs of ``tests.add_to_log`` in one transaction."""
    with transaction(engine, commit=commit) as session:
        return [outbox.enqueue(session, tasks.TASK, input, **opts) for input, opts in calls]


# -- Redis, through a real worker ---------------------------------------------------------------


def test_a_worker_runs_each_message_as_its_task_with_the_fields_on_the_request(
    publisher: CeleryPublisher, queue: str
) -> None:
    """A worker runs the task named by the job, with the task id the idempotency key: an object
    input becomes keyword arguments, a list one positional argument (never spread), None no
    arguments; every field is an attribute of ``self.request`` (None when unset) and the trace
    context is also in ``self.request.headers``, where OpenTelemetry looks."""
    now = dt.datetime.now(dt.timezone.utc)
    sent = [
        OutboxMessage(uuid.uuid4(), tasks.TASK, queue, {"marker": "kw", "n": 1}, "order-42", 5,
                      now, now, "acme", TRACEPARENT, "user:7"),
        OutboxMessage(uuid.uuid4(), tasks.TASK, queue, ["a", 1], uuid.uuid4().hex, 3, now, now),
        OutboxMessage(uuid.uuid4(), tasks.TASK, queue, None, uuid.uuid4().hex, 3, now, now),
    ]  # fmt: skip
    with worker(tasks.app, queue):
        publisher.publish_batch(sent)
        runs = tasks.wait_for_runs(queue, lambda runs: len(runs) >= 3, WAIT)
    assert [run.id for run in runs] == [m.idempotency_key for m in sent]
    assert [(run.args, run.kwargs) for run in runs] == [
        ((), {"marker": "kw", "n": 1}),
        ((["a", 1],), {}),
        ((), {}),
    ]
    first, message = runs[0], sent[0]
    assert first.attributes == {
        "traceparent": TRACEPARENT,
        "tenant_id": "acme",
        "enqueued_by": "user:7",
        "idempotency_key": "order-42",
        "outbox_id": str(message.id),
        "outbox_queue": queue,
        "max_attempts": 5,
        "run_at": message.run_at.isoformat(),
        "staged_at": message.staged_at.isoformat(),
    }
    assert first.headers["traceparent"] == TRACEPARENT
    assert runs[1].attributes["traceparent"] is None and runs[1].attributes["tenant_id"] is None


def test_pipelined_jobs_run_in_the_order_they_were_committed(
    pg_engine: Engine, make_relay: MakeRelay, queue: str
) -> None:
    """Jobs of several transactions, published pipelined (the default), run in commit order,
    then enqueue order, with one worker, like the one-by-one publishing the conformance suite
    runs."""
    for start, count in ((0, 5), (5, 3), (8, 4)):
        calls = [({"n": n}, {"queue": queue}) for n in range(start, start + count)]
        enqueue_all(pg_engine, calls, commit=True)
    publisher = CeleryPublisher(tasks.app)  # pipelined by default
    relay = make_relay(pg_engine, publisher, batch_size=5)  # three passes, one partly filled
    with worker(tasks.app, queue):
        assert relay.drain().published == 12
        runs = tasks.wait_for_runs(queue, lambda runs: len(runs) >= 12, WAIT)
    assert [run.kwargs["n"] for run in runs] == list(range(12))


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "one-by-one"])
def test_a_failed_message_stops_the_pass_after_the_confirmed_prefix(
    pg_engine: Engine, make_relay: MakeRelay, queue: str, pipeline: bool
) -> None:
    """When Celery refuses one message of a pass, exactly the messages before it are marked
    published (and run); the refused one records the error and the rest of its transaction
    waits behind it, unpublished and uncharged."""
    strict = Celery("strict", broker=tasks.REDIS_URL, set_as_current=False)
    # Only the test's queue exists: a message for any other queue raises QueueNotFound.
    strict.conf.update(task_default_queue=queue, task_create_missing_queues=False)
    messages = enqueue_all(
        pg_engine,
        [
            ({"n": 0}, {"queue": queue}),
            ({"n": 1}, {}),  # the outbox's default queue: left to Celery's routing
            ({"n": 2}, {"queue": "no_such_queue"}),
            ({"n": 3}, {"queue": queue}),
        ],
        commit=True,
    )
    relay = make_relay(pg_engine, CeleryPublisher(strict, pipeline=pipeline))
    try:
        with worker(tasks.app, queue):
            result = relay.drain()
            runs = tasks.wait_for_runs(queue, lambda runs: len(runs) >= 2, WAIT)
    finally:
        strict.close()
    assert (result.published, result.failed) == (2, True)
    assert [run.kwargs["n"] for run in runs] == [0, 1]
    rows = [row(pg_engine, m.id) for m in messages]
    assert [r.published_at is not None for r in rows] == [True, True, False, False]
    assert rows[2].attempts == 1
    assert "no_such_queue" in rows[2].last_error
    assert (rows[3].attempts, rows[3].last_error) == (0, None)


def test_an_instrumented_relay_keeps_the_trace_of_the_request_that_enqueued(
    pg_engine: Engine, make_relay: MakeRelay, publisher: CeleryPublisher, queue: str
) -> None:
    """With OpenTelemetry's Celery instrumentation in the relay, the task's parent is still in the
    enqueuing request's trace, not in a new trace rooted in the relay.

    The instrumentation starts a publish span in ``before_task_publish`` and overwrites the
    ``traceparent`` header with it; the handler below does exactly that with a real SDK tracer.
    """
    trace_sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="needs opentelemetry-sdk")
    from celery.signals import before_task_publish  # noqa: PLC0415
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    tracer = trace_sdk.TracerProvider().get_tracer("sqla-outbox-tests")

    def instrumentation(headers: dict[str, Any], **_: Any) -> None:
        span = tracer.start_span("apply_async/tests.add_to_log", kind=trace.SpanKind.PRODUCER)
        TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(span))
        span.end()

    [message] = enqueue_all(
        pg_engine, [({"n": 0}, {"queue": queue, "traceparent": TRACEPARENT})], commit=True
    )
    relay = make_relay(pg_engine, publisher)
    before_task_publish.connect(instrumentation, weak=False)
    try:
        with tracer.start_as_current_span("relay pass"), worker(tasks.app, queue):
            assert relay.drain().published == 1
            [run] = tasks.wait_for_runs(queue, lambda runs: len(runs) >= 1, WAIT)
    finally:
        before_task_publish.disconnect(instrumentation)
    _version, trace_id, parent_id, _flags = run.attributes["traceparent"].split("-")
    assert trace_id == TRACEPARENT.split("-")[1]  # the enqueuer's trace
    assert parent_id != TRACEPARENT.split("-")[2]  # under the publish span the handler started
    assert run.id == message.idempotency_key


# -- RabbitMQ: publisher confirms ---------------------------------------------------------------


@pytest.fixture(scope="module")
def rabbitmq() -> None:
    """Skip, saying why, when RabbitMQ cannot be reached."""
    connection = Connection(tasks.AMQP_URL, connect_timeout=3)
    try:
        connection.ensure_connection(max_retries=1)
    except Exception as error:
        pytest.skip(f"RabbitMQ is not reachable at {tasks.AMQP_URL}: {error}")
    finally:
        connection.release()


@pytest.fixture
def amqp_queue(rabbitmq: None) -> Iterator[str]:
    """A queue name no other test uses; the queue and its exchange are deleted afterwards."""
    name = f"sqla_outbox_celery_{uuid.uuid4().hex[:12]}"
    yield name
    with Connection(tasks.AMQP_URL, connect_timeout=3) as connection:
        channel = connection.default_channel
        channel.queue_delete(name)
        channel.exchange_delete(name)


def test_rabbitmq_delivers_committed_jobs_with_their_headers(
    pg_engine: Engine, make_relay: MakeRelay, amqp_queue: str
) -> None:
    """On AMQP too, exactly the committed jobs run, in order, with task id and headers intact
    (unset headers arrive as None)."""
    enqueue_all(pg_engine, [({"marker": "rolled-back"}, {"queue": amqp_queue})], commit=False)
    committed = enqueue_all(
        pg_engine,
        [
            ({"n": 0}, {"queue": amqp_queue, "traceparent": TRACEPARENT, "tenant_id": "acme"}),
            ({"n": 1}, {"queue": amqp_queue}),
        ],
        commit=True,
    )
    publisher = CeleryPublisher(tasks.amqp_app)
    relay = make_relay(pg_engine, publisher)
    with worker(tasks.amqp_app, amqp_queue):
        assert relay.drain().published == 2
        runs = tasks.wait_for_runs(amqp_queue, lambda runs: len(runs) >= 2, WAIT)
    assert [(run.id, run.kwargs) for run in runs] == [
        (m.idempotency_key, m.input) for m in committed
    ]
    assert runs[0].attributes["traceparent"] == TRACEPARENT
    assert runs[0].attributes["tenant_id"] == "acme"
    assert runs[1].attributes["tenant_id"] is None
    assert runs[1].attributes["outbox_id"] == str(committed[1].id)


def test_rabbitmq_refusing_a_message_leaves_it_unpublished(
    pg_engine: Engine, make_relay: MakeRelay, amqp_queue: str
) -> None:
    """The publisher turns on publisher confirms, so a message the broker refuses (a full queue
    that rejects publishes) is not marked published; with ``confirm=False`` the same publish
    "succeeds" and the message is silently lost, which is why confirms are the default."""
    full = Celery("full", broker=tasks.AMQP_URL, set_as_current=False)
    full.conf.task_queues = [
        Queue(
            amqp_queue,
            Exchange(amqp_queue),
            routing_key=amqp_queue,
            queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )
    ]
    [message] = enqueue_all(pg_engine, [({"n": 0}, {"queue": amqp_queue})], commit=True)
    confirmed, unconfirmed = CeleryPublisher(full), CeleryPublisher(full, confirm=False)
    try:
        result = make_relay(pg_engine, confirmed).drain()
        unconfirmed.publish(message)  # no error: nothing tells the publisher it was dropped
    finally:
        confirmed.close()
        unconfirmed.close()
        full.close()
    assert (result.published, result.failed) == (0, True)
    refused = row(pg_engine, message.id)
    assert (refused.published_at, refused.attempts) == (None, 1)
    assert "Nack" in refused.last_error
    with Connection(tasks.AMQP_URL, connect_timeout=3) as connection:
        _name, depth, _consumers = connection.default_channel.queue_declare(
            amqp_queue, passive=True
        )
    assert depth == 0


def test_a_message_due_later_carries_an_eta_and_queue_map_renames_queues(
    publisher: CeleryPublisher, queue: str
) -> None:
    """A message whose run_at is still ahead is sent with that eta, so the worker holds it until
    then; ``queue_map`` sends an outbox queue to the Celery queue it names."""
    now = dt.datetime.now(dt.timezone.utc)
    run_at = now + dt.timedelta(seconds=0.5)
    message = OutboxMessage(
        uuid.uuid4(), tasks.TASK, "later", {"n": 0}, uuid.uuid4().hex, 3, run_at, now
    )
    mapped = CeleryPublisher(tasks.app, queue_map={"later": queue})
    try:
        with worker(tasks.app, queue):
            mapped.publish(message)
            [run] = tasks.wait_for_runs(queue, lambda runs: len(runs) >= 1, WAIT)
    finally:
        mapped.close()
    assert dt.datetime.fromisoformat(run.eta) == run_at
    assert dt.datetime.now(dt.timezone.utc) >= run_at
    assert run.attributes["outbox_queue"] == "later"


# -- outage or message failure ------------------------------------------------------------------


def one_message(queue: str) -> OutboxMessage:
    """A message of the test task, built directly, for tests that call the publisher."""
    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(uuid.uuid4(), tasks.TASK, queue, {"n": 0}, uuid.uuid4().hex, 3, now, now)


@contextmanager
def stop_after(server: throwaway.BrokerProcess, count: int) -> Iterator[None]:
    """Stop ``server`` from Celery's after_task_publish signal, once ``count`` tasks were sent.

    The signal fires inside ``send_task``, between two messages of one batch, so the broker
    goes away exactly there.
    """
    sent = 0

    def handler(**_: Any) -> None:
        nonlocal sent
        sent += 1
        if sent == count:
            server.stop()

    after_task_publish.connect(handler, weak=False)
    try:
        yield
    finally:
        after_task_publish.disconnect(handler)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@pytest.mark.parametrize(
    ("pipeline", "published"), [(False, 2), (True, 0)], ids=["one-by-one", "pipelined"]
)
def test_a_broker_lost_mid_batch_is_an_outage_after_the_confirmed_prefix(
    tmp_path: Path, pipeline: bool, published: int
) -> None:
    """Redis stops after the second task of four is sent: the batch raises
    CeleryUnavailableError, an outage, whose ``published`` is the confirmed prefix: two when
    sent one by one, none when pipelined (the pipeline had not reached Redis)."""
    batch = [one_message("lost_q") for _ in range(4)]
    with throwaway.redis_server(tmp_path) as server:
        app = Celery("lost", broker=f"redis://127.0.0.1:{server.port}/0", set_as_current=False)
        publisher = CeleryPublisher(app, pipeline=pipeline)
        try:
            with stop_after(server, 2), pytest.raises(CeleryUnavailableError) as info:
                publisher.publish_batch(batch)
        finally:
            publisher.close()
            app.close()
    assert is_outage(info.value) and confirmed(info.value) == published
    assert f"it took {published} of 4 messages" in str(info.value)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@pytest.mark.parametrize(
    "condition",
    [("CONFIG", "SET", "maxmemory", "1"), ("REPLICAOF", "127.0.0.1", "1")],
    ids=["out-of-memory", "read-only-replica"],
)
def test_a_redis_broker_that_refuses_every_write_is_an_outage(
    tmp_path: Path, condition: tuple[str, ...]
) -> None:
    """Celery's Redis answers but takes no writes (OOM, READONLY): kombu wraps the reply in an
    OperationalError like any other, and the publisher reports an outage, not a failure of the
    message, since any message would have been refused the same."""
    with throwaway.redis_server(tmp_path) as server:
        admin = redis.Redis(port=server.port, socket_timeout=3)
        app = Celery("full", broker=f"redis://127.0.0.1:{server.port}/0", set_as_current=False)
        publisher = CeleryPublisher(app)
        try:
            admin.execute_command(*condition)
            with pytest.raises(CeleryUnavailableError) as info:
                publisher.publish_batch([one_message("full_q")])
        finally:
            publisher.close()
            app.close()
            admin.close()
    assert is_outage(info.value) and confirmed(info.value) == 0


@pytest.mark.parametrize("broker", ["closed-port", "login-refused"])
def test_an_amqp_broker_that_cannot_be_used_is_an_outage(rabbitmq: None, broker: str) -> None:
    """On AMQP, a broker that refuses connections and one that refuses the login are both
    outages: nothing could be sent through that app, whatever the message. The password is
    not shown."""
    url = (
        f"amqp://guest:s3cret@127.0.0.1:{free_port()}//"
        if broker == "closed-port"
        else tasks.AMQP_URL.replace("guest:guest@", "guest:s3cret@")
    )
    app = Celery("unusable", broker=url, set_as_current=False)
    publisher = CeleryPublisher(app)
    try:
        with pytest.raises(CeleryUnavailableError) as info:
            publisher.publish(one_message("emails"))
    finally:
        publisher.close()
        app.close()
    assert is_outage(info.value)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("refusal", ["queue-not-found", "nacked", "no-such-exchange"])
def test_a_refusal_of_the_message_is_not_an_outage(
    request: pytest.FixtureRequest, refusal: str
) -> None:
    """Celery's router finding no such queue, a broker nack (a full queue with reject-publish,
    which kombu wraps in an OperationalError like a connection error) and an AMQP channel error
    (a passive exchange that does not exist) are about this message: the publisher raises
    them as they are, never as an outage, and a batch counts none of it confirmed."""
    if refusal == "queue-not-found":
        queue = request.getfixturevalue("queue")
        app = Celery("strict", broker=tasks.REDIS_URL, set_as_current=False)
        app.conf.update(task_default_queue=queue, task_create_missing_queues=False)
        target = "no_such_queue"
    else:
        target = request.getfixturevalue("amqp_queue")
        app = Celery(refusal, broker=tasks.AMQP_URL, set_as_current=False)
        if refusal == "nacked":  # a queue that rejects every publish
            exchange = Exchange(target)
            arguments = {"x-max-length": 0, "x-overflow": "reject-publish"}
        else:  # declared passively: the broker closes the channel, 404
            exchange, arguments = Exchange(f"{target}_missing", passive=True), {}
        app.conf.task_queues = [
            Queue(target, exchange, routing_key=target, queue_arguments=arguments)
        ]
    publisher = CeleryPublisher(app)
    try:
        with pytest.raises(Exception) as single:  # Celery's or kombu's own error, as it is
            publisher.publish(one_message(target))
        with pytest.raises(PublishError) as batch:
            publisher.publish_batch([one_message(target)])
    finally:
        publisher.close()
        app.close()
    assert not is_outage(single.value), repr(single.value)
    assert not is_outage(batch.value) and confirmed(batch.value) == 0


# -- from_url and the constructor ---------------------------------------------------------------


def test_from_url_builds_the_publisher_with_its_options() -> None:
    """Options in the query string reach the publisher; a bare module finds its ``app`` the way
    ``celery -A`` does."""
    module = tasks.__name__  # pytest's name for it: brokers.celery_app_for_tests
    made = from_url(
        f"celery:{module}:app?max_retries=1&interval_step=0.5"
        "&confirm=false&confirm_timeout=3&socket_timeout=2&pipeline=false"
    )
    assert made.app is tasks.app
    assert made.retry_policy == {
        "max_retries": 1,
        "interval_start": 0.0,
        "interval_step": 0.5,
        "interval_max": 1.0,
    }
    assert (made.confirm, made.confirm_timeout, made.socket_timeout, made.pipeline) == (
        False,
        3.0,
        2.0,
        False,
    )
    assert from_url(f"celery:{module}").app is tasks.app
    assert from_url(f"celery:{module}:amqp_app").app is tasks.amqp_app


def test_the_constructor_checks_its_arguments() -> None:
    """A wrong app or an unbounded retry policy is refused at construction, with the fix."""
    with pytest.raises(ArgumentTypeError, match=r"needs a celery\.Celery app"):
        CeleryPublisher("celery:myapp:app")
    with pytest.raises(ConfigurationError, match=r"max_retries must be .*got None"):
        CeleryPublisher(tasks.app, retry_policy={"max_retries": None})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="unknown keys"):
        CeleryPublisher(tasks.app, retry_policy={"retries": 3})
    with pytest.raises(ArgumentTypeError, match="queue_map"):
        CeleryPublisher(tasks.app, queue_map={"emails": ""})


# -- the inbox on the consumer's side ----------------------------------------------------------


def test_an_inbox_task_runs_once_per_message_delivered_twice(
    pg_engine: Engine, publisher: CeleryPublisher, queue: str
) -> None:
    """Three messages, each delivered twice (the same task id, as a relay re-publishing after a
    crash sends it): a real worker runs the inbox task six times, its body three, each once; the
    inbox holds the three keys."""
    inbox.metadata.create_all(pg_engine)
    name = f"tests.inbox_once_{uuid.uuid4().hex[:8]}"
    ran: list[int] = []
    finished = threading.Condition()
    done: list[str] = []

    @inbox_task(tasks.app, sessionmaker(pg_engine), consumer="celery", name=name)
    def record(session: Session, n: int) -> None:
        ran.append(n)

    def count(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == name:
            with finished:
                done.append(name)
                finished.notify_all()

    task_postrun.connect(count, weak=False)
    now = dt.datetime.now(dt.timezone.utc)
    sent = [
        OutboxMessage(uuid.uuid4(), name, queue, {"n": n}, uuid.uuid4().hex, 3, now, now)
        for n in range(3)
    ]
    try:
        with worker(tasks.app, queue):
            publisher.publish_batch(sent + sent)
            with finished:
                assert finished.wait_for(lambda: len(done) >= 6, WAIT), done
    finally:
        task_postrun.disconnect(count)
        tasks.app.tasks.unregister(name)
    assert sorted(ran) == [0, 1, 2]
    with Session(pg_engine) as session:
        keys = session.scalars(select(inbox.InboxRow.key)).all()
    assert sorted(keys) == sorted(m.idempotency_key for m in sent)
    assert record.acks_late is True
