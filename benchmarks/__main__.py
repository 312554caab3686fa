"""The benchmark suite: ``.venv/bin/python -m benchmarks [--quick] [--only NAME] [--json PATH]``.

The suite creates its own databases (``<db>``, ``<db>_history`` and ``<db>_held`` from ``--url``),
drops them when it is done (unless ``--keep``), runs the selected workloads and prints one table.
Progress goes to stderr, the table to stdout. See ``docs/performance.md`` for what each row means.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from benchmarks import (
    brokers,
    claim_history,
    drain,
    drain_failures,
    enqueue,
    held_back,
    latency,
    memory,
    observed,
    purge,
)
from benchmarks.harness import (
    DEFAULT_URL,
    Context,
    Result,
    Scale,
    drop_database,
    libpq_conninfo,
    load_average,
    machine_facts,
    make_engine,
    print_table,
    recreate_database,
    server_facts,
    write_json,
)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    module: str
    run: Callable[[Context], list[Result]]


WORKLOADS = (
    Workload("enqueue_1", "enqueue", enqueue.run_single),
    Workload("enqueue_10", "enqueue", enqueue.run_batch),
    Workload("drain", "drain", drain.run_drain),
    Workload("two_relays", "drain", drain.run_two_relays),
    Workload("drain_failures", "drain_failures", drain_failures.run),
    Workload("claim_history", "claim_history", claim_history.run),
    Workload("claim_held_back", "held_back", held_back.run),
    Workload("latency", "latency", latency.run),
    Workload("memory", "memory", memory.run),
    Workload("brokers", "brokers", brokers.run),
    Workload("drain_observed", "observed", observed.run),
    Workload("purge", "purge", purge.run),
)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = sorted({w.name for w in WORKLOADS} | {w.module for w in WORKLOADS})
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="sqla-outbox against raw SQL on the same table, interleaved.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("SQLA_OUTBOX_BENCH_URL", DEFAULT_URL),
        help="postgresql+psycopg URL; its database is DROPPED and recreated "
        "(default: %(default)s, or $SQLA_OUTBOX_BENCH_URL)",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (under a minute)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these workloads (repeatable or comma-separated): {', '.join(names)}",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every number to PATH")
    parser.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    args = parser.parse_args(argv)
    wanted = {part for item in args.only or () for part in item.split(",") if part}
    unknown = wanted - set(names)
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}; choose from {names}")
    args.selected = [w for w in WORKLOADS if not wanted or {w.name, w.module} & wanted]
    return args


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    url = sa.make_url(args.url)
    scale = Scale.quick() if args.quick else Scale.full()
    recreate_database(url)
    engine = make_engine(url)
    ctx = Context(url=url, scale=scale, engine=engine, quick=args.quick, log=_log)
    results: list[Result] = []
    load_before = load_average()
    _log(f"{os.cpu_count()} CPUs, load average {load_before}")
    started = time.perf_counter()
    try:
        for workload in args.selected:
            _log(f"== {workload.name}")
            rows = workload.run(ctx)
            results.extend(rows)
            print_table(rows)
            ctx.engine.dispose()
    finally:
        engine.dispose()
        if not args.keep:
            drop_database(url)
            drop_database(claim_history.history_url(url))
            drop_database(held_back.held_url(url))
    elapsed = time.perf_counter() - started
    load_after = load_average()
    print()
    print(
        f"sqla-outbox benchmarks ({'quick' if args.quick else 'full'} run, {elapsed:.0f} s; "
        f"{os.cpu_count()} CPUs, load average {load_before} before, {load_after} after)"
    )
    print_table(results)
    if args.json:
        meta = {
            "mode": "quick" if args.quick else "full",
            "seconds": round(elapsed, 1),
            "scale": asdict(scale),
            "machine": machine_facts() | {"load_average_before": load_before},
            "server": server_facts(libpq_conninfo(url.set(database="postgres"))),
        }
        write_json(args.json, results, meta)
        _log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
