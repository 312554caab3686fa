"""Shared machinery: databases, the business table, interleaved timing, results and the table.

Every workload module builds its arms (zero-argument callables returning one round's number),
hands them to :func:`interleave`, and turns the per-round samples into :class:`Result` rows with
:func:`compare`. Nothing here asserts: a missed target is a row that says ``miss``.

Interleaving: the arms of one comparison run one after the other inside a round, the order
reversed every other round (ABC, CBA, ABC, ...), for several rounds. A row reports the median of
each arm's per-round numbers, and as its ratio the median of the per-round ratios (ours / baseline
within one round, seconds apart). A burst of noise (other processes on a shared machine, a
checkpoint) then lands on both sides of a ratio instead of on whichever ran second.
Arms of a few milliseconds (the enqueue workloads' committing transactions) go to
:func:`interleave_calls` instead, which interleaves them ten calls at a time within a round.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import psycopg
import sqlalchemy as sa
from sqlalchemy import BigInteger, Engine, Integer, String, Table, insert
from sqlalchemy.engine import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

import sqla_outbox as outbox

__all__ = [
    "DEFAULT_URL",
    "OUTBOX_INSERT",
    "OUTBOX_TABLE",
    "BenchOrder",
    "Context",
    "Result",
    "Scale",
    "Target",
    "compare",
    "create_tables",
    "drop_database",
    "fill_backlog",
    "format_table",
    "fresh_pool",
    "interleave",
    "interleave_calls",
    "libpq_conninfo",
    "load_average",
    "machine_facts",
    "make_engine",
    "outbox_row",
    "percentile",
    "print_table",
    "recreate_database",
    "restore_outbox",
    "run_for",
    "server_facts",
    "snapshot_outbox",
    "uuid7",
    "write_json",
]

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/sqla_outbox_bench"

OUTBOX_TABLE: Table = outbox.OutboxRow.__table__  # type: ignore[assignment]
OUTBOX_INSERT = insert(OUTBOX_TABLE)
"""The hand-written baseline's statement: a Core INSERT on the library's own table object, so
both sides bind through the same column types (JSONB, the UTC timestamp type) and driver."""


# --- scale ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scale:
    """How big and how long; ``--quick`` shrinks everything to a smoke run."""

    rounds: int
    """Rounds of the throughput comparisons (each arm runs once per round)."""
    seconds: float
    """Seconds each arm of a transactions/s comparison runs per round."""
    drain_rows: int
    """Rows pre-filled before every drain (workloads 3 and 4)."""
    drain_rounds: int
    """Rounds of the drain comparisons. Single drains of one arm vary by up to 20% on a shared
    machine, so the median needs more rounds here than the longer transaction arms do."""
    history_rows: int
    """Published rows of the "long history" database (workload 5)."""
    backlog_rows: int
    """Unpublished rows present while claims are timed (workload 5)."""
    claims: int
    """Timed claims per arm (workload 5)."""
    latency_samples: int
    """Commits per latency arm, over all rounds (workload 6)."""
    latency_rounds: int
    memory_messages: int

    @classmethod
    def full(cls) -> Scale:
        return cls(
            rounds=9,
            seconds=1.5,
            drain_rows=50_000,
            drain_rounds=11,
            history_rows=1_000_000,
            backlog_rows=10_000,
            claims=50,
            latency_samples=200,
            latency_rounds=4,
            memory_messages=10_000,
        )

    @classmethod
    def quick(cls) -> Scale:
        return cls(
            rounds=3,
            seconds=0.4,
            drain_rows=5_000,
            drain_rounds=2,
            history_rows=100_000,
            backlog_rows=10_000,
            claims=20,
            latency_samples=40,
            latency_rounds=2,
            memory_messages=10_000,
        )


# --- the database --------------------------------------------------------------------------------


class _BenchBase(DeclarativeBase):
    pass


class BenchOrder(_BenchBase):
    """The business row of the enqueue workloads: small, client-assigned key, no RETURNING."""

    __tablename__ = "bench_orders"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    customer: Mapped[str] = mapped_column(String(64))
    total_cents: Mapped[int] = mapped_column(Integer)


def libpq_conninfo(url: URL) -> str:
    """The SQLAlchemy URL as a libpq connection string, for the raw psycopg baselines."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def make_engine(url: URL) -> Engine:
    """The one engine configuration every arm uses (ours and the baselines alike)."""
    return outbox.create_engine(url)


def fresh_pool(engine: Engine, connections: int = 1) -> None:
    """Replace ``engine``'s pooled connections with ``connections`` new, already open ones.

    PostgreSQL keeps per-session state that changes timings: psycopg prepares a statement on
    its fifth execution, and the server's choice between custom and generic plans for it is
    remembered per connection. The raw-SQL arms open a new connection per run, so before a run
    of ours the pool is renewed too (untimed), and every arm starts from the same state.
    """
    engine.dispose()
    opened = [engine.connect() for _ in range(connections)]
    for connection in opened:
        connection.close()


def recreate_database(url: URL) -> None:
    """Drop ``url``'s database if it exists and create it empty, with the outbox and orders.

    Its sessions default to ``TimeZone = 'UTC'``, for every arm alike: the setting the console
    script's relay runs with (:func:`sqla_outbox.engines.use_utc_sessions`), under which psycopg
    returns ``timezone.utc`` datetimes that the relay need not convert.
    """
    _admin(url, f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')
    _admin(url, f'CREATE DATABASE "{url.database}"')
    _admin(url, f"ALTER DATABASE \"{url.database}\" SET TimeZone = 'UTC'")
    create_tables(url)


def create_tables(url: URL) -> None:
    """Create the outbox and ``bench_orders`` in ``url``'s (new, empty) database."""
    engine = make_engine(url)
    try:
        outbox.metadata.create_all(engine)
        _BenchBase.metadata.create_all(engine)
    finally:
        engine.dispose()


def drop_database(url: URL) -> None:
    """Drop ``url``'s database (the suite's own, created by :func:`recreate_database`)."""
    _admin(url, f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')


def _admin(url: URL, statement: str) -> None:
    """Run ``statement`` from the server's ``postgres`` database (CREATE/DROP DATABASE)."""
    with psycopg.connect(libpq_conninfo(url.set(database="postgres")), autocommit=True) as conn:
        conn.execute(statement.encode())


def server_facts(conninfo: str) -> dict[str, str]:
    """PostgreSQL version and the settings that bound these numbers, for the report."""
    names = (
        "fsync",
        "synchronous_commit",
        "shared_buffers",
        "autovacuum",
        "jit",
        "wal_sync_method",
        "TimeZone",
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        facts = {"server_version": str(conn.execute("SHOW server_version").fetchone()[0])}  # type: ignore[index]
        for name in names:
            facts[name] = str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
    return facts


@dataclass
class Context:
    """What every workload receives: where to connect, how big to go, one shared engine.

    The maintenance statements (:meth:`clear_tables`, :func:`snapshot_outbox`,
    :func:`restore_outbox`) are PostgreSQL's here; ``benchmarks.mysql.MySQLContext`` overrides
    them, :meth:`raw` and :meth:`sql` for MySQL and MariaDB.
    """

    CLEAR: ClassVar[tuple[str, ...]] = (
        "TRUNCATE outbox, bench_orders",
        "VACUUM ANALYZE outbox",
        "CHECKPOINT",
    )
    SNAPSHOT: ClassVar[tuple[str, ...]] = (
        "DROP TABLE IF EXISTS outbox_template",
        "CREATE TABLE outbox_template AS SELECT * FROM outbox",
    )
    RESTORE: ClassVar[tuple[str, ...]] = (
        "TRUNCATE outbox",
        "INSERT INTO outbox SELECT * FROM outbox_template",
        "VACUUM ANALYZE outbox",
        "CHECKPOINT",
    )

    url: URL
    scale: Scale
    engine: Engine
    quick: bool
    log: Callable[[str], None]
    sessions: sessionmaker[Session] = field(init=False)

    def __post_init__(self) -> None:
        self.sessions = sessionmaker(self.engine)

    @property
    def conninfo(self) -> str:
        return libpq_conninfo(self.url)

    def raw(self, *, autocommit: bool = True) -> psycopg.Connection[tuple[Any, ...]]:
        """A plain psycopg 3 connection to the benchmark database."""
        return psycopg.connect(self.conninfo, autocommit=autocommit)

    def sql(self, *statements: str) -> None:
        """Run maintenance statements (TRUNCATE, VACUUM, CHECKPOINT) in autocommit."""
        with self.raw() as conn:
            for statement in statements:
                conn.execute(statement.encode())

    def clear_tables(self) -> None:
        self.sql(*self.CLEAR)


# --- rows the baselines write ---------------------------------------------------------------------


def uuid7() -> uuid.UUID:
    """A time-ordered UUIDv7 (RFC 9562) as a hand-written outbox would mint one: ms + random."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = (rand >> 62) & 0xFFF
    rand_b = rand & ((1 << 62) - 1)
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b)


def outbox_row(job: str, input: Any, now: dt.datetime) -> dict[str, Any]:
    """One outbox row exactly as the library writes it (same keys, same kinds of values).

    The hand-written baselines execute these with :data:`OUTBOX_INSERT`, so the database does the
    same work for both sides; only how the row got there differs.
    """
    message_id = uuid7()
    return {
        "id": message_id,
        "job": job,
        "queue": "default",
        "input": input,
        "idempotency_key": str(message_id),
        "max_attempts": 3,
        "run_at": now,
        "staged_at": now,
        "tenant_id": None,
        "traceparent": None,
        "enqueued_by": None,
        "ordering_key": None,
    }


def fill_backlog(ctx: Context, rows: int, per_transaction: int = 10) -> None:
    """Commit ``rows`` unpublished messages through the library, ``per_transaction`` at a time.

    Every transaction's rows share a ``staged_at``, as real enqueues do, so the claim's
    per-transaction ordering logic sees realistic groups.
    """
    done = 0
    while done < rows:
        with ctx.sessions() as session:
            for _ in range(min(per_transaction, rows - done)):
                outbox.enqueue(session, "send_receipt", {"order_id": done})
                done += 1
            session.commit()


def snapshot_outbox(ctx: Context) -> None:
    """Copy the outbox's current rows to ``outbox_template`` for :func:`restore_outbox`."""
    ctx.sql(*ctx.SNAPSHOT)


def restore_outbox(ctx: Context) -> None:
    """Put the outbox back to exactly the snapshot, vacuumed, analysed and checkpointed.

    Run before every timed drain, untimed, so each arm starts from identical rows, statistics,
    free space and a clean shared-buffer state. (On MySQL and MariaDB: ``TRUNCATE``, ``INSERT
    ... SELECT`` and ``ANALYZE TABLE``; see ``benchmarks.mysql``.)
    """
    ctx.sql(*ctx.RESTORE)


# --- timing ---------------------------------------------------------------------------------------


def run_for(operation: Callable[[], object], seconds: float) -> float:
    """Call ``operation`` repeatedly for about ``seconds``; return calls per second."""
    gc.collect()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        operation()
        count += 1
        now = time.perf_counter()
    return count / (now - start)


def interleave(arms: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run every arm once per round, alternating the order; return each arm's per-round numbers.

    Odd rounds run the arms in reverse order, so no arm always goes first (warm caches) or last
    (a checkpoint triggered by the others' writes).
    """
    names = list(arms)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            samples[name].append(arms[name]())
    return samples


TURN = 10
"""Calls an operation makes in a row in :func:`interleave_calls` before the next one's turn."""


def interleave_calls(
    operations: Mapping[str, Callable[[], object]], rounds: int, seconds: float, turn: int = TURN
) -> dict[str, list[float]]:
    """Like :func:`interleave` for operations of a few milliseconds, interleaved call by call.

    Each round, the operations take turns of ``turn`` calls each, one after the other, the order
    reversed each time all have had a turn (ABC, CBA, ABC, ...), until together they have run
    for about ``seconds`` each: a round lasts as long as one of :func:`interleave`, and every
    operation makes the same number of calls in it. An operation's number for the round is its
    calls per second over its own turns. Every operation of a round therefore runs across the
    same seconds of the machine's life, a few tens of milliseconds apart, not one after the
    other. That matters for commit-bound
    transactions: an fsync's time can swing by 2x within seconds, so two arms run a second
    apart may differ by more than the few percent a ratio between them is about, and
    :func:`interleave` alone then measures the machine.
    """
    names = list(operations)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        gc.collect()
        spent = dict.fromkeys(names, 0.0)
        order = names
        calls = 0
        while sum(spent.values()) < seconds * len(names):
            for name in order:
                operation = operations[name]
                start = time.perf_counter()
                for _ in range(turn):
                    operation()
                spent[name] += time.perf_counter() - start
            calls += turn
            order = order[::-1]
        for name in names:
            samples[name].append(calls / spent[name])
    return samples


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (``pct`` in 0..100) of ``values``."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * pct / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A pass/miss criterion on a row's ``ratio`` or on ``ours`` itself."""

    on: Literal["ratio", "ours"]
    op: Literal[">=", "<=", "=="]
    value: float
    unit: str = ""

    def met(self, result: Result) -> bool | None:
        actual = result.ratio if self.on == "ratio" else result.ours
        if actual is None:
            return None
        if self.op == ">=":
            return actual >= self.value
        if self.op == "<=":
            return actual <= self.value
        return actual == self.value

    def __str__(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.on} {self.op} {self.value:g}{unit}"


@dataclass(slots=True)
class Result:
    """One row of the table (and of the JSON)."""

    name: str
    unit: str
    ours: float
    baseline: float | None = None
    baseline_name: str = ""
    targets: tuple[Target, ...] = ()
    samples: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    paired_ratio: float | None = None
    """Median of the per-round ratios, when ours and the baseline ran in the same rounds."""
    skipped: str = ""
    """Why the row was not measured (a broker that is down); its numbers are then meaningless."""

    @property
    def ratio(self) -> float | None:
        """``paired_ratio`` when there is one, else ours / baseline."""
        if self.paired_ratio is not None:
            return self.paired_ratio
        if self.baseline is None or self.baseline == 0:
            return None
        return self.ours / self.baseline

    @property
    def passed(self) -> bool | None:
        """True/False against the targets; None for informative and skipped rows."""
        if self.skipped:
            return None
        verdicts = [target.met(self) for target in self.targets]
        if not verdicts:
            return None
        return all(v is True for v in verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "ours": self.ours,
            "baseline": self.baseline,
            "baseline_name": self.baseline_name,
            "ratio": self.ratio,
            "ratio_is_paired": self.paired_ratio is not None,
            "targets": [str(t) for t in self.targets],
            "passed": self.passed,
            "samples": self.samples,
            "extra": self.extra,
            "skipped": self.skipped or None,
        }


def compare(
    name: str,
    unit: str,
    samples: Mapping[str, list[float]],
    ours: str,
    baseline: str | None,
    *targets: Target,
    **extra: Any,
) -> Result:
    """A row from interleaved samples: the medians of arm ``ours`` and arm ``baseline``.

    The ratio is the median of the per-round ratios: each round's two numbers were taken
    seconds apart, so a noisy stretch of the machine mostly cancels out within a round.
    """
    kept = {ours: list(samples[ours])}
    paired: float | None = None
    if baseline is not None:
        kept[baseline] = list(samples[baseline])
        ratios = [a / b for a, b in zip(samples[ours], samples[baseline], strict=True) if b]
        paired = statistics.median(ratios) if ratios else None
    return Result(
        paired_ratio=paired,
        name=name,
        unit=unit,
        ours=statistics.median(samples[ours]),
        baseline=statistics.median(samples[baseline]) if baseline is not None else None,
        baseline_name=baseline or "",
        targets=targets,
        samples=kept,
        extra=dict(extra),
    )


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    # Large values, and unitless whole numbers (counts such as duplicates), print as integers.
    if abs(value) >= 100 or (value.is_integer() and not unit):
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}" if unit else text


def format_table(results: Sequence[Result]) -> str:
    """The results as a Markdown table (readable in a terminal, pasteable into the docs)."""
    header = ("workload", "ours", "baseline", "ratio", "target", "result")
    rows = [header]
    for result in results:
        if result.skipped:
            skipped = ("-", "-", "-", ", ".join(str(t) for t in result.targets) or "-")
            rows.append((result.name, *skipped, f"skipped: {result.skipped}"))
            continue
        verdict = {True: "pass", False: "MISS", None: "info"}[result.passed]
        rows.append(
            (
                result.name,
                _number(result.ours, result.unit),
                _number(result.baseline, result.unit)
                + (f" ({result.baseline_name})" if result.baseline_name else ""),
                "-" if result.ratio is None else f"{result.ratio:.3f}",
                ", ".join(str(t) for t in result.targets) or "-",
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def print_table(results: Sequence[Result]) -> None:
    print(format_table(results), flush=True)


def load_average() -> str:
    """The 1/5/15-minute load averages: how busy the (shared) machine was."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def machine_facts() -> dict[str, Any]:
    return {
        "load_average_1_5_15": load_average(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlalchemy": sa.__version__,
        "psycopg": psycopg.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path: str, results: Sequence[Result], meta: Mapping[str, Any]) -> None:
    document = {"meta": dict(meta), "results": [result.to_json() for result in results]}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, default=str)
        handle.write("\n")
