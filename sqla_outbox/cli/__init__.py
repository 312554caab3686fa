"""The ``sqla-outbox`` console script: ``relay``, ``status``, ``dead``, ``purge`` and ``demo``.

``relay`` runs a :class:`~sqla_outbox.Relay` in the foreground; ``status`` shows the backlog,
who holds it and which failed rows hold back others; ``dead list|retry|discard`` lets an operator
see and settle the dead letters (:mod:`sqla_outbox.dead_letters`); ``purge`` deletes old published
rows (:mod:`sqla_outbox.retention`); ``demo`` tells the whole story on a throwaway SQLite database.

Every option is also read from an environment variable (``SQLA_OUTBOX_URL``,
``SQLA_OUTBOX_PUBLISHER``, ...; ``--help`` lists them), so a container needs no command line.

Errors a user can cause print one sentence with the fix on stderr and exit non-zero: ``2`` for
a bad option (a malformed ``--url``, a database other than PostgreSQL, SQLite, MySQL or MariaDB,
a driver that is not installed or is asyncio-only, a publisher that cannot be imported), ``1``
for the rest (an unreachable database, a missing table, a role without the privileges the
command needs). The URL and the table are checked before the command starts
(:mod:`sqla_outbox.preflight`), so a relay that cannot work exits at once instead of logging the
same error forever. They never print a traceback; a traceback means a bug in sqla-outbox.
Database URLs are always shown with the password hidden.

Exit codes of ``relay``: ``0`` after ``--once`` published everything due, or after SIGINT or
SIGTERM (the pass in flight finishes and its marks are written first); ``1`` if a publish failed
under ``--once`` (the message was charged an attempt and is retried after its backoff; the rest
still flowed) or the database cannot be used; ``2`` for a bad option. ``dead retry`` and ``dead
discard`` exit ``1`` when an id given is not a dead letter (after acting on those that are).
``status`` exits ``3`` when a ``--max-age`` or ``--max-dead`` threshold is crossed (after its
report, naming the threshold on stderr), so a cron job or a probe can tell an alert from ``1``,
an outbox it could not read.

``relay --metrics-port`` serves ``/metrics`` and ``/healthz`` beside the relay
(:mod:`sqla_outbox.serving`); ``--log-format json`` prints one JSON object per log line
(:mod:`sqla_outbox.logs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from sqla_outbox.cli.dead import dead
from sqla_outbox.cli.inbox import inbox
from sqla_outbox.cli.purge import purge_command
from sqla_outbox.cli.relay import relay
from sqla_outbox.cli.status import status
from sqla_outbox.errors import OutboxError

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="sqla-outbox", prog_name="sqla-outbox")
def cli() -> None:
    """A transactional outbox for SQLAlchemy: relay committed jobs to a broker.

    Run `sqla-outbox demo` to see the whole flow on a throwaway SQLite database.
    """


@click.command()
@click.option("--keep", is_flag=True, help="Keep the temporary SQLite database and say where.")
def demo(keep: bool) -> int:
    """The whole flow on a throwaway SQLite database: stage, roll back, relay, check.

    Needs no setup and no arguments; finishes in a couple of seconds.
    """
    from sqla_outbox.demo import run_demo  # noqa: PLC0415 - only this command needs it

    return run_demo(keep=keep)


for command in (relay, status, dead, purge_command, inbox, demo):
    cli.add_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Click's standalone mode is off so that this function returns instead of calling
    ``sys.exit``: tests and wrappers call it in-process, and :class:`OutboxError` raised from
    anywhere below becomes one line on stderr here rather than a traceback.
    """
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="sqla-outbox",
            standalone_mode=False,
        )
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.Abort as error:
        click.echo("Aborted.", err=True)
        return 130 if isinstance(error.__cause__, KeyboardInterrupt) else 1
    except OutboxError as error:
        click.echo(f"Error: {error}", err=True)
        return 1
    return result if isinstance(result, int) else 0
