"""Operating a relay: Prometheus metrics, the ``/metrics`` and ``/healthz`` endpoint, and the
alert thresholds of ``sqla-outbox status``.

What is pinned: the counters count exactly what a drain did, per queue; the gauges show what
``sqla-outbox status`` shows, from at most one query per interval however often they are
scraped; relays share a registry without clashing; the CLI serves both paths over real HTTP,
``/healthz`` turns 503 once the database is out of reach (deterministically: the relay's role is
refused and its sessions ended); a missing extra fails in one sentence; and ``status`` exits 3 on
a crossed threshold, distinct from 1 (cannot read the outbox).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text, update
from sqlalchemy import event as sqlalchemy_event
from support import (
    REPO,
    MakeRelay,
    cli_command,
    cli_env,
    expire_backoffs,
    free_port,
    run_cli,
    stage,
    stage_inputs,
    url_of,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox import queries
from sqla_outbox.message import OutboxMessage
from sqla_outbox.metrics import (
    DELAY_BUCKETS,
    Backlog,
    BacklogNumbers,
    DelayHistogram,
    metrics_for,
    read_backlog,
)

PROMETHEUS_HINT = 'pip install "sqla-outbox[prometheus]"'


def fail_flagged(message: OutboxMessage) -> None:
    """A publisher that refuses messages whose input has ``"fail": true``."""
    if isinstance(message.input, dict) and message.input.get("fail"):
        raise RuntimeError(f"broker refused {message.id}")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def stage_failing(engine: Engine, queue: str) -> OutboxMessage:
    """One message that ``fail_flagged`` refuses, alone in its transaction (so it holds back
    nothing else)."""
    [message] = stage_inputs(engine, "charge", [{"fail": True}], queue=queue)
    return message


# --- counters and the histogram ----------------------------------------------------------------


def test_counters_are_exact_per_queue_through_failures_and_a_dead_letter(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A drain with one refused message counts every publish on its queue, one failure on the
    refused message's queue and no dead letter; once the retry fails too (the last attempt), the
    failure count is two and the dead-letter count one. The delay histogram has one observation
    per published message."""
    registry = CollectorRegistry()
    stage(pg_engine, "emails", 3)
    stage(pg_engine, "invoices", 2)
    stage_failing(pg_engine, "invoices")
    relay = make_relay(
        pg_engine, fail_flagged, registry=registry, max_publish_attempts=2, retry_base=300
    )

    relay.drain()
    published = "sqla_outbox_published_total"
    failures = "sqla_outbox_publish_failures_total"
    dead = "sqla_outbox_dead_letters_total"
    assert sample(registry, published, queue="emails") == 3
    assert sample(registry, published, queue="invoices") == 2
    assert sample(registry, failures, queue="invoices") == 1
    assert sample(registry, failures, queue="emails") is None
    assert sample(registry, dead, queue="invoices") is None
    assert sample(registry, "sqla_outbox_publish_delay_seconds_count") == 5

    assert expire_backoffs(pg_engine) == 1
    relay.drain()
    assert sample(registry, failures, queue="invoices") == 2
    assert sample(registry, dead, queue="invoices") == 1
    assert sample(registry, published, queue="invoices") == 2
    assert sample(registry, "sqla_outbox_publish_delay_seconds_count") == 5
    delay_sum = sample(registry, "sqla_outbox_publish_delay_seconds_sum")
    assert delay_sum is not None and delay_sum >= 0


def test_delay_histogram_matches_prometheus_clients_histogram() -> None:
    """Fed a pass at a time (staging times in any order, one from the future by clock skew),
    the delay histogram exposes the same buckets, count and sum as prometheus_client's own
    ``Histogram`` observing each delay, a negative one as 0."""
    from prometheus_client import Histogram  # noqa: PLC0415

    now = 1_700_000_000.0
    passes = [[now - 0.003, now - 0.2, now - 0.07], [now - 4000.0, now + 2.0], [now - 42.0]]
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = DelayHistogram()
    ours_registry.register(ours)
    theirs = Histogram(
        ours.name, ours.documentation, buckets=DELAY_BUCKETS, registry=theirs_registry
    )
    for staged in passes:
        ours.observe_staged(list(reversed(staged)), now)
        for moment in staged:
            theirs.observe(max(0.0, now - moment))

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels.get("le", "")): s.value
            for family in registry.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        }

    expected = samples(theirs_registry)
    actual = samples(ours_registry)
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value), key


def test_a_broker_outage_counts_one_failure_and_charges_nobody(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A pass a broker outage ends counts one publish failure, on the queue of the message being
    published, and no dead letter."""
    registry = CollectorRegistry()
    stage(pg_engine, "emails", 3)

    def down(message: OutboxMessage) -> None:
        raise outbox.BrokerUnavailableError("connection refused")

    relay = make_relay(pg_engine, down, registry=registry)
    assert relay.drain().outage
    assert sample(registry, "sqla_outbox_publish_failures_total", queue="emails") == 1
    assert sample(registry, "sqla_outbox_published_total", queue="emails") is None
    assert sample(registry, "sqla_outbox_dead_letters_total", queue="emails") is None


def test_relays_share_the_metrics_of_one_registry(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """Two relays on one registry, a private one or prometheus_client's default, build without
    "Duplicated timeseries" and count into the same series."""
    registry = CollectorRegistry()
    first = make_relay(pg_engine, fail_flagged, registry=registry)
    second = make_relay(pg_engine, fail_flagged, registry=registry)
    stage(pg_engine, "emails", 2)
    first.drain()
    stage(pg_engine, "emails", 3)
    second.drain()
    assert sample(registry, "sqla_outbox_published_total", queue="emails") == 5

    queue = f"q-{uuid.uuid4().hex[:8]}"  # REGISTRY is the process's: count only this test's queue
    on_default = [make_relay(pg_engine, fail_flagged) for _ in range(2)]
    assert metrics_for(None) is metrics_for(REGISTRY)
    stage(pg_engine, queue, 4)
    on_default[1].drain()
    # Read the counter alone: collecting all of REGISTRY would query the backlog of every relay
    # this test process has built.
    counted = [
        s.value
        for family in metrics_for(REGISTRY).published.collect()
        for s in family.samples
        if s.name == "sqla_outbox_published_total" and s.labels == {"queue": queue}
    ]
    assert counted == [4]


# --- the backlog gauges ------------------------------------------------------------------------


def backlog_gauges(registry: CollectorRegistry) -> dict[str, float | None]:
    names = (
        "sqla_outbox_pending_messages",
        "sqla_outbox_dead_messages",
        "sqla_outbox_oldest_pending_age_seconds",
    )
    return {name: registry.get_sample_value(name) for name in names}


def test_gauges_match_sqla_outbox_status(engine: Engine, make_relay: MakeRelay) -> None:
    """On PostgreSQL and SQLite, the gauges show the pending count (dead letters included), the
    dead letters and the oldest pending age that ``sqla-outbox status --json`` shows."""
    registry = CollectorRegistry()
    relay = make_relay(engine, fail_flagged, registry=registry, max_publish_attempts=1)
    stage_failing(engine, "invoices")
    stage(engine, "emails", 2)
    relay.drain()  # one dead letter, two published
    stage(engine, "emails", 4)  # pending, not relayed
    gauges = backlog_gauges(registry)

    result = run_cli("status", "--json", url=url_of(engine))
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert (status["pending"], status["dead"]) == (5, 1)
    assert gauges["sqla_outbox_pending_messages"] == status["pending"]
    assert gauges["sqla_outbox_dead_messages"] == status["dead"]
    age = gauges["sqla_outbox_oldest_pending_age_seconds"]
    assert age is not None
    # status ran after the scrape: its age is the gauge's plus the time in between.
    assert age - 0.5 <= status["oldest_pending_age_seconds"] <= age + 30


def test_a_scrape_storm_runs_one_statement(engine: Engine, make_relay: MakeRelay) -> None:
    """On PostgreSQL and SQLite, twenty scrapes in a row run one SELECT on the relay's database
    between them: the gauges' one statement, once per interval."""
    registry = CollectorRegistry()
    relay = make_relay(engine, fail_flagged, registry=registry)
    stage(engine, "emails", 2)
    selects: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)

    sqlalchemy_event.listen(relay.engine, "before_cursor_execute", count)
    try:
        for _ in range(20):
            assert backlog_gauges(registry)["sqla_outbox_pending_messages"] == 2
    finally:
        sqlalchemy_event.remove(relay.engine, "before_cursor_execute", count)
    assert len(selects) == 1, selects


def test_gauges_read_zero_for_an_empty_outbox(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """With nothing pending every gauge is 0 (not absent): an alert on the age needs no
    special case for an idle outbox."""
    registry = CollectorRegistry()
    make_relay(pg_engine, fail_flagged, registry=registry)
    assert set(backlog_gauges(registry).values()) == {0.0}


def test_backlog_statement_reads_only_unpublished_rows() -> None:
    """The gauges' statement filters on ``published_at IS NULL`` in its WHERE clause (what the
    partial index ``ix_outbox_unpublished`` covers), so its cost follows the backlog, not the
    published history."""
    compiled = str(queries.backlog_stmt("postgresql").compile(dialect=_postgresql_dialect()))
    assert "WHERE outbox.published_at IS NULL" in compiled
    assert compiled.count("SELECT") == 1


def _postgresql_dialect() -> Any:
    from sqlalchemy.dialects import postgresql  # noqa: PLC0415

    return postgresql.dialect()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingRead:
    """A stand-in for the backlog query that counts its calls; ``release`` holds it open."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, engine: Engine) -> BacklogNumbers:
        self.calls += 1
        self.entered.set()
        self.release.wait(30)
        return BacklogNumbers(pending=self.calls, dead=0, oldest_age_seconds=0.0)


def test_gauges_query_at_most_once_per_interval(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """However many scrapes come in, the backlog is queried at most once per interval: scrapes
    within it serve the last numbers, scrapes that arrive during the query wait for it instead of
    running their own, and the next query comes only once the interval has passed."""
    clock, read = FakeClock(), CountingRead()
    backlog = Backlog(interval=5.0, clock=clock, read=read)
    backlog.watch(make_relay(pg_engine, fail_flagged))
    backlog.watch(make_relay(pg_engine, fail_flagged))  # same database: still one query

    for _ in range(50):
        assert backlog.numbers() == BacklogNumbers(1, 0, 0.0)
    assert read.calls == 1

    clock.now += 4.9
    backlog.numbers()
    assert read.calls == 1

    clock.now += 0.1
    read.release.clear()
    read.entered.clear()
    storm = [threading.Thread(target=backlog.numbers) for _ in range(8)]
    storm[0].start()
    assert read.entered.wait(30)
    for thread in storm[1:]:
        thread.start()
    read.release.set()
    for thread in storm:
        thread.join(30)
    assert read.calls == 2


def test_gauges_are_left_out_while_the_query_fails(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing backlog query leaves the gauges out of the scrape (no stale numbers) and logs
    ``event=metrics.backlog_failed`` with the URL, password hidden; it is retried only after
    the interval."""
    caplog.set_level(logging.WARNING, logger="sqla_outbox")
    clock = FakeClock()

    def broken(engine: Engine) -> BacklogNumbers:
        raise RuntimeError("server closed the connection unexpectedly")

    backlog = Backlog(interval=5.0, clock=clock, read=broken)
    backlog.watch(make_relay(pg_engine, fail_flagged))
    assert list(backlog.collect()) == []
    lines = [r.getMessage() for r in caplog.records if "metrics.backlog_failed" in r.getMessage()]
    assert len(lines) == 1 and "server closed the connection" in lines[0]
    backlog.collect()
    assert len([r for r in caplog.records if "metrics.backlog_failed" in r.getMessage()]) == 1


# --- without the extra -------------------------------------------------------------------------


def without_prometheus(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in an interpreter where ``prometheus_client`` cannot be imported."""
    prelude = "import sys; sys.modules['prometheus_client'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_relay_without_the_extra_pays_nothing(pg_engine: Engine) -> None:
    """Without prometheus_client a relay builds and drains without trying to import it (an
    attempt would raise ``ModuleNotFoundError``)."""
    stage(pg_engine, "emails", 2)
    result = without_prometheus(
        "import sqla_outbox as outbox\n"
        f"relay = outbox.Relay({url_of(pg_engine)!r}, lambda m: None)\n"
        "print(relay.drain().published)\n"
        "relay.close()\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_metrics_port_without_the_extra_fails_in_one_sentence(pg_engine: Engine) -> None:
    """``--metrics-port`` without prometheus_client exits 2 before connecting, with one sentence
    naming the install command."""
    result = without_prometheus(
        "from sqla_outbox.cli import main\n"
        "sys.exit(main(['relay', '--publisher', 'stdout', '--metrics-port', '9', '--url', "
        f"{url_of(pg_engine)!r}]))\n"
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and PROMETHEUS_HINT in lines[0], result.stderr
    assert "--metrics-port" in lines[0] and "Traceback" not in result.stderr


# --- the endpoint, over HTTP -------------------------------------------------------------------


def http_get(url: str) -> tuple[int, str]:
    """Status code and body of a GET, whatever the code; raises if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def answers(url: str) -> bool:
    try:
        http_get(url)
    except OSError:
        return False
    return True


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, by name and labels."""
    _code, body = http_get(f"http://127.0.0.1:{port}/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


@contextmanager
def running_relay(url: str, port: int, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """``sqla-outbox relay`` serving on ``port`` (given as ``SQLA_OUTBOX_METRICS_PORT``) in the
    background; killed if still running when the block ends (a test that expects a clean exit
    signals it and checks the code itself)."""
    command = cli_command("relay", "--publisher", "stdout", "--poll-interval", "0.05", *extra)
    proc = subprocess.Popen(
        command,
        env=cli_env(url=url, metrics_port=str(port), metrics_host="127.0.0.1"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def stop_cleanly(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then the exit code must be 0; returns stderr."""
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_metrics_port_serves_metrics_and_healthz(pg_engine: Engine) -> None:
    """The relay command serves ``/metrics`` (its counters and gauges, in Prometheus text) and
    ``/healthz`` (200 with a one-line body) while it runs, answers 404 elsewhere, exits 0 on
    SIGTERM, and stops serving with it."""
    port = free_port()
    stage(pg_engine, "emails", 3)
    with running_relay(url_of(pg_engine), port) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{base}/healthz") or proc.poll() is not None, "the endpoint")
        assert proc.poll() is None
        published = ("sqla_outbox_published_total", (("queue", "emails"),))
        wait_until(lambda: scrape(port).get(published) == 3, "3 published in /metrics")
        samples = scrape(port)
        # The gauges may still show a scrape's numbers from before the publishes (they are
        # queried at most every BACKLOG_INTERVAL): here only their presence is pinned.
        assert ("sqla_outbox_pending_messages", ()) in samples
        assert ("sqla_outbox_dead_messages", ()) in samples
        assert ("sqla_outbox_oldest_pending_age_seconds", ()) in samples
        assert samples[("sqla_outbox_publish_delay_seconds_count", ())] == 3
        wait_until(lambda: http_get(f"{base}/healthz")[0] == 200, "healthz 200")
        code, body = http_get(f"{base}/healthz")
        assert code == 200 and body.startswith("ok:") and body.count("\n") == 1
        assert http_get(f"{base}/nothing")[0] == 404
        err = stop_cleanly(proc)
    assert "event=relay.serving" in err and "Traceback" not in err
    assert not answers(f"http://127.0.0.1:{port}/healthz")


@pytest.fixture
def relay_role(pg_engine: Engine) -> Iterator[str]:
    """A login role with the relay's privileges on the outbox table; dropped at the end."""
    role = f"outbox_relay_{uuid.uuid4().hex[:10]}"
    with pg_engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT SELECT, UPDATE ON outbox TO {role}"))
    yield role
    with pg_engine.begin() as conn:
        conn.execute(text(f"ALTER ROLE {role} NOLOGIN"))
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
            {"r": role},
        )
        conn.execute(text(f"DROP OWNED BY {role}"))
        conn.execute(text(f"DROP ROLE {role}"))


def test_healthz_turns_503_once_the_database_is_out_of_reach(
    pg_engine: Engine, relay_role: str
) -> None:
    """With the relay's role refused (NOLOGIN) and its sessions ended, no statement of the relay
    completes; once its liveness bound (claim lease + max backoff, 11 s here) has passed,
    ``/healthz`` answers 503 with a one-line reason. SIGTERM still exits 0."""
    port = free_port()
    url = pg_engine.url.set(username=relay_role, password=None)
    with running_relay(rendered(url), port, "--claim-lease", "1") as proc:
        healthz = f"http://127.0.0.1:{port}/healthz"
        wait_until(lambda: answers(healthz) or proc.poll() is not None, "the endpoint")
        wait_until(lambda: http_get(healthz)[0] == 200, "healthz 200")
        with pg_engine.begin() as conn:
            conn.execute(text(f"ALTER ROLE {relay_role} NOLOGIN"))
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                {"r": relay_role},
            )
        wait_until(lambda: http_get(healthz)[0] == 503, "healthz 503", timeout=60)
        code, body = http_get(healthz)
        assert code == 503 and body.startswith("unhealthy:") and body.count("\n") == 1
        assert "11 s" in body
        err = stop_cleanly(proc)
    assert "event=relay.database_error" in err and "Traceback" not in err


def rendered(url: Any) -> str:
    return str(url.render_as_string(hide_password=False))


def test_a_taken_metrics_port_fails_before_relaying(pg_engine: Engine) -> None:
    """A port something else listens on ends the command with one sentence naming the port and
    the fix, exit 1, before anything is published."""
    stage(pg_engine, "emails", 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "relay",
            "--publisher",
            "stdout",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            url=url_of(pg_engine),
        )
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0]
    assert "--metrics-port" in errors[0] and result.stdout == ""


# --- status thresholds: alerting without Prometheus ---------------------------------------------


def age_rows(engine: Engine, seconds: float, *, due: bool = True) -> None:
    """Make every pending row look staged ``seconds`` ago, and due since then unless ``due`` is
    false (each keeps its ``run_at``)."""
    then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)
    values = {"staged_at": then, **({"run_at": then} if due else {})}
    with engine.begin() as conn:
        conn.execute(update(outbox.OutboxRow).values(**values))


def test_status_max_age_exits_3_when_the_oldest_message_is_older(engine: Engine) -> None:
    """``status --max-age`` exits 0 while the oldest pending message is younger than the
    threshold and 3 (naming the threshold on stderr, after the usual report) once it is older."""
    stage(engine, "emails", 2)
    age_rows(engine, 3600)
    calm = run_cli("status", "--max-age", "7200", url=url_of(engine))
    assert calm.returncode == 0, calm.stderr
    assert "Threshold crossed" not in calm.stderr

    alert = run_cli("status", "--max-age", "60", url=url_of(engine))
    assert alert.returncode == 3, alert.stderr
    assert "pending (unpublished)" in alert.stdout
    [line] = alert.stderr.splitlines()
    assert line.startswith("Threshold crossed: a message has waited 36")
    assert "since it came due" in line
    assert "over --max-age 60." in line


def test_status_max_age_counts_the_wait_since_a_message_came_due(engine: Engine) -> None:
    """On PostgreSQL and SQLite, a message scheduled for later is not late, however long ago it
    was staged: ``status --max-age`` and the age gauge measure the wait since a message came due
    (its ``run_at``, when later than its staging). Measured from ``staged_at``, a reminder
    scheduled for tomorrow paged the operator today."""
    now = dt.datetime.now(dt.timezone.utc)
    stage(engine, "reminders", 2, run_at=now + dt.timedelta(hours=2))
    age_rows(engine, 3600, due=False)
    calm = run_cli("status", "--json", "--max-age", "600", url=url_of(engine))
    assert calm.returncode == 0, calm.stderr
    report = json.loads(calm.stdout)
    assert (report["pending"], report["due"], report["oldest_pending_age_seconds"]) == (2, 0, None)
    assert read_backlog(engine).oldest_age_seconds == 0.0

    stage(engine, "emails", 1, run_at=now - dt.timedelta(minutes=20))
    age_rows(engine, 3600, due=False)  # staged an hour ago, due for twenty minutes
    alert = run_cli("status", "--json", "--max-age", "600", url=url_of(engine))
    assert alert.returncode == 3, alert.stderr
    waited = json.loads(alert.stdout)["oldest_pending_age_seconds"]
    assert 1200 <= waited < 1260
    assert 1200 <= read_backlog(engine).oldest_age_seconds < 1260
    [line] = alert.stderr.splitlines()
    assert line.startswith("Threshold crossed: a message has waited 120")


def test_status_max_dead_exits_3_when_there_are_more_dead_letters(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """``status --max-dead 0`` (also from ``SQLA_OUTBOX_MAX_DEAD``) exits 0 with no dead letter
    and 3 with one; ``--json`` keeps stdout one JSON object while stderr says which threshold."""
    assert run_cli("status", "--max-dead", "0", url=url_of(pg_engine)).returncode == 0
    stage_failing(pg_engine, "invoices")
    make_relay(pg_engine, fail_flagged, max_publish_attempts=1).drain()
    alert = run_cli("status", "--json", url=url_of(pg_engine), max_dead="0")
    assert alert.returncode == 3, alert.stderr
    assert json.loads(alert.stdout)["dead"] == 1
    assert alert.stderr.splitlines() == [
        "Threshold crossed: 1 dead letter, over --max-dead 0 (`sqla-outbox dead list` shows them)."
    ]
    assert run_cli("status", "--max-dead", "1", url=url_of(pg_engine)).returncode == 0


def test_status_threshold_exit_code_differs_from_an_unreadable_outbox(pg_engine: Engine) -> None:
    """An unreachable database exits 1, a bad threshold 2: neither is mistaken for the 3 of a
    crossed threshold."""
    missing = pg_engine.url.set(database=f"missing_{uuid.uuid4().hex[:8]}")
    unreachable = run_cli("status", "--max-dead", "0", url=rendered(missing))
    assert unreachable.returncode == 1, unreachable.stderr
    assert "Cannot connect" in unreachable.stderr
    for bad in (["--max-age", "-1"], ["--max-age", "nan"], ["--max-dead", "-1"]):
        result = run_cli("status", *bad, url=url_of(pg_engine))
        assert result.returncode == 2, (bad, result.stderr)
        assert bad[0] in result.stderr
