"""The benchmark suite: ``.venv/bin/python -m benchmarks [--quick] [--only NAME] [--json PATH]``.

The suite creates its own databases (``<db>``, ``<db>_history`` and ``<db>_held`` from ``--url``),
drops them when it is done (unless ``--keep``), runs the selected workloads and prints one table.
Progress goes to stderr, the table to stdout. See ``docs/performance.md`` for what each row means.

A ``mysql+pymysql://`` or ``mariadb+pymysql://`` URL runs the MySQL suite instead
(:mod:`benchmarks.mysql`): the enqueue and drain workloads on that server, one database.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from benchmarks import (
    brokers,
    claim_history,
    drain,
    drain_failures,
    enqueue,
    held_back,
    hot_keys,
    inbox,
    large_transactions,
    latency,
    memory,
    mysql,
    not_due,
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
    Workload("large_transactions", "large_transactions", large_transactions.run),
    Workload("drain_failures", "drain_failures", drain_failures.run),
    Workload("hot_keys", "hot_keys", hot_keys.run),
    Workload("claim_history", "claim_history", claim_history.run),
    Workload("claim_held_back", "held_back", held_back.run),
    Workload("not_due", "not_due", not_due.run),
    Workload("latency", "latency", latency.run),
    Workload("memory", "memory", memory.run),
    Workload("brokers", "brokers", brokers.run),
    Workload("drain_observed", "observed", observed.run),
    Workload("purge", "purge", purge.run),
    Workload("inbox", "inbox", inbox.run),
)

MYSQL_WORKLOADS = (
    Workload("enqueue_1", "enqueue", mysql.run_enqueue_single),
    Workload("enqueue_10", "enqueue", mysql.run_enqueue_batch),
    Workload("drain", "drain", mysql.run_drain),
)
"""The MySQL/MariaDB suite: the PostgreSQL workloads it ports, under the same names."""


@dataclass(frozen=True, slots=True)
class Suite:
    """What differs between the PostgreSQL suite and the MySQL one."""

    server: str
    workloads: tuple[Workload, ...]
    scale: Callable[[bool], Scale]
    context: type[Context]
    recreate: Callable[[URL], None]
    drop: Callable[[URL], None]
    """Drops every database the suite may have created."""
    facts: Callable[[URL], dict[str, str]]


def _drop_postgresql(url: URL) -> None:
    drop_database(url)
    drop_database(claim_history.history_url(url))
    drop_database(held_back.held_url(url))


POSTGRESQL = Suite(
    server="PostgreSQL",
    workloads=WORKLOADS,
    scale=lambda quick: Scale.quick() if quick else Scale.full(),
    context=Context,
    recreate=recreate_database,
    drop=_drop_postgresql,
    facts=lambda url: server_facts(libpq_conninfo(url.set(database="postgres"))),
)
MYSQL = Suite(
    server="MySQL/MariaDB",
    workloads=MYSQL_WORKLOADS,
    scale=mysql.scale,
    context=mysql.MySQLContext,
    recreate=mysql.recreate_database,
    drop=mysql.drop_database,
    facts=mysql.server_facts,
)


def _names(workloads: Sequence[Workload]) -> set[str]:
    return {w.name for w in workloads} | {w.module for w in workloads}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = sorted(_names(WORKLOADS) | _names(MYSQL_WORKLOADS))
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="sqla-outbox against raw SQL on the same table, interleaved.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("SQLA_OUTBOX_BENCH_URL", DEFAULT_URL),
        help="postgresql+psycopg URL, or mysql+pymysql / mariadb+pymysql for the MySQL suite; "
        "its database is DROPPED and recreated (default: %(default)s, or $SQLA_OUTBOX_BENCH_URL)",
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
    url = sa.make_url(args.url)
    args.suite = MYSQL if mysql.is_mysql(url) else POSTGRESQL
    if args.suite is MYSQL and url.get_driver_name() != "pymysql":
        parser.exit(
            2,
            f"{parser.prog}: error: the MySQL suite runs on PyMySQL: use {url.get_backend_name()}+pymysql://\n",
        )
    elsewhere = wanted - _names(args.suite.workloads)
    if elsewhere:
        parser.exit(
            2,
            f"{parser.prog}: error: {', '.join(sorted(elsewhere))} "
            f"{'runs' if len(elsewhere) == 1 else 'run'} on PostgreSQL only; "
            f"on {args.suite.server} choose from {', '.join(sorted(_names(args.suite.workloads)))}"
            "\n",
        )
    args.selected = [w for w in args.suite.workloads if not wanted or {w.name, w.module} & wanted]
    return args


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    suite: Suite = args.suite
    url = sa.make_url(args.url)
    scale = suite.scale(args.quick)
    suite.recreate(url)
    engine = make_engine(url)
    ctx = suite.context(url=url, scale=scale, engine=engine, quick=args.quick, log=_log)
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
            suite.drop(url)
    elapsed = time.perf_counter() - started
    load_after = load_average()
    print()
    on = "" if suite is POSTGRESQL else f" on {suite.server}"
    print(
        f"sqla-outbox benchmarks{on} ({'quick' if args.quick else 'full'} run, {elapsed:.0f} s; "
        f"{os.cpu_count()} CPUs, load average {load_before} before, {load_after} after)"
    )
    print_table(results)
    if args.json:
        machine: dict[str, Any] = machine_facts() | {"load_average_before": load_before}
        if suite is MYSQL:
            import pymysql  # noqa: PLC0415 - only the MySQL suite has it for sure

            machine["pymysql"] = pymysql.__version__
        meta = {
            "mode": "quick" if args.quick else "full",
            "seconds": round(elapsed, 1),
            "scale": asdict(scale),
            "machine": machine,
            "server": suite.facts(url),
        }
        write_json(args.json, results, meta)
        _log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
