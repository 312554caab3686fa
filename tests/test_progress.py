"""Progress of long commands: a line redrawn on a terminal, a log line every few seconds
elsewhere; ``relay --once`` and ``purge`` show it."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from sqlalchemy import Engine, update
from support import stage_inputs, url_of

import sqla_outbox as outbox
from sqla_outbox.cli import main
from sqla_outbox.cli import progress as progress_module
from sqla_outbox.cli.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_gets_one_line_redrawn_in_place() -> None:
    screen, clock = Terminal(), Clock()
    progress = Progress("x.progress", "publishing", "messages", 400, stream=screen, clock=clock)
    progress.advance(100)  # within the first redraw interval: nothing drawn
    assert screen.getvalue() == ""
    clock.now = 1.0
    progress.advance(100)
    clock.now = 2.0
    progress.advance(100)
    progress.finish()
    assert screen.getvalue() == (
        "\rpublishing: 200 of 400 messages (50%)"
        "\rpublishing: 300 of 400 messages (75%)"
        "\rpublishing: 300 of 400 messages (75%)\n"
    )


def test_elsewhere_a_log_line_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    """Not a terminal: one ``event=...progress`` line per interval, none per batch; nothing to
    finish."""
    clock, piped = Clock(), io.StringIO()
    progress = Progress("purge.progress", "purging", "rows", stream=piped, clock=clock)
    with caplog.at_level("INFO", logger="sqla_outbox.cli"):
        for second in range(12):
            clock.now = float(second)
            progress.advance(1000)
        progress.finish()
    lines = [r.getMessage() for r in caplog.records if "purge.progress" in r.getMessage()]
    assert lines == [
        "event=purge.progress done=6000",
        "event=purge.progress done=11000",
    ]
    assert piped.getvalue() == ""


@pytest.fixture
def every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress lines at every step, so a short test sees them."""
    monkeypatch.setattr(progress_module, "LOG_EVERY", 0.0)


def test_relay_once_logs_its_progress(
    sqlite_engine: Engine, every_batch: None, capsys: pytest.CaptureFixture[str]
) -> None:
    stage_inputs(sqlite_engine, "job", [{"n": n} for n in range(30)])
    url = url_of(sqlite_engine)
    code = main(["relay", "--once", "--batch-size", "10", "--publisher", "stdout", "--url", url])
    assert code == 0
    err = capsys.readouterr().err
    assert "event=relay.progress done=10 total=30" in err
    assert "event=relay.progress done=30 total=30" in err


def test_purge_logs_its_progress(
    sqlite_engine: Engine, every_batch: None, capsys: pytest.CaptureFixture[str]
) -> None:
    staged = stage_inputs(sqlite_engine, "job", [{"n": n} for n in range(25)])
    with sqlite_engine.begin() as conn:
        long_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
        row = outbox.OutboxRow
        conn.execute(
            update(row).where(row.id.in_([m.id for m in staged])).values(published_at=long_ago)
        )
    code = main(
        ["purge", "--older-than", "7d", "--batch-size", "10", "--url", url_of(sqlite_engine)]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "Purged 25 published rows" in captured.out
    assert "event=purge.progress done=10\n" in captured.err
    assert "event=purge.progress done=25\n" in captured.err
