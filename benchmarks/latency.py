"""Workload 6: commit-to-publish latency, p50 and p99.

A relay runs with ``start()`` in this process, its publisher noting ``time.monotonic_ns()`` when
a message arrives. A producer commits single enqueues (a new ``Session``, one
``outbox.enqueue``, ``commit()``) spaced 10-20 ms apart (15 ms with random jitter) and notes
``time.monotonic_ns()`` right after each ``commit()`` returns. Latency = receipt - commit return.
``CLOCK_MONOTONIC`` is one clock for the whole machine on Linux, so the two notes compare across
processes.

Three arms, interleaved by rounds, samples pooled per arm:

* **LISTEN/NOTIFY (other process)**: the default relay; the producer is a separate process
  (multiprocessing ``spawn``), so the only wake-up is the table trigger's ``NOTIFY`` reaching the
  relay's ``LISTEN`` connection. The in-process wake (:func:`sqla_outbox.notify.wake_local`)
  cannot fire: the producer process runs no relay.
* **in-process wake**: the same relay, the producer a thread of this process, so a commit wakes
  the relay directly (and the NOTIFY arrives too; whichever is first wins).
* **poll only** (the baseline): ``Relay(..., poll_only=True, poll_interval=0.2)``, producer in
  the other process: what a relay without wake-ups achieves at the default interval.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

import sqla_outbox as outbox
from benchmarks.harness import Context, Result, Target, interleave, make_engine, percentile
from sqla_outbox.message import OutboxMessage

__all__ = ["produce", "run"]

SPACING = 0.015
"""Seconds between commits; each gap is drawn uniformly from 10 to 20 ms."""
POLL_INTERVAL = 0.2
LISTEN_SETTLE = 0.3
"""Seconds given a started relay to open its LISTEN connection before the first commit."""
DRAIN_WAIT = 5.0

Samples = list[tuple[int, int]]
"""(sequence number, monotonic ns when commit() returned)."""


def produce(sessions: sessionmaker[Session], run_id: int, count: int, seed: int) -> Samples:
    """Commit ``count`` single enqueues, jittered; return when each commit returned."""
    rng = random.Random(seed)
    committed: Samples = []
    for seq in range(count):
        with sessions() as session:
            outbox.enqueue(session, "latency_probe", {"run": run_id, "seq": seq})
            session.commit()
            committed.append((seq, time.monotonic_ns()))
        time.sleep(SPACING * rng.uniform(2 / 3, 4 / 3))
    return committed


def _producer_process(url: str, pipe: Connection) -> None:
    """Entry point of the spawned producer: serve ``(run_id, count, seed)`` requests."""
    engine = make_engine(make_url(url))
    sessions = sessionmaker(engine)
    produce(sessions, -1, 3, 0)  # connect and warm up before the first timed request
    pipe.send("ready")
    while (request := pipe.recv()) is not None:
        run_id, count, seed = request
        pipe.send(produce(sessions, run_id, count, seed))
    engine.dispose()


class _Recorder:
    """Publisher noting when each probe arrives (first arrival only)."""

    def __init__(self) -> None:
        self.received: dict[tuple[int, int], int] = {}
        self.lock = threading.Lock()

    def publish(self, message: OutboxMessage) -> None:
        now = time.monotonic_ns()
        key = (message.input["run"], message.input["seq"])
        with self.lock:
            self.received.setdefault(key, now)

    def wait_for(self, run_id: int, count: int) -> None:
        deadline = time.monotonic() + DRAIN_WAIT
        while time.monotonic() < deadline:
            with self.lock:
                if sum(1 for r, _ in self.received if r == run_id) >= count:
                    return
            time.sleep(0.01)


class _Producer:
    """The spawned producer process, reused by every round."""

    def __init__(self, url: URL) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        rendered = url.render_as_string(hide_password=False)
        self.process = context.Process(target=_producer_process, args=(rendered, child))
        self.process.start()
        self.pipe.recv()  # "ready"

    def produce(self, run_id: int, count: int, seed: int) -> Samples:
        self.pipe.send((run_id, count, seed))
        samples: Samples = self.pipe.recv()
        return samples

    def close(self) -> None:
        self.pipe.send(None)
        self.process.join(10)


def run(ctx: Context) -> list[Result]:
    scale = ctx.scale
    ctx.clear_tables()
    per_round = max(1, scale.latency_samples // scale.latency_rounds)
    recorder = _Recorder()
    latencies: dict[str, list[float]] = {"listen": [], "in-process": [], "poll": []}
    lost: dict[str, int] = dict.fromkeys(latencies, 0)
    run_ids = iter(range(1_000_000))
    ctx.log("starting the producer process (spawn)")
    producer = _Producer(ctx.url)

    def arm(name: str, make_relay: Callable[[], outbox.Relay], local: bool) -> Callable[[], float]:
        def one_round() -> float:
            run_id = next(run_ids)
            relay = make_relay()
            relay.start()
            time.sleep(LISTEN_SETTLE)
            if local:
                committed = produce(ctx.sessions, run_id, per_round, seed=run_id)
            else:
                committed = producer.produce(run_id, per_round, seed=run_id)
            recorder.wait_for(run_id, per_round)
            relay.stop()
            this_round: list[float] = []
            for seq, at in committed:
                received = recorder.received.get((run_id, seq))
                if received is None:
                    lost[name] += 1
                else:
                    this_round.append((received - at) / 1e6)
            latencies[name].extend(this_round)
            return percentile(this_round, 50) if this_round else float("nan")

        return one_round

    def listening() -> outbox.Relay:
        return outbox.Relay(ctx.engine, recorder)

    def polling() -> outbox.Relay:
        return outbox.Relay(ctx.engine, recorder, poll_only=True, poll_interval=POLL_INTERVAL)

    ctx.log(f"{per_round} commits per round x {scale.latency_rounds} rounds per arm")
    try:
        interleave(
            {
                "listen": arm("listen", listening, local=False),
                "in-process": arm("in-process", listening, local=True),
                "poll": arm("poll", polling, local=False),
            },
            scale.latency_rounds,
        )
    finally:
        producer.close()
    return _rows(latencies, lost)


def _rows(latencies: dict[str, list[float]], lost: dict[str, int]) -> list[Result]:
    poll = latencies["poll"]
    labels = {"listen": "LISTEN/NOTIFY (other process)", "in-process": "in-process wake"}
    bounds = {50: 3.0, 99: 20.0}
    results: list[Result] = []
    for arm, label in labels.items():
        for pct, bound in bounds.items():
            extra: dict[str, Any] = {"samples": len(latencies[arm]), "lost": lost[arm]}
            extra["max_ms"] = max(latencies[arm], default=float("nan"))
            results.append(
                Result(
                    name=f"latency p{pct}: {label}",
                    unit="ms",
                    ours=percentile(latencies[arm], pct),
                    baseline=percentile(poll, pct),
                    baseline_name=f"poll {POLL_INTERVAL:g} s",
                    targets=(Target("ours", "<=", bound, "ms"),) if arm == "listen" else (),
                    samples={arm: latencies[arm], "poll": poll} if pct == 50 else {},
                    extra=extra | {"poll_lost": lost["poll"]},
                )
            )
    return results
