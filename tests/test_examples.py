"""The examples run as written."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

from fastapi.testclient import TestClient
from sqlalchemy import Engine
from support import WAIT

import sqla_outbox as outbox

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def readme_quickstart() -> str:
    """The first Python block of the README's "## Quickstart" section, verbatim."""
    section = (REPO / "README.md").read_text().split("\n## Quickstart\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    """The README's quickstart, pasted into a file and run in an empty directory, publishes the
    order's job with the order's generated id (flushed before enqueue, so not None)."""
    script = tmp_path / "quickstart.py"
    script.write_text(readme_quickstart())
    result = run(str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["publish send_receipt {'order_id': 1}"]


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


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # SQLAlchemy resolves Mapped[...] annotations through it
    spec.loader.exec_module(module)
    return module


def test_fastapi_app(pg_engine: Engine) -> None:
    """examples/fastapi_app.py: the lifespan starts the relay; an order POSTed through an
    AsyncSession is published with its generated id (flushed before enqueue); /healthz is 200
    once the relay reaches the database; shutdown stops the relay."""
    example = load_example("fastapi_app")
    published: list[outbox.OutboxMessage] = []
    got_one = threading.Event()

    def publish(message: outbox.OutboxMessage) -> None:
        published.append(message)
        got_one.set()

    app = example.create_app(pg_engine.url.render_as_string(hide_password=False), publish)
    with TestClient(app) as client:
        response = client.post("/orders", json={"email": "ada@example.com"})
        assert response.status_code == 201, response.text
        order_id = response.json()["id"]
        assert isinstance(order_id, int)
        assert got_one.wait(WAIT), "the relay published nothing"
        assert client.get("/healthz").json() == {"relay": True}
        relay = app.state.relay
    [message] = published
    assert (message.job, message.queue, message.input) == (
        "send_receipt",
        "emails",
        {"order_id": order_id},
    )
    assert not relay.is_alive()
