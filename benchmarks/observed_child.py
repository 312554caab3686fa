"""One arm of workload ``drain_observed`` in a process of its own (``python -m
benchmarks.observed_child ARM``).

The library turns metrics on whenever ``prometheus_client`` can be imported and tracing whenever
``opentelemetry`` can, for the whole process. So "a deployment without the extras" cannot share
a process with one that has them: each arm is a child of the suite (:mod:`benchmarks.observed`),
and the ``bare`` child blocks both packages (``sys.modules[name] = None``) before anything
imports sqla_outbox. ARM is one of :data:`ARMS`:

* ``bare``: neither package importable; the relay records no metrics and its publisher is not
  wrapped for tracing.
* ``observed``: a ``prometheus_client.CollectorRegistry()`` passed as ``registry=``, the
  OpenTelemetry API importable, no SDK configured (the wrapper checks for a provider and calls
  the publisher directly).
* ``sdk``: as ``observed``, plus an OpenTelemetry SDK ``TracerProvider`` set as the global one,
  with no span processor or exporter: every message gets a real PRODUCER span that goes nowhere.

The database URL is read from ``$SQLA_OUTBOX_BENCH_CHILD_URL`` (a command line would show its
password in ``ps``). The parent speaks one line at a time:

* the child first prints ``{"ready": ARM}`` as JSON once its imports and checks are done;
* ``drain B`` asks for one timed ``Relay(engine, noop, batch_size=B, relay_id="ours").drain()``
  of whatever the outbox holds (the parent restores the snapshot first); the child answers
  ``{"published": n, "seconds": s}``. Only the ``drain()`` call is timed: a fresh pool
  connection, a garbage collection and building the relay come before it, closing the relay and
  the checks after it;
* end of input ends the child.

Every drain is checked, untimed, and a check that fails ends the child with the reason on
stderr and a non-zero status, which the parent reports: the ``observed`` and ``sdk`` relays must
have their publisher wrapped and must have counted exactly the rows they published in
``sqla_outbox_published_total``; the ``sdk`` arm's wrapper must publish inside a recording span;
the ``bare`` relay must have an unwrapped publisher, and neither package may have been imported.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqla_outbox.message import OutboxMessage

__all__ = ["ARMS", "EXTRAS", "URL_VARIABLE", "main"]

ARMS = ("bare", "observed", "sdk")
EXTRAS = ("prometheus_client", "opentelemetry")
"""The packages whose presence turns the library's metrics and tracing on."""
URL_VARIABLE = "SQLA_OUTBOX_BENCH_CHILD_URL"


class ArmCheckError(RuntimeError):
    """The arm does not measure what it claims to (metrics or tracing on when they should be
    off, or the reverse)."""


def _noop(_message: object) -> None:
    return None


def _block_extras() -> None:
    """Make both extras unimportable, as if they were not installed."""
    imported = {name.split(".")[0] for name in sys.modules} & set(EXTRAS)
    if imported:
        raise ArmCheckError(
            f"the bare arm must block {', '.join(EXTRAS)} before they are imported, but "
            f"{', '.join(sorted(imported))} already were; nothing may import them before "
            "benchmarks.observed_child does."
        )
    for name in EXTRAS:
        # None in sys.modules makes "import name" (and of its submodules) raise ImportError,
        # and importlib.util.find_spec(name) return None: what an absent package does.
        sys.modules[name] = None  # type: ignore[assignment]


def _set_sdk_provider() -> None:
    from opentelemetry import trace  # noqa: PLC0415 - the sdk arm only
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - the sdk arm only

    trace.set_tracer_provider(TracerProvider())


def _probe_message() -> OutboxMessage:
    from sqla_outbox.message import OutboxMessage  # noqa: PLC0415 - after the extras' fate

    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(uuid.uuid4(), "probe", "default", {}, "probe", 3, now, now)


def _span_recording() -> bool:
    """Whether the library's tracing wrapper publishes inside a recording span right now."""
    from opentelemetry import trace  # noqa: PLC0415 - observed and sdk arms only

    from sqla_outbox.tracing import trace_publish  # noqa: PLC0415

    seen: list[bool] = []

    def probe(_message: object) -> None:
        seen.append(trace.get_current_span().is_recording())

    trace_publish(probe, probe)(_probe_message())
    return seen == [True]


class _Arm:
    """The relay of one arm, built afresh for every drain on one engine kept for the process."""

    def __init__(self, arm: str, url: str) -> None:
        import sqlalchemy as sa  # noqa: PLC0415 - after the extras' fate

        from benchmarks.harness import make_engine  # noqa: PLC0415

        self.arm = arm
        self.engine = make_engine(sa.make_url(url))
        self.registry: Any = None
        if arm != "bare":
            from prometheus_client import CollectorRegistry  # noqa: PLC0415

            self.registry = CollectorRegistry()
        if arm == "sdk":
            _set_sdk_provider()

    def published_total(self) -> float:
        value = self.registry.get_sample_value("sqla_outbox_published_total", {"queue": "default"})
        return 0.0 if value is None else float(value)

    def drain(self, batch_size: int) -> dict[str, Any]:
        import sqla_outbox as outbox  # noqa: PLC0415 - after the extras' fate
        from benchmarks.drain import BENCH_RELAY_ID  # noqa: PLC0415
        from benchmarks.harness import fresh_pool  # noqa: PLC0415

        counted_before = self.published_total() if self.registry is not None else 0.0
        fresh_pool(self.engine)
        gc.collect()
        relay = outbox.Relay(
            self.engine,
            _noop,
            batch_size=batch_size,
            relay_id=BENCH_RELAY_ID,
            registry=self.registry,
        )
        start = time.perf_counter()
        published = relay.drain().published
        seconds = time.perf_counter() - start
        relay.close()
        self.check(relay, published, counted_before)
        return {"published": published, "seconds": seconds}

    def check(self, relay: Any, published: int, counted_before: float) -> None:
        """Fail loudly unless this arm's relay had exactly the instrumentation it stands for."""
        # The relay's publisher as it calls it: wrapped by sqla_outbox.tracing iff the
        # OpenTelemetry API is importable (a private attribute: the most direct evidence).
        wrapped = relay._publish is not _noop
        if self.arm == "bare":
            from sqla_outbox.metrics import prometheus_available  # noqa: PLC0415

            leaked = [name for name in EXTRAS if sys.modules.get(name) is not None]
            if wrapped or leaked or prometheus_available():
                raise ArmCheckError(
                    f"the bare arm is not bare: publisher wrapped for tracing={wrapped}, "
                    f"imported={leaked}, prometheus_client findable={prometheus_available()}."
                )
            return
        counted = self.published_total() - counted_before
        if not wrapped or counted != published:
            raise ArmCheckError(
                f"the {self.arm} arm is not observed: publisher wrapped for tracing={wrapped}, "
                f"sqla_outbox_published_total grew by {counted:g} for {published} published "
                "rows (they must be equal)."
            )
        recording = _span_recording()
        if recording != (self.arm == "sdk"):
            raise ArmCheckError(
                f"the {self.arm} arm's publish spans are "
                f"{'recording' if recording else 'not recording'}; expected "
                f"{'recording (an SDK is set)' if self.arm == 'sdk' else 'none (no SDK)'}."
            )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ARMS:
        print(f"usage: python -m benchmarks.observed_child {{{','.join(ARMS)}}}", file=sys.stderr)
        return 2
    arm = args[0]
    url = os.environ.get(URL_VARIABLE)
    if not url:
        print(f"set {URL_VARIABLE} to the benchmark database's URL", file=sys.stderr)
        return 2
    if arm == "bare":
        _block_extras()  # before anything below imports sqla_outbox
    runner = _Arm(arm, url)
    print(json.dumps({"ready": arm}), flush=True)
    for line in sys.stdin:
        command, _, value = line.strip().partition(" ")
        if command != "drain" or not value.isdigit():
            raise ArmCheckError(f"unknown command {line.strip()!r}; expected 'drain <batch>'.")
        print(json.dumps(runner.drain(int(value))), flush=True)
    runner.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
