"""The conformance suite: every scenario a bundled publisher must pass, run against every broker.

Each ``test_*`` function taking ``broker`` is one scenario, run once per adapter in
``adapters/`` (pytest id: the broker's name) against the real, live broker; ``conformance.py``
describes the adapter protocol. The scenarios are listed, in this order, in
``docs/brokers/writing.md``, and the last test of this module checks that the list there is
this one. Publishers are built from URLs with the command line's own resolver, so every scenario
also goes through the scheme registered in ``schemes.py`` and the module's ``from_url``.

What the scenarios pin, in short: the broker is registered and documented; a bad URL is one
sentence with the password hidden; exactly the committed messages arrive, in order, with every
field, the idempotency key as the broker's message id and the trace context where tracers look;
an unreachable or stopped broker is an outage within a bound, charging nobody; a refused message
is a message failure, and a batch reports the confirmed prefix before it; the publisher and a
running relay come back by themselves after a broker restart.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from support import (
    REPO,
    WAIT,
    MakeRelay,
    assert_charged,
    assert_uncharged,
    expire_backoffs,
    free_port,
    logged,
    row,
    run_cli,
    stage,
    transaction,
    url_of,
    wait_until,
    without_client,
)

import sqla_outbox as outbox
from sqla_outbox.errors import PublisherError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import batch_function
from sqla_outbox.publishers.loader import resolve_publisher
from sqla_outbox.publishers.schemes import BROKERS

from .adapters import ADAPTERS
from .conformance import (
    PASSWORD,
    REQUIRED_MISTAKES,
    TRACEPARENT,
    BrokerAdapter,
    MissingAdapter,
    Restartable,
    Sandbox,
    expected,
    keys,
    message,
    raised,
    recording,
    unique_in_order,
)
from .outage import confirmed, is_outage

GUIDE = REPO / "docs" / "brokers" / "writing.md"


@pytest.fixture(params=ADAPTERS, ids=[adapter.name for adapter in ADAPTERS])
def broker(request: pytest.FixtureRequest) -> BrokerAdapter:
    """The broker a scenario runs against (skipped, saying why, if its client is missing)."""
    adapter: BrokerAdapter = request.param
    if isinstance(adapter, MissingAdapter):
        adapter.skip()
    return adapter


@pytest.fixture
def sandbox(broker: BrokerAdapter) -> Iterator[Sandbox]:
    """The test's own queues on the live broker (skipped, saying why, if it is not running)."""
    with broker.sandbox() as made:
        yield made


@pytest.fixture
def restartable(broker: BrokerAdapter, tmp_path: Path) -> Iterator[Restartable]:
    """A broker of the test's own that it may stop and start."""
    with broker.restartable(tmp_path) as made:
        yield made


@pytest.fixture
def publishers() -> Iterator[Callable[[str], Any]]:
    """Build a publisher from a URL as ``--publisher`` does; each is closed when the test ends."""
    made: list[Any] = []

    def make(url: str) -> Any:
        made.append(resolve_publisher(url))
        return made[-1]

    yield make
    for publisher in made:
        publisher.close()


def publish_when_back(publisher: Any, message: OutboxMessage) -> None:
    """Publish ``message`` once the restarted broker takes it, as the relay's next passes would:
    every failure meanwhile must be an outage, and it must succeed within :data:`WAIT`."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            publisher.publish(message)
        except Exception as error:
            assert is_outage(error), f"not an outage while reconnecting: {error!r}"
            assert time.monotonic() < deadline, f"still failing after a restart: {error!r}"
        else:
            return
        time.sleep(0.05)  # the poll interval of a bounded retry, not a synchronisation


# -- registered, documented, configured -------------------------------------------------------


def test_its_scheme_is_registered_and_documented(
    broker: BrokerAdapter, sandbox: Sandbox, publishers: Callable[[str], Any]
) -> None:
    """The broker's URL scheme is registered in schemes.py for its module, the command line's
    resolver builds that module's publisher from a URL, and the broker has a docs page that
    docs/publishers.md links to."""
    for url in (broker.example_url, sandbox.url):
        assert BROKERS[urlsplit(url).scheme.lower()].module == broker.module, url
    assert type(publishers(sandbox.url)).__module__ == broker.module
    assert (REPO / "docs" / "brokers" / broker.docs_page).is_file()
    assert f"(brokers/{broker.docs_page})" in (REPO / "docs" / "publishers.md").read_text()


def test_a_bad_url_is_refused_in_one_sentence(broker: BrokerAdapter) -> None:
    """Every URL mistake in the adapter's table (at least a bad port, another broker's scheme and
    an option given twice) is a PublisherError from from_url, before anything connects: one
    sentence, with the offending value and the fix, and any password shown as ***."""
    missing = set(REQUIRED_MISTAKES) - set(broker.bad_urls)
    assert not missing, f"{broker!r} has no bad URL for {sorted(missing)}"
    from_url = importlib.import_module(broker.module).from_url
    wrong: list[str] = []
    for label, bad in broker.bad_urls.items():
        try:
            from_url(bad.url)
        except PublisherError as error:
            text = str(error)
        except Exception as error:
            wrong.append(f"{label}: {bad.url!r} raised {error!r}, not a PublisherError")
            continue
        else:
            wrong.append(f"{label}: {bad.url!r} was accepted")
            continue
        problems = [f"lacks {fragment!r}" for fragment in bad.says if fragment not in text]
        if "\n" in text or not text.endswith("."):
            problems.append("is not one sentence")
        if PASSWORD in text:
            problems.append("shows the password")
        if problems:
            wrong.append(f"{label}: {text!r} {', '.join(problems)}")
    assert not wrong, "\n".join(wrong)


def test_the_cli_reports_a_bad_url_in_one_line(broker: BrokerAdapter, pg_url: URL) -> None:
    """``sqla-outbox relay --publisher <URL giving an option twice>`` exits non-zero with the
    publisher's sentence on stderr, and no traceback."""
    bad = broker.bad_urls["option twice"]
    url = pg_url.render_as_string(hide_password=False)
    done = run_cli("relay", "--once", "--url", url, "--publisher", bad.url)
    assert done.returncode != 0
    assert all(fragment in done.stderr for fragment in bad.says), done.stderr
    assert "Traceback" not in done.stderr


def test_without_its_client_it_names_the_install_line(broker: BrokerAdapter) -> None:
    """The module imports without its client library, so the command line can explain; from_url
    and the constructor then raise a PublisherError with the pip line schemes.py registers."""
    registered = BROKERS[urlsplit(broker.example_url).scheme.lower()]
    module = broker.module.rpartition(".")[2]
    from_url = f"{module}.from_url({broker.example_url!r})"
    # The registry names the client as it is installed (confluent-kafka); Python imports it
    # with underscores.
    client = registered.client.replace("-", "_")
    done = without_client(client, module, from_url, broker.constructor)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    for line in lines:
        assert f"needs the {registered.client} client: {registered.install}." in line


# -- what arrives -------------------------------------------------------------------------------


def test_committed_messages_arrive_in_order(
    broker: BrokerAdapter, sandbox: Sandbox, pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Messages of three transactions, relayed over several passes, arrive in commit order, then
    enqueue order; a rolled-back message, staged first, never arrives."""
    queue = sandbox.queue("emails")
    stage(pg_engine, queue, 2, commit=False)
    committed = [
        *stage(pg_engine, queue, 3),
        *stage(pg_engine, queue, 4),
        *stage(pg_engine, queue, 2),
    ]

    relay = make_relay(pg_engine, resolve_publisher(sandbox.url), batch_size=4)
    result = relay.drain()

    assert (result.published, result.failed) == (9, False)
    assert relay.pending() == 0
    assert keys(sandbox.received(queue, 9)) == [m.idempotency_key for m in committed]


def test_every_field_of_the_message_arrives(
    broker: BrokerAdapter, sandbox: Sandbox, pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """What a consumer rebuilds from each delivery equals the staged message's to_dict() in every
    field the broker carries: ids and times as text, max_attempts a number, the input as JSON (an
    object with non-ASCII text, a list, null), and unset optional fields as None."""
    queue = sandbox.queue("fields")
    with transaction(pg_engine) as session:
        staged = [
            outbox.enqueue(session, "send_email", {"to": "zoë@example.com", "n": 1}, queue=queue,
                           tenant_id="acme", enqueued_by="user:7", traceparent=TRACEPARENT,
                           ordering_key="order-7", idempotency_key="order-42", max_attempts=5),
            outbox.enqueue(session, "render_report", ["a", 1], queue=queue),
            outbox.enqueue(session, "send_email", None, queue=queue),
        ]  # fmt: skip

    relay = make_relay(pg_engine, resolve_publisher(sandbox.url))
    assert relay.drain().published == 3

    arrived = sandbox.received(queue, 3)
    assert [delivery.fields for delivery in arrived] == [expected(m, broker.fields) for m in staged]


def test_the_idempotency_key_is_the_id_the_broker_carries(
    broker: BrokerAdapter, sandbox: Sandbox, publishers: Callable[[str], Any]
) -> None:
    """Each message arrives with its idempotency key, a chosen one or a generated one, as the
    broker's own message id: the id consumers (or the broker) deduplicate on."""
    queue = sandbox.queue("keys")
    sent = [message(queue, idempotency_key="order-42"), message(queue)]
    publisher = publishers(sandbox.url)
    for each in sent:
        publisher.publish(each)
    arrived = sandbox.received(queue, 2)
    assert [delivery.message_id for delivery in arrived] == [m.idempotency_key for m in sent]


def test_the_trace_context_travels_where_tracers_look(
    broker: BrokerAdapter, sandbox: Sandbox, publishers: Callable[[str], Any]
) -> None:
    """A message's traceparent arrives where that broker's OpenTelemetry propagator reads it (a
    header, a stream field, a task header); a message without one arrives without one."""
    queue = sandbox.queue("traced")
    publisher = publishers(sandbox.url)
    publisher.publish(message(queue, traceparent=TRACEPARENT))
    publisher.publish(message(queue))
    arrived = sandbox.received(queue, 2)
    assert [delivery.traceparent for delivery in arrived] == [TRACEPARENT, None]


def test_a_message_published_twice_keeps_its_key(
    broker: BrokerAdapter, sandbox: Sandbox, publishers: Callable[[str], Any]
) -> None:
    """One message published twice (as after a relay died between publish and mark) arrives
    twice under the same key, for the consumer to deduplicate; a broker that deduplicates on the
    key itself (``deduplicates``) stores it once and acknowledges both."""
    queue = sandbox.queue("twice")
    once, other = message(queue), message(queue)
    publisher = publishers(sandbox.url)
    for each in (once, once, other):
        publisher.publish(each)
    expect = [once, other] if broker.deduplicates else [once, once, other]
    arrived = sandbox.received(queue, len(expect))
    assert [delivery.message_id for delivery in arrived] == [m.idempotency_key for m in expect]


def test_close_is_idempotent_and_a_later_publish_reconnects(
    broker: BrokerAdapter, sandbox: Sandbox
) -> None:
    """close() on a publisher that never connected, and twice in a row, is harmless; a publisher
    closed by a stopped relay publishes again when the relay is started again."""
    queue = sandbox.queue("reopened")
    first, second = message(queue), message(queue)
    publisher = resolve_publisher(sandbox.url)
    publisher.close()
    publisher.publish(first)
    publisher.close()
    publisher.close()
    publisher.publish(second)
    publisher.close()
    assert keys(sandbox.received(queue, 2)) == [first.idempotency_key, second.idempotency_key]


def test_the_cli_relays_committed_messages(
    broker: BrokerAdapter, sandbox: Sandbox, pg_engine: Engine
) -> None:
    """``sqla-outbox relay --once --publisher <URL>``, in a subprocess, delivers exactly the
    committed messages, in order."""
    queue = sandbox.queue("cli")
    committed = stage(pg_engine, queue, 3)
    stage(pg_engine, queue, 1, commit=False)
    done = run_cli("relay", "--once", "--url", url_of(pg_engine), "--publisher", sandbox.cli_url)
    assert done.returncode == 0, done.stderr
    assert keys(sandbox.received(queue, 3)) == [m.idempotency_key for m in committed]


# -- outage or message failure ------------------------------------------------------------------


def test_an_unreachable_broker_is_an_outage(
    broker: BrokerAdapter, publishers: Callable[[str], Any]
) -> None:
    """Nothing listening where the broker should be: publish, and publish_batch if the publisher
    has one, raise an outage (a BrokerUnavailableError, or one as ``__cause__``) that confirms
    nothing and says why, within the adapter's bound rather than hanging the relay."""
    publisher = publishers(broker.unreachable_url(free_port()))
    calls = [lambda: publisher.publish(message("emails"))]
    batch = batch_function(publisher)
    if batch is not None:
        calls.append(lambda: batch([message("emails"), message("emails")]))
    for call in calls:
        started = time.monotonic()
        error = raised(call)
        elapsed = time.monotonic() - started
        assert is_outage(error), f"not an outage: {error!r}"
        assert confirmed(error) == 0
        assert re.search(broker.unreachable_says, str(error)), str(error)
        assert elapsed < broker.outage_within


def test_the_relay_charges_nobody_while_the_broker_is_unreachable(
    broker: BrokerAdapter,
    pg_engine: Engine,
    make_relay: MakeRelay,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A relay pass against an unreachable broker is an outage: nothing is published or marked,
    every row is handed back with no attempt charged, one ``relay.broker_unavailable`` line
    carries the publisher's sentence, and run_pass returns rather than raising."""
    messages = stage(pg_engine, "emails", 3)
    relay = make_relay(pg_engine, resolve_publisher(broker.unreachable_url(free_port())))
    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        result = relay.run_pass()
    assert (result.claimed, result.published, result.failed, result.outage) == (3, 0, True, True)
    assert relay.pending() == 3
    assert_uncharged(pg_engine, messages)
    [line] = logged(caplog, "relay.broker_unavailable")
    assert re.search(broker.unreachable_says, line), line
    assert "published=0 handed_back=3" in line


def test_no_error_or_log_shows_the_password(
    broker: BrokerAdapter,
    pg_engine: Engine,
    make_relay: MakeRelay,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A password in the publisher's URL never shows: not in from_url's refusal of a bad URL
    (``***`` there), not in the publisher's repr, not in the outage error of an unreachable
    broker, not in what the relay logs about it."""
    shown: list[str] = []
    from_url = importlib.import_module(broker.module).from_url
    for bad in broker.bad_urls.values():
        if PASSWORD in bad.url:
            with pytest.raises(PublisherError) as refused:
                from_url(bad.url)
            assert "***" in str(refused.value), str(refused.value)
            shown.append(str(refused.value))
    publisher = resolve_publisher(broker.unreachable_url(free_port()))
    shown += [repr(publisher), str(raised(lambda: publisher.publish(message("emails"))))]
    stage(pg_engine, "emails", 1)
    with caplog.at_level(logging.DEBUG, logger="sqla_outbox"):
        make_relay(pg_engine, publisher).run_pass()
    shown.append(caplog.text)
    assert logged(caplog, "relay.broker_unavailable"), "the relay logged no outage"
    for text in shown:
        assert PASSWORD not in text, text


def test_a_refused_message_is_a_message_failure(
    broker: BrokerAdapter, sandbox: Sandbox, publishers: Callable[[str], Any]
) -> None:
    """A message the reachable broker answers and refuses (nothing there to take it, a key of
    the wrong kind, a 4xx) fails as a message failure, never an outage, in the broker's words; a
    batch of a deliverable message and that one confirms exactly the first, which arrives."""
    good, refused = sandbox.queue("good"), sandbox.refused_queue()
    publisher = publishers(sandbox.url)
    error = raised(lambda: publisher.publish(message(refused)))
    assert not is_outage(error), f"a refusal reported as an outage: {error!r}"
    assert re.search(broker.refusal_says, str(error)), str(error)
    first = message(good)
    batch = batch_function(publisher)
    if batch is None:  # the relay sends one at a time; the next scenario pins its prefix
        publisher.publish(first)
    else:
        error = raised(lambda: batch([first, message(refused)]))
        assert not is_outage(error), f"a refusal reported as an outage: {error!r}"
        assert confirmed(error) == 1
    assert keys(sandbox.received(good, 1)) == [first.idempotency_key]


def test_the_relay_marks_the_confirmed_prefix_and_charges_the_refused_message(
    broker: BrokerAdapter, sandbox: Sandbox, pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """One pass over three transactions whose second begins with a refused message: the first
    transaction is marked, the refused message is charged one attempt with the broker's reason
    in last_error, the rest of its transaction waits uncharged, and the third transaction still
    goes out. Once the broker takes that queue and the backoff ends, the held messages arrive,
    in order, and nothing is left."""
    good, refused = sandbox.queue("good"), sandbox.refused_queue()
    before = stage(pg_engine, good, 2)
    held = stage(pg_engine, refused, 2)
    after = stage(pg_engine, good, 1)
    relay = make_relay(pg_engine, resolve_publisher(sandbox.url), retry_base=60)

    result = relay.run_pass()

    assert (result.claimed, result.published, result.failed, result.outage) == (5, 3, True, False)
    last_error = assert_charged(pg_engine, held[0], "").last_error
    assert re.search(broker.refusal_says, last_error), last_error
    assert_uncharged(pg_engine, held[1:])
    assert relay.pending() == 2
    # At least once: a message sent after the refused one in the same round trip may have been
    # taken too, and is sent again; a consumer deduplicates.
    arrived = unique_in_order(keys(sandbox.received(good, 3)))
    assert arrived == [m.idempotency_key for m in (*before, *after)]

    sandbox.accept(refused)
    expire_backoffs(pg_engine)
    assert relay.drain().published == 2
    assert relay.pending() == 0
    arrived = unique_in_order(keys(sandbox.received(refused, 2)))
    assert arrived == [m.idempotency_key for m in held]


# -- restarts -----------------------------------------------------------------------------------


def test_the_publisher_reconnects_after_a_restart(
    broker: BrokerAdapter, restartable: Restartable, publishers: Callable[[str], Any]
) -> None:
    """The same publisher publishes, fails as an outage within the bound while its broker is
    stopped, and publishes again once it is back, reconnecting by itself (a client still
    reconnecting may fail a publish meanwhile, as an outage); a batch goes out after it."""
    queue = restartable.queue("restart")
    first, during, later = message(queue), message(queue), message(queue)
    rest = [message(queue), message(queue)]
    publisher = publishers(restartable.url)
    publisher.publish(first)

    restartable.stop()
    started = time.monotonic()
    error = raised(lambda: publisher.publish(during))
    assert time.monotonic() - started < broker.outage_within
    assert is_outage(error), f"not an outage: {error!r}"
    assert confirmed(error) == 0

    restartable.start()
    publish_when_back(publisher, later)
    batch = batch_function(publisher)
    if batch is not None:
        batch(rest)
    else:
        for each in rest:
            publisher.publish(each)

    arrived = unique_in_order(keys(restartable.received(queue, 4)))
    # The failed publish may still arrive, from a client that queued it while disconnected; the
    # relay would publish it again anyway, and consumers deduplicate.
    assert [key for key in arrived if key != during.idempotency_key] == [
        m.idempotency_key for m in (first, later, *rest)
    ]


def test_a_running_relay_survives_a_restart_and_loses_nothing(
    broker: BrokerAdapter,
    restartable: Restartable,
    pg_engine: Engine,
    make_relay: MakeRelay,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker stops mid-drain under a relay thread and comes back on the same address: each
    publish meanwhile fails as an outage within the bound, the relay logs it, retries, charges no
    row and keeps its thread, and once the broker is back every committed message arrives, in
    order, through the same publisher."""
    queue = restartable.queue("outage")
    committed: list[OutboxMessage] = []
    for _ in range(8):
        committed += stage(pg_engine, queue, 5)
        stage(pg_engine, queue, 1, commit=False)
    recorder = recording(resolve_publisher(restartable.url), pause_after=10)
    relay = make_relay(pg_engine, recorder, batch_size=5, poll_interval=0.05)
    relay.max_backoff = 0.5  # retry soon once the broker is back

    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        relay.start()
        assert recorder.paused.wait(WAIT), "the relay never confirmed 10 messages"
        restartable.stop()  # while the relay is parked between two passes
        recorder.resume.set()
        # Two failed passes: the loop survived one and tried again.
        wait_until(lambda: recorder.outages() >= 2, "two failed passes while the broker is down")
        assert relay.pending() > 0
        restartable.start()
        wait_until(lambda: relay.pending() == 0, "the relay to drain after the restart")
        assert relay._thread is not None and relay._thread.is_alive()
        relay.stop()

    arrived = unique_in_order(keys(restartable.received(queue, len(committed))))
    assert arrived == [m.idempotency_key for m in committed]
    for error, seconds in recorder.failures:
        assert is_outage(error), f"not an outage: {error!r}"
        assert seconds < broker.outage_within, (error, seconds)
    assert len(logged(caplog, "relay.broker_unavailable")) >= 2
    assert [row(pg_engine, m).attempts for m in committed] == [0] * len(committed)


# -- the suite itself ---------------------------------------------------------------------------


def scenarios() -> list[str]:
    """The scenarios of this module, in order: its test functions that take ``broker``."""
    return [
        name.removeprefix("test_")
        for name, function in globals().items()
        if name.startswith("test_") and "broker" in inspect.signature(function).parameters
    ]


def test_every_registered_broker_has_an_adapter() -> None:
    """Every publisher module schemes.py registers a URL scheme for has an adapter in
    adapters/, and no adapter names an unregistered one: a broker joins the command line and
    the conformance suite together."""
    registered = {broker.module for broker in BROKERS.values()}
    adapted = {adapter.module for adapter in ADAPTERS}
    assert registered == adapted


def test_the_guide_lists_every_scenario_and_names_the_protocol() -> None:
    """docs/brokers/writing.md lists exactly this module's scenarios, in order, so the guide a
    contributor follows is the suite their broker must pass; and it names every attribute and
    method of the adapter protocol."""
    guide = GUIDE.read_text()
    section = guide.partition("\n## The scenarios\n")[2].partition("\n## ")[0]
    listed = re.findall(r"^\d+\. `([a-z_]+)`", section, flags=re.MULTILINE)
    assert listed == scenarios()
    members = {
        *BrokerAdapter.__annotations__,
        *BrokerAdapter.__abstractmethods__,
        *(name for name in vars(Sandbox) if not name.startswith("_")),
        *Sandbox.__annotations__,
        *(name for name in vars(Restartable) if not name.startswith("_")),
    }
    unnamed = sorted(name for name in members if not re.search(rf"`{name}\b", guide))
    assert not unnamed, f"{GUIDE.name} does not name {unnamed}"
