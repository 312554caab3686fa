"""Progress of a long command (``relay --once`` over a backlog, ``purge`` of much history).

Such a command may run for minutes; an operator who sees nothing until its last line cannot
tell a slow run from a stuck one. What it shows depends on where its output goes:

* on a terminal, one line on stderr, redrawn in place at most every :data:`REDRAW` seconds:
  ``purging: 120,000 rows``, or ``publishing: 120,000 of 500,000 (24%)`` when the total is
  known;
* anywhere else (a log file, a pipe, a container's log), a structured log line every
  :data:`LOG_EVERY` seconds (``event=relay.progress done=120000 total=500000``), so the log
  shows the rate without a line per batch.

A command that finishes before the first interval shows nothing more than its result.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from sqla_outbox.logs import log_event
from sqla_outbox.observers import PassReport

__all__ = ["LOG_EVERY", "REDRAW", "PassProgress", "Progress"]

LOG_EVERY = 5.0
"""Seconds between two progress log lines when stderr is not a terminal."""
REDRAW = 0.1
"""Seconds between two redraws of the progress line on a terminal."""

log = logging.getLogger("sqla_outbox.cli")


class Progress:
    """Counts what a command has done and shows it (see the module docs).

    :param event: the log event's name (``relay.progress``, ``purge.progress``).
    :param doing: the terminal line's label (``publishing``, ``purging``).
    :param unit: what is counted, plural (``messages``, ``rows``).
    :param total: how many there are to do, if known.
    """

    def __init__(
        self,
        event: str,
        doing: str,
        unit: str,
        total: int | None = None,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_every: float | None = None,
    ) -> None:
        self.event = event
        self.doing = doing
        self.unit = unit
        self.total = total
        self.done = 0
        self._stream = sys.stderr if stream is None else stream
        self._terminal = self._stream.isatty()
        self._clock = clock
        self._every = REDRAW if self._terminal else (LOG_EVERY if log_every is None else log_every)
        self._next = clock() + self._every
        self._drawn = False

    def advance(self, count: int) -> None:
        """``count`` more done; shown if the interval has passed."""
        self.done += count
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._every
        if self._terminal:
            self._stream.write(f"\r{self._line()}")
            self._stream.flush()
            self._drawn = True
        else:
            log_event(log, logging.INFO, self.event, done=self.done, total=self.total)

    def finish(self) -> None:
        """End the terminal line, if one was drawn, so the result prints below it."""
        if self._drawn:
            self._stream.write(f"\r{self._line()}\n")
            self._stream.flush()
            self._drawn = False

    def _line(self) -> str:
        if self.total:
            share = min(100, self.done * 100 // self.total)
            return f"{self.doing}: {self.done:,} of {self.total:,} {self.unit} ({share}%)"
        return f"{self.doing}: {self.done:,} {self.unit}"


class PassProgress:
    """A relay observer (``Relay.observe``) that counts the messages each pass published."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def pass_done(self, report: PassReport) -> None:
        self.progress.advance(len(report.outcome.published))
