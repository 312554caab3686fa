"""Workload ``drain_observed``: what metrics and tracing cost a draining relay.

The drain of workload 3 (:mod:`benchmarks.drain`: ``Relay(engine, noop, batch_size=b,
relay_id="ours").drain()`` of the same ``drain_rows`` snapshot, restored untimed before every
drain) in three deployments, interleaved per batch size (100 and 1,000):

* **metrics + tracing API** (ours): prometheus_client installed and a ``CollectorRegistry``
  passed as ``registry=``, so every pass feeds the counters and the publish-delay histogram;
  the OpenTelemetry API installed and no SDK configured, so every publish goes through the
  tracing wrapper, which finds no provider and calls the publisher. What most deployments that
  install ``sqla-outbox[prometheus,otel]`` and export nothing yet pay.
* **no extras** (the baseline): neither package importable: no metrics, publisher unwrapped.
* **tracing SDK** (informative, batch 100 only: see :data:`SDK_BATCH_SIZES`): as ours, plus an
  SDK ``TracerProvider`` set as the global one, with no span processor or exporter: a PRODUCER
  span created, given its attributes, made current and ended per message, then dropped. A real
  exporter adds its own cost on top.

Target: ours / no extras >= 0.95 at both batch sizes. Each row's JSON ``extra`` also has
``added_us_per_message``: the median over the rounds of ``1/ours - 1/baseline`` in microseconds,
what the arm adds to every message whatever the rate.

The library decides per process (metrics whenever ``prometheus_client`` is importable, tracing
whenever ``opentelemetry`` is), so each arm is a long-lived child process
(:mod:`benchmarks.observed_child`, started once per run, one per arm) that drains when told to
and reports the rows and seconds of the ``drain()`` call alone; the bare child blocks both
packages before it imports sqla_outbox. Every arm runs in a child, so each is measured the same
way (the parent does the restores). Each child checks, after every drain, that it has the
instrumentation its arm names (the counter equals the rows published, the publisher is or is not
wrapped, spans record only with the SDK) and exits with the reason otherwise; the parent then
raises.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from benchmarks.drain import _prepare
from benchmarks.harness import Context, Result, Target, compare, interleave, restore_outbox
from benchmarks.observed_child import URL_VARIABLE

__all__ = ["BATCH_SIZES", "run"]

BATCH_SIZES = (100, 1000)
SDK_BATCH_SIZES = (100,)
"""The SDK arm runs at batch 100 only: a span costs the same per message at any batch size,
and at 1,000 its drains would add a fifth to the workload's time."""
TARGET_RATIO = 0.95

OURS = "metrics + tracing API"
BARE = "no extras"
SDK = "tracing SDK"
CHILD_ARMS = {OURS: "observed", BARE: "bare", SDK: "sdk"}
"""Row arm names and the child's name for each."""

_REPO = Path(__file__).resolve().parent.parent


class _Child:
    """One arm's child process, kept for the whole workload."""

    def __init__(self, ctx: Context, arm: str) -> None:
        self.arm = arm
        env = os.environ | {URL_VARIABLE: ctx.url.render_as_string(hide_password=False)}
        # stderr is the suite's: a failed check's traceback shows in the run's progress log.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.observed_child", arm],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=_REPO,
            env=env,
        )
        ready = self._answer()
        if ready.get("ready") != arm:
            raise RuntimeError(f"child {arm!r} answered {ready!r} instead of being ready")

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def _answer(self) -> dict[str, Any]:
        line = self._pipes()[1].readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(
                f"the {self.arm!r} child of benchmarks.observed exited with status {code}; "
                "its error is above (an arm that does not measure what it names, or a failed "
                "drain)."
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def drain(self, batch_size: int) -> tuple[int, float]:
        stdin = self._pipes()[0]
        stdin.write(f"drain {batch_size}\n")
        stdin.flush()
        answer = self._answer()
        return int(answer["published"]), float(answer["seconds"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _rate_arm(
    ctx: Context, child: _Child, batch_size: int, counts: list[int]
) -> Callable[[], float]:
    def arm() -> float:
        restore_outbox(ctx)
        published, seconds = child.drain(batch_size)
        if published != ctx.scale.drain_rows:
            raise RuntimeError(
                f"the {child.arm!r} drain published {published} of {ctx.scale.drain_rows} rows"
            )
        counts.append(published)
        return published / seconds

    return arm


def _added_microseconds(samples: dict[str, list[float]], arm: str) -> float:
    """Median over the rounds of what ``arm`` adds per message to the bare drain, in µs."""
    return statistics.median(
        1e6 * (1 / ours - 1 / bare) for ours, bare in zip(samples[arm], samples[BARE], strict=True)
    )


def run(ctx: Context) -> list[Result]:
    """Drain rows/s with metrics and tracing against without, at batch 100 and 1,000."""
    _prepare(ctx)
    ctx.log("starting one child process per arm: " + ", ".join(CHILD_ARMS))
    children: dict[str, _Child] = {}
    results: list[Result] = []
    try:
        for name, arm in CHILD_ARMS.items():
            children[name] = _Child(ctx, arm)
        for batch_size in BATCH_SIZES:
            names = [OURS, BARE] + ([SDK] if batch_size in SDK_BATCH_SIZES else [])
            ctx.log(f"drain b={batch_size}: {' / '.join(names)}, interleaved")
            counts: dict[str, list[int]] = {name: [] for name in names}
            arms = {
                name: _rate_arm(ctx, children[name], batch_size, counts[name]) for name in names
            }
            samples = interleave(arms, ctx.scale.drain_rounds)
            results.append(
                compare(
                    f"drain b={batch_size}, metrics + tracing API vs no extras",
                    "rows/s",
                    samples,
                    OURS,
                    BARE,
                    Target("ratio", ">=", TARGET_RATIO),
                    added_us_per_message=_added_microseconds(samples, OURS),
                    published_per_round=counts,
                )
            )
            if SDK in samples:
                results.append(
                    compare(
                        f"drain b={batch_size}, tracing SDK (spans, no exporter) vs no extras",
                        "rows/s",
                        samples,
                        SDK,
                        BARE,
                        added_us_per_message=_added_microseconds(samples, SDK),
                    )
                )
    finally:
        for child in children.values():
            child.close()
    return results
