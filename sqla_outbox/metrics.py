"""Prometheus metrics of the relays of a process (``pip install "sqla-outbox[prometheus]"``).

Every :class:`~sqla_outbox.Relay` built while ``prometheus_client`` is importable records into
the registry given as ``Relay(..., registry=...)`` (``None``: prometheus_client's default
``REGISTRY``). Without the package nothing here imports it and a relay pays nothing.

**What is recorded.**

* ``sqla_outbox_published_total{queue}``: messages published, counted when the relay reports
  the pass (a pass published in full reports before its mark rides on the next claim: a relay
  killed in between publishes those messages again, and counts them again).
* ``sqla_outbox_publish_failures_total{queue}``: publishes that raised: each message the broker
  refused (charged an attempt), and each pass a broker outage ended (charged to nobody; counted
  on the queue of the message being published). A broker that stays down counts one failure per
  retry of the relay's loop.
* ``sqla_outbox_dead_letters_total{queue}``: messages that became dead letters.
* ``sqla_outbox_publish_delay_seconds`` (histogram): from ``staged_at`` to the relay's report of
  the publish, per published message; retries and their backoff included. ``staged_at`` comes
  from the clock of whoever staged the row, the report from the relay host's: clock skew shows
  here (a negative delay counts as 0).
* ``sqla_outbox_pending_messages``, ``sqla_outbox_dead_messages``,
  ``sqla_outbox_oldest_pending_age_seconds`` (gauges): the numbers ``sqla-outbox status`` shows
  as pending (dead letters included), dead letters, and how long the longest-waiting message
  has been due: since it was staged, or since its ``run_at`` if later (0 when none is due; a
  message scheduled for later does not count, a dead letter keeps it growing until it is
  retried or discarded).

**What the gauges cost.** They come from one statement
(:func:`~sqla_outbox.queries.backlog_stmt`, restricted to unpublished rows) run when the
registry is collected, i.e. on a scrape, and at most once per :data:`BACKLOG_INTERVAL` seconds
whatever the number of scrapers: a collection within that interval of the last query serves its
numbers, and concurrent scrapes wait for the one query in flight. Nothing queries when nobody
scrapes. If the query fails the gauges are left out of that scrape (and the failure logged as
``event=metrics.backlog_failed``) rather than served stale: ``absent()`` alerts on it.

**What recording costs.** The counters and the histogram are fed by a
:class:`~sqla_outbox.observers.PassObserver` on the relay's thread, once per pass: one counter
update per queue, and the delays binned for the whole pass at once (:class:`DelayHistogram`),
so that a drain recording them (and tracing through the API) keeps to the ``drain_observed``
benchmark's target: at least 0.95 of the same drain without either.

**Several relays, one registry.** The metrics of a registry are created once and shared by every
relay recording into it, so two relays in one process on the default registry do not collide
(prometheus_client refuses a second metric of the same name with "Duplicated timeseries").
Counters and the histogram add up over the relays. The gauges describe the outbox tables those
relays serve: one query per distinct database URL, pending and dead summed, the oldest age the
largest. A relay stops counting towards the gauges once it has been garbage-collected.

The trap: a registry given to the relay is the one to serve (``generate_latest(registry)``,
``sqla-outbox relay --metrics-port``); metrics recorded in a private ``CollectorRegistry`` do not
appear on the default one.
"""

from __future__ import annotations

import bisect
import collections
import datetime as dt
import importlib.util
import logging
import math
import operator
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import Engine

from sqla_outbox.engines import hide_password
from sqla_outbox.logs import error_line, log_event
from sqla_outbox.observers import PassReport
from sqla_outbox.stores.operating import operations_for

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from sqla_outbox.relay import Relay

__all__ = [
    "BACKLOG_INTERVAL",
    "DELAY_BUCKETS",
    "PROMETHEUS_MISSING",
    "Backlog",
    "BacklogNumbers",
    "DelayHistogram",
    "Registry",
    "RelayMetrics",
    "metrics_for",
    "prometheus_available",
    "read_backlog",
    "relay_metrics",
]

log = logging.getLogger("sqla_outbox.metrics")

Registry: TypeAlias = "CollectorRegistry"
"""prometheus_client's ``CollectorRegistry``, named without importing it at run time."""

PROMETHEUS_MISSING = (
    "Prometheus metrics need the prometheus-client package, which is not installed. Install it "
    'with pip install "sqla-outbox[prometheus]".'
)

BACKLOG_INTERVAL = 5.0
"""Seconds: the backlog gauges are queried at most this often, however often they are scraped."""

DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Upper bounds, in seconds, of ``sqla_outbox_publish_delay_seconds``: a healthy relay publishes
within a poll interval or two; retry backoffs (up to ``retry_max``, 300 s by default) and
outages land in the long buckets."""


def prometheus_available() -> bool:
    """Whether ``prometheus_client`` can be imported (without importing it)."""
    return importlib.util.find_spec("prometheus_client") is not None


# --- the backlog gauges ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BacklogNumbers:
    """What :func:`~sqla_outbox.queries.backlog_stmt` returned, summed over databases."""

    pending: int
    dead: int
    oldest_age_seconds: float


def read_backlog(engine: Engine) -> BacklogNumbers:
    """Read the backlog once on ``engine`` (its store's
    :meth:`~sqla_outbox.stores.operating.Operations.backlog`: ages by the clock that rules
    there, as ``sqla-outbox status`` measures them)."""
    with engine.connect() as conn:
        return BacklogNumbers(*operations_for(engine.dialect.name).backlog(conn))


class Backlog:
    """The gauges' collector: one query per database at most every ``interval`` seconds.

    Registered once per registry; :meth:`watch` adds a relay whose database the gauges cover
    (held weakly). :meth:`collect` is what prometheus_client calls on each scrape.
    """

    def __init__(
        self,
        interval: float = BACKLOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[Engine], BacklogNumbers] = read_backlog,
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._read = read
        self._relays: weakref.WeakSet[Relay] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._numbers: BacklogNumbers | None = None

    def watch(self, relay: Relay) -> None:
        """Cover ``relay``'s database from the next query on."""
        with self._lock:
            self._relays.add(relay)
            self._read_at = None  # a new database: do not serve numbers that leave it out

    def numbers(self) -> BacklogNumbers | None:
        """The backlog, queried now if the last query is ``interval`` old; ``None`` if the query
        failed or no relay is watched."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.interval:
                self._read_at = now
                self._numbers = self._query()
            return self._numbers

    def _query(self) -> BacklogNumbers | None:
        engines: dict[str, Engine] = {}
        for relay in list(self._relays):
            engines.setdefault(relay.engine.url.render_as_string(hide_password=False), relay.engine)
        if not engines:
            return None
        pending = dead = 0
        oldest = 0.0
        for engine in engines.values():
            try:
                numbers = self._read(engine)
            except Exception as error:
                log_event(
                    log,
                    logging.WARNING,
                    "metrics.backlog_failed",
                    url=hide_password(engine.url),
                    retry_in=self.interval,
                    error=error_line(error),
                )
                return None
            pending += numbers.pending
            dead += numbers.dead
            oldest = max(oldest, numbers.oldest_age_seconds)
        return BacklogNumbers(pending, dead, oldest)

    def describe(self) -> Iterable[Metric]:
        """The gauges without samples: lets a registry check names without a query."""
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        """The gauges, from the database (at most once per ``interval``)."""
        numbers = self.numbers()
        if numbers is None:
            return []
        return list(self._families(numbers))

    @staticmethod
    def _families(numbers: BacklogNumbers | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional extra

        gauges = (
            ("sqla_outbox_pending_messages", "Unpublished outbox messages, dead letters included."),
            ("sqla_outbox_dead_messages", "Dead letters: unpublished messages no relay retries."),
            (
                "sqla_outbox_oldest_pending_age_seconds",
                "Seconds the longest-waiting unpublished message has been due, since it was "
                "staged or its run_at if later (0 when none is due).",
            ),
        )
        values = (
            (None, None, None)
            if numbers is None
            else (numbers.pending, numbers.dead, numbers.oldest_age_seconds)
        )
        for (name, documentation), value in zip(gauges, values, strict=True):
            yield GaugeMetricFamily(name, documentation, value=value)


# --- the counters and the histogram ------------------------------------------------------------


class DelayHistogram:
    """``sqla_outbox_publish_delay_seconds``, fed one pass at a time.

    prometheus_client's ``Histogram.observe`` takes two locks and walks the buckets per value:
    a cost per message, which a fast drain feels. A pass hands its staging times
    over at once instead: sorted, each bucket's count is one ``bisect`` (the messages staged
    less than the bucket's bound ago), and the totals are added under one lock per pass.
    """

    name = "sqla_outbox_publish_delay_seconds"
    documentation = "Seconds from staging a message to publishing it."

    def __init__(self, buckets: Iterable[float] = DELAY_BUCKETS) -> None:
        self.bounds = sorted(buckets)
        self._labels = [repr(float(bound)) for bound in self.bounds]  # "le" as Prometheus writes it
        self._lock = threading.Lock()
        self._cumulative = [0] * len(self.bounds)  # messages with a delay <= each bound
        self._count = 0
        self._sum = 0.0

    def observe_staged(self, staged: list[float], now: float) -> None:
        """Add a delay of ``now - t`` for each staging time ``t`` (epoch seconds; ``staged`` is
        sorted in place). A negative delay (clock skew) counts as 0."""
        staged.sort()  # claim order is staging order: already sorted, so this is one pass
        count = len(staged)
        past = bisect.bisect_right(staged, now)  # the rest were staged "after" now: delay 0
        total = past * now - math.fsum(staged[:past])
        within = [count - bisect.bisect_left(staged, now - bound) for bound in self.bounds]
        with self._lock:
            self._count += count
            self._sum += total
            cumulative = self._cumulative
            for index, value in enumerate(within):
                cumulative[index] += value

    def describe(self) -> Iterable[Metric]:
        """The family without samples (lets a registry check names without collecting)."""
        from prometheus_client.core import HistogramMetricFamily  # noqa: PLC0415

        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterable[Metric]:
        """The histogram's buckets, count and sum."""
        from prometheus_client.core import HistogramMetricFamily  # noqa: PLC0415

        with self._lock:
            buckets = [
                (label, float(value))
                for label, value in zip(self._labels, self._cumulative, strict=True)
            ]
            buckets.append(("+Inf", float(self._count)))
            total = self._sum
        return [HistogramMetricFamily(self.name, self.documentation, buckets, total)]


class RelayMetrics:
    """The metrics of one registry; also the :class:`~sqla_outbox.observers.PassObserver` every
    relay recording into that registry subscribes.

    Thread-safe: relays on several threads report to one instance; prometheus_client's counters
    and :class:`DelayHistogram` take their own locks. The work per pass is a few C-level passes
    over its messages (see :class:`DelayHistogram`) and one counter update per queue.
    """

    def __init__(self, registry: Registry) -> None:
        from prometheus_client import Counter  # noqa: PLC0415 - optional extra

        self.published = Counter(
            "sqla_outbox_published_total",
            "Messages published to the broker.",
            ["queue"],
            registry=registry,
        )
        self.failures = Counter(
            "sqla_outbox_publish_failures_total",
            "Publishes that raised: messages the broker refused, and broker outages.",
            ["queue"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "sqla_outbox_dead_letters_total",
            "Messages that became dead letters.",
            ["queue"],
            registry=registry,
        )
        self.delay = DelayHistogram()
        registry.register(self.delay)
        self.backlog = Backlog()
        registry.register(self.backlog)

    def pass_done(self, report: PassReport) -> None:
        """Count what the pass published, failed and sent to the dead letters."""
        outcome = report.outcome
        published = outcome.published
        if published:
            now = time.time()
            self.delay.observe_staged(list(map(_timestamp, map(_staged_at, published))), now)
            for queue, count in collections.Counter(map(_queue, published)).items():
                self.published.labels(queue).inc(count)
        for message, _error in outcome.failed:
            self.failures.labels(message.queue).inc()
        if outcome.outage is not None and outcome.handed_back:
            self.failures.labels(outcome.handed_back[0].queue).inc()
        for message in report.dead:
            self.dead_letters.labels(message.queue).inc()


_staged_at = operator.attrgetter("staged_at")
_queue = operator.attrgetter("queue")
_timestamp = dt.datetime.timestamp


_BY_REGISTRY: weakref.WeakKeyDictionary[Any, RelayMetrics] = weakref.WeakKeyDictionary()
_BY_REGISTRY_LOCK = threading.Lock()


def metrics_for(registry: Registry | None = None) -> RelayMetrics:
    """The metrics of ``registry`` (default: prometheus_client's ``REGISTRY``), created and
    registered on first use. Raises ``ModuleNotFoundError`` without prometheus_client."""
    if registry is None:
        from prometheus_client import REGISTRY  # noqa: PLC0415 - optional extra

        registry = REGISTRY
    with _BY_REGISTRY_LOCK:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = _BY_REGISTRY[registry] = RelayMetrics(registry)
        return metrics


def relay_metrics(relay: Relay, registry: Registry | None) -> RelayMetrics | None:
    """What ``Relay.__init__`` subscribes: the registry's metrics, with the relay's database
    added to the gauges; ``None`` (nothing to subscribe) without prometheus_client."""
    if registry is None and not prometheus_available():
        return None
    metrics = metrics_for(registry)
    metrics.backlog.watch(relay)
    return metrics
