"""The examples run as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_quickstart_on_sqlite() -> None:
    """The quickstart publishes the committed job only, and drains to zero."""
    result = run(str(EXAMPLES / "quickstart.py"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("published send_receipt {'order_id': 1}")
    assert "never" not in result.stdout
    assert lines[-1] == "pending after drain: 0"


def test_quickstart_on_postgresql(pg_engine: Engine) -> None:
    """The same on PostgreSQL."""
    result = run(str(EXAMPLES / "quickstart.py"), pg_engine.url.render_as_string(False))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("published send_receipt") == 1
